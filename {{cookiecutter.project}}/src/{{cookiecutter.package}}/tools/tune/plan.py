"""What tune tries, in which order: the verdict's suggestions, then the neighbours tune measures on its own, side
by side of the step (data, host, compute), the sides by what they can gain. Also decoding once, offline: the
pack it offers a data-bound run reading JPEGs from a folder."""
import functools
import os
import time
from pathlib import Path

import psutil
from omegaconf import DictConfig

from ... import options
from ...core.config import build
from ...core.errors import ClearError
from ...core.files import bytes_in
from ...core.hardware import Hardware
from ...data.crops import TrainCrop
from ...data.format import META
from ...data.format.folder import open_tree
from ...diagnosis.summary import Summary
from ...diagnosis.verdict import SIDES, faster_precision
from ..pack import Convert, pack, pack_path, tree_key
from ..trials import Ranks

SAMPLE = 16  # images converted to time a pack before building it


class PackOffer:
    """Decoding once, offline: the data set in the format that holds pixels, at the side the crops need (TrainCrop), in
    tune.pack_dir. Tried when that pack exists; built only when allowed and it fits in the budget."""

    def __init__(self, root: Path, crop_size: int, pack_dir: str, on_error: str):
        self.root, self.side, self.on_error = root, TrainCrop(crop_size).full_detail_side(), on_error
        self.format = options.only("format", "holds_pixels")
        self.path = pack_path(Path(pack_dir).expanduser(), tree_key(root), self.format, self.side)
        self.change = {"format": self.format, "decoder": options.only("decoder", "takes_pixels"),
                       "format.path": str(self.path)}
        self.command = (f"python -m {options.PACKAGE}.pack data.root={root} format={self.format} "
                        f"pack.short_side={self.side} pack.out={self.path}")

    @property
    def ready(self) -> bool:
        return (self.path / META).is_file()

    def build(self, seconds: float) -> str | None:
        """Write the pack if it can be done in `seconds`; why not, or None once it is there."""
        train, val, _ = open_tree(self.root)
        convert, began = Convert(True, self.side, 90), time.monotonic()
        for path in train.paths[:SAMPLE]:
            convert(path)
        workers = os.cpu_count() or 1
        needed = (len(train) + len(val)) * (time.monotonic() - began) / min(SAMPLE, len(train)) / workers
        if needed > seconds:
            return f"building its pack would take about {needed:.0f} s, more than the {seconds:.0f} s left: {self.command}"
        try:
            pack(self.root, self.format, self.path, self.side, 90, workers, False, self.on_error)
        except ClearError as err:
            return f"its pack could not be built: {err}"
        return None


def pack_offer(cfg: DictConfig, summary: Summary, ranks: Ranks) -> PackOffer | None:
    """The pack to decode once, for a data-bound run that decodes JPEGs from a folder on one node."""
    if summary.bound != "data" or options.facts("format", summary.choices["format"]).packed:
        return None
    single_node = int(os.environ.get("LOCAL_WORLD_SIZE", ranks.size)) == ranks.size  # a pack on node 0 only
    source = build(cfg.data)
    if source.root is None or not single_node:
        return None
    return PackOffer(source.root, source.train_crop_size, cfg.tune.pack_dir, source.on_error)


def sweep(key: str, values, current: str | None = None) -> list[dict[str, str]]:
    return [{key: str(value)} for value in dict.fromkeys(values) if str(value) != str(current)]


Group = list[dict[str, str]]  # candidate changes trialled one after another before the best is reconsidered


def neighbours(summary: Summary, cfg: DictConfig, hardware: Hardware, offer: PackOffer | None) -> dict[str, list[Group]]:
    """By the side of the step they shorten, the switches worth measuring beyond those the verdict names;
    only those this hardware can profit from."""
    choices, cores = summary.choices, hardware.cores
    current = {group: options.facts(group, option) for group, option in choices.items()
              if (options.CONF / group / f"{option}.yaml").is_file()}
    data: list[Group] = []
    if offer is not None and (offer.ready or cfg.tune.allow_pack):
        data.append([offer.change])
    # Workers waiting on reads are nearly free: up to twice the cores.
    data.append(sweep("loader.num_workers", [1, 2, cores, 2 * cores], cfg.loader.num_workers))
    if not current["format"].holds_pixels:
        data.append(sweep("decoder", [name for name in options.options("decoder")
                                      if not (facts := options.facts("decoder", name)).takes_pixels
                                      and (hardware.on_gpu or not facts.gpu) and not facts.missing()
                                      and facts.passed(hardware.device)],
                          choices["decoder"]))
    data += [[{"loader.persistent_workers": "true"}], [{"loader.prefetch_factor": "4"}],
             sweep("prefetcher", [name for name in options.options("prefetcher")
                                  if not (facts := options.facts("prefetcher", name)).ceiling
                                  and (hardware.on_gpu or not facts.gpu) and facts.passed(hardware.device)],
                   choices["prefetcher"])]
    if not current["format"].packed and not current["staging"].copies_to_ram and fits_in_ram(cfg):
        data += [[{"staging": option}] for option in options.having("staging", "copies_to_ram")
                 if options.facts("staging", option).passed(hardware.device)]
    compute: list[Group] = []
    faster = faster_precision(hardware)
    if faster != "fp32":
        compute.append([{"precision": faster}])
    compute.append([{"model.channels_last": "true"}])  # measured, where the hardware facts do not settle it
    if hardware.on_gpu:  # on a CPU, compiling takes much of a short budget and seldom pays back within a trial
        compute += [[{"model.compile": "true"}], [{"cudnn": "benchmark"}],
                    *([{"prefetcher": option}] for option in options.having("prefetcher", "overlaps_copy"))]
    return {"data": data, "host": [], "compute": compute}


def moves(summary: Summary, cfg: DictConfig, offer: PackOffer | None) -> tuple[list[Group], list[tuple[dict, str]]]:
    """Groups of candidate changes in the order they can gain, and the changes left out, each with why.

    Removing a side's share s of the step gains at most 1 / (1 - s): the data loading's cost on a data-bound
    run (the wait, and on a CPU the cores its workers take), the compute share on a compute-bound one. The bound's side comes first, then the others by what they can
    gain; a side that cannot gain tune.min_gain is left out. Within a side, the switches the verdict names
    (the run's suggestions) come before the neighbours tune measures on its own. The verdict's withheld
    switches, which this hardware would run slower, are never tried.
    """
    hardware = Hardware.from_record(summary.hardware)
    advised: dict[str, list[Group]] = {side: [] for side in SIDES}
    for suggestion in summary.suggestions:
        if suggestion["tunable"] and suggestion["value"] is not None:
            advised[suggestion["side"]].append([{suggestion["key"]: suggestion["value"], **suggestion["also"]}])
    found = neighbours(summary, cfg, hardware, offer)
    shares = {"data": summary.data_cost, "host": summary.host_frac}
    shares["compute"] = max(0.0, 1 - shares["data"] - shares["host"])
    gains = {side: 1 / max(1e-9, 1 - share) for side, share in shares.items()}
    order = [summary.bound, *sorted((side for side in SIDES if side != summary.bound), key=gains.get,
                                        reverse=True)]
    groups, left_out = [], [({held["key"]: held["value"]}, f"{held['why']} ({held['fact']})")
                            for held in summary.withheld]
    withheld = {(held["key"], held["value"]) for held in summary.withheld}  # never tried, whoever names them
    for side in order:
        candidates = [kept for group in advised[side] + found[side]
                      if (kept := [change for change in group if not withheld & set(change.items())])]
        if side != summary.bound and gains[side] - 1 < cfg.tune.min_gain:
            left_out += [(change, f"{side}-side: removing all of the {side} share ({100 * shares[side]:.0f}%) gains "
                                  f"at most x{gains[side]:.2f}, less than tune.min_gain") for group in candidates
                         for change in group]
            continue
        groups += candidates
    return groups, left_out


def fits_in_ram(cfg: DictConfig) -> bool:
    try:
        root = build(cfg.data).root
    except ClearError:
        return False
    return root is not None and ram_would_hold(root)


@functools.cache  # moves() asks again at each new best: one walk of a large tree is enough
def ram_would_hold(root: Path) -> bool:
    return 0 < bytes_in(root) < psutil.virtual_memory().available / 4
