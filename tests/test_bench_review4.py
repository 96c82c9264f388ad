"""The statistician's fourth review of the bench (2026-12-04): a build that returns errors is flagged (failed requests
paired per question, exact McNemar); Holm's family keeps only tests that can reject at their step (Tarone's rule); a
request still running at the open loop's join deadline is censored in the latency from the schedule; the permutation
fallback's line says which side is flat."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

# the collection's modules by their package path (also how tools/mutation.py picks these tests for them)
from ansible_collections.d3fleet.fleet.plugins.module_utils import d3_bench_stats as st

# the third review's suite, instances and the loaded tools/bench_compare.py: one place for them
from test_bench_review3 import OK, bc, inst


def test_a_build_that_returns_errors_is_flagged() -> None:
    """Review item 1: the old build answers everything, the new returns HTTP 500 to 6 of 10 cases (health still 200).
    Before: failed requests were only counted; 0 flips, accuracy not tested, nothing CHANGED (with every request 500:
    0 tests). Now the failed/not-failed flag is paired per case (one request; the fifth review: not per question,
    which counted one failed request as three pairs): 0 -> 6 failed requests, exact McNemar p 2 x 2^-6, CHANGED, the
    newly failing cases listed."""
    old = [{"id": f"k{i}", "status": 200, "answers": OK} for i in range(10)]
    new = [{"id": f"k{i}", "status": 500 if i < 6 else 200, "answers": None if i < 6 else OK} for i in range(10)]
    out = bc.compare({"instances": [inst(old)]}, {"instances": [inst(new)]})
    e, a = out["rows"][0]["failures"], out["rows"][0]["accuracy"]
    assert (e["old"], e["new"], e["pairs"], e["no_longer_failed"]) == (0, 6, 10, [])
    assert e["newly_failed"] == [f"k{i}" for i in range(6)]
    assert e["p"] == st.mcnemar_exact(6, 0) and math.isclose(e["p"], 2 * 2**-6) and e["adjusted_p"] == e["p"] and e["changed"] is True
    assert a["untestable"] and a["changed"] is False  # the accuracy pairs still leave the failed questions out
    assert [(fam["figure"], fam["changed"]) for fam in out["family"]] == [("failed requests", True)]
    lines = bc.table(out, {}, {})
    assert any(ln.startswith("  failed requests 0/10 -> 6/10 requests (cases) without an HTTP 200 reply: newly failing 6, "
                             "no longer failing 0; exact McNemar p 0.0313, adjusted 0.0313 CHANGED") for ln in lines)
    assert "    newly failing: k0, k1, k2, k3, k4, k5" in "\n".join(lines)
    # every request 500: the one figure left is tested and flagged
    new = [{"id": f"k{i}", "status": 500, "answers": None} for i in range(10)]
    out = bc.compare({"instances": [inst(old)]}, {"instances": [inst(new)]})
    assert out["tests"] == 1 and math.isclose(out["rows"][0]["failures"]["p"], 2 * 2**-10) and out["rows"][0]["failures"]["changed"]
    # the same failures on both sides: nothing newly fails, the test cannot reject, it is not in the family
    out = bc.compare({"instances": [inst(new)]}, {"instances": [inst(new)]})
    e = out["rows"][0]["failures"]
    assert e["untestable"] and e["changed"] is False and out["tests"] == 0


def family_with_a_flat_closed_loop(latency_instances: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """16.0 x5 -> 8.0 x5 requests/s without windows (the exact permutation test: smallest p 2/252) on instance i0,
    beside 2 unchanged latency figures (Welch on 5 + 5 runs, 2 % apart) per instance."""
    def side(shift: int) -> dict[str, Any]:
        out = []
        for n in range(latency_instances):
            runs = [100.0 * (1 + 0.02 * ((j + shift + n) % 5 - 2)) for j in range(5)]
            out.append({"host": "h", "name": f"i{n}", "model": "m", "health": 200,
                        "latency": {q: {"runs": [{"p50": x} for x in runs]} for q in ("q2", "q4")}, "throughput": []})
        out[0]["throughput"] = [{"concurrency": 16, "runs": [{"requests_per_s": 16.0 if shift == 0 else 8.0}] * 5}]
        return {"instances": out}

    return side(0), side(1)


def test_a_test_that_cannot_reject_at_alpha_over_k_is_not_in_holm_s_family() -> None:
    """Review item 2: the permutation test's smallest p at 5 + 5 runs is 2/252 = 0.0079; beside 8 latency figures
    (m = 9) it was kept (0.0079 <= alpha) and adjusted to 9 x 0.0079 = 0.071: never CHANGED, yet it made every other
    test stricter. Tarone's rule (Biometrics 46 (1990) 515-522): K = 8, 0.0079 > 0.05/8, left out, m = 8. At m <= 6
    (5 latency figures beside it) it stays and is CHANGED. Under BH it stays (it can be flagged at BH's last step)."""
    old, new = family_with_a_flat_closed_loop(4)
    out = bc.compare(old, new, detect=False)
    d = out["rows"][0]["throughput"][16]
    assert d["p"] == d["min_p"] == 2 / math.comb(10, 5) and d["changed"] is False and d["adjusted_p"] is None
    assert d["untestable"] == ("its smallest attainable p (0.00794) is above alpha/8 = 0.00625: it cannot reject in "
                               "this family (Tarone's rule)")
    assert out["tests"] == 8 and all(fam["figure"].startswith("latency") for fam in out["family"])
    line = next(ln for ln in bc.table(out, old, new) if ln.startswith("  closed loop c=16"))
    assert line.endswith("Tarone's rule): not tested, not CHANGED")
    assert bc.attainable_bound([2 / 252] + [0.0] * 6, 0.05, "holm") == (0.05 / 7, 7)  # m = 7: left out too
    # 5 latency figures and it: K = 6, 0.0079 <= 0.05/6: in the family, smallest p, adjusted 6 x 0.0079: CHANGED
    old["instances"][2]["latency"].pop("q4")
    new["instances"][2]["latency"].pop("q4")
    for side in (old, new):
        side["instances"].pop()
    out = bc.compare(old, new, detect=False)
    d = out["rows"][0]["throughput"][16]
    assert out["tests"] == 6 and d["adjusted_p"] == 6 * d["p"] and d["changed"] is True
    # BH: kept whenever its smallest p is <= alpha (BH's last step can flag it)
    old, new = family_with_a_flat_closed_loop(4)
    out = bc.compare(old, new, "bh", detect=False)
    assert out["tests"] == 9 and not out["rows"][0]["throughput"][16].get("untestable")


def test_a_request_unanswered_at_the_join_deadline_is_censored_from_the_schedule(monkeypatch: Any) -> None:
    """Review item 3: a fake client whose requests sent from 0.40 s on (inside the 0.5 s schedule) hang past the
    level's join deadline (schedule + timeout + grace; the grace made short here). Before: counted as errors only,
    neither in `_recs` nor censored: from the schedule n was the answered alone, censored 0, max 5.3 ms. Now each is
    a record `unanswered`, censored at what it waited (at least the schedule's end - its intended time), in n, and
    the tail is a lower bound - in rate_level's figures and in the window's (open_levels)."""
    from ansible_collections.d3fleet.fleet.plugins.modules import bench_load as bl

    release = threading.Event()
    t0 = [0.0]

    class Hangs:
        def __init__(self, url: str, timeout: float, api_key: str | None) -> None:
            pass

        def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, float]:
            if time.perf_counter() - t0[0] >= 0.40:
                release.wait(5.0)
            return 200, b'{"answers": {}}', 5.0

        def close(self) -> None:
            pass

    monkeypatch.setattr(bl, "Client", Hangs)
    monkeypatch.setattr(bl, "JOIN_GRACE_S", 0.05, raising=False)
    rec = bl.Recorder()
    schedule = bl.arrivals(30.0, 0.5, 7)
    t0[0] = time.perf_counter()
    try:
        row = bl.rate_level({"url": "http://t"}, "/p", b"{}", 30.0, 0.5, 0.05, 7, rec)
    finally:
        release.set()
    late = [r for r in row["_recs"] if r.get("unanswered")]
    answered = [r for r in row["_recs"] if r.get("status") == 200]
    assert late and len(late) + len(answered) == len(schedule) and row["errors"] == len(late)
    assert all(r["waited_ms"] >= (0.5 - r["scheduled_s"]) * 1000.0 for r in late)
    fs = row["from_schedule"]
    assert (fs["n"], fs["censored"]) == (len(schedule), len(late)) and "max" in fs["lower_bound"]
    assert fs["max"] == round(max(r["waited_ms"] for r in late), 1) > max(r["ms_from_schedule"] for r in answered)
    # the window's figures (open_levels): the same requests censored there
    for r in row["_recs"]:
        r.pop("window", None)
    w = bl.window_figures(row["_recs"], 1000.05, 1000.5, 4, 300.0, "ms_from_schedule", due=1000.0)
    due_in = sum(at >= 0.05 for at in schedule)
    assert (w["n"], w["censored"]) == (due_in, len(late)) and "max" in w["lower_bound"]
    assert all(r["window"] == "in" for r in late)


def test_the_permutation_line_says_which_side_is_flat() -> None:
    """Review item 4: since the permutation test also runs when one side only is flat, "every run identical on both
    sides" was printed then too; the line now names the side."""
    def level(values: list[float]) -> dict[str, Any]:
        return {"instances": [{"host": "h", "name": "a", "model": "m", "health": 200, "latency": {},
                               "throughput": [{"concurrency": 16, "runs": [{"requests_per_s": x} for x in values]}]}]}

    for old, new, which in (([16.0] * 5, [8.0] * 5, "on both sides"), ([16.0] * 5, [8.0, 8.1, 8.2, 8.0, 8.3], "on the old side"),
                            ([16.0, 16.1, 16.2, 16.0, 16.3], [8.0] * 5, "on the new side")):
        out = bc.compare(level(old), level(new), detect=False)
        line = next(ln for ln in bc.table(out, {}, {}) if ln.startswith("  closed loop c=16"))
        assert f"every run identical {which}: exact permutation test on 5 + 5 runs" in line
