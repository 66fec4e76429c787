"""Checkpoints are written whole or not at all, and a bad resume path is refused clearly."""
import pytest
import torch

from {{ cookiecutter.package }}.core import files
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.distributed import World
from {{ cookiecutter.package }}.contracts import Preprocessing
from {{ cookiecutter.package }}.loop import checkpoint
from {{ cookiecutter.package }}.loop.run import Progress


def test_save_and_load_round_trip(tmp_path):
    path = tmp_path / "last.pt"
    checkpoint.save({"step": 7, "weight": torch.arange(3.0)}, path)
    state = checkpoint.load(path, torch.device("cpu"))
    assert state["step"] == 7 and torch.equal(state["weight"], torch.arange(3.0))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "last.pt"
    checkpoint.save({"step": 1}, path)

    def disk_full(temporary):
        temporary.write_bytes(b"half a checkpo")
        raise OSError(28, "No space left on device")

    with pytest.raises(files.WriteError, match=r"No space left on device \(.* MiB free on its disk\); any "
                                                    "earlier last.pt is intact"):
        files.write_atomic(path, disk_full)
    assert checkpoint.load(path, torch.device("cpu"))["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_torch_saves_failed_write_is_a_write_error_and_a_bug_is_not(tmp_path):
    path = tmp_path / "last.pt"

    def stream_writer_failure(temporary):  # how torch.save reports a write the disk refused
        raise RuntimeError("[enforce fail at inline_container.cc:671] . unexpected pos 576 vs 534")

    with pytest.raises(files.WriteError, match="unexpected pos"):
        files.write_atomic(path, stream_writer_failure)

    def bug(temporary):
        raise RuntimeError("a bug in the state being saved")

    with pytest.raises(RuntimeError, match="a bug") as raised:
        files.write_atomic(path, bug)
    assert not isinstance(raised.value, files.WriteError) and not list(tmp_path.iterdir())


def test_a_checkpoint_the_disk_has_no_room_for_names_the_errno_and_keeps_the_last_one(small_disk):
    disk = small_disk(2)
    if disk is None:
        pytest.skip(small_disk.refused)
    path = disk / "last.pt"
    checkpoint.save({"step": 1}, path)
    with pytest.raises(files.WriteError, match=rf"^could not write {path}: No space left on device \(ENOSPC; "
                                                r"\d+\.\d MiB free on its disk(: it is full)?\); any earlier "
                                                "last.pt is intact$"):
        checkpoint.save({"step": 2, "weight": torch.zeros(2**20)}, path)  # 4 MiB
    assert checkpoint.load(path, torch.device("cpu"))["step"] == 1
    assert [p.name for p in disk.iterdir()] == ["last.pt"]


def test_resume_choices(tmp_path):
    assert checkpoint.find(None, tmp_path) is None
    assert checkpoint.find("auto", tmp_path) is None
    checkpoint.save({}, tmp_path / "last.pt")
    assert checkpoint.find("auto", tmp_path) == tmp_path / "last.pt"
    with pytest.raises(ConfigError, match="no such checkpoint"):
        checkpoint.find(str(tmp_path / "missing.pt"), tmp_path)


def test_a_torchrun_job_carries_on_from_the_checkpoint_in_the_folder_its_rendezvous_id_names(tmp_path, monkeypatch):
    """A node that replaces a failed one joins with its restart count at 0: the folder's checkpoint is still the job's."""
    job = tmp_path / "torchrun-exp1"
    job.mkdir()
    checkpoint.save({}, job / "last.pt")
    assert checkpoint.find(None, job) is None  # a plain run starts afresh
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "exp1")
    assert checkpoint.find(None, job) == job / "last.pt"
    checkpoint.save({}, tmp_path / "last.pt")
    assert checkpoint.find(None, tmp_path) is None  # --standalone: a folder of the user's own, not the job's
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert checkpoint.find(None, tmp_path) == tmp_path / "last.pt"


def test_a_job_that_slurm_requeued_carries_on_from_the_checkpoint_in_its_folder(tmp_path, monkeypatch):
    """hydra/launcher=slurm runs a requeued job again in the same folder; its first start begins afresh."""
    checkpoint.save({}, tmp_path / "last.pt")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert checkpoint.find(None, tmp_path) is None
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert checkpoint.find(None, tmp_path) == tmp_path / "last.pt"


def test_damaged_checkpoint_is_refused(tmp_path):
    path = tmp_path / "last.pt"
    checkpoint.save({"weight": torch.zeros(1000)}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ConfigError, match="is not a readable checkpoint"):
        checkpoint.load(path, torch.device("cpu"))


class NodeWithoutTheCheckpoint:
    """A world of two processes, the other of which sees no checkpoint (its run folder is not shared)."""

    device = torch.device("cpu")

    def max(self, value: float) -> float:
        return max(value, -1)  # -1: the other process starts from scratch


def test_processes_that_disagree_on_the_checkpoint_refuse_to_resume(tmp_path):
    checkpoint.save({"progress": Progress(step=4).state_dict()}, tmp_path / "last.pt")
    with pytest.raises(ConfigError, match="storage that all of them share"):
        checkpoint.resume_state("auto", tmp_path, NodeWithoutTheCheckpoint())
    path, state = checkpoint.resume_state(None, tmp_path, NodeWithoutTheCheckpoint())  # neither resumes
    assert path is None and state is None
    path, state = checkpoint.resume_state("auto", tmp_path, World(0, 0, 1, torch.device("cpu")))
    assert path == tmp_path / "last.pt" and state["progress"]["step"] == 4


@pytest.mark.parametrize("held", [{"step": 4, "model": {}}, torch.zeros(2)], ids=["older layout", "not a dict"])
def test_a_checkpoint_without_the_runs_progress_is_refused_in_one_line_naming_the_way_on(tmp_path, held):
    torch.save(held, tmp_path / "last.pt")
    with pytest.raises(ConfigError, match=r"holds no run progress: .*model.weights=.*last.pt$"):
        checkpoint.resume_state("auto", tmp_path, World(0, 0, 1, torch.device("cpu")))


class Held:
    """A checkpoint part holding a given state."""

    def __init__(self, state: dict):
        self.state = state

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = state


INFERENCE = checkpoint.Inference(classes=["cat", "dog"], model={"name": "resnet18"},
                                 preprocessing=Preprocessing(mean=(0.5,) * 3, std=(0.2,) * 3, crop_size=32, resize=36))


def checkpoints_in(folder) -> checkpoint.Checkpoints:
    return checkpoint.Checkpoints(folder, True, {"model": "resnet18", "classes": 2}, INFERENCE)


def parts(step: int, weight: float) -> dict:
    return {"progress": Progress(step=step), "model": Held({"weight": torch.full((2,), weight)})}


def test_best_pt_holds_the_weights_of_the_best_validation_so_far(tmp_path):
    checkpoints = checkpoints_in(tmp_path)
    for step, top1 in ((1, 50.0), (2, 80.0), (3, 60.0)):
        checkpoints.save(parts(step, float(step)), top1=top1)
    checkpoints.save(parts(4, 4.0))  # a stop mid-epoch: nothing validated
    best, last = (checkpoint.load(tmp_path / name, torch.device("cpu")) for name in ("best.pt", "last.pt"))
    assert best["progress"]["step"] == 2 and torch.equal(best["model"]["weight"], torch.full((2,), 2.0))
    assert best["best_top1"] == 80
    assert last["progress"]["step"] == 4 and last["best_top1"] == 80  # what a resumed run compares its epochs with
    assert sorted(path.name for path in tmp_path.iterdir()) == ["best.pt", "last.pt"]


def test_a_checkpoint_holds_each_parts_state_by_its_key_and_restores_them_where_it_has_them(tmp_path):
    checkpoints_in(tmp_path).save({**parts(3, 1.0), "ema": Held({"updates": 3})}, top1=70.0)
    state = checkpoint.load(tmp_path / "last.pt", torch.device("cpu"))
    assert set(state) == {"progress", "model", "ema", "identity", "inference", "best_top1"}
    assert state["identity"] == {"model": "resnet18", "classes": 2} and state["inference"] == INFERENCE.state_dict()
    resumed, added = checkpoints_in(tmp_path), Held({"fresh": True})
    restored = {**parts(0, 0.0), "ema": Held({}), "added": added}
    resumed.restore(restored, state)
    assert restored["progress"] == Progress(step=3) and torch.equal(restored["model"].state["weight"], torch.ones(2))
    assert restored["ema"].state == {"updates": 3}
    assert added.state == {"fresh": True}, "a part the checkpoint lacks keeps its fresh start"
    assert (resumed.best_top1, resumed.saved_step) == (70.0, 3)


def test_a_best_epoch_links_best_pt_to_last_pt_and_copies_where_links_fail(tmp_path, monkeypatch):
    checkpoints = checkpoints_in(tmp_path)
    checkpoints.save(parts(1, 1.0), top1=50.0)
    assert (tmp_path / "best.pt").samefile(tmp_path / "last.pt")  # one file on disk, written once
    checkpoints.save(parts(2, 0.0), top1=40.0)
    assert not (tmp_path / "best.pt").samefile(tmp_path / "last.pt")
    assert checkpoint.load(tmp_path / "best.pt", torch.device("cpu"))["progress"]["step"] == 1

    def no_links(source, target):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(checkpoint.os, "link", no_links)
    checkpoints.save(parts(3, 3.0), top1=70.0)
    assert not (tmp_path / "best.pt").samefile(tmp_path / "last.pt")
    assert checkpoint.load(tmp_path / "best.pt", torch.device("cpu"))["progress"]["step"] == 3
    assert sorted(path.name for path in tmp_path.iterdir()) == ["best.pt", "last.pt"]


def test_a_checkpoint_to_use_holds_its_classes_and_preprocessing_or_is_refused_in_one_line(tmp_path):
    checkpoint.save({"step": 1, "model": {}, "inference": INFERENCE.state_dict()}, tmp_path / "new.pt")
    assert checkpoint.load_trained(str(tmp_path / "new.pt"), torch.device("cpu"))[1] == INFERENCE
    checkpoint.save({"step": 1, "model": {}, "identity": {"model": "resnet18", "classes": 2}}, tmp_path / "old.pt")
    with pytest.raises(ConfigError, match=r"^checkpoint=.*old.pt holds no class names or preprocessing: it was written "
                                          "before checkpoints kept them"):
        checkpoint.load_trained(str(tmp_path / "old.pt"), torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"^checkpoint=.*missing.pt: no such file"):
        checkpoint.load_trained(str(tmp_path / "missing.pt"), torch.device("cpu"))
