"""staging=tmpfs and scripts/stage_tmpfs.sh: a verified copy in RAM, reused while it matches, refused when too big."""
import os
import shutil
import subprocess

import pytest

from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.distributed import ALONE
from {{ cookiecutter.package }}.data.staging import manifest, tmpfs

from helpers.paths import PROJECT


def files(root):
    return {path.relative_to(root): path.read_bytes() for path in root.rglob("*") if path.is_file()
            and not path.name.startswith(".staged")}


def test_stages_a_copy_and_reuses_it_while_the_manifest_matches(tiny_root, tmp_path, monkeypatch):
    stage = tmpfs(str(tmp_path / "shm"), 0.0, ALONE)
    staged = stage(tiny_root)
    assert staged.parent == tmp_path / "shm" and files(staged) == files(tiny_root)
    monkeypatch.setattr(shutil, "copytree", lambda *args, **kwargs: pytest.fail("copied again"))
    assert stage(tiny_root) == staged


def grown(path):
    path.write_bytes(path.read_bytes() + b"\0")


def rewritten_at_its_size_and_mtime(path):
    before = path.stat()
    path.write_bytes(bytes(reversed(path.read_bytes())))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.parametrize("change", [grown, rewritten_at_its_size_and_mtime])
def test_a_changed_source_is_copied_again(tiny_root, tmp_path, change):
    source = tmp_path / "source"
    shutil.copytree(tiny_root, source)
    stage = tmpfs(str(tmp_path / "shm"), 0.0, ALONE)
    staged = stage(source)
    change(next(source.rglob("*.JPEG")))
    stage(source)
    assert files(staged) == files(source) and manifest(source) != manifest(tiny_root)


def test_refuses_with_numbers_when_space_or_memory_is_short(tiny_root, tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"needs 0\.\d+ GiB of RAM plus staging.reserve_gb=100000"):
        tmpfs(str(tmp_path / "shm"), 100000.0, ALONE)(tiny_root)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(100, 100, 0))
    with pytest.raises(ConfigError, match=r"needs 0\.\d+ GiB and .* has 0\.00 GiB free"):
        tmpfs(str(tmp_path / "shm"), 0.0, ALONE)(tiny_root)
    assert not any((tmp_path / "shm").iterdir())


def test_a_copy_cut_short_leaves_nothing_behind(tiny_root, tmp_path, monkeypatch):
    def copy_some_then_fill_up(source, target, **kwargs):
        os.makedirs(target)
        (target / "part").write_bytes(b"x")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copytree", copy_some_then_fill_up)
    with pytest.raises(ConfigError, match="No space left on device"):
        tmpfs(str(tmp_path / "shm"), 0.0, ALONE)(tiny_root)
    assert list((tmp_path / "shm").iterdir()) == []


def stage_script(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(PROJECT / "scripts/stage_tmpfs.sh"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.full
def test_script_copies_checks_and_prints_the_override_idempotently(tiny_root, packs, tmp_path):
    first = stage_script(tiny_root, tmp_path / "tree")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().splitlines()[-1] == f"train with: data.root={tmp_path / 'tree'}"
    assert files(tmp_path / "tree") == files(tiny_root)
    again = stage_script(tiny_root, tmp_path / "tree")
    assert again.returncode == 0 and again.stdout == first.stdout
    pytest.importorskip("lmdb", reason="pip install -e '.[lmdb]'")
    packed = stage_script(packs["lmdb"], tmp_path / "packed")
    assert packed.stdout.strip().splitlines()[-1] == f"train with: format.path={tmp_path / 'packed'}"


@pytest.mark.full
def test_script_refuses_a_missing_source_and_a_folder_it_did_not_fill(tiny_root, tmp_path):
    result = stage_script(tmp_path / "nowhere", tmp_path / "dst")
    assert result.returncode == 1 and "does not exist" in result.stderr
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy/keep.txt").write_text("someone else's")
    result = stage_script(tiny_root, tmp_path / "busy")
    assert result.returncode == 1 and "holds other files" in result.stderr
    assert (tmp_path / "busy/keep.txt").exists()
