"""Which process holds the others back. DDP's all-reduce evens out the step times, so only each rank's own
data wait and host share show a straggler: a rank whose loader reads from a slower disk waits for data, the
others wait for it inside the all-reduce, which counts as their compute."""
from collections.abc import Sequence
from dataclasses import dataclass

from ..loop.clock import Window
from .advice import Suggestion

STANDS_OUT = 0.10  # a rank's share this far above every other rank's (and above their own spread) is its own


@dataclass(frozen=True)
class RankTimes:
    rank: int
    host: str
    window: Window

    def record(self) -> dict:
        total = self.window
        return {"rank": self.rank, "host": self.host, "data_frac": total.data_frac, "host_frac": total.host_frac,
                "compute_frac": total.compute_s / total.wall_s if total.wall_s > 0 else 0.0,
                "images_per_s": total.images_per_s}


def spread(windows: list[Window]) -> dict[str, float]:
    """TensorBoard scalars of one logging window across the ranks: the extremes of each idle share, and the rank
    that idled most."""
    data = [window.data_frac for window in windows]
    host = [window.host_frac for window in windows]
    idle = [data_frac + host_frac for data_frac, host_frac in zip(data, host)]
    return {"ranks/data_frac_max": max(data), "ranks/data_frac_min": min(data), "ranks/host_frac_max": max(host),
            "ranks/host_frac_min": min(host), "ranks/slowest": float(idle.index(max(idle)))}


@dataclass(frozen=True)
class Straggler:
    times: RankTimes
    side: str  # data | host
    others: tuple[float, ...]  # the share of that side on each other rank

    def share(self) -> float:
        return getattr(self.times.window, f"{self.side}_frac")

    def verdict(self) -> str:
        what = "waited for data" if self.side == "data" else "left its GPU idle with the batch ready"
        low, high = (f"{100 * share:.0f}" for share in (min(self.others), max(self.others)))
        return (f"Rank {self.times.rank} on host {self.times.host} holds the others back: it {what} "
                f"{100 * self.share():.0f}% of the time; the other{'s' if len(self.others) > 1 else ''} "
                f"{low if low == high else f'{low}-{high}'}%.")

    def suggestion(self) -> Suggestion:
        host, fact = self.times.host, self.verdict().split(": ", 1)[1].rstrip(".")
        if self.side == "data":
            return Suggestion(key="data.root", value=None, side="data", fact=fact, tunable=False,
                              why=f"Look at host {host}'s disk and data path: a slower mount, a cold cache or another "
                              "job reading it. The switches act on every rank alike, and the others do not wait for "
                              "data")
        return Suggestion(key="distributed", value=None, side="host", fact=fact, tunable=False,
                          why=f"Look at host {host}'s cores: another job on them, or fewer cores than its GPUs need. "
                          "The switches act on every rank alike, and the others are not held up by their host")


def straggler(ranks: Sequence[RankTimes]) -> Straggler | None:
    """The rank whose data or host share stands out above every other rank's, by `STANDS_OUT` and by more than the
    others differ among themselves; None when no rank does (or there is one process)."""
    found = []
    for side in ("data", "host"):
        shares = sorted(((getattr(times.window, f"{side}_frac"), times) for times in ranks), key=lambda s: s[0])
        if len(shares) < 2:
            return None
        (top, times), others = shares[-1], [share for share, _ in shares[:-1]]
        gap = top - others[-1]
        if gap >= max(STANDS_OUT, others[-1] - others[0]):
            found.append((gap, Straggler(times, side, tuple(others))))
    return max(found, key=lambda pair: pair[0])[1] if found else None
