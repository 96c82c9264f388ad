"""tools/bench_compare.py: two bench reports into one table and a plot of the differences, a difference flagged only
when its interval excludes 0 (accuracy: Newcombe's hybrid score interval; latency: the two sample ranges)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import testkit

ROOT = Path(__file__).resolve().parent.parent
bc = testkit.load_file("bench_compare", ROOT / "tools/bench_compare.py")


def inst(name: str, correct: int, q4: list[float], health: int = 200, image: str = "img@sha256:1") -> dict[str, Any]:
    lat = {"samples_ms": q4, "n": len(q4), "p50": sorted(q4)[len(q4) // 2]}
    return {"host": "h", "name": name, "model": "m-" + name, "health": health, "record": {"image_ref": image},
            "score": {"correct": correct, "total": 26, "calibration": {"choice": {"value": 0.3}, "noul": {"value": 0.1}}},
            "latency": {"q2": {}, "q4": lat}, "throughput": [{"concurrency": 4, "requests_per_s": 10.0}]}


def report(*instances: dict[str, Any], generated: str = "t") -> dict[str, Any]:
    return {"generated": generated, "simulated": True, "instances": list(instances)}


def test_newcombe_interval_of_a_difference() -> None:
    # Newcombe 1998, table II example (method 10): 56/70 - 48/80 = 0.2, interval 0.0524 to 0.3339
    d = bc.accuracy_diff({"correct": 48, "total": 80}, {"correct": 56, "total": 70})
    assert d["diff"] == pytest.approx(0.2) and d["interval"] == pytest.approx([0.0524, 0.3339], abs=1e-4)
    assert d["changed"] is True
    same = bc.accuracy_diff({"correct": 17, "total": 26}, {"correct": 15, "total": 26})
    assert same["changed"] is False and same["interval"][0] < 0 < same["interval"][1]


def test_mann_whitney_counts_and_the_shift_interval() -> None:
    assert bc.u_counts(2, 2) == [1, 1, 2, 1, 1] and sum(bc.u_counts(4, 4)) == 70 and sum(bc.u_counts(6, 5)) == 462
    assert bc.u_counts(3, 1) == [1, 1, 1, 1] and bc.u_counts(0, 3) == [1]
    # 4 a side, all new above all old: the interval is the range of the differences (k = 1), p = 2/70
    shift, interval, p = bc.shift_interval([100, 110, 104, 106], [150, 160, 151, 158])
    assert (shift, interval, p) == (50.0, [40, 60], pytest.approx(2 / 70))
    # 6 a side with one overlap (an outlier in the old run): still an interval above 0 (k = 6), p = 2 x 2/924
    shift, interval, p = bc.shift_interval([13.4, 13.6, 15.9, 18.2, 13.5, 14.0], [17.0, 20.1, 21.0, 20.5, 22.3, 27.3])
    assert interval[0] > 0 and p == pytest.approx(4 / 924) and shift == pytest.approx(6.65) and interval == pytest.approx([3.0, 9.1])
    # 3 a side: too few for a 95 % interval
    assert bc.shift_interval([1, 2, 3], [10, 11, 12])[1] is None


def test_latency_flagged_only_when_the_interval_excludes_0() -> None:
    old, new = [100, 110, 104, 106], [150, 160, 151, 158]
    slower = bc.latency_diff({"samples_ms": old, "n": 4, "p50": 105}, {"samples_ms": new, "n": 4, "p50": 155})
    assert slower == {"old": 105, "new": 155, "diff": 50.0, "interval": [40, 60], "p": 0.0286, "changed": True, "n": [4, 4]}
    faster = bc.latency_diff({"samples_ms": new, "n": 4, "p50": 155}, {"samples_ms": old, "n": 4, "p50": 105})
    assert faster["changed"] is True and faster["interval"] == [-60, -40]
    few = bc.latency_diff({"samples_ms": [100, 110], "n": 2, "p50": 105}, {"samples_ms": [150, 160], "n": 2, "p50": 155})
    assert few["interval"] is None and few["changed"] is False and few["p"] == 0.3333
    same = bc.latency_diff({"samples_ms": [100, 140, 120, 121], "n": 4, "p50": 120},
                           {"samples_ms": [130, 150, 119, 122], "n": 4, "p50": 126})
    assert same["changed"] is False and same["interval"][0] < 0 < same["interval"][1]
    assert bc.latency_diff({}, {"samples_ms": [1.0]}) is None
    assert "too few samples for an interval" in bc._flag(few, "{:.0f}")


def test_compare_table_and_plot(tmp_path: Path) -> None:
    old = report(inst("a", 17, [100.0, 102.0, 101.0, 103.0]), inst("gone", 1, [1.0]), generated="monday")
    new = report(inst("a", 16, [150.0, 152.0, 151.0, 149.0], image="img@sha256:2"), inst("down", 1, [1.0], health=503),
                 generated="tuesday")
    rows = bc.compare(old, new)
    assert [r["instance"] for r in rows] == ["h/a"]  # only what both runs benched
    (row,) = rows
    assert row["accuracy"]["changed"] is False and row["latency"]["q4"]["changed"] is True
    assert row["image"] == ("img@sha256:1", "img@sha256:2") and row["throughput"] == {4: (10.0, 10.0)}
    lines = bc.table(rows, old, new)
    assert lines[0].startswith("bench-compare [SIMULATED]: monday -> tuesday")
    assert any(ln.startswith("  q4 p50 ms") and ln.endswith("CHANGED") for ln in lines)
    assert any(ln.startswith("  accuracy") and "CHANGED" not in ln for ln in lines)
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    assert bc.main([str(tmp_path / "old.json"), str(tmp_path / "new.json"), "--plot", str(tmp_path / "d.png"),
                    "--json", str(tmp_path / "d.json")]) == 0
    assert (tmp_path / "d.png").read_bytes()[:4] == b"\x89PNG" and json.loads((tmp_path / "d.json").read_text())[0]["instance"] == "h/a"
