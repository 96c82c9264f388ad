"""playbooks/bench.yml on the lab hosts (the lab is a STAND-IN: simulated L4 hosts, the vLLM simulator).

One bench run on the converged lab (4 min of lab time before issue 24 paid for the rest: 6 samples, 1 s per level, the
load passes on d3-mini only): its JSON holds every planned instance of the three hosts, with n and intervals; the
accuracy recomputed here from the recorded answers and by docs/bench.md's script from the JSONL equals the reported
one; percentiles are ordered; the closed loop and an open loop beyond capacity (goodput falls, latency grows); the
plots are written; every figure is labelled simulated (the simulator says so in GET /version). Then nightly against
nightly: host3 moved to nightly-next (1.5x slower in the lab), benched again and compared with tools/bench_compare.py
(latency flagged, accuracy not), and moved back; that second bench run also targets host2 carrying the rollout marker,
which is refused, and the run moving host3 back is also the monitor's second site.yml run (tag metrics): nothing
changes on the monitor.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import labkit
import pytest
import yaml

pytestmark = pytest.mark.lab

HOSTS = ["d3-lab-host1", "d3-lab-host2", "d3-lab-host3"]
SUITE = labkit.ROOT / "roles/d3_bench/files/suites/support-tickets.yml"
CONCURRENCY = [1, 4]
RATES = [8.0, 160.0]  # requests/s: well within d3-mini's simulated capacity (about 60/s), and far beyond it
LOADED = "d3-mini"  # the one instance the load passes run on (the others: accuracy and latency only), to keep it cheap
SLO_MS = 250
MARKER = "/var/lib/d3/rollout-in-progress"  # roles/d3_state/defaults/main.yml: d3_state_rollout_marker
# host3's d3-lite is the comparison's instrument: its answers take ~15 ms, of which nightly-next's 1.5x scales only the
# simulated part (~3 ms more), so it gets 24 samples a side (cheap: 24 x 2 x 15 ms) and the other hosts 6
SAMPLES = "{{ 24 if inventory_hostname == 'd3-lab-host3' else 6 }}"
# and 5 runs of it (d3_bench_repeats: the run-level figures bench-compare judges; 5 x 24 x 2 x 15 ms, about 4 s)
REPEATS = "{{ 5 if inventory_hostname == 'd3-lab-host3' else 1 }}"
SHORT = {"d3_bench_samples": SAMPLES, "d3_bench_warmup": 1, "d3_bench_duration_s": 1.0, "d3_bench_concurrency": CONCURRENCY,
         "d3_bench_load_instances": [LOADED], "d3_bench_request_rates": RATES, "d3_bench_slo_ms": SLO_MS,
         "d3_bench_repeats": REPEATS}
# An extra endpoint named by one host only (d3_bench_endpoints): host2's d3-nano again, as a stand-in "generalist".
EXTRA = ("{{ [{'name': 'generalist', 'url': 'http://127.0.0.1:' ~ (d3_host_plan.instances | selectattr('model', 'eq', "
         "'d3-nano') | map(attribute='port') | first), 'model': 'd3-nano', 'label': 'stand-in generalist', 'gpus': 0}] "
         "if inventory_hostname == 'd3-lab-host2' else [] }}")


@pytest.fixture(scope="module")
def bench(converge_run: labkit.Run, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    start = time.monotonic()
    run = labkit.run_playbook(
        "playbooks/bench.yml",
        limit=",".join(HOSTS),
        extravars={**SHORT, "d3_bench_endpoints": EXTRA, "d3_bench_output": str(out / "report.json"),
                   "d3_bench_plot_dir": str(out / "plots")},
    )
    assert run.status == "successful", run.failure_text() + run.stdout[-3000:]
    print(f"\nbench.yml on {', '.join(HOSTS)} took {time.monotonic() - start:.1f} s")
    return {"run": run, "report": json.loads((out / "report.json").read_text()), "dir": out}


def doc_script() -> Any:
    """docs/bench.md's recompute script, loaded the way the quick tier's tests/test_bench_recompute.py loads it."""
    spec = importlib.util.spec_from_file_location("bench_recompute_test", labkit.ROOT / "tests/test_bench_recompute.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.doc_script()


def expected_instances() -> set[tuple[str, str]]:
    """(host, instance) of every D3 container running on the benched hosts (what the converge started)."""
    found = {(h, name) for h in HOSTS for name in labkit.running(h)}
    assert found, "no D3 instance runs on the lab hosts"
    return found


def rescore(answers: list[dict[str, Any]], suite: dict[str, Any]) -> tuple[int, int]:
    """(right, asked) computed here, independently of the filter: exact for choice and noul (P(yes) >= 0.5 is yes),
    within half a level for score; a failed case counts its questions as wrong."""
    got = {a["id"]: a for a in answers}
    right = asked = 0
    for case in suite["cases"]:
        ans = got[case["id"]]["answers"] if got[case["id"]]["status"] == 200 else {}
        for qid, want in case["expect"].items():
            asked += 1
            q = (case.get("questions") or {}).get(qid) or suite["questions"][qid]
            a = ans.get(qid) or {}
            if q["type"] == "choice":
                right += a.get("choice") == want
            elif q["type"] == "noul":
                right += (a.get("noul", -1) >= 0.5) == want and "noul" in a
            else:
                right += "score" in a and abs(a["score"] - q["criteria"].index(want)) <= 0.5
    return right, asked


def test_every_planned_instance_is_in_the_report(bench: dict[str, Any]) -> None:
    planned = [i for i in bench["report"]["instances"] if i["kind"] == "planned"]
    assert {(i["host"], i["name"]) for i in planned} == expected_instances()
    assert all(i["health"] == 200 for i in bench["report"]["instances"])


def test_extra_endpoint_is_benched_from_the_host_that_names_it(bench: dict[str, Any]) -> None:
    (extra,) = [i for i in bench["report"]["instances"] if i["kind"] == "extra"]
    assert (extra["host"], extra["name"], extra["model"], extra["gpu_count"]) == (HOSTS[1], "generalist", "stand-in generalist", 0)
    assert extra["score"]["total"] > 0 and extra["throughput"] == [] and extra["rate"] == []  # not d3_bench_load_instances


def test_lab_figures_are_labelled_simulated(bench: dict[str, Any]) -> None:
    report = bench["report"]
    assert report["simulated"] is True and report["label"].startswith("SIMULATED")
    for inst in report["instances"]:
        assert inst["simulated"] is True and "+d3sim" in inst["server_version"], inst["name"]
    table = "\n".join(str(r["res"].get("msg", "")) for r in bench["run"].results() if r.get("task") == "Print the bench tables")
    assert "SIMULATED" in table and "[published: field report]" in table


def test_accuracy_recomputed_from_the_recorded_answers(bench: dict[str, Any]) -> None:
    suite = yaml.safe_load(SUITE.read_text())
    accuracies = set()
    for inst in bench["report"]["instances"]:
        right, asked = rescore(inst["answers"], suite)
        score = inst["score"]
        assert (score["correct"], score["total"]) == (right, asked), inst["name"]
        assert math.isclose(score["accuracy"], right / asked, abs_tol=1e-4)
        assert score["failed_requests"] == 0
        assert 0.0 <= score["calibration"]["choice"]["value"] <= 2.0 and 0.0 <= score["calibration"]["noul"]["value"] <= 1.0
        assert 0.0 <= score["calibration"]["score"]["value"] <= 1.0
        accuracies.add(score["correct"])
    assert len(accuracies) > 1, "the simulator answers every model alike"


def test_latency_percentiles_are_ordered_and_grow_with_questions_and_size(bench: dict[str, Any]) -> None:
    p50 = {}
    for inst in bench["report"]["instances"]:
        for label in ("q2", "q4"):
            lat = inst["latency"][label]
            n, runs = (24 * 5, 5) if inst["host"] == "d3-lab-host3" else (6, 1)
            assert lat["errors"] == 0 and lat["n"] == n and len(lat["runs"]) == runs
            assert lat["unsupported"] == (["p99"] if n >= 72 else ["p95", "p99"])  # order-statistic intervals
            assert lat["min"] <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"], (inst["name"], label, lat)
        q2, q4 = inst["latency"]["q2"], inst["latency"]["q4"]
        if inst["model"] in ("d3", "d3-flash"):
            # tens of ms more per question (the simulator's calibration on the field report's 470 and 215 ms): the
            # median of q4 above q2's, whatever the machine's load
            assert q4["p50"] > q2["p50"], (inst["name"], q2, q4)
        else:
            # the small models take 1-4 ms more per question: within the noise of 6 requests on a loaded machine (CI
            # saw a p50 of 14.1 ms for q4 against 14.5 for q2). Their medians' 95 % intervals overlap or q4's is higher.
            assert q4["interval"]["p50"][1] >= q2["interval"]["p50"][0], (inst["name"], q2, q4)
        for level in inst["throughput"]:
            assert level["p50"] <= level["p95"] <= level["p99"], (inst["name"], level)
        if inst["kind"] == "planned":
            p50[inst["model"]] = inst["latency"]["q4"]["p50"]
    assert p50["d3"] > p50["d3-flash"] > p50["d3-mini"] > p50["d3-edge"], p50


def test_throughput_for_each_concurrency_on_the_loaded_instance_only(bench: dict[str, Any]) -> None:
    loaded = [i for i in bench["report"]["instances"] if i["throughput"]]
    assert [i["name"] for i in loaded] == [LOADED]
    levels = loaded[0]["throughput"]
    assert [t["concurrency"] for t in levels] == CONCURRENCY
    for t in levels:
        assert t["requests"] > 0 and t["errors"] == 0, t
        assert t["requests_per_s"] > 0 and math.isclose(t["questions_per_s"], t["requests_per_s"] * 4, rel_tol=0.02)
        assert t["input_tokens_per_s"] > 0 and t["goodput_per_s"] <= t["requests_per_s"]
        assert set(t["metrics"]) == {"before", "during", "after"}  # the simulator's /metrics, read around the level


def test_open_loop_beyond_capacity_goodput_falls_and_latency_grows(bench: dict[str, Any]) -> None:
    (inst,) = [i for i in bench["report"]["instances"] if i["rate"]]
    low, high = inst["rate"]
    closed = {t["concurrency"]: t for t in inst["throughput"]}
    assert (low["rate"], high["rate"]) == tuple(RATES)
    # far beyond capacity the server answers fewer than were offered, each later: latency grows, the share of answers
    # within the objective falls
    assert high["p50"] > 2 * low["p50"], (low, high)
    assert high["goodput_per_s"] / high["offered_per_s"] < low["goodput_per_s"] / low["offered_per_s"], (low, high)
    assert high["requests_per_s"] < high["offered_per_s"]
    # the closed loop at 4 in flight never queues like that: its latency stays below the overloaded open loop's
    assert closed[4]["p50"] < high["p50"]
    # the generator's own limit, measured in the same run, is far above the rates; whether a level was driven
    # follows the stated rule (95 % of the offered rate sent, p99 lag under max(1 ms, 5 % of the mean gap): on this
    # shared machine a 160/s level's p99 lag can reach its 1 ms bound); latency from the schedule never below that
    # from the send
    assert inst["generator_limit"]["sent_per_s"] > high["offered_per_s"]
    for level in (low, high):
        assert level["from_schedule"]["p50"] >= level["p50"] and level["lag"]["n"] > 0, level
        rule = (level["sent_per_s"] >= 0.95 * level["offered_per_s"]
                and level["lag"]["p99"] < bench_load.lag_bound_ms(level["rate"]))
        assert level["driven"] == rule, (level["rate"], level["sent_per_s"], level["lag"], level["not_driven"])
    assert {t["window"]["ramp_s"] for t in inst["throughput"]} == {0.2} and low["window"]["ramp_s"] == 0.1
    table = "\n".join(str(r["res"].get("msg", "")) for r in bench["run"].results() if r.get("task") == "Print the bench tables")
    assert "Request rate [SIMULATED], open loop" in table and "closed loop" in table
    assert "the generator's own limit, measured in this run" in table
    # a driven level prints its figures from the schedule; one the generator could not drive (a loaded 2-core CI machine:
    # both levels once, 2026-12-04) says so instead, with no server figure
    for level in (low, high):
        assert ("from schedule p50" if level["driven"] else f"NOT DRIVEN: {level['not_driven']}") in table, (level["rate"], table)


def test_raw_requests_recompute_the_report(bench: dict[str, Any]) -> None:
    """The JSONL beside the report holds every request with its send and receive times; docs/bench.md's script
    recomputes n, intervals and the three calibration scores from it alone."""
    raw = bench["dir"] / "report.jsonl"
    lines = [json.loads(x) for x in raw.read_text().splitlines()]
    assert all(x["received"] >= x["sent"] > 1.7e9 for x in lines if not x.get("not_sent"))
    assert {x["phase"] for x in lines} == {"accuracy", "latency", "closed", "open"}
    again = doc_script().recompute(raw)
    for inst in bench["report"]["instances"]:
        mine = again[f"{inst['host']}/{inst['name']}"]
        s = inst["score"]
        assert (mine["correct"], mine["n"]) == (s["correct"], s["total"])
        assert mine["interval"] == pytest.approx(s["interval"], abs=1e-4)
        for kind in ("choice", "noul", "score"):
            assert mine[kind] == pytest.approx(s["calibration"][kind]["value"], abs=1e-4), (inst["name"], kind)



def test_gpus_and_memory_per_instance(bench: dict[str, Any]) -> None:
    by = {i["name"]: i for i in bench["report"]["instances"] if i["kind"] == "planned"}
    assert by["d3-27b"]["gpu_count"] == 2 and by["d3-27b"]["gpus"] == [0, 1]
    for inst in by.values():
        assert inst["memory"]["used_mib"] > 0 and inst["memory"]["budget_mib"] > 0, inst["name"]


def test_plots_written(bench: dict[str, Any]) -> None:
    names = ("latency-vs-concurrency", "one-at-a-time", "accuracy-vs-latency", "reliability", "load")
    for name in (f"bench-{n}.png" for n in names):
        path: Path = bench["dir"] / "plots" / name
        assert path.is_file() and path.stat().st_size > 10_000, path
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------------------------- issue 34's must-shows
# Driven from this machine with bench_load's own code (no extra bench.yml run): host3's d3-lite through the port the
# lab publishes on loopback, and two in-process LAB STAND-IN simulators for the seeded regressions.
sys.path.insert(0, str(labkit.ROOT / "collections"))
from ansible_collections.d3fleet.fleet.plugins.filter import d3_bench as bench_filter  # noqa: E402
from ansible_collections.d3fleet.fleet.plugins.modules import bench_load  # noqa: E402

COMPARE = labkit.ROOT / "tools/bench_compare.py"


def tool() -> Any:
    spec = importlib.util.spec_from_file_location("bench_compare_lab", COMPARE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lite_url() -> str:
    """host3's d3-lite (running, as converged) as published on this machine's loopback (the lab's port mapping)."""
    args = labkit.container_args(ROLLED, "d3-lite")
    port = args[args.index("--port") + 1]
    return "http://" + labkit.podman("port", ROLLED, f"{port}/tcp", check=True).stdout.strip().splitlines()[0]


def params(**over: Any) -> dict[str, Any]:
    reqs = bench_filter.bench_requests(yaml.safe_load(SUITE.read_text()))
    return {"api_key": None, "timeout": 30.0, "path": "/v1/systemone", "cases": reqs["cases"], "warmup": 1, "samples": 10,
            "latency_requests": reqs["latency_requests"], "load_request": "q4", "concurrency": [], "duration_s": 1.0,
            "max_requests": 0, "request_rates": [], "load_targets": [], "seed": 0, "slo_ms": 250.0, "metrics_path": "",
            "repeats": 1, "max_inflight": 256, **over}


def as_report(results: list[dict[str, Any]], stamp: str) -> dict[str, Any]:
    """bench_load results as a bench report (bench_report, the extra-endpoint path: no plan)."""
    suite = yaml.safe_load(SUITE.read_text())
    report = bench_filter.bench_report([{"host": ROLLED, "results": results}], suite, {}, {}, [], True)
    return {**report, "generated": stamp}


def interleaved_benches(urls: list[str], runs: int, p: dict[str, Any]) -> list[dict[str, Any]]:
    """One bench per URL (its accuracy pass, then `runs` latency passes), the benches' runs interleaved in time: run 1 of
    every bench, then run 2, ... (so a slow minute of this shared machine falls on every bench alike)."""
    out = []
    for url in urls:
        client = bench_load.Client(url, p["timeout"], None)
        out.append({"name": "d3-lite", "url": url, "model": "d3-lite", "health": 200, "version": "+d3sim",
                    "cases": bench_load.accuracy_pass(client, p["path"], "d3-lite", p["cases"]), "passes": [], "client": client})
    for run in range(1, runs + 1):
        for res in out:
            res["passes"].append(bench_load.latency_pass(res["client"], p["path"], "d3-lite", p["latency_requests"],
                                                         p["samples"], None, run))
    for res in out:
        res["client"].close()
        res["latency"] = bench_load.pool_runs(res.pop("passes"))
        res.pop("client")
    return out


def test_a_a_same_build_benched_five_times_every_pair_compared(converge_run: labkit.Run) -> None:
    """The same build (host3's d3-lite, nightly) benched 5 times (5 runs each, interleaved), every one of the 10 pairs
    compared by bench-compare: the share of comparisons with any CHANGED, against the stated family-wise 5 %."""
    start = time.monotonic()
    url = lite_url()
    benches = interleaved_benches([url] * 5, 5, params())
    reports = [as_report([b], f"bench {n}") for n, b in enumerate(benches, start=1)]
    bc = tool()
    pairs = [(a, b) for a in range(5) for b in range(a + 1, 5)]
    flagged, tests = [], 0
    for a, b in pairs:
        result = bc.compare(reports[a], reports[b])
        tests += result["tests"]
        flagged += [(a + 1, b + 1, f["figure"], round(f["adjusted_p"], 4)) for f in result["family"] if f["changed"]]
        assert result["rows"][0]["accuracy"]["right_to_wrong"] == []  # greedy answers: the same every time
    compared = len({(a, b) for a, b, *_ in flagged})
    print(f"\nA/A on {url}: 5 benches x 5 runs, {len(pairs)} pairs, {tests} tests: {len(flagged)} figures flagged "
          f"{flagged}; comparisons with any CHANGED {compared}/{len(pairs)} (stated: at most 5 % each, Holm family-wise); "
          f"{time.monotonic() - start:.1f} s")
    # The 10 pairs share the 5 benches, so they are not independent (the binomial's 9 % and 0.1 % assumed they
    # were): the statistician's fourth review (2026-12-04) simulated 1,500 A/A sets (5 benches x 5 runs, 2 % spread,
    # q2 and q4, Holm): per-pair rate 4.2 %, 2 or more of 10 flagged 10.6 % of the time, 4 or more 0.67 %: the bound
    # a working comparison passes in CI, and one a comparison that judges noise as change (the per-sample intervals
    # this issue replaced flagged most pairs) fails.
    assert compared <= 3, flagged


def stand_in(scale: float) -> tuple[Any, str]:
    """The LAB STAND-IN simulator in-process (tools/bench_loadgen.py's stand_in_simulator), d3-lite, each answer
    D3_SIM_REQUEST_MS=200 times D3_SIM_LATENCY_SCALE=scale (long enough that this shared machine's scheduling noise
    stays small beside it); returns (server, url)."""
    spec = importlib.util.spec_from_file_location("bench_loadgen_lab", labkit.ROOT / "tools/bench_loadgen.py")
    assert spec and spec.loader
    loadgen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loadgen)
    return loadgen.stand_in_simulator("vllm-sr/d3-lite", int(1.8e9), "d3-lite",
                                      {"D3_SIM_REQUEST_MS": "200", "D3_SIM_LATENCY_SCALE": str(scale)})


def seed_words(score: dict[str, Any], suite: dict[str, Any], at_least: int = 8) -> tuple[list[str], set[str]]:
    """The cases to turn around: those the old run answered best (every answer right first) until they hold at least
    `at_least` right answers; per case a comma-free piece of its ticket (D3_SIM_FLIP_STATES is comma-separated).
    Returns (the words, the "case/question" right answers that must turn wrong: choice and noul always do)."""
    by_case: dict[str, list[dict[str, Any]]] = {}
    for r in score["questions"]:
        by_case.setdefault(r["case"], []).append(r)
    tickets = {str(c["id"]): str(c["state"]["ticket"]) for c in suite["cases"]}
    chosen, words, right = [], [], 0
    for case in sorted(by_case, key=lambda c: (sum(not r["correct"] for r in by_case[c]), -len(by_case[c]))):
        word = max(tickets[case].split(","), key=len).strip()
        if right >= at_least or sum(word in t for t in tickets.values()) > 1:  # enough, or not this case alone
            continue
        chosen.append(case)
        words.append(word)
        right += sum(r["correct"] for r in by_case[case])
    must = {f"{r['case']}/{r['question']}" for c in chosen for r in by_case[c] if r["correct"] and r["type"] != "score"}
    return words, must


def test_seeded_accuracy_regression_and_ten_percent_latency_flagged_with_five_runs() -> None:
    """Old: the stand-in as is. New: 10 % slower (D3_SIM_LATENCY_SCALE 1.1) and answering a known set of cases the
    other way round (D3_SIM_FLIP_STATES, a labelled STAND-IN setting: the cases the old run answered best, so their
    right answers turn wrong). 5 runs a side, interleaved. bench-compare flags the latency, and the accuracy with
    exactly the seeded flips listed. A 10 % shift at k = 5 is flagged in about 94 % of synthetic tries (docs/bench.md):
    a miss is measured again once (about 0.4 % then), so the test says the method has the power it claims, not that
    one draw on a shared machine always lands."""
    start = time.monotonic()
    suite = yaml.safe_load(SUITE.read_text())
    attempt = 1
    result, words, old, new = seeded_comparison(suite)
    if not result["rows"][0]["latency"]["q4"]["changed"]:
        attempt = 2
        result, words, old, new = seeded_comparison(suite)
    (row,) = result["rows"]
    acc = row["accuracy"]
    _, must = seed_words(bench_filter.score_cases(old["cases"], suite), suite)
    seeded = {str(c["id"]) for c in suite["cases"] if any(w in str(c["state"]["ticket"]) for w in words)}
    print(f"\nseeded cases {sorted(seeded)}: right->wrong {acc['right_to_wrong']}, wrong->right {acc['wrong_to_right']}, "
          f"exact McNemar p {acc['p']:.4f}, adjusted {acc['adjusted_p']:.4f} ({result['method']}, {result['tests']} tests); "
          f"q4 x{row['latency']['q4']['ratio']:.3f} {[round(x, 3) for x in row['latency']['q4'].get('interval') or []]} "
          f"({row['latency']['q4']['test']}) adjusted p "
          f"{row['latency']['q4']['adjusted_p']:.2g} (attempt {attempt}); run medians "
          f"{[r['p50'] for r in old['latency']['q4']['runs']]} -> {[r['p50'] for r in new['latency']['q4']['runs']]}; "
          f"{time.monotonic() - start:.1f} s")
    assert must <= set(acc["right_to_wrong"]) and {f.split("/")[0] for f in acc["right_to_wrong"] + acc["wrong_to_right"]} <= seeded
    assert acc["changed"], acc
    d = row["latency"]["q4"]
    # Welch's interval on the log run figures; when every run of a side measured the same (the stand-in's exact
    # latencies, on a quiet machine: seen 2026-12-05) bench-compare takes the exact permutation test, which gives none
    assert d["runs"] == [5, 5] and d["changed"] and d["ratio"] > 1.0, d
    assert d["interval"][0] > 1.0 if "interval" in d else d["test"] == "exact permutation on log run figures", d


def seeded_comparison(suite: dict[str, Any]) -> tuple[dict[str, Any], list[str], dict[str, Any], dict[str, Any]]:
    """One old/new pair of benches (5 interleaved runs a side) and bench-compare's result: (result, words, old, new)."""
    (old_srv, old_url), (new_srv, new_url) = stand_in(1.0), stand_in(1.1)
    try:
        p = params(samples=5)
        q4 = [r for r in p["latency_requests"] if r["label"] == "q4"]  # the 4-question request only: 5 x 2 x 5 x 0.2 s
        old, new = interleaved_benches([old_url, new_url], 5, {**p, "cases": [], "latency_requests": q4})
        old["cases"] = interleaved_benches([old_url], 0, p)[0]["cases"]
        words, _ = seed_words(bench_filter.score_cases(old["cases"], suite), suite)
        with pytest.MonkeyPatch.context() as env:
            env.setenv("D3_SIM_FLIP_STATES", ",".join(words))
            new["cases"] = interleaved_benches([new_url], 0, p)[0]["cases"]
    finally:
        old_srv.shutdown()
        new_srv.shutdown()
    return tool().compare(as_report([old], "old"), as_report([new], "new")), words, old, new


def test_open_loop_beyond_the_generator_limit_is_reported_and_timed_from_the_schedule(converge_run: labkit.Run) -> None:
    """Open loop on host3's d3-lite: at 10/s with the default cap (256 in flight) the generator keeps up (p99 lag under
    its 5 ms bound); at 120/s, 2 s long, with at most one request in flight (the generator's limit then: about one
    answer time, 1 / 15 ms) it falls behind - requests wait their turn in the generator, the level is reported NOT
    DRIVEN, latency from the send stays flat while latency from the schedule climbs (coordinated omission, measured
    instead of hidden). (One in flight at 10/s is not driven either under the p99 lag rule: two Poisson arrivals
    within one answer time are likely among 20.)"""
    start = time.monotonic()
    url = lite_url()
    p = params(request_rates=[10.0], samples=0, duration_s=2.0)
    load = {r["label"]: r for r in p["latency_requests"]}["q4"]
    target = {"name": "d3-lite", "url": url, "model": "d3-lite"}
    payload = bench_load.encode("d3-lite", load["body"])
    limit = bench_load.generator_limit(1200.0, 0.5, 1)
    (low,) = bench_load.open_levels(p, target, payload, 4, bench_load.Recorder(), limit)
    p = params(request_rates=[120.0], max_inflight=1, samples=0, duration_s=2.0)
    (high,) = bench_load.open_levels(p, target, payload, 4, bench_load.Recorder(), limit)
    table = bench_filter._open(high)
    print(f"\nopen loop on {url} (limit probe, 1 in flight: {limit}): 10/s from send p50 {low['p50']} from schedule "
          f"{low['from_schedule']['p50']} lag p99 {low['lag']['p99']} driven {low['driven']}; 120/s, 1 in flight, "
          f"from send p50 {high['p50']} from schedule "
          f"{high['from_schedule']['p50']} lag p50 {high['lag']['p50']} not sent {high['not_sent']}: {table}; "
          f"{time.monotonic() - start:.1f} s")
    # 10/s is driven unless the machine stalled the sender past the 5 ms bound on one of 20 requests (CI's 2 cores
    # under load: lag p99 5.18 ms once, 2026-12-03); then the verdict says so, and the sender still kept up typically
    bound = bench_load.lag_bound_ms(10.0)
    assert low["driven"] or low["lag"]["p99"] > bound, low
    assert low["lag"]["p50"] < bound, low
    assert not high["driven"] and table.startswith("NOT DRIVEN: the generator")
    assert high["p50"] < 2 * low["p50"]  # from the send: flat
    assert high["from_schedule"]["p50"] > 5 * low["from_schedule"]["p50"]  # from the schedule: climbing
    assert high["not_sent"] > 0 and high["lag"]["p50"] > high["p50"]


# --------------------------------------------------------------------------------------------- nightly against nightly
ROLLED = HOSTS[2]  # one instance (d3-lite) alone on its GPU: the cheapest restart, no neighbour's memory to race
MARKED = HOSTS[1]  # carries the rollout marker during the second bench run: refused
UNITS_ONLY = "--tags units,smoke,state"  # re-render the units and restart what changed (docs/testing.md)


MONITOR = "d3-lab-router1"  # the lab's d3-monitors (lab/roles/lab_hosts/templates/hosts.yml.j2)


def move(host: str, tag: str, limit: str | None = None, tags: str = UNITS_ONLY) -> labkit.Run:
    run = labkit.run_playbook("site.yml", limit=limit or host, extravars={"d3_image_name": f"{labkit.IMAGE}:{tag}"}, cmdline=tags)
    assert run.status == "successful", run.failure_text()
    return run


def move_back_a_second_run_on_the_monitor(host: str) -> None:
    """``host`` back to nightly in a site.yml run that is also the monitor's second run (issue 25: a second site.yml
    run changes nothing on the monitor): tag metrics too, so over every l4 host (the monitor reads every plan) and the
    monitor; nothing changes on the monitor."""
    run = move(host, "nightly", limit="l4-nodes:d3-monitors", tags=UNITS_ONLY + ",metrics")
    assert "Wait until Prometheus knows every target" in run.tasks_run(MONITOR), run.tasks_run(MONITOR)
    assert run.changed_tasks(MONITOR) == []


def test_bench_compare_across_a_rollout_flags_latency_not_accuracy(bench: dict[str, Any]) -> None:
    """The README's "after every nightly": the bench run above (nightly), ROLLED moved to nightly-next (the lab's
    simulator answers 1.5x slower there, the same answers) the cheapest way, benched again without load, and
    tools/bench_compare.py on the two reports; then ROLLED goes back to nightly, as converged (conftest's order).
    The same bench run also targets MARKED, which carries the rollout marker: refused there before any request, the
    rolled host benched all the same (this was its own bench.yml run, test_host_mid_rollout_is_refused)."""
    out = bench["dir"] / "next"
    try:
        move(ROLLED, "nightly-next")
        labkit.on_host(MARKED, f"mkdir -p {Path(MARKER).parent} && touch {MARKER}")
        try:
            run = labkit.run_playbook("playbooks/bench.yml", limit=f"{ROLLED},{MARKED}", extravars={
                **SHORT, "d3_bench_concurrency": [], "d3_bench_request_rates": [], "d3_bench_output": str(out / "report.json"),
                "d3_bench_plot_dir": ""})
        finally:
            labkit.on_host(MARKED, f"rm -f {MARKER}")
        assert run.failed(MARKED) and not run.failed(ROLLED), run.stats
        assert MARKER in run.failure_text(MARKED) and "rollout" in run.failure_text(MARKED)
        assert "Send the suite and the load from the host to each instance, one instance at a time" not in run.tasks_run(MARKED)
        assert "Send the suite and the load from the host to each instance, one instance at a time" in run.tasks_run(ROLLED)
        assert {i["host"] for i in json.loads((out / "report.json").read_text())["instances"]} == {ROLLED}
    finally:
        move_back_a_second_run_on_the_monitor(ROLLED)
    compare = bench["dir"] / "compare.json"
    tool = subprocess.run([sys.executable, str(labkit.ROOT / "tools/bench_compare.py"), str(bench["dir"] / "report.json"),
                           str(out / "report.json"), "--json", str(compare), "--plot", str(out / "bench-compare.png")],
                          capture_output=True, text=True, check=True)
    print(tool.stdout)
    result = json.loads(compare.read_text())
    rows = {r["instance"]: r for r in result["rows"]}
    assert {f"{ROLLED}/{i}" for i in labkit.running(ROLLED)} <= set(rows)  # every instance of the rolled host
    lite = rows[f"{ROLLED}/d3-lite"]
    assert lite["image"][0] != lite["image"][1], lite["image"]  # the run records tell the two digests apart
    for q in ("q2", "q4"):  # run-level: 5 runs a side, Welch on their medians
        assert lite["latency"][q]["runs"] == [5, 5] and lite["latency"][q]["changed"] and lite["latency"][q]["ratio"] > 1
    for row in rows.values():  # the same answers: no flip, nothing flagged
        assert row["accuracy"]["right_to_wrong"] == row["accuracy"]["wrong_to_right"] == [] and not row["accuracy"]["changed"]
    # the family holds only the tests that can reject (the second review): no flips, no calibration difference and
    # identical throughput runs are out of it, so at least host3's d3-lite's q2 and q4 latency remain
    assert "Holm (1979) step-down, family-wise error rate 0.05" in tool.stdout and result["tests"] >= 2
    assert "CHANGED" in tool.stdout and (out / "bench-compare.png").stat().st_size > 10_000
