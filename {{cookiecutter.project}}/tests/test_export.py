"""The export command: for every target in conf/export/target/, the file it writes, loaded by that format's own
runtime, computes what the checkpoint's model computes, on a batch of another size than the one it was exported with."""
import json
import sys

import pytest
import torch
import torchvision
from hydra.errors import HydraException
from omegaconf import OmegaConf

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.config import build
from {{ cookiecutter.package }}.core.errors import ClearError, ConfigError
from {{ cookiecutter.package }}.core.packages import installs_here
from {{ cookiecutter.package }}.loop.checkpoint import Inference, save
from {{ cookiecutter.package }}.tools.export import TorchScript, export

from helpers.colours import PREPROCESSING
from helpers.paths import CONF, PACKAGE
from helpers.runs import hydra_run

EXPORT_CONF = CONF / "export"
FORMATS = sorted(path.stem for path in (EXPORT_CONF / "target").glob("*.yaml"))


def facts(format: str) -> options.Facts:
    return options.facts_of(OmegaConf.load(EXPORT_CONF / "target" / f"{format}.yaml"))


def runtime(format: str):
    """The format's own loader, as a user serving the file would call it: a function of a batch."""
    if format == "onnx":
        onnxruntime = pytest.importorskip("onnxruntime", reason="checking an ONNX file needs onnxruntime: "
                                                                "pip install -e '.[export]'")
        return lambda path: (lambda images: torch.from_numpy(
            onnxruntime.InferenceSession(str(path)).run(None, {"images": images.numpy()})[0]))
    if format == "torchscript":
        return lambda path: torch.jit.load(str(path))
    return lambda path: torch.export.load(str(path)).module()


@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint of a torchvision ResNet-18 with 3 classes, and the model it holds."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3).eval()
    inference = Inference(classes=["a", "b", "c"], preprocessing=PREPROCESSING,
                          model={"_target_": f"{PACKAGE}.loop.model.torchvision.Torchvision", "name": "resnet18",
                                 "weights": None, "num_classes": 0, "channels_last": False, "compile": False})
    save({"model": model.state_dict(), "inference": inference.state_dict(), "step": 6}, tmp_path / "best.pt")
    return tmp_path / "best.pt", model


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
# TorchScript in the fast tier; the other exporters (onnx 6 s, exported_program 4 s) walk the same command.
@pytest.mark.parametrize("format", [pytest.param(format, marks=[] if format == "torchscript" else [pytest.mark.full])
                                    for format in FORMATS])
def test_the_exported_file_computes_what_the_checkpoint_does(format, checkpoint, tmp_path):
    if facts(format).missing():
        pytest.skip(f"target={format}: {facts(format).missing()}")
    load = runtime(format)
    path, model = checkpoint
    with hydra_run("export", [f"checkpoint={path}", f"target={format}"], tmp_path / "run", EXPORT_CONF) as cfg:
        written = export(cfg, tmp_path / "run")
    batch = torch.randn(5, 3, PREPROCESSING.crop_size, PREPROCESSING.crop_size)  # exported with 2
    with torch.no_grad():
        expected, got = model(batch), load(written["path"])(batch)
    assert got.shape == (5, 3) and (got - expected).abs().max() <= 1e-4 * expected.abs().max()
    assert written["difference"] <= 1e-4  # the command's own check, on its own batch
    card = json.loads(written["card"].read_text())
    assert card["classes"] == ["a", "b", "c"] and card["preprocessing"]["crop_size"] == PREPROCESSING.crop_size
    assert sorted(file.name for file in written["path"].parent.iterdir() if file.suffix != ".log") == sorted(
        [written["path"].name, "model.json"])  # no partial file left beside them


def test_a_file_that_computes_something_else_is_deleted_and_refused(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(TorchScript, "load", lambda self, path: lambda images: torch.zeros(len(images), 3))
    with hydra_run("export", [f"checkpoint={checkpoint[0]}", "target=torchscript"], tmp_path / "run",
                   EXPORT_CONF) as cfg, pytest.raises(ClearError, match=r"model\.ts's outputs differ from the "
                                                                        r"checkpoint's by 1 of their largest"):
        export(cfg, tmp_path / "run")
    assert list((tmp_path / "run").iterdir()) == []  # neither the file nor its model.json is left to be served


@pytest.mark.full  # a second ONNX export, 4-5 s; the fast tier exports and checks one
def test_an_onnx_file_stands_unchecked_where_onnxruntime_is_missing(checkpoint, tmp_path, monkeypatch, caplog):
    if facts("onnx").missing():
        pytest.skip(f"target=onnx: {facts('onnx').missing()}")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # installed only to check the file, not to write it
    with hydra_run("export", [f"checkpoint={checkpoint[0]}", "target=onnx"], tmp_path / "run", EXPORT_CONF) as cfg:
        written = export(cfg, tmp_path / "run")
    assert written["difference"] is None and written["path"].stat().st_size > 0
    assert "is written but not checked: onnxruntime is not installed" in caplog.text


def test_an_unknown_format_is_refused_naming_it(checkpoint, tmp_path):
    with pytest.raises(HydraException, match="Could not find 'target/keras'"):
        with hydra_run("export", [f"checkpoint={checkpoint[0]}", "target=keras"], tmp_path / "run", EXPORT_CONF):
            pass


@pytest.mark.parametrize("format", [format for format in FORMATS if facts(format).module])
def test_a_format_whose_package_is_missing_is_refused_with_its_install_command(format, monkeypatch):
    monkeypatch.setitem(sys.modules, facts(format).module, None)  # what an absent package looks like to import
    assert installs_here(facts(format).extra)
    with pytest.raises(ConfigError, match=rf"{facts(format).module} is not installed \(.*\): pip install -e "
                                          rf"'\.\[{facts(format).extra}\]'"):
        build(OmegaConf.load(EXPORT_CONF / "target" / f"{format}.yaml"))
