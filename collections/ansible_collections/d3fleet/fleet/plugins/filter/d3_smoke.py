"""Smoke-test helpers: check a /v1/systemone answer against its questions, and format the fleet table.

The answer shapes are vLLM's (tests/contracts/vllm/systemone-response.json names the source:
vllm/entrypoints/generate/structured_decisions/question_types.py). What the System One wire format does not
require (a noul's `probabilities` and `confidence`) is checked only when present.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_table import table

TOLERANCE = 1e-3


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_probabilities(qid: str, probs: Any, keys: list[str], problems: list[str]) -> dict[str, float] | None:
    """Probabilities keyed exactly by `keys`, each in [0, 1], summing to 1; the dict when they are."""
    if not isinstance(probs, dict) or sorted(probs) != sorted(keys):
        problems.append(f"{qid}: probabilities {probs!r:.120} are not keyed exactly by {keys}")
        return None
    if not all(_number(v) and 0.0 <= v <= 1.0 for v in probs.values()):
        problems.append(f"{qid}: probabilities {probs!r:.120} are not all numbers in [0, 1]")
        return None
    total = sum(probs.values())
    if abs(total - 1.0) > TOLERANCE:
        problems.append(f"{qid}: probabilities sum to {total:.4f}, not 1")
        return None
    return probs


def _check_choice(qid: str, question: dict[str, Any], answer: dict[str, Any], expected: str | None) -> list[str]:
    problems: list[str] = []
    options = [str(o) for o in question["criteria"]]
    value = answer.get("choice")
    if value not in options:
        problems.append(f"{qid}: choice {value!r} is not one of {options}")
    elif expected is not None and value != expected:
        problems.append(f"{qid}: chose {value!r}, expected {expected!r}")
    _check_probabilities(qid, answer.get("probabilities"), options, problems)
    return problems


def _check_noul(qid: str, answer: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    value = answer.get("noul")
    if not _number(value) or not 0.0 <= value <= 1.0:
        problems.append(f"{qid}: noul {value!r} is not a probability of yes in [0, 1]")
        return problems
    if "probabilities" in answer:
        probs = _check_probabilities(qid, answer["probabilities"], ["yes", "no"], problems)
        if probs is not None and abs(probs["yes"] - value) > TOLERANCE:
            problems.append(f"{qid}: probabilities.yes {probs['yes']} differs from noul {value}")
    return problems


def _check_score(qid: str, question: dict[str, Any], answer: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    levels = [str(level) for level in question["criteria"]]
    indices = [str(i) for i in range(len(levels))]
    legend = answer.get("legend")
    if legend != dict(zip(indices, levels, strict=True)):
        problems.append(f"{qid}: legend {legend!r:.120} does not map 0..{len(levels) - 1} to the levels {levels}")
    value = answer.get("score")
    if not _number(value) or not 0.0 <= value <= len(levels) - 1:
        problems.append(f"{qid}: score {value!r} is not a level index in [0, {len(levels) - 1}]")
        return problems
    probs = _check_probabilities(qid, answer.get("probabilities"), indices, problems)
    if probs is not None:
        expected = sum(int(i) * p for i, p in probs.items())
        if abs(expected - value) > TOLERANCE * len(levels):
            problems.append(f"{qid}: score {value} is not the expected index {expected:.4f} of its probabilities")
    return problems


def decision_problems(
    response: Any, questions: dict[str, dict[str, Any]], expected_choice: dict[str, str] | None = None
) -> list[str]:
    """Everything wrong with a structured-decision response; [] when its shape is vLLM's and every expected
    choice was picked."""
    if not isinstance(response, dict):
        return [f"response is not a JSON object: {response!r:.200}"]
    problems: list[str] = []
    if response.get("object") != "structured_decision":
        problems.append(f"object is {response.get('object')!r}, expected 'structured_decision'")
    answers = response.get("answers")
    if not isinstance(answers, dict):
        return [*problems, "no answers object"]
    for qid, question in questions.items():
        answer = answers.get(qid)
        if not isinstance(answer, dict):
            problems.append(f"{qid}: no answer")
            continue
        kind = question["type"]
        if answer.get("type") != kind:
            problems.append(f"{qid}: type {answer.get('type')!r}, expected {kind!r}")
            continue
        if "confidence" in answer and not (_number(answer["confidence"]) and 0.0 <= answer["confidence"] <= 1.0):
            problems.append(f"{qid}: confidence {answer['confidence']!r} is not in [0, 1]")
        if kind == "choice":
            problems += _check_choice(qid, question, answer, (expected_choice or {}).get(qid))
        elif kind == "noul":
            problems += _check_noul(qid, answer)
        elif kind == "score":
            problems += _check_score(qid, question, answer)
        else:
            problems.append(f"{qid}: question type {kind!r} is not one of choice, noul, score")
    return problems


def probe_rows(
    health: list[dict[str, Any]], decisions: list[dict[str, Any]], questions: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per probed instance from the d3_smoke role's probe.yml results: /health status, the decision's
    status, latency and shape problems (checked like the smoke test)."""
    by_name = {d["item"]["item"]["name"]: d for d in decisions if not d.get("skipped")}
    rows = []
    for h in health:
        name = h["item"]["name"]
        d = by_name.get(name, {})
        status = d.get("status")
        rows.append(
            {
                "name": name,
                "health": h.get("status"),
                "decision": status,
                "elapsed_ms": d.get("elapsed_ms") if status == 200 else None,
                "problems": decision_problems(d.get("json"), questions) if status == 200 else [],
            }
        )
    return rows


def smoke_table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per instance: host, instance, model, digest, health, latencies next to the field report's."""
    header = ("host", "instance", "model", "digest", "health", "2q ms", "4q ms", "field report 2q/4q ms")
    lines = []
    for r in rows:
        base = r.get("baseline") or {}
        lines.append(
            (
                str(r["host"]),
                str(r["instance"]),
                str(r["model"]),
                str(r.get("digest", ""))[:19],
                str(r["health"]),
                str(r.get("q2_ms", "-")),
                str(r.get("q4_ms", "-")),
                f"{base.get('q2', '-')}/{base.get('q4', '-')}",
            )
        )
    return table(header, lines)


class FilterModule:
    """Ansible filters: d3_decision_problems, d3_probe_rows, d3_smoke_table."""

    def filters(self) -> dict[str, Any]:
        return {"d3_decision_problems": decision_problems, "d3_probe_rows": probe_rows, "d3_smoke_table": smoke_table}
