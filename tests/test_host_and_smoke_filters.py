"""Unit tests for the preflight (d3_host) and smoke (d3_smoke) filters."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from d3_host import apt_candidate, df_line, download_bytes, upstream_version
from d3_smoke import decision_problems, smoke_table

QUESTIONS: dict[str, Any] = {
    "team": {"type": "choice", "instructions": "?", "criteria": {"billing": None, "shipping": None}},
    "urgent": {"type": "noul", "instructions": "?"},
    "tone": {"type": "score", "instructions": "?", "criteria": ["calm", "annoyed", "furious"]},
}
GOOD: dict[str, Any] = {
    "object": "structured_decision",
    "answers": {
        "team": {"type": "choice", "choice": "billing", "probabilities": {"billing": 0.8, "shipping": 0.2}, "confidence": 0.8},
        "urgent": {"type": "noul", "noul": 0.3, "probabilities": {"true": 0.3, "false": 0.7}, "confidence": 0.7},
        "tone": {
            "type": "score",
            "score": 0.4,
            "probabilities": {"calm": 0.3, "annoyed": 0.6, "furious": 0.1},
            "confidence": 0.6,
            "legend": {"calm": 0.0, "annoyed": 0.5, "furious": 1.0},
        },
    },
}


def test_good_decision_has_no_problems() -> None:
    assert decision_problems(GOOD, QUESTIONS, {"team": "billing"}) == []


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("object",), "chat.completion", "expected 'structured_decision'"),
        (("answers", "team", "choice"), "legal", "not one of"),
        (("answers", "team", "probabilities"), {"billing": 0.7, "shipping": 0.2}, "sum to 0.9000"),
        (("answers", "urgent", "confidence"), 1.5, "confidence 1.5"),
        (("answers", "tone", "score"), -0.1, "score -0.1"),
        (("answers", "tone", "type"), "noul", "expected 'score'"),
        (("answers", "tone", "probabilities"), {"calm": 1.0}, "do not cover exactly"),
    ],
)
def test_each_shape_problem_is_reported(path: tuple[str, ...], value: Any, needle: str) -> None:
    bad = copy.deepcopy(GOOD)
    node = bad
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    problems = decision_problems(bad, QUESTIONS)
    assert any(needle in p for p in problems), problems


def test_missing_answer_and_wrong_choice() -> None:
    bad = copy.deepcopy(GOOD)
    del bad["answers"]["urgent"]
    assert decision_problems(bad, QUESTIONS) == ["urgent: no answer"]
    assert decision_problems(GOOD, QUESTIONS, {"team": "shipping"}) == ["team: chose 'billing', expected 'shipping'"]
    assert decision_problems("oops", QUESTIONS)[0].startswith("response is not a JSON object")


def test_smoke_table_aligns_columns() -> None:
    rows = [
        {"host": "h1", "instance": "d3-27b", "model": "d3", "digest": "sha256:" + "a" * 64, "health": "ready",
         "q2_ms": 12, "q4_ms": 20, "baseline": {"q2": 240, "q4": 470}},
        {"host": "h2", "instance": "d3-mini", "model": "d3-mini", "digest": "sha256:" + "b" * 64, "health": "ready"},
    ]  # fmt: skip
    lines = smoke_table(rows)
    assert lines[0].split() == ["host", "instance", "model", "digest", "health", "2q", "ms", "4q", "ms", "field", "report", "2q/4q", "ms"]
    assert lines[1].split() == ["h1", "d3-27b", "d3", "sha256:aaaaaaaaaaaa", "ready", "12", "20", "240/470"]
    assert lines[2].split()[-3:] == ["-", "-", "-/-"]
    assert len({line.index("d3") for line in lines[1:]}) == 1


def test_df_line() -> None:
    assert df_line("/var/lib 123456") == {"mount": "/var/lib", "size_available": 123456}
    assert df_line("/mnt/my disk 7") == {"mount": "/mnt/my disk", "size_available": 7}
    with pytest.raises(ValueError, match="cannot read free space"):
        df_line("garbage")


def test_apt_candidate_and_upstream_version() -> None:
    policy = "podman:\n  Installed: (none)\n  Candidate: 4.3.1+ds1-8+deb12u1+b3\n  Version table:\n"
    assert apt_candidate(policy) == "4.3.1"
    assert apt_candidate("podman:\n  Installed: (none)\n  Candidate: (none)\n") == ""
    assert upstream_version("1:5.4.2+ds1-2+b2") == "5.4.2"


def test_download_bytes_prefers_hub_sizes(catalog_vars: dict[str, Any]) -> None:
    item = {"item": {"item": {"hf_repo": "vllm-sr/d3"}}}
    tree = [
        {"type": "file", "path": "a", "size": 10},
        {"type": "directory", "path": "d", "size": 0},
        {"type": "file", "path": "d/b", "size": 32},
    ]
    assert download_bytes({**item, "json": tree}, catalog_vars["d3_catalog"]) == 42
    assert download_bytes({**item, "json": [{"type": "file", "path": "a"}]}, catalog_vars["d3_catalog"]) == 52_200_000_000
    assert download_bytes({**item, "status": -1}, catalog_vars["d3_catalog"]) == 52_200_000_000
