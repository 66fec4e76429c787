"""bench's baseline row: pytorch/examples imagenet's training loader, torchvision's ImageFolder and Pillow, as its
users run it."""
import multiprocessing
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from ...data.decoder import DECODE_ERRORS
from ...data.images import REPLACEMENTS, WrongDataSet
from .timing import time_epochs


class SkippingImageFolder:
    """torchvision's ImageFolder under the skip policy training has: an unreadable image is counted once and the
    next one takes its place (pytorch/examples itself would stop at the first)."""

    def __init__(self, root: Path, transform):
        from torchvision import datasets

        self.folder = datasets.ImageFolder(str(root), transform)
        self.bad = multiprocessing.RawArray("b", len(self.folder))  # seen from every worker

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, index: int):
        for position in (index + offset for offset in range(REPLACEMENTS)):
            position %= len(self.folder)
            try:
                return self.folder[position]
            except DECODE_ERRORS:
                self.bad[position] = 1
        raise WrongDataSet(f"{REPLACEMENTS} images in a row from {self.folder.samples[index][0]} on are unreadable: "
                           "is this the data set you meant?")


def baseline(root: Path, size: int, batch_size: int, num_workers: int, epochs: int,
             device: torch.device) -> tuple[float, int]:
    """pytorch/examples imagenet's training loader, as its users run it: images/s, and the unreadable images met."""
    from torchvision import transforms

    recipe = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                                 transforms.ToTensor(),
                                 transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])
    dataset = SkippingImageFolder(root / "train", recipe)
    timed = time_epochs(DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                                   num_workers=num_workers, persistent_workers=num_workers > 0), epochs,
                        lambda batches: ((images.to(device, non_blocking=True), labels) for images, labels in batches),
                        device)
    return timed.rate, sum(dataset.bad)
