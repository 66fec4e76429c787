"""Mixup and CutMix (`train.mixup_alpha`, `train.cutmix_alpha`): each training batch, on the device, blended with
itself rolled by one image, its labels blended in the same proportions, as torchvision's reference recipe does
(--mixup-alpha 0.2 --cutmix-alpha 1.0) with torchvision.transforms.v2's MixUp and CutMix.

Mixup blends whole images with a weight drawn from Beta(alpha, alpha); CutMix pastes a box of the other image, its
area drawn the same way. With both on, each batch gets one of the two, at even odds. With both 0 the batch and its
integer labels pass unchanged. The draws come from torch's generator, seeded before each batch (loop/draws.py):
each process draws its own, and a resumed run the uninterrupted one's. The training top-1 in the logs still counts
each image's own label, which a mixed image only partly shows.
"""
import torch


class BatchMix:
    def __init__(self, mixup_alpha: float, cutmix_alpha: float, classes: int):
        self.transform = None
        if mixup_alpha > 0 or cutmix_alpha > 0:
            from torchvision.transforms import v2  # here, so that a run without mixing never imports torchvision

            mixes = [mix(alpha=alpha, num_classes=classes)
                     for mix, alpha in ((v2.MixUp, mixup_alpha), (v2.CutMix, cutmix_alpha)) if alpha > 0]
            self.transform = v2.RandomChoice(mixes)

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch to train on and its targets: class indices, or, mixed, a probability per class."""
        return self.transform(images, labels) if self.transform else (images, labels)
