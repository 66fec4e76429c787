"""What bench shows once its rows are measured: the table and bench.png."""
from pathlib import Path

from .. import options
from ..core.config import optional_import


def read_from(row: dict) -> str:
    """The row's format, with its order and staging where they are not the defaults."""
    order, staging = row.get("order", options.default("order")), row.get("staging", options.default("staging"))
    read = row["format"] if order == options.default("order") else f"{row['format']}/{order}"
    return read if staging == options.default("staging") else f"{read}+{staging}"


def chart(rows: list[dict], path: Path) -> None:
    pyplot = optional_import("matplotlib.pyplot", "bench")
    rows = [row for row in rows if row["images_per_s"]]  # not the decoders this machine could not run
    figure, axes = pyplot.subplots(figsize=(max(6, len(rows) * 0.9), 4))
    labels = [f"{row['decoder']}\n{read_from(row)}\nw={row['num_workers']}" for row in rows]
    colours = {"storage": "tab:orange"}  # the storage probe's reads beside the loaders and references
    axes.bar(labels, [row["images_per_s"] for row in rows],
             color=[colours.get(row["decoder"], "grey" if row.get("reference") else "tab:blue") for row in rows])
    axes.set_ylabel("images/s (loader only)")
    axes.tick_params(axis="x", labelsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def table(rows: list[dict]) -> str:
    def ratio(value, width: int) -> str:
        return f"{value:>{width}.2f}" if isinstance(value, float) else f"{'':>{width}}"

    lines = [f"{'decoder':<15}{'format':<14}{'workers':>8}{'images/s':>10}{'x baseline':>11}{'x ceiling':>10}"
             f"{'x region':>9}{'unreadable':>11}  note"]
    lines += [f"{row['decoder']:<15}{read_from(row):<14}{row['num_workers']:>8}{row['images_per_s']:>10.0f}"
              f"{ratio(row.get('vs_baseline'), 11)}{ratio(row.get('vs_ceiling'), 10)}"
              f"{ratio(row.get('vs_region_ceiling'), 9)}{row['unreadable']!s:>11}  {row['note']}" for row in rows]
    return "\n".join(lines)
