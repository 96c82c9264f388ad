"""Smoke-test helpers: check a /v1/systemone answer against its questions, and format the fleet table."""

from __future__ import annotations

from typing import Any

TOLERANCE = 1e-3


def _options(question: dict[str, Any]) -> list[str]:
    kind = question["type"]
    if kind == "choice":
        return list(question["criteria"])
    if kind == "noul":
        return ["true", "false"]
    return list(question["criteria"])


def decision_problems(
    response: Any, questions: dict[str, dict[str, Any]], expected_choice: dict[str, str] | None = None
) -> list[str]:
    """Everything wrong with a structured-decision response; [] when its shape is right and every expected
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
        probs = answer.get("probabilities")
        options = _options(question)
        if not isinstance(probs, dict) or sorted(probs) != sorted(options):
            problems.append(f"{qid}: probabilities {probs!r:.120} do not cover exactly {options}")
        elif abs(sum(float(v) for v in probs.values()) - 1.0) > TOLERANCE:
            problems.append(f"{qid}: probabilities sum to {sum(float(v) for v in probs.values()):.4f}, not 1")
        confidence = answer.get("confidence")
        if not isinstance(confidence, int | float) or not 0.0 <= confidence <= 1.0:
            problems.append(f"{qid}: confidence {confidence!r} is not in [0, 1]")
        value = answer.get(kind)
        if kind == "choice" and value not in options:
            problems.append(f"{qid}: choice {value!r} is not one of {options}")
        elif kind == "choice" and (expected_choice or {}).get(qid, value) != value:
            problems.append(f"{qid}: chose {value!r}, expected {expected_choice[qid]!r}")
        if kind in ("noul", "score") and (not isinstance(value, int | float) or not 0.0 <= value <= 1.0):
            problems.append(f"{qid}: {kind} {value!r} is not in [0, 1]")
    return problems


def smoke_table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per instance: host, instance, model, digest, health, latencies next to the field report's."""
    header = ("host", "instance", "model", "digest", "health", "2q ms", "4q ms", "field report 2q/4q ms")
    table = [header]
    for r in rows:
        base = r.get("baseline") or {}
        table.append(
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
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]


class FilterModule:
    """Ansible filters: d3_decision_problems, d3_smoke_table."""

    def filters(self) -> dict[str, Any]:
        return {"d3_decision_problems": decision_problems, "d3_smoke_table": smoke_table}
