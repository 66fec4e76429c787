"""Markdown tables, as the tools write them into their reports."""


def markdown_table(header: list[str], rows: list[list], right: set[int] = frozenset()) -> list[str]:
    """The lines of a Markdown table; the columns whose index is in `right` are right-aligned (numbers)."""
    rule = "|" + "|".join("---:" if column in right else "---" for column in range(len(header))) + "|"
    return [line(header), rule, *(line(row) for row in rows)]


def line(cells: list) -> str:
    """One row; an empty cell is a single space, as people write them."""
    return "|" + "|".join(f" {cell} " if str(cell) else " " for cell in cells) + "|"
