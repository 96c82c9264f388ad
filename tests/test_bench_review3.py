"""The statistician's third review of the bench (their synthetic experiments with known answers, /tmp/review-bench3
e1..e6, q1..q7, as tests): a 200 reply without a usable answer is a flip (only failed requests are left out);
one side with zero spread does not shrink Welch's standard error below the figure's quantization (Sheppard);
zero spread on both sides falls back to the exact permutation test; fast errors are not latency samples; a late
closed-loop record counts in its own level only."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import testkit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.d3fleet.fleet.plugins.filter import d3_bench as f  # noqa: E402
from ansible_collections.d3fleet.fleet.plugins.module_utils import d3_bench_stats as st  # noqa: E402

bc = testkit.load_file("bench_compare", ROOT / "tools/bench_compare.py")

Q = {"type": "noul", "instructions": "x?"}
SUITE = {"questions": {"a": Q, "b": Q, "c": Q},
         "cases": [{"id": f"k{i}", "state": "s", "expect": {"a": True, "b": True, "c": False}} for i in range(10)]}
OK = {"a": {"noul": 0.9}, "b": {"noul": 0.8}, "c": {"noul": 0.1}}


def inst(cases: list[dict[str, Any]]) -> dict[str, Any]:
    return {"host": "h", "name": "n", "model": "m", "health": 200, "score": f.score_cases(cases, SUITE),
            "latency": {}, "throughput": []}


def test_a_build_that_stops_answering_is_flagged() -> None:
    """Review item 1 (e1.py): 4 of 10 cases reply HTTP 200 with null, a string or no answer (12 questions right ->
    no answer). Before: left out like timeouts, 0 flips, not tested. Now: 12 right -> wrong flips, McNemar p 0.0005,
    CHANGED; a request without HTTP 200 is still left out (tests/test_bench_review2.py)."""
    bad = {"a": {"noul": None}, "b": {"noul": "yes"}, "c": {}}
    old = [{"id": f"k{i}", "status": 200, "answers": OK} for i in range(10)]
    new = [{"id": f"k{i}", "status": 200, "answers": bad if i < 4 else OK} for i in range(10)]
    out = bc.compare({"instances": [inst(old)]}, {"instances": [inst(new)]})
    a = out["rows"][0]["accuracy"]
    assert (a["pairs"], len(a["right_to_wrong"]), a["wrong_to_right"]) == (30, 12, [])
    assert a["failed"] == [0, 0] and a["no_answer"] == [0, 12]
    assert a["p"] == st.mcnemar_exact(12, 0) < 0.001 and a["changed"] is True and out["tests"] == 1
    lines = bc.table(out, {}, {})
    assert any("(0 old, 12 new replied without a usable answer: wrong, paired)" in ln for ln in lines)
    # a report from before `failed` was recorded: `given` None cannot be told from a failed request: left out
    legacy = [inst(old), inst(new)]
    for rep in legacy:
        for row in rep["score"]["questions"]:
            del row["failed"]
    a = bc.compare({"instances": [legacy[0]]}, {"instances": [legacy[1]]})["rows"][0]["accuracy"]
    assert a["pairs"] == 18 and a["failed"] == [0, 12] and a["right_to_wrong"] == []
