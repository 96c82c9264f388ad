"""docs/bench.md's "Recomputing the report" script, run on a recorded lab run (tests/data/bench/: tests/lab/test_bench.py
on the lab, 2026-12-01, SIMULATED; the JSONL's accuracy lines - the load lines left out - and the report without its
per-question rows): it finds the report's n, accuracy, Wilson intervals and the three calibration scores from the
JSONL alone."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests/data/bench"


def doc_script() -> types.ModuleType:
    """The one ```python block of docs/bench.md that defines recompute(), as a module."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs/bench.md").read_text(), re.S)
    (code,) = [b for b in blocks if "def recompute(" in b]
    module = types.ModuleType("bench_recompute")
    exec(compile(code, "docs/bench.md", "exec"), module.__dict__)  # the project's own docs
    return module


def test_the_docs_script_recomputes_the_recorded_report() -> None:
    report = json.loads((DATA / "report.json").read_text())
    again = doc_script().recompute(DATA / "report.jsonl")
    assert set(again) == {f"{i['host']}/{i['name']}" for i in report["instances"]}
    for inst in report["instances"]:
        mine, s = again[f"{inst['host']}/{inst['name']}"], inst["score"]
        assert (mine["correct"], mine["n"]) == (s["correct"], s["total"])
        assert mine["interval"] == pytest.approx(s["interval"], abs=1e-4)
        for kind in ("choice", "noul", "score"):
            assert mine[kind] == pytest.approx(s["calibration"][kind]["value"], abs=1e-4), (inst["name"], kind)


def test_the_docs_script_counts_a_failed_request_as_wrong(tmp_path: Path) -> None:
    line = {"host": "h", "instance": "i", "phase": "accuracy", "status": 500, "answers": None, "case": "c",
            "expect": {"team": {"type": "choice", "expected": "billing"}, "tone": {"type": "score", "expected": "calm",
                                                                                   "levels": ["calm", "furious"]}}}
    ok = {**line, "status": 200, "case": "d", "answers": {
        "team": {"choice": "billing", "probabilities": {"billing": 0.75, "shipping": 0.25}},
        "tone": {"score": 0.5, "probabilities": {"0": 0.5, "1": 0.5}}}}
    raw = tmp_path / "r.jsonl"
    raw.write_text(json.dumps(line) + "\n" + json.dumps(ok) + "\n" + json.dumps({"phase": "open"}) + "\n")
    got = doc_script().recompute(raw)["h/i"]
    # 4 questions, 1 right (team; tone 0.5 gives the higher level, furious); Brier 2 x 0.25^2; RPS 0.5^2
    assert (got["correct"], got["n"], got["choice"], got["noul"], got["score"]) == (1, 4, 0.125, None, 0.25)
    assert got["interval"] == pytest.approx((0.0456, 0.6994), abs=1e-4)
