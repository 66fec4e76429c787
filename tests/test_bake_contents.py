"""What a user bakes is their project: its prose says nothing of how the template was made. The words of the template's
own workshop (the working session that measured a figure, the machine lent to it and its lease, the device time left,
the template's issue numbers) stay in the template's docs/ and its git history."""
import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from cookiecutter.main import cookiecutter

# "session" as a term of its own (a pytest session, a process session of setsid, an HTTP or FUSE session) is not a
# working session. Upstream references such as pytorch/pytorch#135712 or .../issues/135712 are not the template's.
WORKING_WORDS = {
    "session": r"(?<!pytest )(?<!process )(?<!HTTP )(?<!FUSE )\bsessions?\b",
    "lease": r"\blease[sd]?\b",
    "lent": r"\b(?:device|GPU|machine|accelerator|chip)s?\b\W+(?:\w+\W+){0,3}?lent\b"
            r"|\blent\b\W+(?:\w+\W+){0,3}?(?:device|GPU|machine|accelerator|chip)s?\b",
    "device time": r"\bdevice[- ]time\b",
    "issue number": r"\bissues? #?\d+|(?<![\w/])#\d+\b|(?<![\w.-]/)\bissues/\d+",
}
WORKING = {name: re.compile(pattern, re.IGNORECASE) for name, pattern in WORKING_WORDS.items()}
FOUND_ANYWHERE = re.compile(r"session|lease|lent|device.time|issue|#\d", re.IGNORECASE)  # a cheap first look
COMMENTED = {".yaml", ".yml", ".sh", ".toml", ".cfg", ".ini", ".txt", ""}  # "": Makefile, .gitignore


def python_prose(text: str) -> list[tuple[int, str]]:
    """A module's comments, docstrings and messages, each line with its number. A string of one word is left out:
    it names something (`scope="session"`)."""
    lines = [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(text).readline)
             if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value.split()) > 1:
            lines += [(node.lineno + offset, line) for offset, line in enumerate(node.value.splitlines())]
    return lines


def prose(path: Path) -> list[tuple[int, str]]:
    """The lines of a baked text file that a reader takes as prose: all of a page, the comments of code."""
    text = path.read_text()
    if not FOUND_ANYWHERE.search(text):
        return []
    if path.suffix == ".md":
        return list(enumerate(text.splitlines(), 1))
    if path.suffix == ".py":
        return python_prose(text)
    if path.suffix in COMMENTED:
        return [(number, line[match.start():]) for number, line in enumerate(text.splitlines(), 1)
                if (match := re.search(r"(?:^|\s)#", line))]
    return []


def working_words(project: Path) -> list[str]:
    hits = []
    for path in sorted(project.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        try:
            lines = prose(path)
        except UnicodeDecodeError:
            continue  # an image
        hits += [f"{path.relative_to(project)}:{number}: {name} ({match.group(0)!r}) in: {line.strip()}"
                 for number, line in lines for name, pattern in WORKING.items() for match in pattern.finditer(line)]
    return hits


@pytest.fixture(scope="module")
def baked(template, tmp_path_factory) -> Path:
    return Path(cookiecutter(str(template), no_input=True, output_dir=str(tmp_path_factory.mktemp("bake"))))


def test_the_bake_has_none_of_the_templates_working_words(baked):
    hits = working_words(baked)
    print("\n".join(hits))
    assert hits == [], f"{len(hits)} working words in the bake:\n" + "\n".join(hits)


@pytest.mark.parametrize("text", [
    "Not measured there yet: no GPU was lent to measure it.", "read on a later lease of the same machine kind",
    "cut short by the device time left to that session", "not reflowed yet (issue 49)", "as #49 asked",
    "see issues/49"])
def test_the_working_words_are_found(text):
    assert any(pattern.search(text) for pattern in WORKING.values()), text


@pytest.mark.parametrize("text", [
    "(pytorch/pytorch#135712)", "github.com/pytorch/pytorch/issues/124133", "a process session of its own",
    "once per pytest session", "whether its batch's memory was lent", "a `Lent` tensor", "# 3 seeds"])
def test_upstream_references_and_terms_of_their_own_are_not(text):
    assert not any(pattern.search(text) for pattern in WORKING.values()), text


def make_targets(makefile: Path) -> set[str]:
    return {target for line in makefile.read_text().splitlines() if line.startswith(".PHONY:")
            for target in line.split(":", 1)[1].split()}


def test_the_bake_names_no_make_target_only_the_template_has(baked, template):
    """`make demo` and its kin are the template's Makefile's: a baked page or comment that names one sends the user
    to a command their project does not have."""
    theirs = make_targets(template / "Makefile") - make_targets(baked / "Makefile")
    assert theirs, "the template's Makefile has no target of its own: nothing to check"
    named = re.compile(rf"\bmake ({'|'.join(map(re.escape, sorted(theirs)))})\b")
    hits = []
    for path in sorted(baked.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            hits += [f"{path.relative_to(baked)}:{number}: {line.strip()}"
                     for number, line in enumerate(text.splitlines(), 1)
                     if named.search(line)]
    assert hits == [], "\n".join(hits)
