"""The LAB STAND-IN simulator's per-size behaviour that bench.yml measures (lab/simulator/vllm_sim.py; no podman):
latency grows with the weights per GPU and the number of questions and is fitted to the field report's two points;
a batching engine queues beyond max_num_seqs; answers follow the state's words with per-model noise, so the shipped
suite's accuracy differs per model and per case; the smoke test's billing ticket stays billing for every size."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest
import testkit
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.d3fleet.fleet.plugins.filter import d3_bench as b  # noqa: E402

# checkpoint bytes (lab HF mirror metadata = the catalog's BF16 sizes) and weights per GPU after online FP8
SIZES = {"vllm-sr/d3": (52.2e9, 12.15), "vllm-sr/d3-flash": (19.4e9, 9.03), "vllm-sr/d3-mini": (9.4e9, 4.38),
         "vllm-sr/d3-nano": (4.6e9, 2.14), "vllm-sr/d3-lite": (1.8e9, 0.84), "vllm-sr/d3-edge": (1.4e9, 0.65)}


@pytest.fixture(scope="module")
def sim() -> ModuleType:
    return testkit.load_file("vllm_sim_bench", ROOT / "lab/simulator/vllm_sim.py")


def test_latency_fitted_to_the_field_report_and_growing_with_size(sim: ModuleType) -> None:
    def q4(w: float) -> float:
        return sim.REQUEST_BASE_MS + 4 * sim.per_question_ms(w)

    assert q4(12.15) == pytest.approx(470, abs=1)  # d3 27B TP 2, field report
    assert q4(9.03) == pytest.approx(215, abs=1)  # d3-flash, field report
    assert sim.REQUEST_BASE_MS + 2 * sim.per_question_ms(12.15) == pytest.approx(240, abs=2)
    per_q = [sim.per_question_ms(w) for _, w in SIZES.values()]
    assert per_q == sorted(per_q, reverse=True) and len(set(per_q)) == len(per_q)


def test_state_latency_from_env(sim: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    args = sim.parse_args(["--model", "vllm-sr/d3-flash", "--enforce-eager"])
    model = sim.Model("vllm-sr/d3-flash", Path("/x"), {}, int(19.4e9))
    plan = sim.Plan(8192, 1000, 9.03, 1.0)
    monkeypatch.delenv("D3_SIM_MS_PER_QUESTION", raising=False)
    st = sim.make_state(args, plan, model)
    assert (st.base_ms, round(st.ms_per_question, 1)) == (8.0, 51.7)
    assert st.service_time_s(4) == pytest.approx(0.215, abs=0.001)
    monkeypatch.setenv("D3_SIM_LATENCY_SCALE", "0.5")
    assert sim.make_state(args, plan, model).service_time_s(4) == pytest.approx(0.1075, abs=0.001)
    monkeypatch.setenv("D3_SIM_MS_PER_QUESTION", "50")
    fixed = sim.make_state(args, plan, model)
    assert (fixed.base_ms, fixed.ms_per_question) == (0.0, 25.0)  # the scale applies to the fixed cost too
    assert fixed.profile == sim.SizeProfile("vllm-sr/d3-flash", 0.5497, True)
    monkeypatch.delenv("D3_SIM_LATENCY_SCALE")
    assert sim.make_state(args, plan, model).ms_per_question == 50.0
    assert (fixed.max_num_seqs, fixed.batch_slowdown) == (8, 0.3)  # the stand-in defaults


def test_request_ms_stand_in_sets_the_latency_of_one_answer(sim: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """D3_SIM_REQUEST_MS (issue 22's slow answers): the same latency whatever the questions, above the others."""
    args = sim.parse_args(["--model", "vllm-sr/d3-flash", "--enforce-eager", "--max-num-seqs", "40"])
    model = sim.Model("vllm-sr/d3-flash", Path("/x"), {}, int(19.4e9))
    plan = sim.Plan(8192, 1000, 9.03, 1.0)
    monkeypatch.delenv("D3_SIM_LATENCY_SCALE", raising=False)
    monkeypatch.setenv("D3_SIM_MS_PER_QUESTION", "50")
    monkeypatch.setenv("D3_SIM_REQUEST_MS", "1000")
    st = sim.make_state(args, plan, model)
    st.running = 1  # alone
    assert st.service_time_s(1) == st.service_time_s(64) == 1.0
    assert st.max_num_seqs == 40  # --max-num-seqs wins over D3_SIM_MAX_NUM_SEQS's stand-in default
    monkeypatch.setenv("D3_SIM_LATENCY_SCALE", "1.5")  # what nightly-next bakes
    assert sim.make_state(args, plan, model).service_time_s(4) == 1.5


def test_nightly_next_is_built_to_answer_slower(sim: ModuleType) -> None:
    """build.sh bakes the stand-in regression into nightly-next only (issue 24: bench-compare across a rollout)."""
    text = (ROOT / "lab/simulator/build.sh").read_text()
    next_line = next(line for line in text.splitlines() if "variant=nightly-next" in line)
    assert "ENV D3_SIM_LATENCY_SCALE=1.5" in next_line
    assert text.count("D3_SIM_LATENCY_SCALE=") == 2  # here and in its comment: nightly and nightly-broken keep 1.0


def test_many_slow_requests_are_served_at_once(sim: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """32 keep-alive clients whose answers take 1 s: all 32 run in the engine at once (threaded server,
    --max-num-seqs 32), none waits for another."""
    import http.client
    import json

    args = sim.parse_args(["--model", "vllm-sr/d3-edge", "--served-model-name", "m", "--enforce-eager",
                           "--max-num-seqs", "32", "--uvicorn-log-level", "warning"])
    monkeypatch.setenv("D3_SIM_REQUEST_MS", "1000")
    monkeypatch.setenv("D3_SIM_BATCH_SLOWDOWN", "0")
    st = sim.make_state(args, sim.Plan(8192, 100_000, 0.65, 4.0), sim.Model("vllm-sr/d3-edge", Path("/x"), {}, 1))
    httpd = sim.SimHTTPServer(("127.0.0.1", 0), sim.make_handler(st))
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    body = json.dumps({"model": "m", "state": "s", "questions": {"q": {"type": "noul", "instructions": "x?"}}})
    statuses: list[int] = []
    peak = 0

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", httpd.server_address[1], timeout=30)
        conn.request("POST", "/v1/systemone", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        statuses.append(resp.status)
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(32)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            peak = max(peak, st.running)
            time.sleep(0.01)
        for t in threads:
            t.join(timeout=10)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert statuses == [200] * 32
    assert peak == 32


def test_batching_engine_slows_and_queues(sim: ModuleType) -> None:
    st = sim.State(args=None, plan=None, ms_per_question=10.0, base_ms=0.0, max_num_seqs=2, batch_slowdown=0.5)
    running: list[int] = []

    def one() -> None:
        with sim.engine_slot(st):
            running.append(st.running)
            time.sleep(0.05)

    threads = [threading.Thread(target=one) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(running) == 2  # never more than max_num_seqs at once
    with sim.engine_slot(st):
        assert st.service_time_s(2) == pytest.approx(0.02)
        st.running += 1  # another request running: +50 %
        assert st.service_time_s(2) == pytest.approx(0.03)
        st.running -= 1


def test_answers_differ_per_model_and_per_case_on_the_suite(sim: ModuleType) -> None:
    suite = yaml.safe_load((ROOT / "roles/d3_bench/files/suites/support-tickets.yml").read_text())
    reqs = b.bench_requests(suite)
    per_model: dict[str, int] = {}
    per_case: dict[str, list[bool]] = {}
    for repo, (size, _) in SIZES.items():
        prof = sim.SizeProfile.of(repo, int(size))
        cases = [{"id": c["id"], "status": 200, "answers": sim.decide(c["body"], "m", c["body"]["questions"], prof)["answers"]}
                 for c in reqs["cases"]]
        score = b.score_cases(cases, suite)
        per_model[repo] = score["correct"]
        for row in score["questions"]:
            per_case.setdefault(row["case"], []).append(row["correct"])
        again = [{"id": c["id"], "status": 200, "answers": sim.decide(c["body"], "m", c["body"]["questions"], prof)["answers"]}
                 for c in reqs["cases"]]
        assert again == cases  # deterministic
    assert len(set(per_model.values())) > 2, per_model
    fractions = {case: sum(v) / len(v) for case, v in per_case.items()}
    assert len(set(fractions.values())) > 2, fractions


def test_noise_shrinks_with_size_and_keeps_the_smoke_ticket_billing(sim: ModuleType) -> None:
    amps = [sim.SizeProfile.of(repo, int(size)).amplitude for repo, (size, _) in SIZES.items()]
    assert amps == sorted(amps) and amps[-1] < 1.5
    smoke = yaml.safe_load((ROOT / "roles/d3_smoke/defaults/main.yml").read_text())
    body = {"state": smoke["d3_smoke_state"], "questions": smoke["d3_smoke_questions"]}
    for repo, (size, _) in SIZES.items():
        out = sim.decide(body, "m", body["questions"], sim.SizeProfile.of(repo, int(size)))
        assert out["answers"]["team"]["choice"] == "billing", repo


def test_larger_sizes_read_negations(sim: ModuleType) -> None:
    assert sim.words_read("Not urgent at all, no access problem") == {"not", "all"}
    assert sim.SizeProfile.of("vllm-sr/d3-flash", int(19.4e9)).reads_negation
    assert not sim.SizeProfile.of("vllm-sr/d3-nano", int(4.6e9)).reads_negation
    q = {"type": "noul", "instructions": "Does the customer need a reply within the hour?"}
    state = "Not urgent at all, reply whenever you can."
    big = sim.answer(state, "u", q, profile=sim.SizeProfile("k", 0.0001, True))["noul"]
    small = sim.answer(state, "u", q, profile=sim.SizeProfile("k", 0.0001, False))["noul"]
    assert big < small


def test_seeded_flip_stand_in_turns_the_answers_of_the_named_states(sim: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """D3_SIM_FLIP_STATES (issue 34's seeded regression, a STAND-IN): the cases whose state holds one of its words
    get every answer turned around; the others are untouched; bench-compare's paired test lists exactly those."""
    suite = yaml.safe_load((ROOT / "roles/d3_bench/files/suites/support-tickets.yml").read_text())
    reqs = b.bench_requests(suite)
    prof = sim.SizeProfile.of("vllm-sr/d3", int(52.2e9))

    def score() -> dict:
        cases = [{"id": c["id"], "status": 200, "answers": sim.decide(c["body"], "m", c["body"]["questions"], prof)["answers"]}
                 for c in reqs["cases"]]
        return b.score_cases(cases, suite)

    monkeypatch.delenv("D3_SIM_FLIP_STATES", raising=False)
    before = score()
    monkeypatch.setenv("D3_SIM_FLIP_STATES", "charged twice, package , nothing-matches")
    after = score()
    flipped = {c["id"] for c in suite["cases"] if "charged twice" in str(c["state"]) or "package " in str(c["state"])}
    assert len(flipped) >= 2
    for old, new in zip(before["questions"], after["questions"], strict=True):
        if old["case"] not in flipped:
            assert old == new
        elif old["type"] == "noul":
            assert old["correct"] != new["correct"]  # a binary answer turned around: right <-> wrong
        elif old["type"] == "choice":
            assert old["given"] != new["given"]
        else:
            assert old["score"] + new["score"] == pytest.approx(2.0)  # three levels mirrored
    changed = {old["case"] for old, new in zip(before["questions"], after["questions"], strict=True)
               if old["correct"] != new["correct"]}
    assert changed and changed <= flipped  # what bench-compare's paired test lists: only the seeded cases
    # each kind turned around: the probabilities swap or mirror, the score mirrors
    a = {"type": "score", "score": 0.4, "probabilities": {"0": 0.7, "1": 0.2, "2": 0.1}}
    assert sim.flip_answer(a) == {"type": "score", "score": pytest.approx(1.6), "probabilities": {"0": 0.1, "1": 0.2, "2": 0.7}}
    c = {"type": "choice", "choice": "x", "probabilities": {"x": 0.6, "y": 0.3, "z": 0.1}}
    assert sim.flip_answer(c) == {"type": "choice", "choice": "z", "probabilities": {"x": 0.1, "y": 0.3, "z": 0.6}}
    n = {"type": "noul", "noul": 0.8, "probabilities": {"yes": 0.8, "no": 0.2}}
    assert sim.flip_answer(n) == {"type": "noul", "noul": pytest.approx(0.2), "probabilities": {"yes": 0.2, "no": 0.8}}
    monkeypatch.setenv("D3_SIM_FLIP_STATES", " , ")
    assert score()["questions"] == before["questions"]
