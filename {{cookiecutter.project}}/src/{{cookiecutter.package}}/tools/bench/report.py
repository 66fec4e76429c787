"""What bench shows once its rows are measured: the table, the closing line naming the best loader here, and
bench.png."""
from pathlib import Path

from ... import options
from ...core.charts import pyplot_for


def read_from(row: dict) -> str:
    """The row's format, with its order and staging where they are not the defaults."""
    order, staging = row.get("order", options.default("order")), row.get("staging", options.default("staging"))
    read = row["format"] if order == options.default("order") else f"{row['format']}/{order}"
    return read if staging == options.default("staging") else f"{read}+{staging}"


def ran(row: dict) -> bool:
    """Whether the row was measured: one this machine cannot run has no rate, and its note says why."""
    return row["images_per_s"] is not None


def table(rows: list[dict]) -> str:
    def ratio(value, width: int) -> str:
        return f"{value:>{width}.2f}" if isinstance(value, float) else f"{'':>{width}}"

    def figures(row: dict) -> str:
        if not ran(row):
            return f"  {row['note']}"
        return (f"{row['images_per_s']:>10.0f}{ratio(row.get('vs_baseline'), 11)}{ratio(row.get('vs_ceiling'), 10)}"
                f"{ratio(row.get('vs_region_ceiling'), 9)}{row['unreadable']!s:>11}  {row['note']}")

    lines = [f"{'decoder':<15}{'format':<14}{'workers':>8}{'images/s':>10}{'x baseline':>11}{'x ceiling':>10}"
             f"{'x region':>9}{'unreadable':>11}  note"]
    lines += [f"{row['decoder']:<15}{read_from(row):<14}{row['num_workers']:>8}{figures(row)}" for row in rows]
    return "\n".join(lines)


def best_line(rows: list[dict], data_overrides: list[str]) -> str:
    """The closing line: the fastest loader row measured, beside the baseline of its worker count, and the command
    that trains with it. `data_overrides`: the data set's own, as bench was given them."""
    measured = [row for row in rows if ran(row) and not row.get("reference")]
    if not measured:
        return "best here: none, no loader row ran on this machine (each row's note says why)"
    best = max(measured, key=lambda row: row["images_per_s"])
    baseline = next(row for row in rows if row["decoder"] == "baseline" and row["workers"] == best["workers"])
    workers = f"{best['num_workers']} worker{'' if best['num_workers'] == 1 else 's'}"
    command = " ".join([f"python -m {options.PACKAGE}.train", *data_overrides, *best["train_with"]])
    return (f"best here: decoder={best['decoder']} on {read_from(best)}, {workers}: {best['images_per_s']:.0f} "
            f"images/s, x{best['vs_baseline']:.2f} the pytorch/examples baseline's {baseline['images_per_s']:.0f} "
            f"(loader only, no model); train with it: {command}")


def chart(loader_rows: list[dict], storage_rows: list[dict], path: Path) -> None:
    """The loaders (blue) and references (grey) in images/s; the storage probe's reads per second, often ten times
    more, in a panel of their own, so that they do not flatten the loaders' bars."""
    if (pyplot := pyplot_for(path)) is None:
        return
    measured = [row for row in loader_rows if ran(row)]
    panels = [(measured, "images/s (loader only)", ["grey" if row.get("reference") else "tab:blue" for row in measured]),
              (storage_rows, "random reads/s (storage probe)", ["tab:orange"] * len(storage_rows))]
    panels = [panel for panel in panels if panel[0]]
    figure, axes = pyplot.subplots(1, len(panels), squeeze=False, width_ratios=[len(rows) for rows, *_ in panels],
                                   figsize=(max(6, sum(len(rows) for rows, *_ in panels) * 0.9), 4))
    for axis, (rows, unit, colours) in zip(axes[0], panels):
        axis.bar([f"{row['decoder']}\n{read_from(row)}\nw={row['num_workers']}" for row in rows],
                 [row["images_per_s"] for row in rows], color=colours)
        axis.set_ylabel(unit)
        axis.tick_params(axis="x", labelsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
