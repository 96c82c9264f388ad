"""Bench (playbooks/bench.yml) on the controller: the decision suite turned into requests, the answers scored, the
report assembled and printed like the field report's tables.

Suite format (d3-bench-suite/1, YAML): `questions` (id -> a System One question: type choice|noul|score,
instructions, criteria), `cases` (each: `id`, `state`, optional `instructions`, optional case-only `questions`, and
`expect`: question id -> the right answer: an option for choice, true/false for noul, a level for score; a case asks
exactly the questions its `expect` names, in that order), and `latency` (`state` and four question ids: the
2-question request asks the first two, the 4-question request all four). Example: roles/d3_bench/files/suites/.

Scoring: choice and noul are right when the answer is the expected one (noul: P(yes) >= 0.5 means yes); a score is
right when its expected level index is within half a level of the expected level. The confidence of an answer is
the probability the model gave to the answer it gave (choice: its option's probability; noul: max(P(yes), P(no));
score: the probability of the level nearest its score). Brier score = mean over answered questions of
(confidence - 1 if right else 0)^2 (0 is perfect; always answering with confidence 0.5 gives 0.25). A question whose
request failed, or whose answer is malformed, counts as wrong and has no confidence.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_table import table as _grid

SUITE_FORMAT = "d3-bench-suite/1"
REPORT_FORMAT = "d3-bench/1"
TYPES = ("choice", "noul", "score")


# ------------------------------------------------------------------------------------------------- the suite
def _question_problems(qid: str, q: Any) -> list[str]:
    if not isinstance(q, dict):
        return [f"question {qid!r} is not a mapping"]
    problems = []
    if q.get("type") not in TYPES:
        problems.append(f"question {qid!r}: type {q.get('type')!r} is not one of {', '.join(TYPES)}")
    if not isinstance(q.get("instructions"), str) or not q["instructions"].strip():
        problems.append(f"question {qid!r}: instructions must be a non-empty string")
    crit = q.get("criteria")
    if q.get("type") == "choice" and not (isinstance(crit, dict) and len(crit) >= 2):
        problems.append(f"question {qid!r}: a choice needs criteria with at least two options")
    if q.get("type") == "score" and not (isinstance(crit, list) and len(crit) >= 2):
        problems.append(f"question {qid!r}: a score needs criteria, a list of at least two levels")
    return problems


def _expect_problem(where: str, q: dict[str, Any], expected: Any) -> str | None:
    kind = q.get("type")
    if kind == "choice" and str(expected) not in [str(o) for o in q.get("criteria") or {}]:
        return f"{where}: expects {expected!r}, not one of the options {list(q.get('criteria') or {})}"
    if kind == "noul" and not isinstance(expected, bool):
        return f"{where}: a noul expects true or false, not {expected!r}"
    if kind == "score" and str(expected) not in [str(lv) for lv in q.get("criteria") or []]:
        return f"{where}: expects {expected!r}, not one of the levels {q.get('criteria')}"
    return None


def suite_problems(suite: Any) -> list[str]:
    """Everything wrong with a decision suite; [] when it can be run."""
    if not isinstance(suite, dict):
        return ["the suite is not a mapping"]
    problems: list[str] = []
    if suite.get("format") != SUITE_FORMAT:
        problems.append(f"format is {suite.get('format')!r}, expected {SUITE_FORMAT!r}")
    shared = suite.get("questions") or {}
    if not isinstance(shared, dict):
        return [*problems, "questions must be a mapping of id -> question"]
    for qid, q in shared.items():
        problems += _question_problems(qid, q)
    cases = suite.get("cases")
    if not isinstance(cases, list) or not cases:
        return [*problems, "cases must be a non-empty list"]
    seen: set[str] = set()
    for n, case in enumerate(cases):
        if not isinstance(case, dict) or not case.get("id"):
            problems.append(f"case #{n + 1} has no id")
            continue
        cid = str(case["id"])
        if cid in seen:
            problems.append(f"case {cid!r} appears twice")
        seen.add(cid)
        if not isinstance(case.get("state"), str | dict | list) or not case.get("state"):
            problems.append(f"case {cid!r}: state must be a non-empty string or JSON")
        own = case.get("questions") or {}
        for qid, q in own.items() if isinstance(own, dict) else []:
            problems += _question_problems(f"{cid}.{qid}", q)
        expect = case.get("expect")
        if not isinstance(expect, dict) or not expect:
            problems.append(f"case {cid!r}: expect must name at least one question and its right answer")
            continue
        for qid, expected in expect.items():
            q = (own if isinstance(own, dict) else {}).get(qid, shared.get(qid))
            if q is None:
                problems.append(f"case {cid!r}: question {qid!r} is defined neither in the case nor in questions")
            elif isinstance(q, dict):
                problem = _expect_problem(f"case {cid!r} question {qid!r}", q, expected)
                if problem:
                    problems.append(problem)
    lat = suite.get("latency")
    if not isinstance(lat, dict) or not lat.get("state"):
        problems.append("latency must give a state and four question ids")
    else:
        ids = lat.get("questions")
        if not isinstance(ids, list) or len(ids) != 4 or len(set(map(str, ids))) != 4:
            problems.append(f"latency.questions must list four distinct question ids, not {ids!r}")
        else:
            problems += [f"latency: question {q!r} is not in questions" for q in ids if q not in shared]
    return problems


def _case_questions(suite: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    own = case.get("questions") or {}
    return {qid: own.get(qid, suite["questions"].get(qid)) for qid in case["expect"]}


def bench_requests(suite: Any) -> dict[str, Any]:
    """The request bodies of a suite (without `model`): `cases` [{id, body}] and `latency_requests`
    [{label: q2, body}, {label: q4, body}]. Fails listing every problem of an invalid suite."""
    problems = suite_problems(suite)
    if problems:
        raise AnsibleFilterError("the decision suite cannot be run: " + "; ".join(problems))
    cases = []
    for case in suite["cases"]:
        body = {"state": case["state"], "questions": _case_questions(suite, case)}
        if case.get("instructions"):
            body["instructions"] = case["instructions"]
        cases.append({"id": str(case["id"]), "body": body})
    ids = suite["latency"]["questions"]
    latency = [
        {"label": label, "body": {"state": suite["latency"]["state"], "questions": {q: suite["questions"][q] for q in ids[:n]}}}
        for label, n in (("q2", 2), ("q4", 4))
    ]
    return {"cases": cases, "latency_requests": latency}


def bench_targets(instances: list[dict[str, Any]], address: str = "") -> list[dict[str, str]]:
    """bench_load targets for a host's planned instances: {name, url, model (served name)}. The URL is the plan's
    (its health_url without /health: the address the instance listens on) unless `address` names another one
    (http://address:port; an IPv6 address is bracketed)."""
    targets = []
    for i in instances or []:
        if address:
            host = f"[{address}]" if ":" in str(address) and not str(address).startswith("[") else str(address)
            url = f"http://{host}:{i['port']}"
        else:
            url = str(i["health_url"]).removesuffix("/health")
        targets.append({"name": i["name"], "url": url, "model": i["served_model_name"]})
    return targets


# ------------------------------------------------------------------------------------------------- scoring
def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def judge(question: dict[str, Any], expected: Any, answer: Any) -> dict[str, Any]:
    """{given, correct, confidence} of one answer against the expected one (confidence None when malformed)."""
    kind = question["type"]
    bad = {"given": None, "correct": False, "confidence": None}
    if not isinstance(answer, dict):
        return bad
    probs = answer.get("probabilities") if isinstance(answer.get("probabilities"), dict) else {}
    if kind == "choice":
        given = answer.get("choice")
        if given is None:
            return bad
        conf = probs.get(given, answer.get("confidence"))
        return {"given": given, "correct": str(given) == str(expected), "confidence": conf if _num(conf) else None}
    if kind == "noul":
        p_yes = answer.get("noul")
        if not _num(p_yes):
            return bad
        given = p_yes >= 0.5
        return {"given": given, "correct": given == bool(expected), "confidence": p_yes if given else 1.0 - p_yes}
    levels = [str(lv) for lv in question["criteria"]]
    score = answer.get("score")
    if not _num(score):
        return bad
    nearest = min(len(levels) - 1, max(0, math.floor(score + 0.5)))
    conf = probs.get(str(nearest))
    return {
        "given": levels[nearest],
        "score": score,
        "correct": abs(score - levels.index(str(expected))) <= 0.5,
        "confidence": conf if _num(conf) else None,
    }


def score_cases(cases: list[dict[str, Any]], suite: dict[str, Any]) -> dict[str, Any]:
    """Accuracy and calibration of one instance from its recorded accuracy pass (bench_load's `cases`)."""
    by_id = {str(c.get("id")): c for c in cases or []}
    rows: list[dict[str, Any]] = []
    for case in suite["cases"]:
        cid = str(case["id"])
        got = by_id.get(cid) or {}
        answers = got.get("answers") if got.get("status") == 200 and isinstance(got.get("answers"), dict) else {}
        for qid, q in _case_questions(suite, case).items():
            verdict = judge(q, case["expect"][qid], answers.get(qid))
            rows.append({"case": cid, "question": qid, "type": q["type"], "expected": case["expect"][qid],
                         "tags": case.get("tags") or [], **verdict})
    right = [r for r in rows if r["correct"]]
    answered = [r for r in rows if r["confidence"] is not None]

    def mean(xs: list[float]) -> float | None:
        return round(sum(xs) / len(xs), 4) if xs else None

    by_type = {}
    for kind in TYPES:
        of_kind = [r for r in rows if r["type"] == kind]
        if of_kind:
            by_type[kind] = {"correct": sum(r["correct"] for r in of_kind), "total": len(of_kind)}
    return {
        "correct": len(right),
        "total": len(rows),
        "accuracy": round(len(right) / len(rows), 4) if rows else None,
        "by_type": by_type,
        "brier": mean([(r["confidence"] - (1.0 if r["correct"] else 0.0)) ** 2 for r in answered]),
        "confidence_right": mean([r["confidence"] for r in answered if r["correct"]]),
        "confidence_wrong": mean([r["confidence"] for r in answered if not r["correct"]]),
        "unanswered": len(rows) - len(answered),
        "failed_requests": sum(1 for c in suite["cases"] if (by_id.get(str(c["id"])) or {}).get("status") != 200),
        "questions": rows,
    }


# ------------------------------------------------------------------------------------------------- the report
def _memory(instance: dict[str, Any], gpus_now: list[dict[str, Any]], plan: dict[str, Any]) -> dict[str, Any]:
    """Per GPU of the instance: memory used now (nvidia-smi) and its planned budget; a GPU shared with other
    instances has its used memory attributed by the planned budgets."""
    now = {int(g["index"]): g for g in gpus_now or []}
    budgets = {int(g["index"]): g.get("budget") or [] for g in plan.get("gpus") or []}
    per_gpu, attributed, planned, known = [], 0.0, 0, False
    for idx in instance.get("gpus") or []:
        g = now.get(int(idx), {})
        shares = budgets.get(int(idx), [])
        mine = next((b["budget_mib"] for b in shares if b.get("instance") == instance["name"]), None)
        total_budget = sum(b["budget_mib"] for b in shares) or None
        used = g.get("memory_used_mib")
        per_gpu.append({"index": int(idx), "used_mib": used, "total_mib": g.get("memory_total_mib"), "budget_mib": mine,
                        "shared_with": [b["instance"] for b in shares if b.get("instance") != instance["name"]]})
        planned += mine or 0
        if used is not None:
            known = True
            attributed += used * (mine / total_budget) if mine and total_budget else used
    return {"per_gpu": per_gpu, "used_mib": round(attributed) if known else None, "budget_mib": planned or None}


def _is_simulated(version: str | None, markers: list[str]) -> bool:
    return any(m and m in (version or "") for m in markers)


def bench_report(
    hosts: list[dict[str, Any]],
    suite: dict[str, Any],
    catalog: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
    simulated_markers: list[str] | None = None,
    simulated: Any = None,
) -> dict[str, Any]:
    """The bench report (JSON) from every host's record: {host, plan (d3_host_plan), results (bench_load's results,
    planned instances first, then the host's extra endpoints), endpoints (the extra endpoints as declared), gpus
    (nvidia-smi after the load, nvidia_smi_query_gpus), image_ref}. `simulated`: true/false to force the label, None
    to decide from the servers' /version strings (one containing a marker is a simulator)."""
    catalog = catalog or {}
    markers = list(simulated_markers or [])
    instances = []
    for h in hosts:
        plan = h.get("plan") or {}
        planned = {i["name"]: i for i in plan.get("instances") or []}
        extra = {e["name"]: e for e in h.get("endpoints") or []}
        for res in h.get("results") or []:
            inst = planned.get(res["name"])
            model = inst["model"] if inst else str((extra.get(res["name"]) or {}).get("label") or res["model"])
            entry = {
                "host": h["host"],
                "name": res["name"],
                "kind": "planned" if inst else "extra",
                "model": model,
                "served_model_name": res["model"],
                "url": res["url"],
                "image_ref": h.get("image_ref") or "",
                "server_version": res.get("version") or "",
                "simulated": bool(simulated) if simulated is not None else _is_simulated(res.get("version"), markers),
                "health": res.get("health"),
                "gpu_count": len(inst["gpus"]) if inst else int((extra.get(res["name"]) or {}).get("gpus") or 0),
                "gpus": list(inst["gpus"]) if inst else [],
                "memory": _memory(inst, h.get("gpus") or [], plan) if inst else None,
                "decision_index": (catalog.get(model) or {}).get("decision_index",
                                                                 (extra.get(res["name"]) or {}).get("decision_index")),
                "score": score_cases(res.get("cases") or [], suite),
                "answers": res.get("cases") or [],
                "latency": res.get("latency") or {},
                "throughput": res.get("throughput") or [],
            }
            instances.append(entry)
    any_sim = any(i["simulated"] for i in instances)
    return {
        "format": REPORT_FORMAT,
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "simulated": any_sim,
        "label": "SIMULATED (lab stand-in): not a property of D3" if any_sim else "measured",
        "suite": {"name": suite.get("name"), "cases": len(suite["cases"]),
                  "questions": sum(len(c["expect"]) for c in suite["cases"])},
        "settings": settings or {},
        "instances": instances,
    }


# ------------------------------------------------------------------------------------------------- the table
def _ms(x: Any) -> str:
    return "-" if x is None else f"{x:.0f}"


def bench_table(report: dict[str, Any], published: dict[str, Any] | None = None) -> list[str]:
    """The report as the field report's two tables (latency; accuracy / 4q latency / extra GPUs / Decision
    Index), plus calibration, throughput per concurrency and memory; the published rows marked as such."""
    published = published or {}
    sim = report.get("simulated")
    tag = " [SIMULATED]" if sim else ""
    lines = []
    if sim:
        lines += ["SIMULATED: these endpoints are the lab's vLLM simulator (a stand-in); no figure below is a "
                  "property of D3.", ""]

    def who(i: dict[str, Any]) -> str:
        return f"{i['host']}/{i['name']} ({i['model']}){' [SIMULATED]' if i['simulated'] else ''}"

    insts = [i for i in report.get("instances") or [] if i.get("health") == 200]
    rows = [(who(i), *(f"{_ms((i['latency'].get(q) or {}).get('p50'))} / {_ms((i['latency'].get(q) or {}).get('p95'))} / "
                        f"{_ms((i['latency'].get(q) or {}).get('p99'))} ms" for q in ("q2", "q4"))) for i in insts]
    rows += [(f"{p['config']} [published: {p.get('source', 'field report')}]", f"~{p['q2_ms']}ms" if p.get("q2_ms") else "-",
              f"~{p['q4_ms']}ms" if p.get("q4_ms") else "-") for p in published.get("latency") or []]
    lines += [f"Latency{tag} (p50 / p95 / p99, one request at a time)"]
    lines += _grid(("Config", "2-question latency", "4-question latency"), rows)

    rows = []
    for i in insts:
        s = i["score"]
        rows.append((who(i), f"{s['correct']}/{s['total']}", f"{_ms((i['latency'].get('q4') or {}).get('p50'))}ms",
                     str(i["gpu_count"]), "-" if i["decision_index"] is None else str(i["decision_index"]),
                     "-" if s["brier"] is None else f"{s['brier']:.3f}",
                     "/".join("-" if s[k] is None else f"{s[k]:.2f}" for k in ("confidence_right", "confidence_wrong"))))
    rows += [(f"{p['model']} [published: {p.get('source', 'field report')}]", f"{p['correct']}/{p['total']}", f"{p['q4_ms']}ms",
              str(p.get("extra_gpus", "-")), str(p.get("decision_index", "-")), "-", "-") for p in published.get("accuracy") or []]
    lines += ["", f"Accuracy{tag} (suite {report['suite']['name']}: {report['suite']['cases']} cases, "
              f"{report['suite']['questions']} questions)"]
    lines += _grid(("Model", "Accuracy", "4q Latency", "GPUs", "Decision Index", "Brier", "conf right/wrong"), rows)

    levels = sorted({t["concurrency"] for i in insts for t in i["throughput"]})
    rows = []
    for i in insts:
        by = {t["concurrency"]: t for t in i["throughput"]}
        rows.append((who(i), *(f"{by[c]['requests_per_s']:.1f} req/s {by[c]['questions_per_s']:.0f} q/s "
                               f"p99 {_ms(by[c]['p99'])}ms err {by[c]['errors']}" if c in by else "-" for c in levels)))
    lines += ["", f"Throughput{tag} (closed loop, {report.get('settings', {}).get('duration_s', '?')} s per level, "
              "4-question requests)"]
    lines += _grid(("Instance", *(f"concurrency {c}" for c in levels)), rows)

    rows = [(who(i), ",".join(map(str, i["gpus"])) or "-",
             "-" if not i["memory"] or i["memory"]["used_mib"] is None else str(i["memory"]["used_mib"]),
             "-" if not i["memory"] or i["memory"]["budget_mib"] is None else str(i["memory"]["budget_mib"]),
             ", ".join(sorted({n for g in (i["memory"] or {}).get("per_gpu", []) for n in g["shared_with"]})) or "-")
            for i in insts]
    lines += ["", f"GPUs and memory{tag} (nvidia-smi after the load; a shared GPU's use split by planned budgets)"]
    lines += _grid(("Instance", "GPUs", "used MiB", "planned MiB", "shares GPUs with"), rows)
    bad = [i for i in report.get("instances") or [] if i.get("health") != 200]
    lines += [f"NOT BENCHED: {who(i)}: /health answered {i['health']}" for i in bad]
    return lines


class FilterModule:
    """Ansible filters: d3_bench_requests, d3_bench_targets, d3_bench_report, d3_bench_table (score_cases is
    d3_bench_report's scoring, not a filter of its own)."""

    def filters(self) -> dict[str, Any]:
        return {
            "d3_bench_requests": bench_requests,
            "d3_bench_targets": bench_targets,
            "d3_bench_report": bench_report,
            "d3_bench_table": bench_table,
        }
