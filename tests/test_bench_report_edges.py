"""Edge cases of the bench's controller side (collection filter d3_bench.py) that tests/test_bench_report.py leaves
open: every refusal of a suite word for word, the scoring of odd answers, and the report and its table compared
whole (every key, every line), so that a changed key, message, default or column shows."""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.d3fleet.fleet.plugins.filter import d3_bench as b  # noqa: E402

TEAM = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "money", "shipping": "parcels"}}
URGENT = {"type": "noul", "instructions": "Urgent?"}
TONE = {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "furious"]}
REFUND = {"type": "noul", "instructions": "Refund?"}


def suite(**over: Any) -> dict[str, Any]:
    base = {
        "format": "d3-bench-suite/1",
        "name": "mini",
        "questions": {"team": TEAM, "urgent": URGENT, "tone": TONE, "refund": REFUND},
        "cases": [{"id": "a", "state": "charged twice", "expect": {"team": "billing", "urgent": True}}],
        "latency": {"state": "x", "questions": ["team", "urgent", "tone", "refund"]},
    }
    return copy.deepcopy({**base, **over})


# --------------------------------------------------------------------------------------------- questions
@pytest.mark.parametrize(
    ("question", "problems"),
    [
        ("nope", ["question 'q' is not a mapping"]),
        ({"type": "rank", "instructions": "x"}, ["question 'q': type 'rank' is not one of choice, noul, score"]),
        ({"type": "noul", "instructions": "  "}, ["question 'q': instructions must be a non-empty string"]),
        ({"type": "noul", "instructions": 3}, ["question 'q': instructions must be a non-empty string"]),
        ({"type": "choice", "instructions": "x", "criteria": {"only": "one"}},
         ["question 'q': a choice needs criteria with at least two options"]),
        # a list of options is not a mapping of option -> meaning, however long
        ({"type": "choice", "instructions": "x", "criteria": ["a", "b"]},
         ["question 'q': a choice needs criteria with at least two options"]),
        ({"type": "score", "instructions": "x", "criteria": {"a": 1, "b": 2}},
         ["question 'q': a score needs criteria, a list of at least two levels"]),
        ({"type": "score", "instructions": "x", "criteria": ["low"]},
         ["question 'q': a score needs criteria, a list of at least two levels"]),
        ({"type": "score", "instructions": "x", "criteria": ["low", "high"]}, []),  # two levels are enough
        ({"type": "choice", "instructions": "x", "criteria": {"a": 1, "b": 2}}, []),  # two options too
        ({"type": "noul", "instructions": "x", "criteria": "anything"}, []),  # a noul has no criteria to check
        ({"type": "choice", "instructions": "", "criteria": {}},
         ["question 'q': instructions must be a non-empty string",
          "question 'q': a choice needs criteria with at least two options"]),
    ],
)
def test_question_problems_word_for_word(question: Any, problems: list[str]) -> None:
    assert b._question_problems("q", question) == problems


def test_expect_problems_name_the_options_and_levels() -> None:
    assert b._expect_problem("w", TEAM, "sales") == "w: expects 'sales', not one of the options ['billing', 'shipping']"
    assert b._expect_problem("w", TONE, "livid") == "w: expects 'livid', not one of the levels ['calm', 'annoyed', 'furious']"
    assert b._expect_problem("w", URGENT, "yes") == "w: a noul expects true or false, not 'yes'"
    assert b._expect_problem("w", TONE, "annoyed") is None and b._expect_problem("w", TEAM, "billing") is None
    assert b._expect_problem("w", URGENT, False) is None


# --------------------------------------------------------------------------------------------- suites
def test_a_suite_that_is_not_a_mapping() -> None:
    assert b.suite_problems(["cases"]) == ["the suite is not a mapping"]


def test_questions_that_are_not_a_mapping_stop_the_check() -> None:
    assert b.suite_problems(suite(format="v0", questions=["team"])) == [
        "format is 'v0', expected 'd3-bench-suite/1'", "questions must be a mapping of id -> question"]


def test_a_shared_question_is_named_in_its_problem() -> None:
    questions = {"team": TEAM, "urgent": URGENT, "tone": TONE, "refund": REFUND, "rank": {"type": "rank", "instructions": "x"}}
    assert b.suite_problems(suite(questions=questions)) == ["question 'rank': type 'rank' is not one of choice, noul, score"]


def test_cases_missing_or_empty() -> None:
    assert b.suite_problems(suite(cases=None)) == ["cases must be a non-empty list"]
    assert b.suite_problems(suite(cases={"a": {}})) == ["cases must be a non-empty list"]


def test_every_case_is_checked_past_a_bad_one() -> None:
    cases = [
        {"state": "no id", "expect": {"urgent": True}},
        {"id": "", "state": "empty id", "expect": {"urgent": True}},
        {"id": "e", "state": "s", "expect": {}},
        {"id": "f", "state": "s", "expect": ["urgent"]},
        {"id": "g", "state": "s", "questions": {"late": {"type": "noul"}}, "expect": {"late": True}},
        {"id": "h", "state": "s", "questions": ["late"], "expect": {"late": True}},
        {"id": "i", "state": "s", "expect": {"team": "sales", "tone": "livid"}},
        {"id": "g", "state": None, "expect": {"urgent": "no"}},
    ]
    assert b.suite_problems(suite(cases=cases)) == [
        "case #1 has no id",
        "case #2 has no id",
        "case 'e': expect must name at least one question and its right answer",
        "case 'f': expect must name at least one question and its right answer",
        "question 'g.late': instructions must be a non-empty string",
        # a case's questions that are not a mapping add none: 'late' is then defined nowhere
        "case 'h': question 'late' is defined neither in the case nor in questions",
        "case 'i' question 'team': expects 'sales', not one of the options ['billing', 'shipping']",
        "case 'i' question 'tone': expects 'livid', not one of the levels ['calm', 'annoyed', 'furious']",
        "case 'g' appears twice",
        "case 'g': state must be a non-empty string or JSON",
        "case 'g' question 'urgent': a noul expects true or false, not 'no'",
    ]


def test_a_case_question_overrides_the_shared_one() -> None:
    # the case's own "urgent" is a score: its expectation is checked against the case's levels, not as a noul
    own = {"urgent": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "high"]}}
    ok = suite(cases=[{"id": "a", "state": {"t": 1}, "questions": own, "expect": {"urgent": "high"}}])
    assert b.suite_problems(ok) == []
    bad = suite(cases=[{"id": "a", "state": ["t"], "questions": own, "expect": {"urgent": True}}])
    assert b.suite_problems(bad) == ["case 'a' question 'urgent': expects True, not one of the levels ['low', 'high']"]


@pytest.mark.parametrize(
    ("latency", "problems"),
    [
        (None, ["latency must give a state and four question ids"]),
        ({"questions": ["team", "urgent", "tone", "refund"]}, ["latency must give a state and four question ids"]),
        ({"state": "x", "questions": ["team", "team", "urgent", "tone"]},
         ["latency.questions must list four distinct question ids, not ['team', 'team', 'urgent', 'tone']"]),
        ({"state": "x", "questions": "abcd"}, ["latency.questions must list four distinct question ids, not 'abcd'"]),
        # ids are compared as text: 1 and "1" are the same question
        ({"state": "x", "questions": ["team", "urgent", 1, "1"]},
         ["latency.questions must list four distinct question ids, not ['team', 'urgent', 1, '1']"]),
        ({"state": "x", "questions": ["team", "urgent", "tone"]},
         ["latency.questions must list four distinct question ids, not ['team', 'urgent', 'tone']"]),
        ({"state": "x", "questions": ["team", "urgent", "late", "why"]},
         ["latency: question 'late' is not in questions", "latency: question 'why' is not in questions"]),
    ],
)
def test_latency_problems_word_for_word(latency: Any, problems: list[str]) -> None:
    assert b.suite_problems(suite(latency=latency)) == problems


def test_the_refusal_lists_every_problem() -> None:
    bad = suite(format="v0", latency={"state": "x"})
    with pytest.raises(AnsibleFilterError) as err:
        b.bench_requests(bad)
    assert str(err.value) == ("the decision suite cannot be run: format is 'v0', expected 'd3-bench-suite/1'; "
                              "latency.questions must list four distinct question ids, not None")


def test_latency_requests_whole() -> None:
    s = suite(latency={"state": {"ticket": "slow"}, "questions": ["tone", "refund", "team", "urgent"]})
    assert b.bench_requests(s)["latency_requests"] == [
        {"label": "q2", "body": {"state": {"ticket": "slow"}, "questions": {"tone": TONE, "refund": REFUND}}},
        {"label": "q4", "body": {"state": {"ticket": "slow"}, "questions": {"tone": TONE, "refund": REFUND, "team": TEAM,
                                                                            "urgent": URGENT}}},
    ]


def test_targets_keep_a_bracketed_address_and_a_host_name() -> None:
    plan = [{"name": "i", "port": 8001, "served_model_name": "m", "health_url": "http://10.0.0.5:8001/health"}]
    assert b.bench_targets(plan, "[fd00::5]") == [{"name": "i", "url": "http://[fd00::5]:8001", "model": "m"}]
    assert b.bench_targets(plan, "gpu-1.lan") == [{"name": "i", "url": "http://gpu-1.lan:8001", "model": "m"}]
    assert b.bench_targets(None) == []


# --------------------------------------------------------------------------------------------- scoring
def test_judge_choice_confidence_is_the_options_probability_and_the_api_confidence_beside_it() -> None:
    # no probabilities (or not a mapping): no derived confidence and no Brier; the API's confidence is kept apart
    assert b.judge(TEAM, "billing", {"choice": "billing", "confidence": 0.7}) == {
        "given": "billing", "correct": True, "confidence": None, "api_confidence": 0.7, "proper": None}
    assert b.judge(TEAM, "billing", {"choice": "billing", "probabilities": ["x"], "confidence": 0.6}) == {
        "given": "billing", "correct": True, "confidence": None, "api_confidence": 0.6, "proper": None}
    # the probability of the option given; the Brier over the options listed (a missing class that happened costs 1)
    assert b.judge(TEAM, "billing", {"choice": "billing", "probabilities": {"billing": 0.9}, "confidence": 0.1}) == {
        "given": "billing", "correct": True, "confidence": 0.9, "api_confidence": 0.1, "proper": pytest.approx(0.01)}
    assert b.judge(TEAM, "shipping", {"choice": "billing", "probabilities": {"billing": "high"}, "confidence": True}) == {
        "given": "billing", "correct": False, "confidence": None, "api_confidence": None, "proper": None}
    assert b.judge(TEAM, "shipping", {"choice": "billing", "probabilities": {"billing": 0.9}})["proper"] == pytest.approx(1.81)
    assert b.judge(TEAM, "billing", {"choice": "billing"}) == {"given": "billing", "correct": True, "confidence": None,
                                                               "api_confidence": None, "proper": None}


def test_judge_score_whole_and_clamped_to_the_levels() -> None:
    probs = {"0": 0.2, "1": 0.5, "2": 0.3}
    # RPS: cumulative (0.2, 0.7) against the expected level's (0, 1): (0.04 + 0.09) / 2
    assert b.judge(TONE, "annoyed", {"score": 1.2, "probabilities": probs}) == {
        "given": "annoyed", "score": 1.2, "correct": True, "confidence": 0.5, "api_confidence": None,
        "proper": pytest.approx(0.065)}
    # below the first level and above the last: the nearest level is the first / the last
    assert b.judge(TONE, "calm", {"score": 0.1, "probabilities": probs}) == {
        "given": "calm", "score": 0.1, "correct": True, "confidence": 0.2, "api_confidence": None,
        "proper": pytest.approx((0.8**2 + 0.3**2) / 2)}
    assert b.judge(TONE, "annoyed", {"score": -3, "probabilities": probs})["given"] == "calm"
    assert b.judge(TONE, "furious", {"score": 7.0, "probabilities": probs}) == {
        "given": "furious", "score": 7.0, "correct": True, "confidence": 0.3, "api_confidence": None,
        "proper": pytest.approx((0.2**2 + 0.7**2) / 2)}
    # a probability that is not a number is a missing level (0); no probabilities: no confidence and no RPS
    assert b.judge(TONE, "furious", {"score": 2, "probabilities": {"2": "most"}}) == {
        "given": "furious", "score": 2, "correct": True, "confidence": None, "api_confidence": None, "proper": None}
    assert b.judge(TONE, "furious", {"score": 2, "probabilities": {"1": 0.1, "2": 0.9}, "confidence": 0.88}) == {
        "given": "furious", "score": 2, "correct": True, "confidence": 0.9, "api_confidence": 0.88,
        "proper": pytest.approx(0.1**2 / 2)}
    assert b.judge(TONE, "furious", {"score": 2, "probabilities": None}) == {
        "given": "furious", "score": 2, "correct": True, "confidence": None, "api_confidence": None, "proper": None}


def test_score_cases_rows_and_rounding() -> None:
    s = suite(cases=[
        {"id": "a", "state": "s", "tags": ["trick"], "expect": {"team": "billing", "urgent": True, "tone": "calm"}},
        {"id": 7, "state": "s", "expect": {"refund": False}},
    ])
    recorded = [{"id": "a", "status": 200, "answers": {"team": {"choice": "billing", "probabilities": {"billing": 2 / 3}},
                                                       "urgent": {"noul": 0.2}, "tone": {"score": 0.0}}},
                {"id": 7, "status": 200, "answers": {"refund": {"noul": "no"}}}]
    out = b.score_cases(recorded, s)
    rows = out.pop("questions")
    assert out == {
        "correct": 2, "total": 4, "accuracy": 0.5, "interval": [0.15, 0.85],
        "by_type": {"choice": {"correct": 1, "total": 1, "accuracy": 1.0, "interval": [0.2065, 1.0]},
                    "noul": {"correct": 0, "total": 2, "accuracy": 0.0, "interval": [0.0, 0.6576]},
                    "score": {"correct": 1, "total": 1, "accuracy": 1.0, "interval": [0.2065, 1.0]}},
        "by_tag": {"trick": {"correct": 2, "total": 3, "accuracy": 0.6667, "interval": [0.2077, 0.9385]},
                   "untagged": {"correct": 0, "total": 1, "accuracy": 0.0, "interval": [0.0, 0.7935]}},
        # team: (1/3)^2; urgent: (0.2 - 1)^2 (the refund answer is malformed: not scored); tone: no probabilities
        "calibration": {"choice": {"rule": "brier", "value": 0.1111, "n": 1}, "noul": {"rule": "brier", "value": 0.64, "n": 1},
                        "score": {"rule": "rps", "value": None, "n": 0}},
        "confidence": {"confidence": {"right": 0.6667, "wrong": 0.8, "n_right": 1, "n_wrong": 1},
                       "api_confidence": {"right": None, "wrong": None, "n_right": 0, "n_wrong": 0}},
        "reliability": {"confidence": [{"low": 0.6, "high": 0.8, "n": 1, "confidence": 0.6667, "accuracy": 1.0,
                                        "interval": [0.2065, 1.0]},
                                       {"low": 0.8, "high": 1.0, "n": 1, "confidence": 0.8, "accuracy": 0.0,
                                        "interval": [0.0, 0.7935]}],
                        "api_confidence": []},
        # ECE over the same bins: 1/2 x |1.0 - 0.6667| + 1/2 x |0.0 - 0.8|
        "ece": {"confidence": {"value": 0.5667, "n": 2, "binning": "5 equal-width bins on [0, 1]"}, "api_confidence": None},
        "unanswered": 1, "failed_requests": 0,
    }
    assert rows[0] == {"case": "a", "question": "team", "type": "choice", "expected": "billing", "tags": ["trick"], "failed": False,
                       "given": "billing", "correct": True, "confidence": 2 / 3, "api_confidence": None,
                       "proper": pytest.approx(1 / 9)}
    assert rows[3] == {"case": "7", "question": "refund", "type": "noul", "expected": False, "tags": [], "failed": False,
                       "given": None, "correct": False, "confidence": None, "api_confidence": None, "proper": None}
    # case a alone: 2 of 3 right, the accuracy rounded to 4 places too
    three = b.score_cases(recorded[:1], suite(cases=s["cases"][:1]))
    assert (three["correct"], three["total"], three["accuracy"]) == (2, 3, 0.6667)


def test_reliability_bins_edges() -> None:
    rows = [{"confidence": c, "correct": r} for c, r in ((0.0, False), (0.2, True), (0.19999, False), (1.0, True), (None, True))]
    assert [(x["low"], x["high"], x["n"]) for x in b.reliability(rows)] == [(0.0, 0.2, 2), (0.2, 0.4, 1), (0.8, 1.0, 1)]


def test_score_cases_of_a_suite_without_questions() -> None:
    out = b.score_cases([], {"cases": [], "questions": {}})
    assert out == {"correct": 0, "total": 0, "accuracy": None, "interval": None, "by_type": {}, "by_tag": {},
                   "calibration": {}, "confidence": {k: {"right": None, "wrong": None, "n_right": 0, "n_wrong": 0}
                                                     for k in ("confidence", "api_confidence")},
                   "reliability": {"confidence": [], "api_confidence": []}, "unanswered": 0, "failed_requests": 0,
                   "ece": {"confidence": None, "api_confidence": None}, "questions": []}


def test_answers_of_a_failed_or_malformed_request_are_ignored() -> None:
    s = suite()
    good = {"team": {"choice": "billing", "probabilities": {"billing": 1.0}}, "urgent": {"noul": 1.0}}
    assert b.score_cases([{"id": "a", "status": 500, "answers": good}], s)["correct"] == 0
    assert b.score_cases([{"id": "a", "status": 200, "answers": ["x"]}], s)["unanswered"] == 2
    assert b.score_cases([{"id": "a", "status": 200, "answers": good}], s)["correct"] == 2


def test_is_simulated_needs_a_marker_in_the_version() -> None:
    assert b._is_simulated(None, ["X"]) is False and b._is_simulated("", ["X"]) is False
    assert b._is_simulated("1.0+X", ["", "X"]) is True and b._is_simulated("1.0", [""]) is False


def test_ms() -> None:
    assert (b._ms(None), b._ms(0), b._ms(12.5), b._ms(13.5)) == ("-", "0", "12", "14")


# --------------------------------------------------------------------------------------------- the report
ONE_CASE = suite(name="one", cases=[{"id": "a", "state": "s", "expect": {"urgent": True}}])
RIGHT = [{"id": "a", "status": 200, "answers": {"urgent": {"noul": 0.75}}}]


def odd_host() -> dict[str, Any]:
    """A host whose plan, nvidia-smi and endpoints disagree: GPU 3 budgeted to another instance only, GPU 4 neither
    planned nor seen, GPU 5 planned but not seen; an extra endpoint with GPUs and a Decision Index, one without a
    label, and results without a version."""
    plan = {
        "instances": [{"name": "odd", "model": "d3-odd", "gpus": [3, 4]}, {"name": "blind", "model": "d3-blind", "gpus": [5]}],
        "gpus": [{"index": 3, "budget": [{"instance": "other", "budget_mib": 1000}]},
                 {"index": 5, "budget": [{"instance": "blind", "budget_mib": 2000}]}],
    }
    results = [
        {"name": "odd", "url": "http://h2:1", "model": "odd-served", "health": 200, "version": None, "cases": RIGHT},
        {"name": "blind", "url": "http://h2:2", "model": "blind-served", "health": 200},
        {"name": "ext", "url": "http://h2:3", "model": "ext-served", "health": 200, "version": "v+sim"},
        {"name": "raw", "url": "http://h2:4", "model": "raw-served", "health": 503, "version": "v"},
    ]
    endpoints = [{"name": "ext", "label": "External", "gpus": "2", "decision_index": 50.5}, {"name": "raw"}]
    gpus = [{"index": 3, "memory_used_mib": 500.4, "memory_total_mib": 23034}]
    return {"host": "h2", "plan": plan, "results": results, "endpoints": endpoints, "gpus": gpus}


def test_report_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "gmtime", lambda *_: time.struct_time((2026, 3, 4, 5, 6, 7, 2, 63, 0)))
    report = b.bench_report([odd_host()], ONE_CASE, {"d3-odd": {"decision_index": 60}, "External": {}}, None, ["+sim"])
    score = b.score_cases([], ONE_CASE)
    common = {"host": "h2", "image_ref": "", "latency": {}, "throughput": [], "rate": [], "generator_limit": None,
              "record": {"image_ref": "", "image": None, "revision": None, "args": [], "env": {}, "tensor_parallel_size": None,
                         "gpu_memory_utilization": None, "max_model_len": None}}
    assert report == {
        "format": "d3-bench/1",
        "generated": "2026-03-04T05:06:07Z",
        "simulated": True,
        "label": "SIMULATED (lab stand-in): not a property of D3",
        "suite": {"name": "one", "cases": 1, "questions": 1},
        "settings": {},
        "instances": [
            {**common, "name": "odd", "kind": "planned", "model": "d3-odd", "served_model_name": "odd-served",
             "url": "http://h2:1", "server_version": "", "simulated": False, "health": 200, "gpu_count": 2, "gpus": [3, 4],
             "memory": {"per_gpu": [{"index": 3, "used_mib": 500.4, "total_mib": 23034, "budget_mib": None, "shared_with": ["other"]},
                                    {"index": 4, "used_mib": None, "total_mib": None, "budget_mib": None, "shared_with": []}],
                        "used_mib": 500, "budget_mib": None},
             "decision_index": 60, "score": b.score_cases(RIGHT, ONE_CASE), "answers": RIGHT},
            {**common, "name": "blind", "kind": "planned", "model": "d3-blind", "served_model_name": "blind-served",
             "url": "http://h2:2", "server_version": "", "simulated": False, "health": 200, "gpu_count": 1, "gpus": [5],
             "memory": {"per_gpu": [{"index": 5, "used_mib": None, "total_mib": None, "budget_mib": 2000, "shared_with": []}],
                        "used_mib": None, "budget_mib": 2000},
             "decision_index": None, "score": score, "answers": []},
            # an extra endpoint: its label is its model, its GPUs and Decision Index are the declared ones
            {**common, "name": "ext", "kind": "extra", "model": "External", "served_model_name": "ext-served",
             "url": "http://h2:3", "server_version": "v+sim", "simulated": True, "health": 200, "gpu_count": 2, "gpus": [],
             "memory": None, "decision_index": 50.5, "score": score, "answers": []},
            {**common, "name": "raw", "kind": "extra", "model": "raw-served", "served_model_name": "raw-served",
             "url": "http://h2:4", "server_version": "v", "simulated": False, "health": 503, "gpu_count": 0, "gpus": [],
             "memory": None, "decision_index": None, "score": score, "answers": []},
        ],
    }
    assert report["instances"][0]["score"]["correct"] == 1


def test_report_keeps_the_image_and_settings_and_the_forced_label(monkeypatch: pytest.MonkeyPatch) -> None:
    host = {"host": "h3", "image_ref": "img@sha256:9", "results": [{"name": "x", "url": "u", "model": "m", "version": "+sim"}]}
    report = b.bench_report([host], ONE_CASE, None, {"duration_s": 3}, ["+sim"], False)
    assert report["settings"] == {"duration_s": 3} and report["simulated"] is False and report["label"] == "measured"
    (inst,) = report["instances"]
    assert (inst["image_ref"], inst["server_version"], inst["simulated"], inst["gpu_count"]) == ("img@sha256:9", "+sim", False, 0)
    # no marker given: nothing is simulated whatever the version; a result without a version neither
    assert b.bench_report([host], ONE_CASE)["simulated"] is False
    bare = {"host": "h3", "results": [{"name": "x", "url": "u", "model": "m"}]}
    assert b.bench_report([bare], ONE_CASE, simulated_markers=["XX"])["instances"][0]["simulated"] is False
    assert b.bench_report([bare], ONE_CASE, simulated=1)["instances"][0]["simulated"] is True


# --------------------------------------------------------------------------------------------- the table
def entry(name: str, sim: bool, **over: Any) -> dict[str, Any]:
    base = {"host": "h", "name": name, "model": "m-" + name, "simulated": sim, "health": 200, "gpu_count": 1, "gpus": [0],
            "memory": None, "decision_index": None, "latency": {}, "throughput": [],
            "score": {"correct": 0, "total": 2, "accuracy": 0.0, "interval": [0.0, 0.6576]}}
    return {**base, **over}


def test_table_whole_with_gaps_published_rows_and_unhealthy_instances() -> None:
    report = {"simulated": True, "suite": {"name": "s", "cases": 2, "questions": 3}, "instances": [
        entry("a", True, gpu_count=2, gpus=[0, 1], decision_index=66.26,
              latency={"q2": {"n": 25, "p50": 240.4, "p95": 250.6, "p99": None, "interval": {"p50": [230.1, 250.0]}},
                       "q4": {"n": 100, "p50": 470.5, "p95": 480.0, "p99": 490.0, "runs": [{}, {}],
                              "interval": {"p50": [460.0, 480.2], "p95": [475.0, 499.0], "p99": None}}},
              throughput=[{"concurrency": 4, "requests_per_s": 7.96, "questions_per_s": 31.84, "p50": 400.2, "p99": 512.7,
                           "n": 120, "errors": 1, "goodput_per_s": 6.5, "input_tokens_per_s": 3200.4,
                           "metrics": {"before": {"vllm:request_queue_time_seconds_sum": 1.0,
                                                  "vllm:request_queue_time_seconds_count": 10},
                                       "during": {"vllm:num_requests_running": 4, "vllm:num_requests_waiting": 0,
                                                  "vllm:kv_cache_usage_perc": 0.123},
                                       "after": {"vllm:request_queue_time_seconds_sum": 3.5,
                                                 "vllm:request_queue_time_seconds_count": 110}}},
                          {"concurrency": 1, "requests_per_s": 2.04, "questions_per_s": 8.5, "p99": None, "errors": 0,
                           "metrics": {"before": {"vllm:num_requests_running": None}}}],
              rate=[{"rate": 8.0, "offered_per_s": 7.5, "requests_per_s": 6.0, "p50": 700.0, "p99": 2500.0, "n": 15,
                     "errors": 0, "goodput_per_s": 1.2, "sent_per_s": 7.5, "not_sent": 0, "driven": True,
                     "lag": {"p50": 0.4, "p99": 2.5}, "from_schedule": {"n": 15, "p50": 701.0, "p99": 2600.0,
                     "interval": {"p50": [650.0, None]}, "censored": 1, "lower_bound": ["p50", "p99"]}},
                    {"rate": 2000.0, "offered_per_s": 1990.0, "requests_per_s": 50.0, "p50": 50.0, "n": 500,
                     "errors": 9, "sent_per_s": 1010.0, "not_sent": 9, "driven": False, "lag": {"p50": 984.0, "p99": 1900.0},
                     "not_driven": "the generator sent 1010/s of 1990/s offered"}],
              generator_limit={"sent_per_s": 1100.0, "probe_rate": 20000.0},
              memory={"used_mib": 40010, "budget_mib": 43764,
                      "per_gpu": [{"shared_with": ["zeta"]}, {"shared_with": ["alpha", "zeta"]}]},
              score={"correct": 1, "total": 2, "accuracy": 0.5, "interval": [0.0945, 0.9055], "by_type": {"noul": {
                  "correct": 1, "total": 2, "accuracy": 0.5, "interval": [0.0945, 0.9055]}}, "by_tag": {"trick": {
                  "correct": 0, "total": 1, "accuracy": 0.0, "interval": [0.0, 0.7935]}},
                  "calibration": {"noul": {"rule": "brier", "value": 0.12345, "n": 2}},
                  "confidence": {"confidence": {"right": 0.876, "wrong": None, "n_right": 1, "n_wrong": 0}},
                  "reliability": {"confidence": [{"low": 0.8, "high": 1.0, "n": 1, "confidence": 0.876, "accuracy": 1.0,
                                                  "interval": [0.2065, 1.0]}]},
                  "ece": {"confidence": {"value": 0.124, "n": 1, "binning": "5 equal-width bins on [0, 1]"}}}),
        entry("b", False, gpus=[], gpu_count=0,
              throughput=[{"concurrency": 16, "requests_per_s": 30.0, "questions_per_s": 120.0, "p99": 900.0, "errors": 0,
                           "runs": [{}, {}, {}]}],
              memory={"used_mib": None, "budget_mib": None, "per_gpu": []},
              score={"correct": 2, "total": 2, "accuracy": 1.0, "interval": [0.3424, 1.0],
                     "calibration": {"score": {"rule": "rps", "value": 0.0, "n": 2}},
                     "confidence": {"api_confidence": {"right": 1.0, "wrong": 0.25, "n_right": 2, "n_wrong": 1}}}),
        entry("c", False, health=201),
        entry("d", True, health=-1),
    ]}
    published = {"latency": [{"config": "cfgA", "q2_ms": 300, "q4_ms": 490}, {"config": "cfgB", "source": "blog"}],
                 "accuracy": [{"model": "pm", "correct": 19, "total": 19, "q4_ms": 170, "extra_gpus": 0, "decision_index": "~45"},
                              {"model": "pn", "source": "paper", "correct": 17, "total": 19, "q4_ms": 215}]}
    assert b.bench_table(report, published) == [
        "SIMULATED: these endpoints are the lab's vLLM simulator (a stand-in); no figure below is a property of D3.",
        '',
        'Latency [SIMULATED] (p50 / p95 / p99 [95 % interval] and n, one request at a time)',
        "  with 2 runs or more, where every run's n allows the percentile: the mean of the runs' percentiles, its t"
        " interval over the runs ('over k runs': the run is the unit)",
        "  else the pooled samples' percentile and its order-statistic interval, which assumes independent samples"
        " (latencies in a run are autocorrelated: too narrow)",
        "  a percentile is shown where n allows its interval (order statistics: p50 n >= 6, p95 72, p99 368), else '(n too small)'",
        'Config                          2-question latency                          4-question latency',
        'h/a (m-a) [SIMULATED]           240 [230-250] / (n too small) / - ms, n=25  470 [460-480] / 480 [475-499] /'
        ' (n too small) ms, n=100, 2 runs',
        'h/b (m-b)                       -                                           -',
        'cfgA [published: field report]  ~300ms                                      ~490ms',
        'cfgB [published: blog]          -                                           -',
        '',
        'Accuracy [SIMULATED] (suite s: 2 cases, 3 questions; [95 % Wilson interval])',
        "  GPUs: total per instance; the published totals read from the report's 'Extra GPUs' (d3_bench_published)",
        'Model                                               Accuracy                  4q p50            GPUs  Decision Index',
        'h/a (m-a) [SIMULATED]                               1/2 = 0.50 [0.09-0.91]    470 [460-480] ms  2     66.26',
        'h/b (m-b)                                           2/2 = 1.00 [0.34-1.00]    - ms              0     -',
        'pm [published: field report, its own 19 questions]  19/19 = 1.00 [0.83-1.00]  170 ms            -     ~45',
        'pn [published: paper, its own 19 questions]         17/19 = 0.89 [0.69-0.97]  215 ms            -     -',
        '',
        'Accuracy per question type and per case tag [SIMULATED] [95 % Wilson interval]',
        'Instance               noul                    tag trick',
        'h/a (m-a) [SIMULATED]  1/2 = 0.50 [0.09-0.91]  0/1 = 0.00 [0.00-0.79]',
        'h/b (m-b)              -                       -',
        '',
        'Calibration [SIMULATED] (0 is perfect: multi-class Brier (choice), binary Brier (noul), RPS (score))',
        "  mean confidence right/wrong: p(given) of the answer given; API: the answer's own `confidence`",
        'Instance               proper scores                                                                      confidence right/wrong',
        'h/a (m-a) [SIMULATED]  noul Brier 0.123 (n=2); ECE 0.124 (n=1, 5 equal-width bins on [0, 1] of p(given)) '
        ' p(given) 0.88/- (n=1/0); API -/- (n=0/0)',
        'h/b (m-b)              score RPS 0.000 (n=2)                                                             '
        ' p(given) -/- (n=0/0); API 1.00/0.25 (n=2/1)',
        '',
        'Reliability [SIMULATED] (p(given) in bins against the accuracy observed in each)',
        'Instance               confidence bin  n  mean confidence  accuracy [95 %]',
        'h/a (m-a) [SIMULATED]  0.8-1.0         1  0.88             1/1 = 1.00 [0.21-1.00]',
        '',
        'Throughput [SIMULATED], closed loop (? s per level, 4-question requests)',
        '  each level after its warm-up; its first fifth (the ramp) and the answers after its end (the drain) are'
        ' outside its window: rates over the window, latency of the requests sent in it',
        "  percentile intervals: over the runs ('over k runs') with 2 runs or more, else order statistics of the"
        " pooled samples (assume independent samples: too narrow for autocorrelated latencies)",
        "  goodput: answers within - ms per s; after |: the server's /metrics (halfway; queue: over the level)",
        'Instance               concurrency  figures',
        'h/a (m-a) [SIMULATED]  1            2.0 req/s p50 - p99 - ms n=0 err 0 | no vLLM metrics',
        'h/a (m-a) [SIMULATED]  4            8.0 req/s goodput 6.5/s 3200 tok/s p50 400 p99 (n too small) ms n=120 err'
        ' 1 | run 4 wait 0 kv 12% queue 25ms',
        'h/b (m-b)              16           30.0 req/s (3 runs) p50 - p99 (n too small) ms n=0 err 0 | -',
        '',
        'Request rate [SIMULATED], open loop (Poisson arrivals, due on schedule whatever the answers do)',
        '  one run per rate: percentile intervals from order statistics, which assume independent samples (too narrow'
        ' for autocorrelated latencies)',
        '  latency from the schedule (the intended send time: what a client arriving then waited) and from the actual'
        ' send; lag: how late the dispatcher started each request after its intended time; its first tenth (ramp) and'
        ' the answers after the schedule (drain) are outside the window; goodput judged from the schedule',
        "  requests never sent that were due in the window, and requests that failed (no HTTP 200), count in the"
        " latency from the schedule, censored at the window's end (each waited at least end - intended time; a failure"
        " at what it spent if longer): a figure reaching them is printed '>= X'; the latency from the send is the"
        " answered requests' alone",
        '  NOT DRIVEN: sent under 95 % of the offered rate, or a p99 lag (the dispatcher\'s start of a request after its'
        ' intended time) of max(1 ms, 5 % of the mean gap) or more',
        "  the generator's own limit, measured in this run: h/a (m-a) [SIMULATED] 1100/s (probe 20000/s)",
        'Instance               rate                     figures',
        'h/a (m-a) [SIMULATED]  8/s (offered 7.5)        6.0 req/s goodput 1.2/s | from schedule p50 >= 701 [650-inf]'
        ' p99 (n too small) ms | from send p50 700 p99 (n too small) ms n=15 | sent 7.5/s, lag p50 0.4 p99 2.5 ms, not'
        ' sent 0 | err 0 | -',
        'h/a (m-a) [SIMULATED]  2000/s (offered 1990.0)  NOT DRIVEN: the generator sent 1010/s of 1990/s offered (sent'
        ' 1010/s, lag p50 984.0 p99 1900.0 ms, not sent 9): no server figure',
        '',
        "GPUs and memory [SIMULATED] (nvidia-smi after the load; a shared GPU's use split by planned budgets)",
        'Instance               GPUs  used MiB  planned MiB  shares GPUs with',
        'h/a (m-a) [SIMULATED]  0,1   40010     43764        alpha, zeta',
        'h/b (m-b)              -     -         -            -',
        'NOT BENCHED: h/c (m-c): /health answered 201',
        'NOT BENCHED: h/d (m-d) [SIMULATED]: /health answered -1',
    ]


def test_table_of_a_measured_report_without_published_rows() -> None:
    report = {"suite": {"name": "t", "cases": 1, "questions": 1}, "settings": {"duration_s": 2.5}, "instances": [entry("z", False)]}
    assert b.bench_table(report) == [
        'Latency (p50 / p95 / p99 [95 % interval] and n, one request at a time)',
        "  with 2 runs or more, where every run's n allows the percentile: the mean of the runs' percentiles, its t"
        " interval over the runs ('over k runs': the run is the unit)",
        "  else the pooled samples' percentile and its order-statistic interval, which assumes independent samples"
        " (latencies in a run are autocorrelated: too narrow)",
        "  a percentile is shown where n allows its interval (order statistics: p50 n >= 6, p95 72, p99 368), else '(n too small)'",
        'Config     2-question latency  4-question latency',
        'h/z (m-z)  -                   -',
        '',
        'Accuracy (suite t: 1 cases, 1 questions; [95 % Wilson interval])',
        "  GPUs: total per instance; the published totals read from the report's 'Extra GPUs' (d3_bench_published)",
        'Model      Accuracy                4q p50  GPUs  Decision Index',
        'h/z (m-z)  0/2 = 0.00 [0.00-0.66]  - ms    1     -',
        '',
        'Accuracy per question type and per case tag [95 % Wilson interval]',
        'Instance',
        'h/z (m-z)',
        '',
        'Calibration (0 is perfect: multi-class Brier (choice), binary Brier (noul), RPS (score))',
        "  mean confidence right/wrong: p(given) of the answer given; API: the answer's own `confidence`",
        'Instance   proper scores  confidence right/wrong',
        'h/z (m-z)  -              p(given) -/- (n=0/0); API -/- (n=0/0)',
        '',
        'Reliability (p(given) in bins against the accuracy observed in each)',
        'Instance  confidence bin  n  mean confidence  accuracy [95 %]',
        '',
        'Throughput, closed loop (2.5 s per level, 4-question requests)',
        '  each level after its warm-up; its first fifth (the ramp) and the answers after its end (the drain) are'
        ' outside its window: rates over the window, latency of the requests sent in it',
        "  percentile intervals: over the runs ('over k runs') with 2 runs or more, else order statistics of the"
        " pooled samples (assume independent samples: too narrow for autocorrelated latencies)",
        "  goodput: answers within - ms per s; after |: the server's /metrics (halfway; queue: over the level)",
        'Instance  concurrency  figures',
        '',
        "GPUs and memory (nvidia-smi after the load; a shared GPU's use split by planned budgets)",
        'Instance   GPUs  used MiB  planned MiB  shares GPUs with',
        'h/z (m-z)  0     -         -            -',
    ]


# --------------------------------------------------------------------------------------------- the JSON lines
def test_records_are_the_requests_with_what_a_recompute_needs() -> None:
    s = suite(cases=[{"id": "a", "state": "s", "tags": ["trick"], "expect": {"team": "billing", "tone": "calm"}},
                     {"id": 7, "state": "s", "expect": {"refund": False}}])
    acc = {"phase": "accuracy", "case": "a", "sent": 1.0, "received": 1.5, "status": 200, "answers": {"team": {}}}
    host = {"host": "h", "results": [
        {"name": "i", "records": [acc, {"phase": "accuracy", "case": 7, "status": 500, "answers": None},
                                  {"phase": "accuracy", "case": "unknown", "status": 200},
                                  {"phase": "open", "rate": 8.0, "case": "a", "status": 200}]},
        {"name": "j"}]}
    lines = b.bench_records([host, {"host": "empty"}], s)
    assert lines[0] == {"host": "h", "instance": "i", **acc, "tags": ["trick"], "expect": {
        "team": {"type": "choice", "expected": "billing"},
        "tone": {"type": "score", "expected": "calm", "levels": ["calm", "annoyed", "furious"]}}}
    assert lines[1] == {"host": "h", "instance": "i", "phase": "accuracy", "case": 7, "status": 500, "answers": None,
                        "tags": [], "expect": {"refund": {"type": "noul", "expected": False}}}
    # a case the suite does not have, and the load passes: as recorded
    assert lines[2:] == [{"host": "h", "instance": "i", "phase": "accuracy", "case": "unknown", "status": 200},
                         {"host": "h", "instance": "i", "phase": "open", "rate": 8.0, "case": "a", "status": 200}]


def test_ece_weights_each_bin_by_its_share_of_the_answers() -> None:
    """ECE over 5 equal-width bins, each bin weighted by n_bin / N (Guo et al. 2017, eq. 3), by hand on bins of
    unequal size (an answer without a confidence is in none):
      [0.2, 0.4): 0.3 wrong                          n 1, accuracy 0,    confidence 0.3: gap 0.3
      [0.6, 0.8): 0.7 right, 0.7 right, 0.7 wrong    n 3, accuracy 2/3,  confidence 0.7: gap 0.0333
      [0.8, 1.0]: 0.8, 0.9, 1.0 right, 0.9 wrong     n 4, accuracy 3/4,  confidence 0.9: gap 0.15
    ECE = 1/8 x 0.3 + 3/8 x 0.0333 + 4/8 x 0.15 = 0.125 (the unweighted mean of the gaps would be 0.161; weights
    1/5 each 0.097)."""
    rows = [{"confidence": c, "correct": ok} for c, ok in (
        (0.3, False), (0.7, True), (0.7, True), (0.7, False), (0.8, True), (0.9, True), (1.0, True), (0.9, False),
        (None, True))]
    bins = b.reliability(rows)
    assert [(x["low"], x["high"], x["n"], x["accuracy"], x["confidence"]) for x in bins] == [
        (0.2, 0.4, 1, 0.0, 0.3), (0.6, 0.8, 3, 0.6667, 0.7), (0.8, 1.0, 4, 0.75, 0.9)]
    assert b.ece(bins) == {"value": 0.125, "n": 8, "binning": "5 equal-width bins on [0, 1]"}
    assert b.ece([]) is None
