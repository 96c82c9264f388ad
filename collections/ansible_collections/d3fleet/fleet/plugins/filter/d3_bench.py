"""Bench (playbooks/bench.yml) on the controller: the decision suite turned into requests, the answers scored, the
report assembled and printed like the field report's tables.

Suite format (d3-bench-suite/1, YAML): `questions` (id -> a System One question: type choice|noul|score,
instructions, criteria), `cases` (each: `id`, `state`, optional `instructions`, optional case-only `questions`, and
`expect`: question id -> the right answer: an option for choice, true/false for noul, a level for score; a case asks
exactly the questions its `expect` names, in that order), and `latency` (`state` and four question ids: the
2-question request asks the first two, the 4-question request all four). Example: roles/d3_bench/files/suites/.

Scoring: choice and noul are right when the answer is the expected one (noul: P(yes) >= 0.5 means yes); a score is
right when the level it gives (given_level: the level nearest its score) is the expected level. The confidence of an
answer is the probability the model gave to the answer it gave (choice: its option's probability; noul: max(P(yes),
P(no)); score: the probability of the level given). Calibration, per question type, by proper scores over all of a
question's classes (d3_bench_stats): choice, Brier's multi-class score (0-2); noul, the binary Brier (P(yes) -
outcome)^2 (0-1); score, the ranked probability score (0-1); 0 is perfect. Beside them the reliability bins (five
equal-width bins of the confidence on [0, 1], the last closed) and the expected calibration error over those same
bins, ECE = sum over bins of n_bin/N x |accuracy_bin - mean confidence_bin| (Naeini, Cooper and Hauskrecht, AAAI
2015; Guo et al., ICML 2017, eq. 3). A question whose request failed, or whose answer is malformed, counts as wrong
and has no confidence.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_bench_stats import brier, min_n, rps, wilson
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


def given_level(score: float, levels: int) -> int:
    """THE rule for the level a score answer gives (used by correctness and by confidence alike): the level nearest
    the score (the API's expected value), a tie (1.5) going to the higher level, clamped to the levels."""
    return min(levels - 1, max(0, math.floor(score + 0.5)))


def judge(question: dict[str, Any], expected: Any, answer: Any) -> dict[str, Any]:
    """One answer against the expected one: {given, correct, confidence (the probability the answer gives to what it
    gave), api_confidence (the API's own `confidence`: top probability x label mass), proper (the type's proper
    score: multi-class Brier for choice, binary Brier for noul, RPS for score; None without probabilities)}."""
    kind = question["type"]
    bad = {"given": None, "correct": False, "confidence": None, "api_confidence": None, "proper": None}
    if not isinstance(answer, dict):
        return bad
    probs = answer.get("probabilities") if isinstance(answer.get("probabilities"), dict) else {}
    probs = {str(k): v for k, v in probs.items() if _num(v)}
    api = answer.get("confidence") if _num(answer.get("confidence")) else None
    if kind == "choice":
        given = answer.get("choice")
        if given is None:
            return bad
        return {"given": given, "correct": str(given) == str(expected), "confidence": probs.get(str(given)),
                "api_confidence": api, "proper": brier(probs, str(expected)) if probs else None}
    if kind == "noul":
        p_yes = answer.get("noul")
        if not _num(p_yes):
            return bad
        given = p_yes >= 0.5
        return {"given": given, "correct": given == bool(expected), "confidence": p_yes if given else 1.0 - p_yes,
                "api_confidence": api, "proper": (p_yes - (1.0 if expected else 0.0)) ** 2}
    levels = [str(lv) for lv in question["criteria"]]
    score = answer.get("score")
    if not _num(score):
        return bad
    idx = given_level(score, len(levels))
    want = levels.index(str(expected))
    dist = [probs.get(str(i), 0.0) for i in range(len(levels))] if probs else None
    return {"given": levels[idx], "score": score, "correct": idx == want, "confidence": probs.get(str(idx)),
            "api_confidence": api, "proper": rps(dist, want) if dist else None}


def _share(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """{correct, total, accuracy, interval: [low, high] (95 % Wilson)} of judged rows."""
    right = sum(1 for r in rows if r["correct"])
    ci = wilson(right, len(rows))
    return {"correct": right, "total": len(rows), "accuracy": round(right / len(rows), 4) if rows else None,
            "interval": [round(ci[0], 4), round(ci[1], 4)] if ci else None}


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


RELIABILITY_BINS = 5


def reliability(rows: list[dict[str, Any]], key: str = "confidence") -> list[dict[str, Any]]:
    """Confidence bins of width 1/RELIABILITY_BINS (the last one closed) against the observed accuracy in each: {low,
    high, n, confidence (mean), accuracy, interval}; empty bins are left out. A calibrated model's accuracy matches
    its confidence bin by bin."""
    out = []
    for b in range(RELIABILITY_BINS):
        inside = [r for r in rows if r[key] is not None and min(int(r[key] * RELIABILITY_BINS), RELIABILITY_BINS - 1) == b]
        if inside:
            out.append({"low": b / RELIABILITY_BINS, "high": (b + 1) / RELIABILITY_BINS, "n": len(inside),
                        "confidence": _mean([r[key] for r in inside]),
                        **{k: v for k, v in _share(inside).items() if k in ("accuracy", "interval")}})
    return out


def ece(bins: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The expected calibration error over reliability()'s bins: sum of n_bin/N x |accuracy - mean confidence|, with
    the binning it used; None without answers."""
    total = sum(b["n"] for b in bins)
    if not total:
        return None
    value = sum(b["n"] / total * abs(b["accuracy"] - b["confidence"]) for b in bins)
    return {"value": round(value, 4), "n": total, "binning": f"{RELIABILITY_BINS} equal-width bins on [0, 1]"}


def score_cases(cases: list[dict[str, Any]], suite: dict[str, Any]) -> dict[str, Any]:
    """Accuracy (with 95 % Wilson intervals: overall, per question type, per case tag) and calibration (proper scores
    per type, mean confidences, reliability bins) of one instance from its recorded accuracy pass."""
    by_id = {str(c.get("id")): c for c in cases or []}
    rows: list[dict[str, Any]] = []
    for case in suite["cases"]:
        cid = str(case["id"])
        got = by_id.get(cid) or {}
        answers = got.get("answers") if got.get("status") == 200 and isinstance(got.get("answers"), dict) else {}
        for qid, q in _case_questions(suite, case).items():
            verdict = judge(q, case["expect"][qid], answers.get(qid))
            # failed: the request got no HTTP 200 (network failure, timeout, error status): no reply to judge. A 200
            # reply without a usable answer is the model's answer, scored wrong, and not `failed` (bench-compare
            # pairs it: third review item 1)
            rows.append({"case": cid, "question": qid, "type": q["type"], "expected": case["expect"][qid],
                         "tags": list(case.get("tags") or []), "failed": got.get("status") != 200, **verdict})
    answered = [r for r in rows if r["given"] is not None]
    tags = sorted({t for r in rows for t in r["tags"]})
    calibration = {}
    for kind, name in (("choice", "brier"), ("noul", "brier"), ("score", "rps")):
        scored = [r["proper"] for r in rows if r["type"] == kind and r["proper"] is not None]
        if any(r["type"] == kind for r in rows):
            calibration[kind] = {"rule": name, "value": _mean(scored), "n": len(scored)}
    confidence = {}
    for key in ("confidence", "api_confidence"):
        have = [r for r in answered if r[key] is not None]
        confidence[key] = {"right": _mean([r[key] for r in have if r["correct"]]),
                           "wrong": _mean([r[key] for r in have if not r["correct"]]),
                           "n_right": sum(1 for r in have if r["correct"]),
                           "n_wrong": sum(1 for r in have if not r["correct"])}
    return {
        **_share(rows),
        "by_type": {kind: _share([r for r in rows if r["type"] == kind]) for kind in TYPES if any(r["type"] == kind for r in rows)},
        "by_tag": {**{t: _share([r for r in rows if t in r["tags"]]) for t in tags},
                   **({"untagged": _share([r for r in rows if not r["tags"]])} if tags else {})},
        "calibration": calibration,
        "confidence": confidence,
        "reliability": {key: reliability(answered, key) for key in ("confidence", "api_confidence")},
        "ece": {key: ece(reliability(answered, key)) for key in ("confidence", "api_confidence")},
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


SECRET_WORD = re.compile(r"(?i)(key|token|secret|password|passwd|credential)")


def run_record(inst: dict[str, Any] | None, image_ref: str) -> dict[str, Any]:
    """What ran, from the plan and the deployment record, so that two runs can be compared: the image reference the
    host recorded (with its digest), the planned image, the revision, vLLM's arguments and the container
    environment (variables whose name looks like a secret are left out)."""
    inst = inst or {}
    return {"image_ref": image_ref, "image": inst.get("image"), "revision": inst.get("revision"),
            "args": list(inst.get("args") or []),
            "env": {k: v for k, v in (inst.get("env") or {}).items() if not SECRET_WORD.search(str(k))},
            "tensor_parallel_size": inst.get("tensor_parallel_size"),
            "gpu_memory_utilization": inst.get("gpu_memory_utilization"), "max_model_len": inst.get("max_model_len")}


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
    to decide from the servers' /version strings (one containing a marker is a simulator). The raw requests
    (bench_load's `records`) are not in it: d3_bench_records writes them as JSON lines beside it."""
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
                "record": run_record(inst, h.get("image_ref") or ""),
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
                "rate": res.get("rate") or [],
                "generator_limit": res.get("generator_limit"),
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


def bench_records(hosts: list[dict[str, Any]], suite: dict[str, Any]) -> list[dict[str, Any]]:
    """Every request of a bench run, one dict per JSON line (the JSONL beside the report): bench_load's records with
    the instance's host and name; an accuracy record also carries, per question asked, its type, expected answer
    and levels (score), and the case's tags, so that accuracy, intervals and calibration can be recomputed from the
    file alone (docs/bench.md, "Recomputing the report")."""
    cases = {str(c["id"]): c for c in suite["cases"]}
    out = []
    for h in hosts:
        for res in h.get("results") or []:
            for rec in res.get("records") or []:
                line = {"host": h["host"], "instance": res["name"], **rec}
                case = cases.get(str(rec.get("case")))
                if rec.get("phase") == "accuracy" and case:
                    line["tags"] = list(case.get("tags") or [])
                    line["expect"] = {qid: {"type": q["type"], "expected": case["expect"][qid],
                                            **({"levels": [str(lv) for lv in q["criteria"]]} if q["type"] == "score" else {})}
                                      for qid, q in _case_questions(suite, case).items()}
                out.append(line)
    return out


# ------------------------------------------------------------------------------------------------- the table
def _ms(x: Any) -> str:
    return "-" if x is None else f"{x:.0f}"


def _pct(fig: dict[str, Any], q: str) -> str:
    """A percentile with its 95 % interval. With 2 runs or more where each run's n supports it (`run_level`): the
    mean of the runs' percentiles and its t interval over the runs, "X [lo-hi over k runs]". Otherwise the pooled
    samples' percentile with its distribution-free interval (order statistics, which assume independent samples);
    one whose n is too small for that interval (d3_bench_stats.min_n: p50 6, p95 72, p99 368) shown as "n too small",
    not as a number; one that reaches a censored latency (a request never sent, or failed: `lower_bound`) as ">= X", its
    interval's open upper end as "inf"."""
    runs = fig.get("run_level") or {}
    if (runs.get("interval") or {}).get(q):
        lo, hi = runs["interval"][q]
        return f"{runs[q]:.0f} [{lo:.0f}-{hi:.0f} over {runs['k']} runs]"
    if fig.get(q) is None:
        return "-"
    if int(fig.get("n") or 0) < min_n(float(q[1:])):
        return "(n too small)"
    ci = (fig.get("interval") or {}).get(q)
    value = f"{'>= ' if q in (fig.get('lower_bound') or []) else ''}{fig[q]:.0f}"
    if not ci:
        return value
    return f"{value} [{ci[0]:.0f}-{'inf' if ci[1] is None else format(ci[1], '.0f')}]"


def _lat(fig: dict[str, Any]) -> str:
    if not fig:
        return "-"
    runs = f", {len(fig['runs'])} runs" if len(fig.get("runs") or []) > 1 else ""
    return f"{_pct(fig, 'p50')} / {_pct(fig, 'p95')} / {_pct(fig, 'p99')} ms, n={fig.get('n', 0)}{runs}"


def _acc(s: dict[str, Any]) -> str:
    if not s or not s.get("total"):
        return "-"
    lo, hi = s["interval"]
    return f"{s['correct']}/{s['total']} = {s['accuracy']:.2f} [{lo:.2f}-{hi:.2f}]"


def _num_or_dash(x: Any, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def _calib(s: dict[str, Any]) -> str:
    parts = []
    for kind, label in (("choice", "choice Brier"), ("noul", "noul Brier"), ("score", "score RPS")):
        c = (s.get("calibration") or {}).get(kind)
        if c:
            parts.append(f"{label} {_num_or_dash(c['value'])} (n={c['n']})")
    e = (s.get("ece") or {}).get("confidence")
    if e:
        parts.append(f"ECE {e['value']:.3f} (n={e['n']}, {e['binning']} of p(given))")
    return "; ".join(parts) or "-"


def _confs(s: dict[str, Any]) -> str:
    out = []
    for key, label in (("confidence", "p(given)"), ("api_confidence", "API")):
        c = (s.get("confidence") or {}).get(key) or {}
        out.append(f"{label} {_num_or_dash(c.get('right'), '{:.2f}')}/{_num_or_dash(c.get('wrong'), '{:.2f}')} "
                   f"(n={c.get('n_right', 0)}/{c.get('n_wrong', 0)})")
    return "; ".join(out)


def _server(m: dict[str, Any]) -> str:
    """The server's own view of a level from its /metrics: running/waiting halfway, KV cache use halfway, mean queue
    time over the level (the histogram's sum and count, after minus before)."""
    before, during, after = (m or {}).get("before") or {}, (m or {}).get("during") or {}, (m or {}).get("after") or {}
    if not (before or during or after):
        return "-"
    parts = []
    for name, label in (("vllm:num_requests_running", "run"), ("vllm:num_requests_waiting", "wait")):
        if during.get(name) is not None:
            parts.append(f"{label} {during[name]:g}")
    if during.get("vllm:kv_cache_usage_perc") is not None:
        parts.append(f"kv {100 * during['vllm:kv_cache_usage_perc']:.0f}%")
    s_key, c_key = "vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count"
    if None not in (before.get(s_key), after.get(s_key), before.get(c_key), after.get(c_key)) and after[c_key] > before[c_key]:
        parts.append(f"queue {1000 * (after[s_key] - before[s_key]) / (after[c_key] - before[c_key]):.0f}ms")
    return " ".join(parts) or "no vLLM metrics"


def _level(t: dict[str, Any]) -> str:
    good = f" goodput {t['goodput_per_s']:.1f}/s" if t.get("goodput_per_s") is not None else ""
    tok = f" {t['input_tokens_per_s']:.0f} tok/s" if t.get("input_tokens_per_s") is not None else ""
    runs = f" ({len(t['runs'])} runs)" if len(t.get("runs") or []) > 1 else ""
    return (f"{t['requests_per_s']:.1f} req/s{runs}{good}{tok} p50 {_pct(t, 'p50')} p99 {_pct(t, 'p99')} ms "
            f"n={t.get('n', 0)} err {t['errors']} | {_server(t.get('metrics') or {})}")


def _open(t: dict[str, Any]) -> str:
    """An open-loop level: the rate reached, goodput, latency from the schedule and from the send, the sender's lag
    and what it never sent; a level the generator could not drive says so instead of giving the server's figures."""
    sched = t.get("from_schedule") or {}
    lag = t.get("lag") or {}
    head = (f"sent {t.get('sent_per_s', 0):g}/s, lag p50 {_num_or_dash(lag.get('p50'), '{:.1f}')} p99 "
            f"{_num_or_dash(lag.get('p99'), '{:.1f}')} ms, not sent {t.get('not_sent', 0)}")
    if t.get("driven") is False:
        return f"NOT DRIVEN: {t.get('not_driven')} ({head}): no server figure"
    good = f" goodput {t['goodput_per_s']:.1f}/s" if t.get("goodput_per_s") is not None else ""
    return (f"{t['requests_per_s']:.1f} req/s{good} | from schedule p50 {_pct(sched, 'p50')} p99 {_pct(sched, 'p99')} ms"
            f" | from send p50 {_pct(t, 'p50')} p99 {_pct(t, 'p99')} ms n={t.get('n', 0)} | {head} | err {t['errors']} | "
            f"{_server(t.get('metrics') or {})}")


def bench_table(report: dict[str, Any], published: dict[str, Any] | None = None) -> list[str]:
    """The report as the field report's two tables (latency; accuracy / 4q latency / GPUs / Decision Index), each
    figure with its n and accuracy with its 95 % Wilson interval, then accuracy per question type and per tag,
    calibration (proper scores, confidences, reliability bins), closed-loop and request-rate load per level with the
    server's /metrics, and memory; the published rows marked as such."""
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
    rows = [(who(i), *(_lat(i["latency"].get(q) or {}) for q in ("q2", "q4"))) for i in insts]
    rows += [(f"{p['config']} [published: {p.get('source', 'field report')}]", f"~{p['q2_ms']}ms" if p.get("q2_ms") else "-",
              f"~{p['q4_ms']}ms" if p.get("q4_ms") else "-") for p in published.get("latency") or []]
    lines += [f"Latency{tag} (p50 / p95 / p99 [95 % interval] and n, one request at a time)",
              "  with 2 runs or more, where every run's n allows the percentile: the mean of the runs' percentiles, its "
              "t interval over the runs ('over k runs': the run is the unit)",
              "  else the pooled samples' percentile and its order-statistic interval, which assumes independent samples "
              "(latencies in a run are autocorrelated: too narrow)",
              f"  a percentile is shown where n allows its interval (order statistics: p50 n >= {min_n(50)}, p95 "
              f"{min_n(95)}, p99 {min_n(99)}), else '(n too small)'"]
    lines += _grid(("Config", "2-question latency", "4-question latency"), rows)

    rows = []
    for i in insts:
        s = i["score"]
        rows.append((who(i), _acc(s), f"{_pct(i['latency'].get('q4') or {}, 'p50')} ms", str(i["gpu_count"]),
                     "-" if i["decision_index"] is None else str(i["decision_index"])))
    rows += [(f"{p['model']} [published: {p.get('source', 'field report')}, its own {p['total']} questions]",
              _acc({"correct": p["correct"], "total": p["total"], "accuracy": p["correct"] / p["total"],
                    "interval": list(wilson(p["correct"], p["total"]) or (0, 0))}),
              f"{p['q4_ms']} ms", "-" if p.get("gpus") is None else str(p["gpus"]),
              str(p.get("decision_index", "-"))) for p in published.get("accuracy") or []]
    lines += ["", f"Accuracy{tag} (suite {report['suite']['name']}: {report['suite']['cases']} cases, "
              f"{report['suite']['questions']} questions; [95 % Wilson interval])",
              "  GPUs: total per instance; the published totals read from the report's 'Extra GPUs' (d3_bench_published)"]
    lines += _grid(("Model", "Accuracy", "4q p50", "GPUs", "Decision Index"), rows)

    kinds = [k for k in TYPES if any(k in (i["score"].get("by_type") or {}) for i in insts)]
    tags = sorted({t for i in insts for t in i["score"].get("by_tag") or {}})
    rows = [(who(i), *(_acc((i["score"].get("by_type") or {}).get(k) or {}) for k in kinds),
             *(_acc((i["score"].get("by_tag") or {}).get(t) or {}) for t in tags)) for i in insts]
    lines += ["", f"Accuracy per question type and per case tag{tag} [95 % Wilson interval]"]
    lines += _grid(("Instance", *kinds, *(f"tag {t}" for t in tags)), rows)

    rows = [(who(i), _calib(i["score"]), _confs(i["score"])) for i in insts]
    lines += ["", f"Calibration{tag} (0 is perfect: multi-class Brier (choice), binary Brier (noul), RPS (score))",
              "  mean confidence right/wrong: p(given) of the answer given; API: the answer's own `confidence`"]
    lines += _grid(("Instance", "proper scores", "confidence right/wrong"), rows)

    rows = []
    for i in insts:
        for b in (i["score"].get("reliability") or {}).get("confidence") or []:
            rows.append((who(i), f"{b['low']:.1f}-{b['high']:.1f}", str(b["n"]), f"{b['confidence']:.2f}",
                         _acc({"correct": round(b["accuracy"] * b["n"]), "total": b["n"], "accuracy": b["accuracy"],
                               "interval": b["interval"]})))
    lines += ["", f"Reliability{tag} (p(given) in bins against the accuracy observed in each)"]
    lines += _grid(("Instance", "confidence bin", "n", "mean confidence", "accuracy [95 %]"), rows)

    slo = (report.get("settings") or {}).get("slo_ms")
    levels = sorted({t["concurrency"] for i in insts for t in i["throughput"]})
    rows = []
    for i in insts:
        by = {t["concurrency"]: t for t in i["throughput"]}
        rows += [(who(i), str(c), _level(by[c])) for c in levels if c in by]
    lines += ["", f"Throughput{tag}, closed loop ({report.get('settings', {}).get('duration_s', '?')} s per level, "
              "4-question requests)",
              "  each level after its warm-up; its first fifth (the ramp) and the answers after its end (the drain) are "
              "outside its window: rates over the window, latency of the requests sent in it",
              "  percentile intervals: over the runs ('over k runs') with 2 runs or more, else order statistics of the "
              "pooled samples (assume independent samples: too narrow for autocorrelated latencies)",
              f"  goodput: answers within {slo or '-'} ms per s; after |: the server's /metrics (halfway; queue: over the level)"]
    lines += _grid(("Instance", "concurrency", "figures"), rows)
    rows = []
    for i in insts:
        for t in i.get("rate") or []:
            rows.append((who(i), f"{t['rate']:g}/s (offered {t['offered_per_s']:.1f})", _open(t)))
    if rows:
        limits = [f"{who(i)} {i['generator_limit']['sent_per_s']:g}/s (probe {i['generator_limit']['probe_rate']:g}/s)"
                  for i in insts if i.get("generator_limit")]
        lines += ["", f"Request rate{tag}, open loop (Poisson arrivals, due on schedule whatever the answers do)",
                  "  one run per rate: percentile intervals from order statistics, which assume independent samples "
                  "(too narrow for autocorrelated latencies)",
                  "  latency from the schedule (the intended send time: what a client arriving then waited) and from the "
                  "actual send; lag: how late the dispatcher started each request after its intended time; its first tenth "
                  "(ramp) and the answers after the "
                  "schedule (drain) are outside the window; goodput judged from the schedule",
                  "  requests never sent that were due in the window, and requests that failed (no HTTP 200), count in "
                  "the latency from the schedule, censored at the window's end (each waited at least end - intended "
                  "time; a failure at what it spent if longer): a figure reaching them is printed '>= X'; the latency "
                  "from the send is the answered requests' alone",
                  "  NOT DRIVEN: sent under 95 % of the offered rate, or a p99 lag (the dispatcher's start of a request "
                  "after its intended time) of max(1 ms, 5 % of the mean gap) or more",
                  f"  the generator's own limit, measured in this run: {'; '.join(limits) or '-'}"]
        lines += _grid(("Instance", "rate", "figures"), rows)

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
    """Ansible filters: d3_bench_requests, d3_bench_targets, d3_bench_report, d3_bench_records, d3_bench_table
    (score_cases is d3_bench_report's scoring, not a filter of its own)."""

    def filters(self) -> dict[str, Any]:
        return {
            "d3_bench_requests": bench_requests,
            "d3_bench_targets": bench_targets,
            "d3_bench_report": bench_report,
            "d3_bench_records": bench_records,
            "d3_bench_table": bench_table,
        }
