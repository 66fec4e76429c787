"""The training loss and top-1 of each logging window, summed on the device as the steps go and read at the window's
end, after the clock's device sync: no step waits for them."""
import torch

from ..core.distributed import World
from .clock import Window


class TrainMeter:
    """`add` each step's output, labels and loss; `lap` at each window's end. The windows add up to the epoch's
    top-1, as pytorch/examples' AverageMeter keeps it."""

    def __init__(self, device: torch.device):
        self.loss_sum = torch.zeros((), device=device)
        self.hits = torch.zeros((), device=device, dtype=torch.long)
        self.epoch_hits = self.epoch_images = 0

    def start_epoch(self) -> None:
        self.epoch_hits = self.epoch_images = 0

    def add(self, output: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor) -> None:
        self.loss_sum += loss.detach().nan_to_num(0.0, 0.0, 0.0)  # an fp16 step the scaler skipped adds nothing
        self.hits += (output.detach().argmax(dim=1) == labels).sum()

    def lap(self, window: Window) -> dict[str, float]:
        """The window's mean loss and top-1 in percent (of its `window.images`); the sums start again."""
        loss_sum, hits = self.loss_sum.item(), int(self.hits.item())
        self.loss_sum.zero_()
        self.hits.zero_()
        self.epoch_hits, self.epoch_images = self.epoch_hits + hits, self.epoch_images + window.images
        return {"train/loss": loss_sum / window.steps, "train/top1": 100 * hits / max(1, window.images)}

    def epoch_top1(self, world: World) -> float | None:
        """Top-1 in percent over the batches every process trained since `start_epoch` (a collective); None before
        the first window."""
        counts = torch.tensor([self.epoch_hits, self.epoch_images], dtype=torch.float64, device=world.device)
        hits, images = world.sum(counts).tolist()
        return 100 * hits / images if images else None
