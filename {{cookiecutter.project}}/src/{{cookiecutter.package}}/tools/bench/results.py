"""bench.csv: its columns, and the writer that keeps it whole on disk while bench runs."""
import csv
from pathlib import Path

import torch

from ...core.files import write_atomic
from .ceilings import shares

COLUMNS = ("decoder", "format", "order", "staging", "workers", "num_workers", "images_per_s", "vs_baseline",
           "vs_ceiling", "vs_region_ceiling", "unreadable", "staging_s", "page_cache", "read_mb_s", "sequential_mb_s",
           "first_batch_s", "limit", "note")


class BenchCsv:
    """bench.csv, written whole again each time rows finish, under a temporary name and then renamed, so that a
    failure leaves every row measured before it and never a half-written file. The loader rows and references come
    with their shares of the references' passes timed so far, the storage probe's rows after them."""

    def __init__(self, path: Path, cache: str, device: torch.device):
        self.path, self.cache, self.device = path, cache, device
        self.measured: list[dict] = []  # the references keep their Ceiling until the rows are given (shares)
        self.probed: list[dict] = []

    def loader_rows(self) -> list[dict]:
        """The loaders' rows and the references, each with its shares of the references."""
        return [{**row, "note": "; ".join(filter(None, [row["note"], f"on {self.device.type}"]))}
                for row in shares(self.measured, self.cache)]

    def rows(self) -> list[dict]:
        return self.loader_rows() + self.probed

    def add(self, rows: list[dict], probed: bool = False) -> None:
        (self.probed if probed else self.measured).extend(rows)
        self.save()

    def save(self) -> None:
        def write(temporary: Path) -> None:
            with temporary.open("w", newline="") as file:
                writer = csv.DictWriter(file, COLUMNS, extrasaction="ignore")
                writer.writeheader()
                writer.writerows({column: round(value, 2) if isinstance(value, float) else value
                                  for column, value in row.items()} for row in self.rows())
        write_atomic(self.path, write)
