"""The lab side of each contract in tests/contracts/: the LAB STAND-IN vLLM simulator (lab/simulator/vllm_sim.py)
answers exactly as the fixtures written from vLLM's source say.

In-process, no podman: the simulator module is imported and its HTTP handler served on a loopback port from a
thread (the same handler the image runs). The request fields it accepts are checked against vLLM's
StructuredDecisionRequest (vllm/entrypoints/generate/structured_decisions/protocol.py).
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import math
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
KEY = "contract-key"


def load(name: str) -> dict[str, Any]:
    return json.loads((HERE / name).read_text())


REQUEST = load("vllm/systemone-request.json")
RESPONSE = load("vllm/systemone-response.json")
UNAUTHORIZED = load("vllm/unauthorized.json")
HEALTH = load("vllm/health.json")
MODELS = load("vllm/models.json")
SERVED = MODELS["body"]["data"][0]["id"]
# vLLM StructuredDecisionRequest's fields (protocol.py, read 2026-11-30 from vllm-project/vllm)
VLLM_REQUEST_FIELDS = {"model", "state", "questions", "instructions", "decision_template", "chat_template_kwargs",
                       "seed", "priority", "request_id"}
VLLM_QUESTION_FIELDS = {"type", "instructions", "criteria"}


@pytest.fixture(scope="module")
def sim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_sim_contract", ROOT / "lab/simulator/vllm_sim.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


class Server:
    def __init__(self, sim: ModuleType, api_key: str | None) -> None:
        argv = ["--model", MODELS["body"]["data"][0]["root"], "--served-model-name", SERVED,
                "--max-model-len", str(MODELS["body"]["data"][0]["max_model_len"]), "--enforce-eager"]
        args = sim.parse_args([*argv, *(["--api-key", api_key] if api_key else [])])
        args.uvicorn_log_level = "warning"
        self.state = sim.State(args=args, plan=sim.Plan(args.max_model_len, 100_000, 9.0, 4.0), ms_per_question=0.0)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), sim.make_handler(self.state))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def call(self, method: str, path: str, body: Any = None, key: str | None = None) -> tuple[int, bytes, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        conn.request(method, path, json.dumps(body).encode() if body is not None else None, headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, data, resp.getheader("content-type") or ""

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server(sim: ModuleType) -> Iterator[Server]:
    s = Server(sim, KEY)
    yield s
    s.close()


def request_body() -> dict[str, Any]:
    return {k: v for k, v in REQUEST.items() if not k.startswith("_")}


def shape(obj: Any) -> Any:
    """Keys at every level and JSON value types (numbers as one type)."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items() if not k.startswith("_")}
    if isinstance(obj, bool):
        return "bool"
    if isinstance(obj, (int, float)):
        return "number"
    return type(obj).__name__


@pytest.fixture(scope="module")
def answer(server: Server) -> dict[str, Any]:
    status, body, ctype = server.call("POST", "/v1/systemone", request_body(), KEY)
    assert status == 200, body
    assert ctype.startswith("application/json")
    return json.loads(body)


def test_systemone_answer_has_exactly_the_fixture_structure(answer: dict[str, Any]) -> None:
    assert shape(answer) == shape(RESPONSE)
    assert answer["object"] == "structured_decision"
    assert answer["model"] == RESPONSE["model"] == REQUEST["model"]
    assert isinstance(answer["id"], str) and answer["id"]
    assert isinstance(answer["created"], int) and not isinstance(answer["created"], bool)
    for key in ("input_tokens", "output_tokens"):
        assert isinstance(answer["usage"][key], int) and answer["usage"][key] >= 0
    assert answer["usage"]["output_tokens"] == len(REQUEST["questions"])


def test_choice_answer_follows_vllm(answer: dict[str, Any]) -> None:
    q, a = REQUEST["questions"]["team"], answer["answers"]["team"]
    assert list(a["probabilities"]) == list(q["criteria"])
    assert a["choice"] in q["criteria"]
    assert a["probabilities"][a["choice"]] == max(a["probabilities"].values())
    assert math.isclose(sum(a["probabilities"].values()), 1.0, abs_tol=1e-9)
    mass = answer["diagnostics"]["team"]["label_mass"]
    assert math.isclose(a["confidence"], a["probabilities"][a["choice"]] * mass, rel_tol=1e-9)
    assert 0.0 <= a["confidence"] <= a["probabilities"][a["choice"]]


def test_noul_answer_follows_vllm(answer: dict[str, Any]) -> None:
    a = answer["answers"]["urgent"]
    assert set(a["probabilities"]) == {"yes", "no"}
    assert 0.0 <= a["noul"] <= 1.0
    assert a["noul"] == a["probabilities"]["yes"]
    assert math.isclose(a["probabilities"]["yes"] + a["probabilities"]["no"], 1.0, abs_tol=1e-9)
    mass = answer["diagnostics"]["urgent"]["label_mass"]
    assert math.isclose(a["confidence"], max(a["probabilities"].values()) * mass, rel_tol=1e-9)
    assert 0.0 <= a["confidence"] <= max(a["probabilities"].values())


def test_score_answer_follows_vllm(answer: dict[str, Any]) -> None:
    levels = REQUEST["questions"]["tone"]["criteria"]
    a = answer["answers"]["tone"]
    n = len(levels)
    assert a["legend"] == {str(i): lv for i, lv in enumerate(levels)}
    assert list(a["probabilities"]) == [str(i) for i in range(n)]
    assert math.isclose(sum(a["probabilities"].values()), 1.0, abs_tol=1e-9)
    assert math.isclose(a["score"], sum(i * a["probabilities"][str(i)] for i in range(n)), rel_tol=1e-9)
    assert 0.0 <= a["score"] <= n - 1
    top = max(a["probabilities"].values())
    mass = answer["diagnostics"]["tone"]["label_mass"]
    assert math.isclose(a["confidence"], top * mass, rel_tol=1e-9)
    assert 0.0 <= a["confidence"] <= top


def test_diagnostics_per_question(answer: dict[str, Any]) -> None:
    assert list(answer["diagnostics"]) == list(REQUEST["questions"])
    for d in answer["diagnostics"].values():
        assert 0.0 <= d["label_mass"] <= 1.0
        assert isinstance(d["argmax_is_label"], bool)


def test_the_fixture_request_uses_only_vllm_fields() -> None:
    assert set(request_body()) <= VLLM_REQUEST_FIELDS
    for q in REQUEST["questions"].values():
        assert set(q) <= VLLM_QUESTION_FIELDS


def test_simulator_accepts_exactly_vllms_request_fields(sim: ModuleType) -> None:
    assert sim.REQUEST_FIELDS == VLLM_REQUEST_FIELDS
    assert sim.QUESTION_FIELDS == VLLM_QUESTION_FIELDS


def test_all_vllm_request_fields_accepted(server: Server) -> None:
    body = {**request_body(), "instructions": "Support tickets.", "chat_template_kwargs": {}, "seed": 7,
            "priority": 0, "request_id": "contract-1", "decision_template": None}
    status, data, _ = server.call("POST", "/v1/systemone", body, KEY)
    assert status == 200, data


def test_unknown_request_field_is_ignored_like_vllms_openaibasemodel(server: Server,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """OpenAIBaseModel (vllm/entrypoints/openai/engine/protocol.py): extra="allow" and a logged warning."""
    status, data, _ = server.call("POST", "/v1/systemone", {**request_body(), "cache_salt": "x", "stream": True},
                                  KEY)
    assert status == 200, data
    assert "The following fields were present in the request but ignored" in capsys.readouterr().out


def test_unknown_question_field_is_refused_like_vllms_serving(server: Server) -> None:
    body = request_body()
    body["questions"] = {**body["questions"], "extra": {"type": "noul", "instructions": "x?", "temperature": 0}}
    status, data, _ = server.call("POST", "/v1/systemone", body, KEY)
    assert status == 400
    assert "unknown field(s) ['temperature']" in json.loads(data)["error"]["message"]


@pytest.mark.parametrize("path", UNAUTHORIZED["guarded_paths"])
def test_v1_paths_without_the_key_answer_the_fixture(server: Server, path: str) -> None:
    method = "GET" if path == "/v1/models" else "POST"
    for key in (None, "wrong-key"):
        status, data, ctype = server.call(method, path, request_body() if method == "POST" else None, key)
        assert (status, json.loads(data)) == (UNAUTHORIZED["status"], UNAUTHORIZED["body"])
        assert ctype.startswith("application/json")


@pytest.mark.parametrize("path", UNAUTHORIZED["open_paths"])
def test_open_paths_stay_open_without_the_key(server: Server, path: str) -> None:
    assert server.call("GET", path)[0] == 200


def test_health_answers_the_fixture(server: Server) -> None:
    status, data, _ = server.call("GET", HEALTH["path"])
    assert (status, data.decode()) == (HEALTH["serving"]["status"], HEALTH["serving"]["body"])
    assert not HEALTH["needs_api_key"]


def test_health_503_when_the_engine_is_dead(sim: ModuleType) -> None:
    s = Server(sim, None)
    try:
        s.state.engine_dead = True
        assert s.call("GET", HEALTH["path"])[0] == HEALTH["engine_dead"]["status"]
    finally:
        s.close()


def test_models_answers_the_fixture(server: Server) -> None:
    assert MODELS["needs_api_key"]
    status, data, _ = server.call("GET", MODELS["path"], key=KEY)
    assert status == MODELS["status"]
    body = json.loads(data)
    assert body["object"] == MODELS["body"]["object"]
    assert len(body["data"]) == len(MODELS["body"]["data"])
    for got, want in zip(body["data"], MODELS["body"]["data"], strict=True):
        assert set(want) <= set(got)
        assert shape({k: got[k] for k in want}) == shape(want)
        assert {k: got[k] for k in want if k != "created"} == {k: v for k, v in want.items() if k != "created"}


KEEP_ALIVE = load("vllm/keep-alive.json")


def test_keep_alive_default_and_env_are_vllms(sim: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    assert sim.State(args=None, plan=None).keep_alive_s == KEEP_ALIVE["default_s"]
    args = sim.parse_args(["--model", "vllm-sr/d3-mini", "--enforce-eager"])
    model = sim.Model("vllm-sr/d3-mini", Path("/x"), {}, int(9.4e9))
    monkeypatch.delenv(KEEP_ALIVE["env"], raising=False)
    assert sim.make_state(args, sim.Plan(8192, 1000, 4.4, 1.0), model).keep_alive_s == KEEP_ALIVE["default_s"]
    monkeypatch.setenv(KEEP_ALIVE["env"], "2")
    assert sim.make_state(args, sim.Plan(8192, 1000, 4.4, 1.0), model).keep_alive_s == 2


def test_idle_keep_alive_connection_is_closed_after_the_timeout_not_before(sim: ModuleType) -> None:
    """The fixture's uvicorn behaviour, with a short timeout: a connection is reused right after a response, and
    closed without a response once it has been idle for the timeout (polled with a deadline)."""
    s = Server(sim, None)
    s.state.keep_alive_s = 0.4
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
        for _ in range(3):  # kept alive between requests sent at once
            conn.request("GET", "/health")
            resp = conn.getresponse()
            assert (resp.status, resp.read(), resp.will_close) == (200, b"", False)
        sock = conn.sock
        assert sock is not None
        sock.settimeout(5)  # the server closes first: recv returns b"" (EOF), no bytes of a response
        assert sock.recv(1) == b""
        conn.close()
    finally:
        s.close()


def test_no_keep_alive_timer_before_the_first_request(sim: ModuleType) -> None:
    """uvicorn arms the timer only after a response: a fresh connection that waits longer than the timeout is
    still served."""
    import socket
    import time
    s = Server(sim, None)
    s.state.keep_alive_s = 0.2
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
            deadline = time.monotonic() + 0.5  # longer than the timeout, then the request
            while time.monotonic() < deadline:
                time.sleep(0.05)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 200")
    finally:
        s.close()


METRICS = yaml.safe_load((HERE / "metrics/names.yml").read_text())["vllm"]


def parse_metrics(text: str) -> tuple[dict[str, tuple[str, str]], dict[tuple[str, frozenset[tuple[str, str]]], float]]:
    """Prometheus text format -> ({family: (type, help)}, {(sample name, labels): value})."""
    import re
    meta: dict[str, list[str]] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if m := re.fullmatch(r"# (HELP|TYPE) (\S+) (.*)", line):
            meta.setdefault(m.group(2), ["", ""])[m.group(1) == "HELP"] = m.group(3)
        elif line:
            m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)', line)
            assert m, line
            labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
            samples[(m.group(1), labels)] = float(m.group(3))
    return {k: (v[0], v[1]) for k, v in meta.items()}, samples


def metric(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **extra: str) -> float:
    return samples[(name, frozenset({("model_name", SERVED), ("engine", "0"), *extra.items()}))]


def test_metrics_have_vllms_names_types_and_labels(server: Server) -> None:
    """Every vLLM metric of the contract (tests/contracts/metrics/names.yml), exposed as prometheus_client writes it:
    the TYPE line names the family, a counter's sample ends in _total, a histogram has cumulative buckets with
    vLLM's bounds, +Inf equal to _count; model_name and engine on every sample; no other vllm: series."""
    status, data, ctype = server.call("GET", METRICS["path"])
    assert status == 200 and ctype.startswith("text/plain")
    families, samples = parse_metrics(data.decode())
    for name, kind in METRICS["metrics"].items():
        assert families[name][0] == kind, name
        assert families[name][1], name  # a help text
        if kind == "gauge":
            assert metric(samples, name) >= 0
        elif name == "vllm:request_success":
            for reason in METRICS["finished_reasons"]:
                assert metric(samples, f"{name}_total", finished_reason=reason) >= 0
        elif kind == "counter":
            assert metric(samples, f"{name}_total") >= 0
        else:
            les = [float(le) for (n, labels), _ in samples.items() if n == f"{name}_bucket"
                   for k, le in labels if k == "le"]
            assert les == [*METRICS["request_latency_buckets"], float("inf")], name
            assert metric(samples, f"{name}_count") == metric(samples, f"{name}_bucket", le="+Inf")
            assert metric(samples, f"{name}_sum") >= 0
    assert {n for n, _ in samples if n.startswith("vllm:")} <= {
        f"{n}{suffix}" for n in METRICS["metrics"] for suffix in ("", "_total", "_bucket", "_count", "_sum")}
    assert "vllm:gpu_cache_usage_perc" not in families  # the deprecated twin
    assert all(set(dict(labels)) >= set(METRICS["labels"]) for _, labels in samples)


def test_metrics_move_with_concurrent_load_like_vllms_scheduler(sim: ModuleType) -> None:
    """Five 0.6 s requests on an engine of two slots: two running, three waiting, KV blocks in use while they run;
    afterwards nothing running or waiting, five successes, five queue and e2e observations, the prompt tokens."""
    import time
    s = Server(sim, None)
    s.state.base_ms, s.state.batch_slowdown, s.state.max_num_seqs = 600.0, 0.0, 2
    s.state.plan.kv_tokens = 1000
    before = parse_metrics(s.call("GET", "/metrics")[1].decode())[1]
    done: list[int] = []
    threads = [threading.Thread(target=lambda: done.append(s.call("POST", "/v1/systemone", request_body())[0]))
               for _ in range(5)]
    try:
        for t in threads:
            t.start()
        peak: dict[str, float] = {}
        deadline = time.monotonic() + 10
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            now = parse_metrics(s.call("GET", "/metrics")[1].decode())[1]
            for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
                peak[name] = max(peak.get(name, 0.0), metric(now, name))
        for t in threads:
            t.join(timeout=10)
        after = parse_metrics(s.call("GET", "/metrics")[1].decode())[1]
    finally:
        s.close()
    assert done == [200] * 5
    assert peak["vllm:num_requests_running"] == 2
    assert peak["vllm:num_requests_waiting"] == 3
    n_prompt = sim.prompt_tokens(request_body(), REQUEST["questions"])
    one_seq = -(-(n_prompt + len(REQUEST["questions"])) // 16) * 16 / 1000  # whole 16-token blocks of 1000
    assert peak["vllm:kv_cache_usage_perc"] == pytest.approx(2 * one_seq)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert metric(before, name) == metric(after, name) == 0
    assert metric(after, "vllm:request_success_total", finished_reason="length") == 5
    assert metric(after, "vllm:prompt_tokens_total") == 5 * n_prompt
    assert metric(after, "vllm:generation_tokens_total") == 5 * len(REQUEST["questions"])
    e2e, queue = "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"
    assert metric(after, f"{e2e}_count") == metric(after, f"{queue}_count") == 5
    assert metric(after, f"{e2e}_bucket", le="0.5") == 0  # every request took >= 0.6 s
    assert metric(after, f"{queue}_bucket", le="0.3") == 2  # the first two did not wait, three waited a round or two
    assert metric(after, f"{queue}_sum") >= 3 * 0.6 - 0.3
    assert metric(after, f"{e2e}_sum") >= 5 * 0.6


def test_queue_time_is_recorded_when_a_request_finishes_and_a_wedged_engine_finishes_nothing(
    sim: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM records vllm:request_queue_time_seconds for finished requests only (loggers.py record(): the
    finished_requests' queued_time; tests/contracts/metrics/names.yml): with the STAND-IN wedge switch on, requests
    hold their slots (running 2, waiting 1), nothing is counted finished and the queue-time histogram does not move;
    removed, they finish and are recorded then."""
    import time

    wedge = tmp_path / "wedge"
    monkeypatch.setenv("D3_SIM_WEDGE_FILE", str(wedge))
    wedge.touch()
    s = Server(sim, None)
    s.state.base_ms, s.state.batch_slowdown, s.state.max_num_seqs = 50.0, 0.0, 2
    done: list[int] = []
    threads = [threading.Thread(target=lambda: done.append(s.call("POST", "/v1/systemone", request_body())[0]))
               for _ in range(3)]  # fmt: skip
    try:
        for t in threads:
            t.start()
        deadline, now = time.monotonic() + 10, {}
        while time.monotonic() < deadline:
            now = parse_metrics(s.call("GET", "/metrics")[1].decode())[1]
            if metric(now, "vllm:num_requests_running") == 2 and metric(now, "vllm:num_requests_waiting") == 1:
                break
            time.sleep(0.05)
        time.sleep(0.5)
        held = parse_metrics(s.call("GET", "/metrics")[1].decode())[1]
        assert (metric(held, "vllm:num_requests_running"), metric(held, "vllm:num_requests_waiting")) == (2, 1)
        assert metric(held, "vllm:request_queue_time_seconds_count") == 0
        assert sum(metric(held, "vllm:request_success_total", finished_reason=r) for r in METRICS["finished_reasons"]) == 0
        assert s.call("GET", "/health")[0] == 200  # a wedged engine still answers /health
        wedge.unlink()
        for t in threads:
            t.join(timeout=10)
        after = parse_metrics(s.call("GET", "/metrics")[1].decode())[1]
    finally:
        wedge.unlink(missing_ok=True)
        s.close()
    assert done == [200] * 3
    assert metric(after, "vllm:request_queue_time_seconds_count") == 3
    assert metric(after, "vllm:request_queue_time_seconds_bucket", le="0.3") == 2  # the third waited past 0.3 s
    assert metric(after, "vllm:num_requests_running") == 0


# ------------------------------------------------------------------ startup memory: vLLM's KV cache arithmetic
ARCH = json.loads((HERE / "d3-architectures.json").read_text())["models"]
GIB = 1024**3


def test_kv_layout_of_d3_at_tp2_is_vllms_arithmetic_worked_by_hand(sim: ModuleType) -> None:
    """d3 (64 layers: 16 full attention, 48 Gated DeltaNet), TP 2, BF16 KV cache. Per GPU: attention 2 (K, V) x
    2 KV heads x 256 x 2 B = 2048 B per token; GDN state = conv 3 x (128 x 16 x 2 + 128 x 48) / 2 x 2 B = 30,720 B
    + temporal 24 x 128 x 128 x 4 B (float32) = 1,572,864 B -> 1,603,584 B; attention block 16 x cdiv(1603584,
    16 x 2048) = 784 tokens, page 784 x 2048 = 1,605,632 B; groups of 16 layers: 1 attention + 3 state groups."""
    lay = sim.kv_layout(ARCH["d3"]["config"], "auto", 2)
    assert (lay.block_size, lay.page_bytes, lay.state_page_bytes) == (784, 1_605_632, 1_603_584)
    assert (lay.group_size, lay.attn_groups, lay.state_groups) == (16, 1, 3)
    assert lay.blocks_per_sequence(8192) == 11 + 3  # cdiv(8192, 784) attention blocks + one state block per group
    assert lay.needed_bytes(8192) == 16 * 1_605_632 * 14
    pool = 5 * GIB
    blocks = pool // 1_605_632 // 16
    assert lay.capacity(pool, 8192) == (blocks // 4 * 784, blocks / 14)
    fp8 = sim.kv_layout(ARCH["d3"]["config"], "fp8", 2)  # 1-byte KV: twice the tokens in the same page
    assert (fp8.block_size, fp8.page_bytes) == (1568, 1_605_632)


def test_kv_layout_groups_like_vllm(sim: ModuleType) -> None:
    edge = sim.kv_layout(ARCH["d3-edge"]["config"], "auto", 1)  # 12 layers: 3 full, 9 GDN -> groups of 3
    assert (edge.group_size, edge.attn_groups, edge.state_groups) == (3, 1, 3)
    # max < 1.5 x min: groups of the max, padded (gpt-oss-20b + eagle's 12 sw + 13 full in vLLM's comment)
    odd = {"text_config": {**ARCH["d3-edge"]["config"]["text_config"], "num_hidden_layers": 11,
                           "layer_types": ["full_attention"] * 5 + ["linear_attention"] * 6}}
    assert sim.kv_layout(odd, "auto", 1).group_size == 6
    plain = {"text_config": {**ARCH["d3-edge"]["config"]["text_config"], "layer_types": ["full_attention"] * 12}}
    lay = sim.kv_layout(plain, "auto", 1)  # no GDN layer: 16-token blocks, one group
    assert (lay.block_size, lay.page_bytes, lay.groups, lay.group_size) == (16, 16 * 2 * 2 * 256 * 2, 1, 12)
    assert lay.capacity(GIB, 4096)[0] == GIB // lay.page_bytes // 12 * 16


def test_estimated_max_model_len_is_the_longest_that_fits(sim: ModuleType) -> None:
    lay = sim.kv_layout(ARCH["d3-mini"]["config"], "auto", 1)
    pool = lay.needed_bytes(100_000)
    est = lay.estimate_max_model_len(pool, 262144)
    assert est >= 100_000 and lay.needed_bytes(est) <= pool < lay.needed_bytes(est + 1)
    assert lay.estimate_max_model_len(lay.needed_bytes(1) - 1, 262144) == 0


def start_plan(sim: ModuleType, monkeypatch: pytest.MonkeyPatch, argv: list[str], size: str, weights: int,
               gpus: int = 1) -> Any:
    """check_and_plan on simulated L4s (memory.total 23034 MiB, nothing used) for the size's config.json."""
    l4s = [sim.Gpu(i, "NVIDIA L4", f"GPU-{i}", 23034, 0, "580.95.05", "8.9") for i in range(gpus)]
    monkeypatch.setattr(sim, "CLAIM", sim.GpuClaim("/nonexistent-claims"))  # nothing published: free_mib takes
    monkeypatch.setattr(sim, "query_gpus", lambda: l4s)  # this process's memory off nvidia-smi's figure
    model = sim.Model(ARCH[size]["hf_repo"], Path("/x"), ARCH[size]["config"], weights)
    return sim.check_and_plan(sim.parse_args(["--model", model.repo, *argv]), l4s, model, lambda _: None)


def test_startup_logs_vllms_two_lines(sim: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The field report's recipe: d3 BF16 checkpoint, online FP8, TP 2, 0.95, 8192. Pool = 0.95 x the L4's 22.03 GiB
    (22560 MiB, torch's total) - 52.2 GB / 2 / 2 of weights - the profile run's 8192 tokens x 96768 B - the 512 MiB
    non-torch stand-in; vLLM's layout of it, logged in vLLM's words."""
    plan = start_plan(sim, monkeypatch, ["-tp", "2", "--quantization", "fp8", "--gpu-memory-utilization", "0.95",
                                         "--max-model-len", "8192", "--enforce-eager"], "d3", 52_200_000_000, 2)
    pool = int(22560 * 2**20 * 0.95) - 52_200_000_000 // 4 - 8192 * 96768 - 512 * 2**20
    blocks = pool // 1_605_632 // 16
    assert plan.kv_tokens == blocks // 4 * 784
    out = capsys.readouterr().out
    assert f"] GPU KV cache size: {blocks // 4 * 784:,} tokens\n" in out
    assert f"] Maximum concurrency for 8,192 tokens per request: {blocks / 14:.2f}x\n" in out
    assert "] Setting attention block size to 784 tokens to ensure that attention page size is >= mamba page size." in out


def test_refuses_a_pool_that_cannot_hold_one_sequence_like_vllm(sim: ModuleType,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe at 0.9 and the default 262144 positions with chunked prefill (a 2048-token profile run): vLLM's
    _check_enough_kv_cache_memory message, verbatim."""
    with pytest.raises(sim.SimExit) as err:
        start_plan(sim, monkeypatch, ["-tp", "2", "--quantization", "fp8", "--gpu-memory-utilization", "0.9",
                                      "--enforce-eager", "--enable-chunked-prefill"], "d3", 52_200_000_000, 2)
    lay = sim.kv_layout(ARCH["d3"]["config"], "auto", 2)
    pool = int(22560 * 2**20 * 0.9) - 52_200_000_000 // 4 - 2048 * 96768 - 512 * 2**20
    est = lay.estimate_max_model_len(pool, 262144)
    assert err.value.exc_type == "ValueError" and err.value.code == 1
    assert err.value.message == (
        f"To serve at least one request with the models's max seq len (262144), ({round(lay.needed_bytes(262144) / GIB, 2)}"
        f" GiB KV cache is needed, which is larger than the available KV cache memory ({round(pool / GIB, 2)} GiB). "
        f"Based on the available memory, the estimated maximum model length is {est}. Try increasing "
        "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. See "
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
    with pytest.raises(sim.SimExit) as none:  # weights + profile + non-torch take the whole budget: no pool
        start_plan(sim, monkeypatch, ["--gpu-memory-utilization", "0.5", "--max-model-len", "8192",
                                      "--enforce-eager"], "d3-mini", int(0.5 * 22560 * 2**20 - 512 * 2**20))
    assert none.value.message.startswith("No available memory for the cache blocks. Try increasing "
                                         "`gpu_memory_utilization` when initializing the engine. See https://")
