"""Train an image classifier; every speed technique is a config group picked on the command line.

    python -m {{ cookiecutter.package }}.train                                   # built-in synthetic JPEGs
    python -m {{ cookiecutter.package }}.train data=folder data.root=/data/imagenet model.name=resnet50

Each run ends with summary.json and a printed report: where the time went and what to flip next.
"""
import logging
import math
import random
import sys
import time
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record
from tqdm import tqdm

from . import options
from .contracts import Axis
from .core import distributed, failures, faults
from .core import record as run_record
from .core.config import build, chosen_keys
from .core.distributed import World
from .core.forensics import Forensics
from .core.hardware import probe
from .data.coverage import Coverage
from .data.sources import fit_preprocessing
from .diagnosis.ranks import spread
from .diagnosis.report import format_report, summarize
from .diagnosis.summary import Summary
from .diagnosis.sysmon import SystemMonitor
from .loop import cudnn
from .loop.accumulate import batches_per_step
from .loop.accuracy import time_to_accuracy
from .loop.assemble import make_data, make_limits, make_optimization, make_weights
from .loop.checkpoint import Checkpoints, Inference, check_fits, resume_state
from .loop.clock import make_clock
from .loop.validate import score, shows_top5
from .loop.logger import NullLogger
from .loop.meter import TrainMeter
from .loop.model import load_weights
from .loop.precision import make_precision
from .loop.preempt import Preempted, StopRequest
from .loop.profiler import NoProfiler
from .loop.run import Run, keep_progress

log = logging.getLogger(__name__)


def make_run(cfg: DictConfig, run_dir: Path, world: World, forensics: Forensics, began: float | None = None) -> Run:
    """Build data, model and helpers; everything that can refuse the config does so before any file is written."""
    device, injected = world.device, faults.on_rank(cfg.faults, world.rank)
    # Set here once, so that every part reading train.accumulate (the compile check, the step, the report) agrees.
    cfg.train.accumulate = batches_per_step(cfg.train, world.size)
    accuracy = time_to_accuracy(cfg.train.top1_levels, began)  # its levels checked before anything is built
    memory_format = torch.channels_last if cfg.model.channels_last else torch.contiguous_format
    network = build(cfg.model)
    pretrained = load_weights(network)  # before the data: its preprocessing is the weights' own, unless set
    preprocessing = fit_preprocessing(cfg.data, pretrained and pretrained.preprocessing, chosen_keys(cfg, "data"))
    loaders = make_data(cfg, world, memory_format, injected)
    hardware = probe(device)
    precision = make_precision(cfg.precision, device, hardware)
    classes = len(loaders.classes)
    outputs = network.num_classes or classes
    weights = make_weights(cfg, network, pretrained, loaders, outputs=outputs, world=world,
                           precision=precision, memory_format=memory_format, injected=injected)
    optimization = make_optimization(cfg, weights.model, outputs=outputs, images=len(loaders.splits.train),
                                     world=world)
    resume_from, state = resume_state(cfg.resume, run_dir, world)
    identity = {"model": cfg.model.name, "classes": classes}
    if state:
        check_fits(state, distributed.unwrap(weights.model), resume_from, identity)
    writes = world.is_main  # the other ranks get objects that write nothing
    checkpoints = Checkpoints(run_dir, writes, identity, Inference(  # what using the model needs beside its weights
        classes=loaders.classes, preprocessing=preprocessing, model=OmegaConf.to_container(cfg.model, resolve=True)))
    run = Run(weights=weights, optimization=optimization, precision=precision, loaders=loaders,
              limits=make_limits(cfg.train), clock=make_clock(device, cfg.train.host_split), meter=TrainMeter(device),
              sysmon=SystemMonitor(device, loaders.splits.train.times, injected.nvml_fails_after, loaders.upload_times),
              logger=build(cfg.logger, run_dir=run_dir) if writes else NullLogger(),
              profiler=build(cfg.profiler, run_dir=run_dir) if writes else NoProfiler(),
              checkpoints=checkpoints, stop=StopRequest(), forensics=forensics, world=world, hardware=hardware,
              coverage=Coverage(len(loaders.splits.train)), accuracy=accuracy)
    if state:
        run.checkpoints.restore(run.parts(), state)
        log.info("resumed from %s at epoch %d, step %d (%d images of the epoch trained)", resume_from,
                 run.progress.epoch, run.progress.step, run.progress.images_in_epoch)
    log.info("%s on %s (%d process%s): %d classes, %d train / %d val images, %d steps per epoch per process",
             cfg.model.name, device, world.size, "es" if world.size > 1 else "", classes,
             len(loaders.splits.train), len(loaders.splits.val), math.ceil(len(loaders.train) / cfg.train.accumulate))
    return run


def end_window(run: Run, bar: tqdm) -> None:
    """Close a logging window: one device sync, then scalars to the logger and the progress bar."""
    window, system = run.clock.lap(), run.sysmon.sample()
    run.precision.check()
    if window.steps:
        run.windows.append((window, system))
        run.logger.scalars({
            **run.meter.lap(window), "train/lr": run.optimization.optimizer.param_groups[0]["lr"],
            "train/skipped_steps": run.precision.skipped.item(), **window.scalars(), **system}, run.progress.step)
        bar.set_postfix_str(f"{window.images_per_s:.0f} img/s, data {100 * window.data_frac:.0f}%, "
                            f"host {100 * window.host_frac:.0f}%")
    ranks, stop_anywhere = run.share_window(window)  # every rank, every window: they stop together or not at all
    if run.world.size > 1 and all(split.steps for split in ranks):
        run.logger.scalars(spread(ranks), run.progress.step)
    run.loaders.share_unreadable(run.world)
    run.stop.check(stop_anywhere)


def step(run: Run, loss: torch.Tensor) -> None:
    """The optimizer step, from the gradients of the batches since the last one (`loss`: the last batch's), and the
    counts. A checkpoint is consistent before `run.updating` is set and after it is cleared, never in between; images
    whose gradients a failure loses before their step are not counted trained, so a resumed run trains them again."""
    accumulation, optimizer = run.optimization.accumulation, run.optimization.optimizer
    images = accumulation.finish(optimizer)  # a short last group: the mean of its batches
    run.precision.clip(optimizer, run.limits.clip_grad_norm)  # on the real gradients: fp16's are unscaled first
    run.optimization.learning_rate.set(run.progress.epoch, run.progress.images_in_epoch)  # where this step starts
    run.updating = True
    with run.precision.stepping(loss, optimizer, run.progress.step) as scaler:  # then the scale's update
        scaler.step(optimizer)  # under fp16, a step whose gradients overflowed is skipped
    optimizer.zero_grad(set_to_none=True)
    run.weights.average.update()
    run.progress.step += 1
    run.progress.images_in_epoch += images * run.world.size
    run.updating = False


def train_one_epoch(run: Run, epoch: int) -> bool:
    """Train from where the epoch stands until the loader or train.max_steps runs out; True if it ended."""
    model, accumulation = run.weights.model, run.optimization.accumulation
    model.train()
    run.weights.freeze.set_epoch(epoch)
    run.loaders.train.set_epoch(epoch, skip_images=run.progress.images_in_epoch)
    batches_left = len(run.loaders.train)
    run.meter.start_epoch()
    run.clock.start()
    bar = tqdm(run.forensics.watch(run.clock.timed(run.loaders.train)), total=batches_left, desc=f"epoch {epoch}",
               mininterval=2, dynamic_ncols=True, disable=not run.world.is_main)
    for images, labels in bar:
        run.optimization.seeds.before(run.progress.epoch, run.progress.images_in_epoch, accumulation.pending)
        inputs, targets = run.optimization.mix(images, labels)
        with accumulation.syncing(model):  # DDP all-reduces on the last batch of a step only
            with run.precision.autocast():
                output = model(inputs)
                loss = run.optimization.criterion(output, targets)
            run.precision.backward(accumulation.add(loss, len(labels)))  # the batch's share of the step's loss
        stepped = accumulation.due
        if stepped:
            step(run, loss)
        run.profiler.step()
        run.meter.add(output, labels, loss)
        batches_left -= 1
        if stepped and run.progress.step % run.limits.log_every == 0:
            end_window(run, bar)
        if run.out_of_steps:
            break
    else:
        batches_left = 0  # the loader ran out, whatever its len said (a restriped stream may count the whole epoch)
        if accumulation.pending:  # the epoch's last, shorter group of train.accumulate
            step(run, loss)
    end_window(run, bar)
    bar.close()
    return batches_left == 0


def validate(run: Run) -> tuple[float, float | None]:
    """Validation top-1 and top-5, logged with the chance level and the epoch's training top-1; top-5 is None with 5
    classes or fewer."""
    top1, top5 = score(run.weights.average.model, run.forensics.watch(run.loaders.val), run.precision, run.world,
                          run.limits.limit_val_batches)
    classes = len(run.loaders.classes)
    top5 = top5 if shows_top5(classes) else None
    run.logger.scalars({"val/top1": top1, **({"val/top5": top5} if top5 is not None else {})}, run.progress.step)
    seconds = run.accuracy.add(top1, run.progress.epoch)  # since the run's start: runs compare by time to accuracy
    run.logger.scalars({"val/top1_by_second": top1}, run.progress.step, Axis(tag="time/elapsed_s", value=seconds))
    trained = run.meter.epoch_top1(run.world)
    log.info("epoch %d step %d: val top-1 %.2f%% (chance %.2f%%)%s%s", run.progress.epoch, run.progress.step, top1,
             100 / classes,
             f", top-5 {top5:.2f}%" if top5 is not None else "",
             f"; train top-1 {trained:.2f}% on the epoch's batches" if trained is not None else "")
    return top1, top5


def run_epochs(run: Run, epochs: int) -> tuple[float, float | None]:
    """Train and validate epoch by epoch, a checkpoint after each; the last validation's top-1 and top-5."""
    scores = None
    with run.profiler:
        while run.progress.epoch < epochs and not run.out_of_steps:
            if train_one_epoch(run, run.progress.epoch):
                run.check_coverage()
                run.progress.epoch, run.progress.images_in_epoch = run.progress.epoch + 1, 0
            scores = validate(run)
            run.checkpoints.save(run.parts(), top1=scores[0])
            run.forensics.progress()
    return scores or validate(run)  # a resumed run that had nothing left still reports its accuracy


def train(cfg: DictConfig, run_dir: Path, world: World, forensics: Forensics) -> Summary | None:
    """Train as `cfg` says; the finished run's summary, or None where a stop request ended it, its checkpoint saved."""
    if run_record.restored_note:
        log.info(run_record.restored_note)
    options.check(cfg)
    cudnn.configure(cfg.cudnn)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    failures.worker_deaths_surface_in_next()
    began = time.perf_counter()
    distributed.check_shared(run_dir, world)  # before a node resumes from, or writes, a folder the others cannot see
    run = make_run(cfg, run_dir, world, forensics, began)
    run_record.keep_resume()  # once the run is built: a value refused while building it must not come back
    run.setup = {"total_s": time.perf_counter() - began, **run.loaders.setup}  # data, workers=auto, model, compile
    run.logger.scalars({"time/setup_s": run.setup["total_s"]}, run.progress.step)
    outcome = "failed"  # until the epochs end, or a stop request ends them with the checkpoint saved
    try:
        with forensics.watching(run.stop):
            top1, top5 = run_epochs(run, cfg.train.epochs)
        outcome = "finished"
    except Preempted as stop:
        run.checkpoints.save(run.parts())
        outcome = "stopped"
        log.info("stopped by %s at step %d (epoch %d, %d images into it); checkpoint saved: continue with %s", stop,
                 run.progress.step, run.progress.epoch, run.progress.images_in_epoch,
                 run_record.resume_command(run_dir))
    except BaseException as err:
        keep_progress(run, err)
        raise
    finally:  # every way out: the sampler thread and the TensorBoard writer end here, the tracker's run marked so
        run.clock.close()
        run.logger.close(outcome)
    if outcome == "stopped":
        run.stop.hand_on()  # the launcher's own handler for the signal, where it had one: submitit's requeues the job
        return None
    summary = summarize(run, cfg, top1, top5, HydraConfig.get())
    if world.is_main:
        summary.write(run_dir / "summary.json")
        log.info("%s\nthis report is kept in %s, its figures in %s", format_report(summary), run_dir / "train.log",
                 run_dir / "summary.json")
    return summary


@hydra.main(version_base="1.3", config_path=str(options.CONF), config_name="train")
@record  # inside hydra.main, which would otherwise swallow the exception: torchrun's summary gets the traceback
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    forensics = Forensics(run_dir, cfg.distributed.stall_min, cfg.distributed.stall_exit)
    failures.one_line(lambda: train(cfg, run_dir, distributed.setup(cfg.distributed.timeout_min, run_dir), forensics),
                      finish=distributed.teardown, record=forensics.record)


if __name__ == "__main__":
    # Launchers such as submitit pickle the task function; one from "__main__" would be pickled by value with
    # everything it reaches (torch included, which cannot be), one from the package by its importable name.
    from {{ cookiecutter.package }}.core import record as run_record
    from {{ cookiecutter.package }}.train import main as importable_main

    if refused := run_record.another_run(sys.argv):  # before Hydra writes over that run's record
        sys.exit(f"error: {refused}")
    sys.argv, run_record.restored_note = run_record.restored(sys.argv)  # resume=auto: the run's own overrides first
    importable_main()
