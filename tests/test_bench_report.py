"""Unit tests of the bench's controller side (collection filters d3_bench.py, module_utils d3_bench_stats.py): the
suite checks, the requests, the scoring (accuracy, Brier, confidence), percentiles, the report and the table."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.d3fleet.fleet.plugins.filter import d3_bench as b  # noqa: E402
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_bench_stats import percentile, summary  # noqa: E402

SUITE_FILE = ROOT / "roles/d3_bench/files/suites/support-tickets.yml"
DEFAULTS = yaml.safe_load((ROOT / "roles/d3_bench/defaults/main.yml").read_text())

TEAM = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "money", "shipping": "parcels"}}
URGENT = {"type": "noul", "instructions": "Urgent?"}
TONE = {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "furious"]}
REFUND = {"type": "noul", "instructions": "Refund?"}
SUITE: dict[str, Any] = {
    "format": "d3-bench-suite/1",
    "name": "mini",
    "questions": {"team": TEAM, "urgent": URGENT, "tone": TONE, "refund": REFUND},
    "cases": [
        {"id": "a", "state": "charged twice", "expect": {"team": "billing", "urgent": True, "tone": "annoyed"}},
        {"id": "b", "state": {"ticket": "late parcel"}, "instructions": "Be strict.",
         "questions": {"late": {"type": "noul", "instructions": "Is it late?"}}, "expect": {"late": True, "team": "shipping"}},
    ],
    "latency": {"state": "x", "questions": ["team", "urgent", "tone", "refund"]},
}


def choice(opt: str, probs: dict[str, float]) -> dict[str, Any]:
    return {"type": "choice", "choice": opt, "probabilities": probs, "confidence": probs[opt] * 0.98}


def noul(p: float) -> dict[str, Any]:
    return {"type": "noul", "noul": p, "probabilities": {"yes": p, "no": 1 - p}}


def score(s: float, probs: list[float]) -> dict[str, Any]:
    return {"type": "score", "score": s, "legend": {"0": "calm", "1": "annoyed", "2": "furious"},
            "probabilities": {str(i): p for i, p in enumerate(probs)}}


# --------------------------------------------------------------------------------------------- percentiles
def test_percentile_is_linear_interpolation_like_numpy() -> None:
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert percentile([10.0, 20.0], 50) == 15.0
    assert percentile([3.0, 1.0, 2.0], 0) == 1.0 and percentile([3.0, 1.0, 2.0], 100) == 3.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match=r"^percentile 101 is not within 0-100$"):
        percentile([1.0], 101)


def test_percentile_matches_numpy_on_a_skewed_sample() -> None:
    numpy = pytest.importorskip("numpy")
    sample = [12.0, 13.5, 11.0, 250.0, 14.2, 12.9, 13.1, 90.0, 12.2, 12.4, 13.3]
    for q in (50, 95, 99):
        assert percentile(sample, q) == pytest.approx(float(numpy.percentile(sample, q)))


def test_summary_is_ordered_and_rounded() -> None:
    s = summary([5.04, 1.0, 3.0, 100.0])
    assert s["n"] == 4 and s["min"] == 1.0 and s["max"] == 100.0 and s["mean"] == 27.3
    assert s["min"] <= s["p50"] <= s["p95"] <= s["p99"] <= s["max"]
    assert summary([]) == {"n": 0, "mean": None, "min": None, "p50": None, "p95": None, "p99": None, "max": None,
                           "interval": {"p50": None, "p95": None, "p99": None}, "unsupported": ["p50", "p95", "p99"]}
    # 0..100: each percentile is its own rank, so p50, p95 and p99 are those percentiles, not neighbours; their
    # order-statistic intervals (scipy.stats.quantile_test's ranks for n = 101: 41-61, 91-101); p99 needs 368
    assert summary([float(v) for v in range(101)]) == {"n": 101, "mean": 50.0, "min": 0.0, "p50": 50.0, "p95": 95.0,
                                                      "p99": 99.0, "max": 100.0,
                                                      "interval": {"p50": [40.0, 60.0], "p95": [90.0, 100.0], "p99": None},
                                                      "unsupported": ["p99"]}


def test_filter_plugin_exports() -> None:
    # score_cases is d3_bench_report's scoring and the percentile is bench_load's (module_utils): neither is a filter
    assert b.FilterModule().filters() == {"d3_bench_requests": b.bench_requests, "d3_bench_targets": b.bench_targets,
                                          "d3_bench_report": b.bench_report, "d3_bench_records": b.bench_records,
                                          "d3_bench_table": b.bench_table}


# --------------------------------------------------------------------------------------------- the suite
def test_shipped_suite_is_valid_and_gives_q2_and_q4_requests() -> None:
    suite = yaml.safe_load(SUITE_FILE.read_text())
    assert b.suite_problems(suite) == []
    reqs = b.bench_requests(suite)
    assert len(reqs["cases"]) == len(suite["cases"]) >= 8
    assert any("trick" in (c.get("tags") or []) for c in suite["cases"])
    types = {q["type"] for c in reqs["cases"] for q in c["body"]["questions"].values()}
    assert types == {"choice", "noul", "score"}
    assert [(r["label"], len(r["body"]["questions"])) for r in reqs["latency_requests"]] == [("q2", 2), ("q4", 4)]


def test_requests_ask_exactly_the_expected_questions_in_order() -> None:
    reqs = b.bench_requests(SUITE)
    assert reqs["cases"][0] == {"id": "a", "body": {"state": "charged twice", "questions": {"team": TEAM, "urgent": URGENT, "tone": TONE}}}
    second = reqs["cases"][1]["body"]
    assert list(second["questions"]) == ["late", "team"] and second["instructions"] == "Be strict."
    assert list(reqs["latency_requests"][0]["body"]["questions"]) == ["team", "urgent"]


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (lambda s: s.update(format="v0"), "format is 'v0'"),
        (lambda s: s["cases"][0]["expect"].update(team="sales"), "expects 'sales', not one of the options"),
        (lambda s: s["cases"][0]["expect"].update(urgent="yes"), "a noul expects true or false"),
        (lambda s: s["cases"][0]["expect"].update(tone="livid"), "expects 'livid', not one of the levels"),
        (lambda s: s["cases"][0]["expect"].update(nope=True), "question 'nope' is defined neither"),
        (lambda s: s["cases"].append(copy.deepcopy(s["cases"][0])), "case 'a' appears twice"),
        (lambda s: s["cases"][0].update(state=""), "state must be a non-empty"),
        (lambda s: s["latency"].update(questions=["team", "urgent"]), "latency.questions must list four"),
        (lambda s: s["questions"].update(bad={"type": "rank", "instructions": "x"}), "type 'rank' is not one of"),
        (lambda s: s["questions"]["tone"].update(criteria=["one"]), "a score needs criteria"),
        (lambda s: s.update(cases=[]), "cases must be a non-empty list"),
    ],
)
def test_invalid_suites_are_refused_naming_the_problem(patch: Any, message: str) -> None:
    suite = copy.deepcopy(SUITE)
    patch(suite)
    with pytest.raises(AnsibleFilterError, match="the decision suite cannot be run: .*" + message.replace("(", r"\(")):
        b.bench_requests(suite)


def test_targets_from_the_plan() -> None:
    plan = [{"name": "d3-27b", "port": 8000, "served_model_name": "big", "health_url": "http://10.0.0.5:8000/health"}]
    assert b.bench_targets(plan) == [{"name": "d3-27b", "url": "http://10.0.0.5:8000", "model": "big"}]
    assert b.bench_targets(plan, "127.0.0.1") == [{"name": "d3-27b", "url": "http://127.0.0.1:8000", "model": "big"}]
    assert b.bench_targets(plan, "::1")[0]["url"] == "http://[::1]:8000"


# --------------------------------------------------------------------------------------------- scoring
def test_judge_choice_noul_and_score() -> None:
    # choice: the multi-class Brier over both options, (0.8 - 1)^2 + 0.2^2
    assert b.judge(TEAM, "billing", choice("billing", {"billing": 0.8, "shipping": 0.2})) == {
        "given": "billing", "correct": True, "confidence": 0.8, "api_confidence": 0.784, "proper": pytest.approx(0.08)}
    wrong = b.judge(TEAM, "shipping", choice("billing", {"billing": 0.8, "shipping": 0.2}))
    assert wrong["correct"] is False and wrong["proper"] == pytest.approx(0.8**2 + 0.8**2)
    assert b.judge(URGENT, True, noul(0.5)) == {"given": True, "correct": True, "confidence": 0.5, "api_confidence": None,
                                                "proper": 0.25}
    assert b.judge(URGENT, False, noul(0.3)) == {"given": False, "correct": True, "confidence": pytest.approx(0.7),
                                                 "api_confidence": None, "proper": pytest.approx(0.09)}
    assert b.judge(URGENT, True, noul(0.49))["correct"] is False
    # one rule for the level given (the nearest to the score, a tie to the higher): correctness and confidence agree
    for s, given, right in ((0.5, "annoyed", True), (1.49, "annoyed", True), (1.5, "furious", False), (0.49, "calm", False)):
        verdict = b.judge(TONE, "annoyed", score(s, [0.2, 0.5, 0.3]))
        assert (verdict["given"], verdict["correct"]) == (given, right), s
        assert verdict["confidence"] == {"calm": 0.2, "annoyed": 0.5, "furious": 0.3}[given]
    # the case: {0.45, 0.1, 0.45} has the expected value 1: given "annoyed", right, with confidence 0.1
    spread = b.judge(TONE, "annoyed", score(1.0, [0.45, 0.1, 0.45]))
    assert (spread["given"], spread["correct"], spread["confidence"]) == ("annoyed", True, 0.1)
    # RPS: cumulative (0.45, 0.55) against (0, 1): (0.45^2 + 0.45^2) / 2
    assert spread["proper"] == pytest.approx(0.2025)
    verdict = b.judge(TONE, "furious", score(1.6, [0.1, 0.2, 0.7]))
    assert verdict["given"] == "furious" and verdict["confidence"] == 0.7 and verdict["correct"] is True


def test_judge_malformed_answers_are_wrong_without_confidence() -> None:
    for q, want, ans in ((TEAM, "billing", None), (TEAM, "billing", {"type": "choice"}), (URGENT, True, {"noul": "yes"}),
                         (TONE, "calm", {"score": float("nan")}), (URGENT, True, {"noul": True})):
        assert b.judge(q, want, ans) == {"given": None, "correct": False, "confidence": None, "api_confidence": None,
                                         "proper": None}


def recorded(a_answers: dict[str, Any] | None, b_answers: dict[str, Any] | None, b_status: int = 200) -> list[dict[str, Any]]:
    return [{"id": "a", "status": 200, "answers": a_answers}, {"id": "b", "status": b_status, "answers": b_answers}]


def test_score_cases_accuracy_intervals_and_calibration() -> None:
    cases = recorded(
        {"team": choice("billing", {"billing": 0.9, "shipping": 0.1}), "urgent": noul(0.2), "tone": score(1.2, [0.1, 0.6, 0.3])},
        {"late": noul(0.8), "team": choice("billing", {"billing": 0.6, "shipping": 0.4})},
    )
    s = b.score_cases(cases, SUITE)
    # right: team (0.9), tone (0.6), late (0.8); wrong: urgent (conf 0.8), team in b (0.6)
    assert (s["correct"], s["total"], s["accuracy"]) == (3, 5, 0.6)
    assert s["interval"] == [0.2307, 0.8824]  # Wilson 95 % of 3/5
    assert s["by_type"] == {"choice": {"correct": 1, "total": 2, "accuracy": 0.5, "interval": [0.0945, 0.9055]},
                            "noul": {"correct": 1, "total": 2, "accuracy": 0.5, "interval": [0.0945, 0.9055]},
                            "score": {"correct": 1, "total": 1, "accuracy": 1.0, "interval": [0.2065, 1.0]}}
    assert s["by_tag"] == {}  # no case carries a tag
    # choice: multi-class Brier (0.1^2 + 0.1^2) and (0.6^2 + 0.6^2); noul: (0.2 - 1)^2 and (0.8 - 1)^2; score: RPS
    assert s["calibration"] == {"choice": {"rule": "brier", "value": pytest.approx((0.02 + 0.72) / 2, abs=1e-4), "n": 2},
                                "noul": {"rule": "brier", "value": pytest.approx((0.64 + 0.04) / 2, abs=1e-4), "n": 2},
                                "score": {"rule": "rps", "value": pytest.approx((0.1**2 + 0.3**2) / 2, abs=1e-4), "n": 1}}
    conf = s["confidence"]["confidence"]
    assert conf["right"] == pytest.approx((0.9 + 0.6 + 0.8) / 3, abs=1e-4)
    assert conf["wrong"] == pytest.approx((0.8 + 0.6) / 2, abs=1e-4) and (conf["n_right"], conf["n_wrong"]) == (3, 2)
    # the API's own confidence (top probability x label mass 0.98 in these answers)
    assert s["confidence"]["api_confidence"]["right"] == pytest.approx(0.98 * 0.9, abs=1e-4)
    assert s["unanswered"] == 0 and s["failed_requests"] == 0
    assert [(r["case"], r["question"], r["correct"]) for r in s["questions"]] == [
        ("a", "team", True), ("a", "urgent", False), ("a", "tone", True), ("b", "late", True), ("b", "team", False)]
    # reliability: 0.6 (tone right, team wrong) in 0.6-0.8; 0.8 (late right, urgent wrong) and 0.9 (team right) in 0.8-1.0
    assert [(r["low"], r["n"], r["accuracy"]) for r in s["reliability"]["confidence"]] == [(0.6, 2, 0.5), (0.8, 3, 0.6667)]


def test_per_tag_accuracy_and_untagged() -> None:
    suite = copy.deepcopy(SUITE)
    suite["cases"][1]["tags"] = ["trick"]
    s = b.score_cases(recorded({"team": choice("billing", {"billing": 1.0, "shipping": 0.0})},
                               {"late": noul(0.1), "team": choice("shipping", {"billing": 0.4, "shipping": 0.6})}), suite)
    assert s["by_tag"]["trick"]["correct"] == 1 and s["by_tag"]["trick"]["total"] == 2
    assert s["by_tag"]["untagged"]["correct"] == 1 and s["by_tag"]["untagged"]["total"] == 3


def test_a_failed_request_counts_its_questions_as_wrong() -> None:
    s = b.score_cases(recorded({"team": choice("billing", {"billing": 1.0, "shipping": 0.0})}, None, b_status=500), SUITE)
    assert (s["correct"], s["total"], s["failed_requests"], s["unanswered"]) == (1, 5, 1, 4)
    assert s["calibration"]["choice"] == {"rule": "brier", "value": 0.0, "n": 1}
    assert s["calibration"]["noul"] == {"rule": "brier", "value": None, "n": 0}
    assert s["confidence"]["confidence"]["wrong"] is None
    assert b.score_cases([], SUITE)["failed_requests"] == 2


# --------------------------------------------------------------------------------------------- report and table
def host_record(version: str = "0.33.1.dev0+d3sim") -> dict[str, Any]:
    plan = {
        "instances": [{"name": "big", "model": "d3", "gpus": [0, 1], "port": 8000, "served_model_name": "big"},
                      {"name": "small", "model": "d3-mini", "gpus": [2], "port": 8001, "served_model_name": "small"},
                      {"name": "tiny", "model": "d3-edge", "gpus": [2], "port": 8002, "served_model_name": "tiny"}],
        "gpus": [{"index": 0, "budget": [{"instance": "big", "budget_mib": 21882}]},
                 {"index": 1, "budget": [{"instance": "big", "budget_mib": 21882}]},
                 {"index": 2, "budget": [{"instance": "small", "budget_mib": 10365}, {"instance": "tiny", "budget_mib": 5758}]}],
    }
    lat = {"q2": {"n": 3, "p50": 240.0, "p95": 250.0, "p99": 260.0}, "q4": {"n": 3, "p50": 470.0, "p95": 480.0, "p99": 490.0}}
    thr = [{"concurrency": c, "requests": 10, "errors": 0, "requests_per_s": 2.0 * c, "questions_per_s": 8.0 * c,
            "p50": 470.0, "p95": 500.0, "p99": 510.0} for c in (1, 4)]
    results = [{"name": n, "url": f"http://127.0.0.1:{p}", "model": n, "health": 200, "version": version,
                "cases": recorded({"team": choice("billing", {"billing": 0.9, "shipping": 0.1})}, None),
                "latency": lat, "throughput": thr} for n, p in (("big", 8000), ("small", 8001), ("tiny", 8002))]
    results.append({"name": "qw14b", "url": "http://10.0.0.9:8000", "model": "qwen", "health": -1, "version": "",
                    "cases": [], "latency": {}, "throughput": []})
    gpus = [{"index": 0, "memory_used_mib": 20000, "memory_total_mib": 23034},
            {"index": 1, "memory_used_mib": 20010, "memory_total_mib": 23034},
            {"index": 2, "memory_used_mib": 16123, "memory_total_mib": 23034}]
    endpoints = [{"name": "qw14b", "url": "http://10.0.0.9:8000", "model": "qwen", "label": "qw14b NextToken", "gpus": 0}]
    return {"host": "h1", "plan": plan, "results": results, "endpoints": endpoints, "gpus": gpus, "image_ref": "img@sha256:1"}


def test_report_entries_memory_and_simulated_label() -> None:
    report = b.bench_report([host_record()], SUITE, {"d3": {"decision_index": 66.26}}, {"duration_s": 1}, ["+d3sim"], None)
    assert report["format"] == "d3-bench/1" and report["simulated"] is True and report["label"].startswith("SIMULATED")
    by = {i["name"]: i for i in report["instances"]}
    assert list(by) == ["big", "small", "tiny", "qw14b"]
    assert by["big"]["gpu_count"] == 2 and by["big"]["memory"]["used_mib"] == 40010 and by["big"]["memory"]["budget_mib"] == 43764
    assert by["small"]["memory"]["used_mib"] == 10365
    assert by["small"]["memory"]["per_gpu"][0]["shared_with"] == ["tiny"]
    assert by["tiny"]["memory"]["used_mib"] == 5758
    assert by["big"]["decision_index"] == 66.26 and by["small"]["decision_index"] is None
    assert by["qw14b"]["kind"] == "extra" and by["qw14b"]["model"] == "qw14b NextToken" and by["qw14b"]["memory"] is None
    assert by["qw14b"]["simulated"] is False and by["big"]["simulated"] is True
    assert by["big"]["score"]["correct"] == 1 and report["suite"] == {"name": "mini", "cases": 2, "questions": 5}


def test_report_simulated_follows_the_servers_or_the_override() -> None:
    real = b.bench_report([host_record("0.33.1")], SUITE, {}, {}, ["+d3sim"], None)
    assert real["simulated"] is False and real["label"] == "measured"
    forced = b.bench_report([host_record("0.33.1")], SUITE, {}, {}, ["+d3sim"], True)
    assert forced["simulated"] is True and all(i["simulated"] for i in forced["instances"])


def test_table_is_laid_out_like_the_field_report_with_published_rows() -> None:
    report = b.bench_report([host_record()], SUITE, {"d3": {"decision_index": 66.26}}, {"duration_s": 1, "slo_ms": 500},
                            ["+d3sim"], None)
    lines = b.bench_table(report, DEFAULTS["d3_bench_published"])
    text = "\n".join(lines)
    assert lines[0].startswith("SIMULATED:")
    assert "Config" in text and "2-question latency" in text and "4-question latency" in text
    # n = 3: no percentile has a distribution-free interval: none is shown as a number
    assert any("h1/big (d3) [SIMULATED]" in ln and "(n too small) / (n too small) / (n too small) ms, n=3" in ln for ln in lines)
    assert any(ln.startswith("Model") and "Accuracy" in ln and "4q p50" in ln and "GPUs" in ln and "Decision Index" in ln
               for ln in lines)
    # published rows: accuracy with its interval, total GPUs (2 for d3-27B; qw14b's total unknown)
    assert any("d3-27B [published: field report, its own 19 questions]" in ln and "19/19 = 1.00 [0.83-1.00]" in ln
               and "470 ms" in ln and "  2  " in ln and "66.26" in ln for ln in lines)
    assert any("qw14b NextToken [published" in ln and "  -  " in ln for ln in lines)
    assert any("d3 27B + expandable_segments [published: field report]" in ln and "~240ms" in ln for ln in lines)
    assert any("h1/big (d3) [SIMULATED]" in ln and "1/5 = 0.20 [0.04-0.62]" in ln and "66.26" in ln for ln in lines)
    assert any("choice Brier 0.020 (n=1)" in ln and "p(given) 0.90/-" in ln for ln in lines)
    assert any(ln.startswith("Instance") and "concurrency" in ln for ln in lines)
    assert any("h1/big" in ln and "  4  " in ln and "8.0 req/s" in ln for ln in lines)
    assert "NOT BENCHED: h1/qw14b (qw14b NextToken): /health answered -1" in text
    assert sum("h1/qw14b" in ln for ln in lines) == 1  # in no table: it was not benched


def test_table_of_a_measured_report_says_nothing_of_simulation() -> None:
    report = b.bench_report([host_record("0.33.1")], SUITE, {}, {}, ["+d3sim"], None)
    lines = b.bench_table(report, {})
    assert "SIMULATED" not in "\n".join(lines)
    assert any(ln.startswith("h1/big (d3)") for ln in lines), lines  # the measured instance is in the table


def test_accuracy_is_exactly_reproducible_from_the_answers() -> None:
    report = b.bench_report([host_record()], SUITE, {}, {}, [], None)
    assert report["instances"] and any(inst["answers"] for inst in report["instances"])
    for inst in report["instances"]:
        again = b.score_cases(inst["answers"], SUITE)
        assert again["correct"] == inst["score"]["correct"] and math.isclose(again["accuracy"] or 0, inst["score"]["accuracy"] or 0)
