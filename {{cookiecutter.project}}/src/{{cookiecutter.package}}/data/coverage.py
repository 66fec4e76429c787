"""The proof that an epoch trained every image once: each process folds the indices of the batches it trained on
into a small digest, the digests travel in the logging window's gather, and at the epoch's end they must add up to
the whole data set's, with the images the epoch leaves out (the tail no process's whole batch reaches) and those
trained before a resume.

A `Digest` is a count and two sums of hashed indices. Each is order-independent and additive, so the digests of
every process's batches add up to the digest of what they trained together, and an image missed or trained twice
changes both sums (a change that leaves both as they were happens by chance about once in 2**96). The sums are
kept below 2**48, so that the window's float64 gather carries them exactly.

What all processes trained of an epoch before a stop is what their records said at the last window, and for the
steps after it, if a failure ended the run between windows, what the agreed order gives them: the checkpoint
carries that digest, and the resumed run's check adds it in. So a resumed epoch is checked against what was
trained, not against what the resumed run assumes was.
"""
import math
from dataclasses import astuple, dataclass, field

import numpy as np

from ..core.errors import ClearError

MASK = 2**48 - 1
SALTS = (0x9E3779B97F4A7C15, 0xD1B54A32D192ED03)


def hashed(indices: np.ndarray, salt: int) -> np.ndarray:
    """SplitMix64's finaliser of each index XOR `salt`: every bit of the index moves every bit of the result."""
    mixed = indices.astype(np.uint64) ^ np.uint64(salt)
    mixed = (mixed ^ (mixed >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    mixed = (mixed ^ (mixed >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return mixed ^ (mixed >> np.uint64(31))


@dataclass(frozen=True)
class Digest:
    count: int = 0
    first: int = 0
    second: int = 0

    @classmethod
    def of(cls, indices) -> "Digest":
        indices = np.asarray(indices, dtype=np.int64)
        return cls(len(indices), *(int(hashed(indices, salt).sum(dtype=np.uint64)) & MASK for salt in SALTS))

    def __add__(self, other: "Digest") -> "Digest":
        return Digest(self.count + other.count, (self.first + other.first) & MASK, (self.second + other.second) & MASK)


@dataclass(frozen=True, kw_only=True)
class EpochRecord:
    """One process's record of the epoch it is in, as the window's gather carries it."""
    epoch: int
    workers: int  # the process's loader workers, for the line that reports a mismatch
    trained: Digest
    left_out: Digest  # on rank 0, the tail no process's whole batch reaches

    WIDTH = 8  # numbers in a row

    def row(self) -> list[float]:
        return [self.epoch, self.workers, *map(float, astuple(self.trained) + astuple(self.left_out))]

    @classmethod
    def from_row(cls, row: list[float]) -> "EpochRecord | None":
        """The record a row holds, or None for a process whose loader keeps no record (`NO_RECORD`)."""
        if math.isnan(row[0]):
            return None
        values = [int(value) for value in row]
        return cls(epoch=values[0], workers=values[1], trained=Digest(*values[2:5]), left_out=Digest(*values[5:8]))


NO_RECORD = [math.nan] * EpochRecord.WIDTH


class EpochTrace:
    """What one process's loader handed over of one epoch, batch by batch, beside what its plan (sampling.EpochPlan)
    leaves out. A prefetcher runs ahead of the step, so a record is asked for the batches the step has trained."""

    def __init__(self, plan, workers: int):
        self.plan, self.workers = plan, workers
        self.taken, self.digests = [], [Digest()]  # digests[k]: of the first k batches
        self.left_out = Digest.of(plan.left_out())

    def took(self, indices: np.ndarray) -> None:
        self.taken.append(indices)
        self.digests.append(self.digests[-1] + Digest.of(indices))

    def trained(self, images_in_epoch: int) -> int:
        """Batches of this process among the `images_in_epoch` all processes trained on (resumed ones included)."""
        return (images_in_epoch - self.plan.skip) // (self.plan.processes * self.plan.batch_size)

    def record(self, images_in_epoch: int) -> EpochRecord:
        return EpochRecord(epoch=self.plan.epoch, workers=self.workers,
                           trained=self.digests[self.trained(images_in_epoch)], left_out=self.left_out)

    def counts(self, size: int) -> np.ndarray:
        """How many times this process counts each image of the data set at its epoch's end: trained or left out, and
        on rank 0 skipped as trained before the resume."""
        counted = [*self.taken, self.plan.left_out(), *([self.plan.before()] if self.plan.rank == 0 else [])]
        return np.bincount(np.concatenate(counted).astype(np.int64), minlength=size).astype(np.int32)


class CoverageMismatch(ClearError):
    """The processes' records of an epoch do not add up to every image once."""


@dataclass
class Coverage:
    """A run's check of each epoch, and what its processes have trained of the epoch they are in."""
    size: int  # images in the training set
    epochs: list[dict] = field(default_factory=list)  # one entry per epoch checked, for summary.json
    before: Digest | None = None  # trained of this epoch before the run resumed it; None: from the order (see check)
    shared: tuple[int, Digest] = (0, Digest())  # images of this epoch trained through the last window, and their digest

    def __post_init__(self):
        self.whole = Digest.of(np.arange(self.size))

    def window(self, records: list["EpochRecord | None"], images_in_epoch: int) -> None:
        """At each window's gather: what all processes have trained of this epoch so far."""
        if all(records):
            trained = sum((record.trained for record in records), self.before or Digest())
            self.shared = images_in_epoch, trained

    def check(self, records: list[EpochRecord | None], trace: EpochTrace | None, counts) -> dict:
        """The epoch's entry, once the records of its last window (every process's, in rank order) add up to the
        whole data set; else raise, with the images missed and doubled that `counts()` (every process's
        `EpochTrace.counts`, summed across processes: a collective every process makes) finds."""
        if trace is None or not all(records):  # a loader of the format's own keeps no record
            return self.ended({"epoch": len(self.epochs), "checked": False})
        before = self.before if self.before is not None else Digest.of(trace.plan.before())  # an older checkpoint's
        entry = {"epoch": trace.plan.epoch, "checked": True, "images": self.size,
                 "trained": sum(record.trained.count for record in records),
                 "left_out": sum(record.left_out.count for record in records), "trained_before_resume": before.count,
                 "processes": len(records), "workers": [record.workers for record in records]}
        total = sum((record.trained + record.left_out for record in records), before)
        if total != self.whole or len({record.epoch for record in records}) > 1:
            self.refuse(entry, counts())
        return self.ended(entry)

    def ended(self, entry: dict) -> dict:
        self.epochs.append(entry)
        self.before, self.shared = Digest(), (0, Digest())
        return entry

    def refuse(self, entry: dict, counts: np.ndarray) -> None:
        missed, doubled = int((counts == 0).sum()), int((counts > 1).sum())
        what = (f"of {self.size} images, {missed} were missed and {doubled} read more than once" if missed or doubled
                else "the images trained before the resume are not those the resumed order left out")
        raise CoverageMismatch(
            f"epoch {entry['epoch']} did not train every image once: {what} ({entry['trained']} trained by "
            f"{entry['processes']} process{'es' if entry['processes'] > 1 else ''} with "
            f"{', '.join(map(str, entry['workers']))} loader workers by rank, {entry['left_out']} left out, "
            f"{entry['trained_before_resume']} trained before the resume): the processes' shares of the epoch overlap; "
            "order=random draws the same order whatever the workers, and train.log holds the run's settings for a "
            "bug report")

    def state_dict(self, images_in_epoch: int, trace: EpochTrace | None) -> dict:
        """The checks so far, and what all processes trained of this epoch: through the last window from their
        records, and after it (a failure between windows) from the order they agreed on, where it is known."""
        images, trained = self.shared
        if images_in_epoch > images and trace is not None:
            trained += Digest.of(trace.plan.drawn.indices[images:images_in_epoch])
        known = images_in_epoch == images or trace is not None
        return {"epochs": self.epochs, **({"trained": list(astuple(trained))} if known else {})}

    def load_state_dict(self, state: dict) -> None:
        self.epochs = list(state.get("epochs", []))
        self.before = Digest(*state["trained"]) if "trained" in state else None
        self.shared = (self.before or Digest()).count, self.before or Digest()
