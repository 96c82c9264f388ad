"""The column-aligned text table the status, smoke, fleet placement and bench filters print (one definition for
all four). Standard library only."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """One line per row, the header first: each cell left-aligned to its column's widest cell, columns two spaces
    apart, trailing blanks stripped. A row with more or fewer cells than the header fails (ValueError, IndexError)."""
    lines = [tuple(header), *(tuple(r) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines]
