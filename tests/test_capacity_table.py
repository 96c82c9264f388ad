"""docs/capacity.md's table of predicted KV cache sizes and concurrencies is what tools/capacity_table.py prints from
the planner today (regenerate: python tools/capacity_table.py --write)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import testkit

ROOT = Path(__file__).resolve().parents[1]


def load_tool() -> Any:
    module = testkit.load_file("capacity_table", ROOT / "tools" / "capacity_table.py")
    return module


def test_the_doc_table_is_the_planners() -> None:
    tool = load_tool()
    assert tool.in_doc(tool.DOC.read_text()) == tool.table(), "run: python tools/capacity_table.py --write"


def test_every_size_and_variant_has_a_row_and_every_refused_cell_a_reason() -> None:
    tool = load_tool()
    lines = [line for line in tool.table().splitlines() if line.startswith("| d3")]
    assert len(lines) == 10  # 6 sizes; the 27B's 5 variants
    cells = [c.strip() for line in lines for c in line.strip("|").split("|")[4:]]
    assert len(cells) == 40
    for text in cells:
        assert text.startswith("refused") or text.endswith("x"), text
    assert "54,096 / 19.93x" in lines[5]  # the field report's recipe at 8192 (docs/capacity.md, hand computation)
    # the profile batch grows with --max-model-len: fewer KV tokens at 16,384 than at 8,192, for every size that starts
    for line in lines:
        at_8k, at_16k = (c.strip() for c in line.strip("|").split("|")[4:6])
        if at_8k.endswith("x"):
            assert int(at_8k.split(" /")[0].replace(",", "")) > int(at_16k.split(" /")[0].replace(",", "")), line


def test_a_refusal_the_table_cannot_word_is_an_error() -> None:
    tool = load_tool()
    with pytest.raises(ValueError, match="no table wording"):
        tool.cell({"errors": ["host x: something new. Fix: y"], "instances": []})
