"""Validation accuracy, each image counted once however many processes share the validation split."""
import torch

from ..core.distributed import World
from .precision import Precision


def shows_top5(classes: int) -> bool:
    """Whether top-5 says anything: with 5 classes or fewer every image is a top-5 hit."""
    return classes > 5


def accuracy(output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...]) -> torch.Tensor:
    """How many samples have the target among the top k outputs, for each k (a tensor, so no sync)."""
    ranked = output.topk(min(max(topk), output.shape[1]), dim=1).indices
    hits = ranked.eq(target[:, None])
    return torch.stack([hits[:, :k].any(dim=1).sum() for k in topk])


@torch.no_grad()
def score(model: torch.nn.Module, loader, precision: Precision, world: World,
             limit_batches: int | None = None) -> tuple[float, float]:
    """Top-1 and top-5 in percent over `loader` (its first `limit_batches` only, if given), summed over processes."""
    model.eval()
    counts = torch.zeros(3, device=world.device, dtype=torch.long)  # top-1 hits, top-5 hits, images
    for batch_index, (images, labels) in enumerate(loader):
        if batch_index == limit_batches:
            break
        with precision.autocast():
            output = model(images)
        counts[:2] += accuracy(output, labels, topk=(1, 5))
        counts[2] += len(labels)
    hits1, hits5, seen = world.sum(counts).tolist()
    return 100 * hits1 / max(1, seen), 100 * hits5 / max(1, seen)


@torch.no_grad()
def confusion(model: torch.nn.Module, loader, precision: Precision, world: World,
              model_class: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The confusion matrix over `loader` (a row per true class, a column per predicted one, among the model's
    first len(model_class) outputs) and the top-5 hits, summed over processes. `model_class[label]`: the model's
    output for the data's class `label`, since the data may lack some of the classes the model was trained on."""
    model.eval()
    classes = len(model_class)
    model_class = model_class.to(world.device)
    counts = torch.zeros(classes * classes, device=world.device, dtype=torch.long)
    hits5 = torch.zeros(1, device=world.device, dtype=torch.long)
    for images, labels in loader:
        with precision.autocast():
            output = model(images)[:, :classes]  # outputs beyond the checkpoint's classes name none
        target = model_class[labels]
        counts += torch.bincount(target * classes + output.argmax(dim=1), minlength=classes * classes)
        hits5 += accuracy(output, target, topk=(5,))
    return world.sum(counts).view(classes, classes).cpu(), int(world.sum(hits5).item())
