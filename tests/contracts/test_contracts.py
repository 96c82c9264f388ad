"""The production side of each contract in tests/contracts/: the smoke check accepts exactly vLLM's answer
shapes (and the System One minimum), refuses the shapes the lab once invented, and the roles' version facts
agree with versions.yml."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from d3_smoke import decision_problems, probe_rows
from d3_status import status_rows

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def load(name: str) -> dict[str, Any]:
    return json.loads((HERE / name).read_text())


REQUEST = load("vllm/systemone-request.json")
QUESTIONS = REQUEST["questions"]
RESPONSE = load("vllm/systemone-response.json")


def test_every_fixture_names_its_source() -> None:
    for path in sorted(HERE.rglob("*.json")):
        assert load(str(path.relative_to(HERE))).get("_source"), path
    assert all(v.get("_source") for v in yaml.safe_load((HERE / "versions.yml").read_text()).values())


def test_the_vllm_answer_passes_the_smoke_check() -> None:
    assert decision_problems(RESPONSE, QUESTIONS, {"team": "billing"}) == []


def test_the_system_one_minimum_passes_the_smoke_check() -> None:
    assert decision_problems(load("vllm/systemone-response-minimal.json"), QUESTIONS) == []


def test_the_fixture_answer_follows_vllms_formulas() -> None:
    """The worked numbers in the fixture are vLLM's formulas applied to its probabilities."""
    answers, diag = RESPONSE["answers"], RESPONSE["diagnostics"]
    team = answers["team"]
    assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert team["confidence"] == pytest.approx(team["probabilities"][team["choice"]] * diag["team"]["label_mass"])
    urgent = answers["urgent"]
    assert urgent["probabilities"] == {"yes": urgent["noul"], "no": pytest.approx(1 - urgent["noul"])}
    tone = answers["tone"]
    assert tone["score"] == pytest.approx(sum(int(i) * p for i, p in tone["probabilities"].items()))
    assert tone["legend"] == {str(i): level for i, level in enumerate(QUESTIONS["tone"]["criteria"])}


@pytest.mark.parametrize("name", sorted(p.name for p in (HERE / "invented").glob("*.json")))
def test_each_invented_shape_is_refused(name: str) -> None:
    fixture = load(f"invented/{name}")
    bad = copy.deepcopy(RESPONSE)
    bad["answers"][fixture["question"]] = fixture["answer"]
    problems = decision_problems(bad, QUESTIONS)
    assert problems and all(p.startswith(f"{fixture['question']}: ") for p in problems), problems


def _with(path: tuple[str, ...], value: Any, base: dict[str, Any] = RESPONSE) -> dict[str, Any]:
    bad = copy.deepcopy(base)
    node = bad
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return bad


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("object",), "chat.completion", "expected 'structured_decision'"),
        (("answers",), [], "no answers object"),
        (("answers", "team", "choice"), "legal", "choice 'legal' is not one of"),
        (("answers", "team", "probabilities"), {"billing": 0.7, "shipping": 0.2, "security": 0.0}, "sum to 0.9000"),
        (("answers", "team", "probabilities"), {"A": 0.9, "B": 0.06, "C": 0.04}, "not keyed exactly"),
        (("answers", "team", "probabilities"), {"billing": 1.2, "shipping": -0.2, "security": 0.0}, "not all numbers"),
        (("answers", "team", "probabilities"), KeyError, "not keyed exactly"),
        (("answers", "team", "confidence"), 1.5, "confidence 1.5"),
        (("answers", "team", "confidence"), True, "confidence True"),
        (("answers", "urgent", "noul"), 1.2, "noul 1.2"),
        (("answers", "urgent", "noul"), True, "noul True"),
        (("answers", "urgent", "noul"), KeyError, "noul None"),
        (("answers", "urgent", "probabilities"), {"yes": 0.5, "no": 0.5}, "differs from noul"),
        (("answers", "urgent", "probabilities"), {"yes": 0.62}, "not keyed exactly"),
        (("answers", "tone", "score"), -0.1, "score -0.1"),
        (("answers", "tone", "score"), 2.01, "score 2.01"),
        (("answers", "tone", "score"), 0.5, "not the expected index"),
        (("answers", "tone", "score"), "1", "score '1'"),
        (("answers", "tone", "legend"), KeyError, "legend None"),
        (("answers", "tone", "legend"), {"0": "calm", "1": "annoyed"}, "does not map 0..2"),
        (("answers", "tone", "probabilities"), {"0": 1.0}, "not keyed exactly"),
        (("answers", "tone", "type"), "noul", "expected 'score'"),
    ],
)
def test_each_shape_problem_is_named(path: tuple[str, ...], value: Any, needle: str) -> None:
    problems = decision_problems(_with(path, value), QUESTIONS)
    assert any(needle in p for p in problems), problems


def test_a_score_of_the_last_index_is_accepted() -> None:
    ok = _with(("answers", "tone"), {"type": "score", "score": 2.0, "legend": RESPONSE["answers"]["tone"]["legend"],
                                       "probabilities": {"0": 0.0, "1": 0.0, "2": 1.0}})
    assert decision_problems(ok, QUESTIONS) == []


def test_missing_answer_wrong_choice_and_non_object() -> None:
    assert decision_problems(_with(("answers", "urgent"), KeyError), QUESTIONS) == ["urgent: no answer"]
    assert decision_problems(RESPONSE, QUESTIONS, {"team": "shipping"}) == ["team: chose 'billing', expected 'shipping'"]
    assert decision_problems("oops", QUESTIONS)[0].startswith("response is not a JSON object")
    odd = {"q": {"type": "rank", "instructions": "?", "criteria": None}}
    assert decision_problems({"object": "structured_decision", "answers": {"q": {"type": "rank"}}}, odd) == [
        "q: question type 'rank' is not one of choice, noul, score"
    ]


def test_the_smoke_role_asks_the_fixture_questions() -> None:
    """The smoke role's questions are the contract request's questions (so the fixture answer is its answer)."""
    defaults = yaml.safe_load((ROOT / "roles/d3_smoke/defaults/main.yml").read_text())
    assert defaults["d3_smoke_questions"] == QUESTIONS
    assert defaults["d3_smoke_state"] == REQUEST["state"]


def _probe(response: Any, status: int = 200, health: int = 200) -> list[dict[str, Any]]:
    instance = {"name": "d3-mini", "port": 8000}
    two = dict(list(QUESTIONS.items())[:2])
    health_results = [{"item": instance, "status": health}]
    decisions = [{"item": {"item": instance}, "status": status, "json": response, "elapsed_ms": 12.5}]
    return probe_rows(health_results, decisions if health == 200 else [{"skipped": True}], two)


def test_the_status_probe_reads_the_vllm_answer_as_ready() -> None:
    rows = _probe(RESPONSE)
    assert rows == [{"name": "d3-mini", "health": 200, "decision": 200, "elapsed_ms": 12.5, "problems": []}]
    plan = {"instances": [{"name": "d3-mini", "model": "d3-mini", "revision": None}]}
    (row,) = status_rows(plan, "h", [], rows, "")
    assert (row["health"], row["smoke_ms"]) == ("ready", 12.5)


@pytest.mark.parametrize("name", ["noul-true-false-keys.json"])
def test_the_status_probe_reports_an_invented_shape(name: str) -> None:
    fixture = load(f"invented/{name}")
    bad = copy.deepcopy(RESPONSE)
    bad["answers"][fixture["question"]] = fixture["answer"]
    (row,) = _probe(bad)
    assert row["problems"] and row["problems"][0].startswith("urgent: ")
    plan = {"instances": [{"name": "d3-mini", "model": "d3-mini", "revision": None}]}
    assert status_rows(plan, "h", [], [row], "")[0]["health"].startswith("bad answer: urgent: ")


def test_the_status_probe_reports_down_and_refused_decisions() -> None:
    plan = {"instances": [{"name": "d3-mini", "model": "d3-mini", "revision": None}]}
    down = _probe(None, health=-1)
    assert down[0]["decision"] is None and status_rows(plan, "h", [], down, "")[0]["health"] == "down (-1)"
    unauthorized = load("vllm/unauthorized.json")
    refused = _probe(unauthorized["body"], status=unauthorized["status"])
    assert refused[0]["problems"] == [] and refused[0]["elapsed_ms"] is None
    assert status_rows(plan, "h", [], refused, "")[0]["health"] == "no decision (401)"
