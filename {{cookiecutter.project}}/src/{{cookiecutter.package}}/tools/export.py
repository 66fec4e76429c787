"""Writing a checkpoint's model as a file for serving, behind `python -m <package>.export target=...`: one class per
file format (conf/export/target/<option>.yaml names it), each an `Exporter` (contracts/) that writes the file and loads
it back, so the command checks the file's outputs against the checkpoint's before it says it is done.

Every format takes what the checkpoint's model takes, a float32 NCHW batch normalised as model.json says, of any
batch size: the batch dimension is exported as dynamic.
"""
import json
import logging
import warnings
from pathlib import Path

import torch
from omegaconf import DictConfig

from .. import options
from ..contracts import Exporter
from ..core.config import build
from ..core.errors import ClearError
from ..core.packages import optional_import
from ..core.files import write_atomic
from ..loop.checkpoint import load_trained
from ..loop.model import trained_model

log = logging.getLogger(__name__)

TOLERANCE = 1e-3  # the largest difference from the checkpoint's outputs, relative to their largest magnitude
CHECK_BATCH = 3  # images in the batch the written file is checked on: another size than the example's
BATCH = {0: torch.export.Dim("batch")}  # the input's first dimension, left free in the exported graph


class TorchScript:
    """TorchScript, traced (`torch.jit.load`); deprecated by PyTorch in favour of `exported_program`, still what many
    C++ and mobile runtimes load."""
    suffix = ".ts"

    def write(self, model: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # its deprecation, which the docstring states once
            torch.jit.trace(model, example).save(str(path))

    def load(self, path: Path):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return torch.jit.load(str(path))


class Onnx:
    """ONNX, through torch.export (`torch.onnx.export(dynamo=True)`, which needs onnxscript); one file, its weights
    inside. Checked with onnxruntime where it is installed."""
    suffix = ".onnx"

    def write(self, model: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
        for library in ("onnx_ir", "onnxscript"):  # their passes log each step at INFO, which the console would show
            logging.getLogger(library).setLevel(logging.WARNING)
        torch.onnx.export(model, (example,), str(path), input_names=["images"], output_names=["logits"],
                          dynamic_shapes=(BATCH,), dynamo=True, external_data=False, verbose=False)

    def load(self, path: Path):
        session = optional_import("onnxruntime", "export").InferenceSession(str(path))
        return lambda images: torch.from_numpy(session.run(None, {"images": images.numpy()})[0])


class ExportedProgram:
    """torch.export's ExportedProgram (`torch.export.load(path).module()`): PyTorch's own format for AOTInductor and
    ExecuTorch."""
    suffix = ".pt2"

    def write(self, model: torch.nn.Module, example: torch.Tensor, path: Path) -> None:
        program = torch.export.export(model, (example,), dynamic_shapes=(BATCH,))
        with path.open("wb") as file:  # a file, since torch.export warns of a path that does not end in .pt2
            torch.export.save(program, file)

    def load(self, path: Path):
        return torch.export.load(str(path)).module()


def difference(expected: torch.Tensor, got: torch.Tensor) -> float:
    """The largest difference between two outputs, relative to the largest magnitude of the expected one."""
    return float((got.float() - expected).abs().max() / expected.abs().max().clamp(min=1e-12))


@torch.no_grad()
def export(cfg: DictConfig, run_dir: Path) -> dict:
    """Write the checkpoint's model in `cfg.target`'s file format, with model.json beside it, and check the file's outputs."""
    options.check(cfg)
    state, inference = load_trained(cfg.checkpoint, torch.device("cpu"))
    model = trained_model(state, inference)
    exporter: Exporter = build(cfg.target)
    side, name = inference.preprocessing.crop_size, type(exporter).__name__
    example = torch.randn(cfg.batch_size, 3, side, side, generator=torch.Generator().manual_seed(0))
    path = Path(cfg.out).expanduser() if cfg.out else run_dir / f"model{exporter.suffix}"
    try:
        write_atomic(path, lambda temporary: exporter.write(model, example, temporary))
    except ClearError:
        raise
    except Exception as err:  # noqa: BLE001 - an architecture the format cannot express: the line names it
        raise ClearError(f"{name} could not export model.name={inference.model['name']}: "
                         f"{err.__class__.__name__}: {str(err).splitlines()[0][:300]}; try another format") from err
    card = {"format": name, "file": path.name, "input": "float32 NCHW, each channel (pixels / 255 - mean) / std",
            "classes": inference.classes, "preprocessing": inference.state_dict()["preprocessing"]}
    write_atomic(path.with_suffix(".json"), lambda temporary: temporary.write_text(json.dumps(card, indent=2)))
    batch = torch.randn(CHECK_BATCH, 3, side, side, generator=torch.Generator().manual_seed(1))
    try:
        differs = difference(model(batch), exporter.load(path)(batch))
    except ClearError as missing:  # what runs the file is not installed here: the file stands, unchecked
        log.warning("%s is written but not checked: %s", path, missing)
        return {"path": path, "card": path.with_suffix(".json"), "difference": None}
    if differs > TOLERANCE:  # a file that computes something else must not look like the model
        path.unlink()
        path.with_suffix(".json").unlink()
        raise ClearError(f"{path}'s outputs differ from the checkpoint's by {differs:.2g} of their largest, more than "
                         f"{TOLERANCE:g}, so it is deleted; try another format")
    return {"path": path, "card": path.with_suffix(".json"), "difference": differs}
