"""Loaders as the tests build them: on the CPU, in this process unless asked for workers."""
from {{ cookiecutter.package }}.core.distributed import ALONE, World
from {{ cookiecutter.package }}.data.loaders import make_loader


def loader(dataset, batch_size: int, train: bool, world: World = ALONE, seed: int = 0, num_workers: int = 0,
           collate=None):
    """make_loader with the CPU settings every test here shares."""
    return make_loader(dataset, batch_size, train, seed, world, num_workers=num_workers, prefetch_factor=2,
                       pin_memory=False, persistent_workers=False, collate=collate)
