"""The collection's one column-aligned table (plugins/module_utils/d3_table.py), which the status, smoke, fleet
placement and bench filters print."""

from __future__ import annotations

import pytest
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_table import table


def test_columns_are_as_wide_as_their_widest_cell_two_spaces_apart() -> None:
    assert table(("a", "bb", "c"), [("xxx", "y", "z"), ("", "yyyy", "")]) == [
        "a    bb    c",
        "xxx  y     z",
        "     yyyy",
    ]


def test_the_header_alone_when_there_are_no_rows() -> None:
    assert table(("host", "instance"), []) == ["host  instance"]


def test_trailing_blanks_are_stripped_leading_ones_kept() -> None:
    assert table(("x", "long"), [(" a", " ")]) == ["x   long", " a"]


def test_rows_may_be_any_iterable_of_sequences() -> None:
    assert table(["h", "i"], (r for r in [["1", "22"], ["333", "4"]])) == ["h    i", "1    22", "333  4"]


def test_a_cell_wider_than_its_header_widens_only_its_column() -> None:
    assert table(("a", "b"), [("wide", "x")]) == ["a     b", "wide  x"]


@pytest.mark.parametrize("row", [("1",), ("1", "2", "3")])
def test_a_row_with_another_number_of_cells_than_the_header_fails(row: tuple[str, ...]) -> None:
    with pytest.raises((ValueError, IndexError)):
        table(("a", "b"), [row])
