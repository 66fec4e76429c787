"""Scoring a checkpoint on a validation split, behind `python -m <package>.evaluate`: the split read through
training's own loader assembly, prepared as the checkpoint says, and the scores counted from one confusion matrix."""
import json
import logging
from pathlib import Path

import torch
from omegaconf import DictConfig, open_dict

from .. import options
from ..core.errors import ConfigError
from ..core.distributed import World, setup
from ..core.files import write_atomic
from ..data.loaders import make_loaders
from ..loop.checkpoint import Inference, load_trained
from ..loop.validate import confusion, shows_top5
from ..loop.model import trained_model
from ..loop.precision import Precision
from .confusion import draw_confusion
from .tables import markdown_table

log = logging.getLogger(__name__)

SHOWN_CLASSES = 20  # per-class rows printed; evaluation.json has every class


def prepared_as_trained(data: DictConfig, inference: Inference) -> None:
    """The checkpoint's preprocessing, in the data node the loader assembly builds from."""
    held = inference.preprocessing
    with open_dict(data):
        data.mean, data.std = list(held.mean), list(held.std)
        data.crop_size, data.val_resize = held.crop_size, held.resize


def model_classes(data_classes: list[str], inference: Inference, where: str) -> torch.Tensor:
    """For each of the data's classes, the model's output that names it; a class the model never saw is refused."""
    unknown = [name for name in data_classes if name not in inference.classes]
    if unknown:
        raise ConfigError(f"{where} has classes the checkpoint was not trained on: {', '.join(unknown[:5])}"
                          f"{', ...' if len(unknown) > 5 else ''} (it knows {', '.join(inference.classes[:5])}"
                          f"{', ...' if len(inference.classes) > 5 else ''}): evaluate it on data of the same classes")
    return torch.tensor([inference.classes.index(name) for name in data_classes])


def scores(matrix: torch.Tensor, hits5: int, classes: list[str]) -> dict:
    """Top-1, top-5 (with more than 5 classes) and per-class accuracy in percent, from the confusion matrix."""
    images, right = matrix.sum(dim=1), matrix.diag()
    total = max(1, int(images.sum()))
    per_class = {name: {"images": int(count), "top1": 100 * int(hits) / int(count) if count else None}
                 for name, count, hits in zip(classes, images, right)}
    return {"images": int(images.sum()), "top1": 100 * int(right.sum()) / total,
            **({"top5": 100 * hits5 / total} if shows_top5(len(classes)) else {}), "per_class": per_class,
            "confusion": matrix.tolist(), "classes": classes}


def evaluate(cfg: DictConfig, run_dir: Path, world: World | None = None) -> dict:
    """Score `cfg.checkpoint` on the validation split of `cfg.data`; write evaluation.json and confusion.png."""
    options.check(cfg)
    world = world or setup()
    state, inference = load_trained(cfg.checkpoint, torch.device("cpu"))
    model = trained_model(state, inference).to(world.device)
    prepared_as_trained(cfg.data, inference)
    loaders = make_loaders(cfg.data, cfg.format, cfg.staging, cfg.order, cfg.decoder, cfg.prefetcher, cfg.loader,
                           batch_size=cfg.batch_size, seed=0, world=world, memory_format=torch.contiguous_format)
    where = cfg.format.get("path") or cfg.data.get("root") or "the data"  # a packed format's folder, or the tree
    matrix, hits5 = confusion(model, loaders.val, Precision(cfg.precision, world.device), world,
                              model_classes(loaders.classes, inference, where))
    result = {"checkpoint": str(Path(cfg.checkpoint).expanduser().resolve()), **scores(matrix, hits5, inference.classes)}
    if world.is_main:
        write_atomic(run_dir / "evaluation.json", lambda path: path.write_text(json.dumps(result, indent=2)))
        write_atomic(run_dir / "confusion.png", lambda path: draw_confusion(matrix, inference.classes).save(path, "PNG"))
    return result


def report(result: dict, run_dir: Path) -> str:
    """The scores as the console shows them: the totals, then the classes, the least accurate first where there are
    more than SHOWN_CLASSES."""
    rows = sorted(((name, entry) for name, entry in result["per_class"].items() if entry["images"]),
                  key=lambda row: row[1]["top1"]) if len(result["per_class"]) > SHOWN_CLASSES else \
        [(name, entry) for name, entry in result["per_class"].items() if entry["images"]]
    top5 = f", top-5 {result['top5']:.2f}%" if "top5" in result else ""
    shown = "" if len(rows) <= SHOWN_CLASSES else f" ({SHOWN_CLASSES} least accurate of {len(rows)}; all in evaluation.json)"
    table = markdown_table(["class", "images", "top-1"], [[name, str(entry["images"]), f"{entry['top1']:.1f}%"]
                                                          for name, entry in rows[:SHOWN_CLASSES]], right={1, 2})
    return "\n".join([f"{result['images']} images: top-1 {result['top1']:.2f}%{top5}", f"per class{shown}:", *table,
                      f"written: {run_dir / 'evaluation.json'}, {run_dir / 'confusion.png'}"])
