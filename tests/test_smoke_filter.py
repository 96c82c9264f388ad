"""Unit tests of the smoke filter (d3fleet.fleet plugins/filter/d3_smoke.py) beyond tests/contracts/: the exact problem
messages, the bounds of each answer type, probe rows, and the fleet table's alignment."""

from __future__ import annotations

from typing import Any

import pytest
from d3_smoke import FilterModule, decision_problems, probe_rows, smoke_table

QUESTIONS = {
    "team": {"type": "choice", "criteria": {"billing": "payments", "shipping": "deliveries"}},
    "urgent": {"type": "noul"},
    "tone": {"type": "score", "criteria": ["calm", "annoyed", "furious"]},
}
LEGEND = {"0": "calm", "1": "annoyed", "2": "furious"}
GOOD = {
    "team": {"type": "choice", "choice": "billing", "probabilities": {"billing": 0.9, "shipping": 0.1}},
    "urgent": {"type": "noul", "noul": 0.62, "probabilities": {"yes": 0.62, "no": 0.38}},
    "tone": {"type": "score", "score": 1.1, "legend": LEGEND, "probabilities": {"0": 0.2, "1": 0.5, "2": 0.3}},
}


def problems(**answers: Any) -> list[str]:
    return decision_problems({"object": "structured_decision", "answers": {**GOOD, **answers}}, QUESTIONS)


def test_the_good_answer_has_no_problems() -> None:
    assert problems() == []


def test_envelope_problems() -> None:
    assert decision_problems({"object": "chat.completion", "answers": GOOD}, QUESTIONS) == [
        "object is 'chat.completion', expected 'structured_decision'"]
    assert decision_problems({"object": "structured_decision"}, QUESTIONS) == ["no answers object"]
    assert decision_problems({"answers": []}, QUESTIONS) == ["object is None, expected 'structured_decision'", "no answers object"]
    assert decision_problems("oops", QUESTIONS) == ["response is not a JSON object: 'oops'"]


def test_every_question_is_checked_after_a_missing_or_mistyped_answer() -> None:
    answers = {"tone": {**GOOD["tone"], "type": "noul"}}
    assert decision_problems({"object": "structured_decision", "answers": answers}, QUESTIONS) == [
        "team: no answer", "urgent: no answer", "tone: type 'noul', expected 'score'"]
    answers = {"team": {"type": "score"}, "urgent": {"noul": 0.5}, "tone": GOOD["tone"]}
    assert decision_problems({"object": "structured_decision", "answers": answers}, QUESTIONS) == [
        "team: type 'score', expected 'choice'", "urgent: type None, expected 'noul'"]
    odd = {"q": {"type": "rank"}}
    assert decision_problems({"object": "structured_decision", "answers": {"q": {"type": "rank"}}}, odd) == [
        "q: question type 'rank' is not one of choice, noul, score"]


def test_choice_problems() -> None:
    assert problems(team={"type": "choice", "choice": "sales", "probabilities": {"billing": 1.0, "shipping": 0.0}}) == [
        "team: choice 'sales' is not one of ['billing', 'shipping']"]
    assert problems(team={"type": "choice", "choice": "billing", "probabilities": {"billing": 1.0}}) == [
        "team: probabilities {'billing': 1.0} are not keyed exactly by ['billing', 'shipping']"]
    wrong = decision_problems({"object": "structured_decision", "answers": GOOD}, QUESTIONS, {"team": "shipping"})
    assert wrong == ["team: chose 'billing', expected 'shipping'"]


@pytest.mark.parametrize("value", [0.0, 1.0, 0, 1])
def test_noul_bounds_are_inclusive(value: float) -> None:
    assert problems(urgent={"type": "noul", "noul": value, "confidence": value}) == []


def test_noul_problems() -> None:
    assert problems(urgent={"type": "noul", "noul": 1.5}) == ["urgent: noul 1.5 is not a probability of yes in [0, 1]"]
    assert problems(urgent={"type": "noul", "noul": True}) == ["urgent: noul True is not a probability of yes in [0, 1]"]
    # exactly TOLERANCE apart is still the same probability
    assert problems(urgent={"type": "noul", "noul": 0.0, "probabilities": {"yes": 0.001, "no": 0.999}}) == []
    assert problems(urgent={"type": "noul", "noul": 0.5, "probabilities": {"yes": 0.6, "no": 0.4}}) == [
        "urgent: probabilities.yes 0.6 differs from noul 0.5"]


def test_probability_problems() -> None:
    assert problems(urgent={"type": "noul", "noul": 1.0, "probabilities": {"yes": 1.5, "no": 0}}) == [
        "urgent: probabilities {'yes': 1.5, 'no': 0} are not all numbers in [0, 1]"]
    assert problems(urgent={"type": "noul", "noul": 0.6, "probabilities": {"yes": 0.6, "no": 0.6}}) == [
        "urgent: probabilities sum to 1.2000, not 1"]


def test_confidence_bounds() -> None:
    for value in (0.0, 1.0):
        assert problems(team={**GOOD["team"], "confidence": value}) == []
    assert problems(team={**GOOD["team"], "confidence": 1.2}) == ["team: confidence 1.2 is not in [0, 1]"]


def test_score_bounds_and_tolerance() -> None:
    lowest = {"type": "score", "legend": LEGEND, "probabilities": {"0": 1.0, "1": 0.0, "2": 0.0}}
    assert problems(tone={**lowest, "score": 0.0}) == []
    assert problems(tone={**lowest, "score": 0.003}) == []  # TOLERANCE per level, 3 levels
    assert problems(tone={**lowest, "score": 0.004}) == ["tone: score 0.004 is not the expected index 0.0000 of its probabilities"]
    highest = {"type": "score", "legend": LEGEND, "probabilities": {"0": 0.0, "1": 0.0, "2": 1.0}}
    assert problems(tone={**highest, "score": 2}) == []
    assert problems(tone={**highest, "score": 3}) == ["tone: score 3 is not a level index in [0, 2]"]
    assert problems(tone={**highest, "score": 2, "legend": {"1": "calm"}}) == [
        "tone: legend {'1': 'calm'} does not map 0..2 to the levels ['calm', 'annoyed', 'furious']"]


def test_probe_rows() -> None:
    health = [{"item": {"name": "a"}, "status": 200}, {"item": {"name": "b"}, "status": 200}, {"item": {"name": "c"}, "status": -1}]
    good = {"object": "structured_decision", "answers": GOOD}
    decisions = [
        {"item": {"item": {"name": "a"}}, "status": 200, "json": good, "elapsed_ms": 12.5},
        {"item": {"item": {"name": "b"}}, "status": 200, "json": {"answers": GOOD}, "elapsed_ms": 9.0},
        {"skipped": True, "item": {"item": {"name": "c"}}, "status": 200, "elapsed_ms": 1.0},
    ]
    assert probe_rows(health, decisions, QUESTIONS) == [
        {"name": "a", "health": 200, "decision": 200, "elapsed_ms": 12.5, "problems": []},
        {"name": "b", "health": 200, "decision": 200, "elapsed_ms": 9.0,
         "problems": ["object is None, expected 'structured_decision'"]},
        {"name": "c", "health": -1, "decision": None, "elapsed_ms": None, "problems": []},
    ]
    refused = [{"item": {"item": {"name": "a"}}, "status": 401, "json": {"error": "x"}, "elapsed_ms": 3.0}]
    assert probe_rows(health[:1], refused, QUESTIONS) == [
        {"name": "a", "health": 200, "decision": 401, "elapsed_ms": None, "problems": []}]


def test_smoke_table_lines_exactly() -> None:
    rows = [
        {"host": "h1", "instance": "d3-27b", "model": "d3", "digest": "sha256:" + "a" * 64, "health": "ready",
         "q2_ms": 12, "q4_ms": 20, "baseline": {"q2": 240, "q4": 470}},
        {"host": "host-22", "instance": "x", "model": "d3-mini", "health": "down"},
    ]
    assert smoke_table(rows) == [
        "host     instance  model    digest               health  2q ms  4q ms  field report 2q/4q ms",
        "h1       d3-27b    d3       sha256:aaaaaaaaaaaa  ready   12     20     240/470",
        "host-22  x         d3-mini                       down    -      -      -/-",
    ]


def test_filter_plugin_exports() -> None:
    assert FilterModule().filters() == {"d3_decision_problems": decision_problems, "d3_probe_rows": probe_rows,
                                        "d3_smoke_table": smoke_table}
