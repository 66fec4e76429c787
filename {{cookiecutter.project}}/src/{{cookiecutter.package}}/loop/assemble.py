"""Assembling the run: one small function per record `Run` holds (loop/run.py), each refusing what it cannot build.
train.py's `make_run` calls them in the order the run needs them."""
import torch
from omegaconf import DictConfig

from ..contracts import Network, Pretrained
from ..core import distributed, faults
from ..core.config import build
from ..core.distributed import World
from ..core.errors import ConfigError
from ..core.faults import Faults
from ..data.loaders import Loaders, make_loaders
from .average import WeightAverage
from .draws import BatchSeeds
from .freeze import FrozenBackbone
from .mix import BatchMix
from .compile import check_mode, compiled
from .model import make_model
from .precision import Precision
from .run import Limits, Optimization, Weights
from .schedule import LearningRate


def make_limits(train: DictConfig) -> Limits:
    """train.*'s limits; a max_steps or limit_val_batches of 0 sets none."""
    return Limits(log_every=train.log_every, max_steps=train.max_steps if train.max_steps > 0 else None,
                  limit_val_batches=train.limit_val_batches if train.limit_val_batches > 0 else None,
                  clip_grad_norm=train.clip_grad_norm)


def make_data(cfg: DictConfig, world: World, memory_format: torch.memory_format, injected: Faults) -> Loaders:
    """The training and validation loaders; refused where an epoch would hold no full training batch."""
    loaders = make_loaders(cfg.data, cfg.format, cfg.staging, cfg.order, cfg.decoder, cfg.prefetcher, cfg.loader,
                           batch_size=cfg.train.batch_size, seed=cfg.seed, world=world, memory_format=memory_format,
                           faults=injected, augment=cfg.augment)
    if not len(loaders.train):  # an epoch without a batch would never end
        each = len(loaders.splits.train) // world.size
        raise ConfigError(f"train.batch_size={cfg.train.batch_size} is more than the {each} training images each of "
                          f"the {world.size} process(es) gets, so an epoch has no full batch: pass "
                          f"train.batch_size={max(1, each)} or less")
    return loaders


def make_weights(cfg: DictConfig, network: Network, pretrained: Pretrained | None, loaders: Loaders, *,
                 outputs: int, world: World, precision: Precision, memory_format: torch.memory_format,
                 injected: Faults) -> Weights:
    """The model for the loaders' classes with `outputs` outputs, on the device, wrapped and compiled as asked (the
    compile mode refused first where the run's steps cannot use it), with its frozen layers and its weight average."""
    check_mode(cfg.model.compile, cfg.model.compile_mode, cfg.train.accumulate,
               len(loaders.crop_sizes(cfg.train.epochs)))
    model = make_model(network, pretrained, len(loaders.classes)).to(world.device, memory_format=memory_format)
    model = world.wrap(model, cfg.distributed.sync_bn, partly_frozen=cfg.train.freeze_epochs > 0)
    # After wrapping, whose sync_bn replaces every BatchNorm layer: the frozen ones must be the layers that run.
    freeze = FrozenBackbone(distributed.unwrap(model), cfg.train.freeze_epochs, outputs, network.name,
                            pretrained is not None)
    side = loaders.train_crop_size
    model = compiled(model, cfg.model.compile, (cfg.train.batch_size, 3, side, side), precision, memory_format,
                     cfg.model.compile_mode, val_side=cfg.data.crop_size)
    average = WeightAverage(model, cfg.train.ema_decay)  # before the injected host delay, which it would copy
    faults.slow_host(model, injected.host_delay_ms)
    return Weights(model=model, freeze=freeze, average=average)


def make_optimization(cfg: DictConfig, model: torch.nn.Module, *, outputs: int, images: int,
                      world: World) -> Optimization:
    """The step's parts for `model` with `outputs` outputs, over an epoch of `images` training images."""
    optimizer = build(cfg.optim, model=model)
    # The run's length shapes the schedule; train.max_steps, where this command stops, does not.
    learning_rate = LearningRate(optimizer, build(cfg.schedule, epochs=cfg.train.epochs), images)
    return Optimization(seeds=BatchSeeds(cfg.seed, world.rank, world.size, cfg.train.batch_size),
                        mix=BatchMix(cfg.train.mixup_alpha, cfg.train.cutmix_alpha, outputs),
                        criterion=torch.nn.CrossEntropyLoss(label_smoothing=cfg.train.label_smoothing),
                        accumulation=build(cfg.reduction, batches=cfg.train.accumulate, world=world),
                        optimizer=optimizer,
                        learning_rate=learning_rate)
