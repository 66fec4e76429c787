"""train.mixup_alpha and train.cutmix_alpha: each batch blended with itself rolled by one image, its labels in the
same proportions."""
import pytest
import torch

from {{ cookiecutter.package }}.loop.draws import BatchSeeds
from {{ cookiecutter.package }}.loop.mix import BatchMix


def batch(classes: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.rand(8, 3, 16, 16), torch.arange(8) % classes


@pytest.mark.parametrize("mixup, cutmix", [(0.2, 0.0), (0.0, 1.0), (0.2, 1.0)], ids=["mixup", "cutmix", "both"])
def test_mixed_labels_sum_to_one_and_blend_the_image_with_its_neighbour(mixup, cutmix):
    images, labels = batch()
    mix = BatchMix(mixup, cutmix, classes=5)
    for _ in range(5):
        mixed, targets = mix(images, labels)
        assert targets.shape == (8, 5) and torch.allclose(targets.sum(dim=1), torch.ones(8))
        own = targets[torch.arange(8), labels]  # each image's share of itself, the rest its neighbour's
        neighbour = labels.roll(1)
        assert torch.allclose(own + targets[torch.arange(8), neighbour], torch.ones(8))
        # Every pixel is the image's own, the neighbour's, or (mixup) the blend of the two in the labels' shares.
        blend = own[:, None, None, None] * images + (1 - own[:, None, None, None]) * images.roll(1, dims=0)
        pasted = (mixed == images) | (mixed == images.roll(1, dims=0))
        assert torch.allclose(mixed, blend, atol=1e-6) or (pasted.all() and torch.allclose(
            (mixed == images).float().mean(dim=(1, 2, 3)), own, atol=1e-6))


def test_without_alphas_the_batch_and_its_class_indices_pass_unchanged():
    images, labels = batch()
    mixed, targets = BatchMix(0.0, 0.0, classes=5)(images, labels)
    assert mixed is images and targets is labels


def test_a_model_with_more_outputs_than_classes_gets_targets_for_all_of_them():
    images, labels = batch(classes=3)
    _, targets = BatchMix(0.2, 0.0, classes=10)(images, labels)
    assert targets.shape == (8, 10) and not targets[:, 3:].any()


def test_each_micro_batch_draws_its_own_mix_on_any_number_of_processes_and_again_when_resumed():
    """Seeded per micro-batch of the epoch's order (seed, epoch, micro-batch): two ranks mix the same step
    differently; the micro-batch that rank 1 of two trains, one process alone trains as the second batch of the same
    step (a global batch of two), and mixes it the same; a resumed run, seeding the same batch again, mixes as the
    uninterrupted run did."""
    images, labels = batch()
    mix = BatchMix(0.2, 1.0, classes=5)

    def mixed(rank: int, images_in_epoch: int, batch_in_step: int = 0, processes: int = 2,
              epoch: int = 0) -> torch.Tensor:
        BatchSeeds(seed=0, rank=rank, processes=processes, batch_size=8).before(epoch, images_in_epoch, batch_in_step)
        return mix(images, labels)[1]

    assert not torch.equal(mixed(0, 80), mixed(1, 80))
    assert torch.equal(mixed(1, 80), mixed(0, 80, batch_in_step=1, processes=1))  # micro-batch 11 of the epoch
    assert not torch.equal(mixed(0, 80), mixed(0, 96)) and not torch.equal(mixed(0, 80), mixed(0, 80, 1))
    assert not torch.equal(mixed(0, 80), mixed(0, 80, epoch=1))
    assert torch.equal(mixed(0, 80), mixed(0, 80)) and torch.equal(mixed(1, 112), mixed(1, 112))
