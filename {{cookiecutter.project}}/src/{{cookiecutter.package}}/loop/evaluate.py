"""Validation accuracy, each image counted once however many processes share the validation split."""
import torch

from ..core.distributed import World
from .precision import Precision


def accuracy(output: torch.Tensor, target: torch.Tensor, topk: tuple[int, ...]) -> torch.Tensor:
    """How many samples have the target among the top k outputs, for each k (a tensor, so no sync)."""
    ranked = output.topk(min(max(topk), output.shape[1]), dim=1).indices
    hits = ranked.eq(target[:, None])
    return torch.stack([hits[:, :k].any(dim=1).sum() for k in topk])


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader, precision: Precision, world: World,
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
