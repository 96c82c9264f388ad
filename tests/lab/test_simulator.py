"""Tests of the LAB STAND-IN vLLM D3 simulator (lab/simulator/vllm_sim.py, image localhost/d3-vllm-sim:<tag>).

Unit tests import the simulator module directly. The `lab` tests start the real image with podman on this
machine: container names `d3simtest-*`, host network on a random loopback port, an HF cache in a tmp dir with a
tiny D3-shaped snapshot, and fake GPUs (`--device /dev/null:/dev/nvidiaN` + a fake `nvidia-smi` script that
prints L4 lines, bind-mounted at /usr/bin/nvidia-smi). The session fixture runs lab/simulator/build.sh first
(idempotent, ~1 s when the image is current) so the image always matches the source; a `lab` test FAILS when
podman or the image is missing (the lab is part of what is tested, not optional).

The GPU-memory and driver tests give the container the lab driver stand-in instead of the fake: the stand-in
nvidia-smi built from lab/nvidia/src (Python; runs with the image's python3), its "NVML" data written by the
stand-in lab-nvidia-setup, and a claims directory shared by every container of the test (as the lab CDI spec
shares /run/lab-nvidia on a lab host), so simulator instances see each other's memory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from labkit import free_port, podman, wait_until

ROOT = Path(__file__).resolve().parents[2]
SIM_DIR = ROOT / "lab" / "simulator"
IMAGE = "localhost/d3-vllm-sim"
L4_MIB = 23034
TORCH_L4_MIB = 22560  # what torch.cuda.mem_get_info() reports for an L4 (tests/contracts/vllm/gpu-memory.json)


CONTEXT_MIB = 512  # the simulator's CUDA-context stand-in, held beside each process's share (CUDA_CONTEXT_STAND_IN_MIB)


def share_mib(util: float) -> int:
    """The simulator's share of an L4 as vLLM takes it: util x torch's total, in whole MiB."""
    return int(TORCH_L4_MIB * 2**20 * util) // 2**20


def held_mib(util: float) -> int:
    """What a started simulator holds on a GPU, as nvidia-smi counts it: its share and its CUDA context."""
    return share_mib(util) + CONTEXT_MIB
NVIDIA_SRC = ROOT / "lab" / "nvidia" / "src" / "lab-nvidia-driver"
LITE_REV = "b" * 40
D3_REV = "c" * 40
MINI_REV = "a" * 40
lab = pytest.mark.lab

SMOKE = {
    "state": {"ticket": "My card was charged twice for one order."},
    "questions": {
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this ticket?",
            "criteria": {"billing": "payments and refunds", "shipping": "deliveries", "security": "account access"},
        },
        "urgent": {"type": "noul", "instructions": "Does the customer need a reply within the hour?"},
        "tone": {"type": "score", "instructions": "How upset is the customer?", "criteria": ["calm", "annoyed", "furious"]},
    },
}


# ------------------------------------------------------------------------------------------- unit tests
@pytest.fixture(scope="module")
def sim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_sim", SIM_DIR / "vllm_sim.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vllm_sim"] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def test_smoke_example_picks_billing_and_probabilities_sum_to_one(sim: ModuleType) -> None:
    model, qs = sim.validate_request({"model": "d3", **SMOKE}, ["d3"])
    out = sim.decide({"model": "d3", **SMOKE}, model, qs)
    assert out["object"] == "structured_decision"
    assert out["answers"]["team"]["choice"] == "billing"
    for ans in out["answers"].values():
        assert abs(sum(ans["probabilities"].values()) - 1.0) < 1e-6
        assert 0.0 <= ans["confidence"] <= 1.0
    assert 0.0 <= out["answers"]["urgent"]["noul"] <= 1.0
    assert out["answers"]["tone"]["legend"] == {"0": "calm", "1": "annoyed", "2": "furious"}
    again = sim.decide({"model": "d3", **SMOKE}, model, qs)
    assert again["answers"] == out["answers"]  # deterministic


def test_shipping_ticket_picks_shipping(sim: ModuleType) -> None:
    body = {**SMOKE, "state": "My package never arrived, the courier tracking shows no delivery."}
    _, qs = sim.validate_request(body, ["d3"])
    assert sim.decide(body, "d3", qs)["answers"]["team"]["choice"] == "shipping"


@pytest.mark.parametrize(
    ("patch", "status"),
    [
        ({"decision_template": "{{ state }}"}, 400),  # needs --trust-request-chat-template
        ({"priority": "high"}, 400),
        ({"seed": 1.5}, 400),
        ({"model": "nope"}, 404),
        ({"questions": {}}, 400),
        ({"questions": {f"q{i}": {"type": "noul", "instructions": "x?"} for i in range(65)}}, 400),
        ({"questions": {"q": {"type": "choice", "instructions": "x?", "criteria": {"only": None}}}}, 400),
        ({"questions": {"q": {"type": "choice", "instructions": "x?",
                              "criteria": {chr(65 + i): None for i in range(27)}}}}, 400),
        ({"questions": {"q": {"type": "noul", "instructions": "x?", "criteria": {"yes": "a", "no": "b"}}}}, 400),
        ({"questions": {"q": {"type": "score", "instructions": "x?", "criteria": ["only"]}}}, 400),
        ({"questions": {"q": {"type": "score", "instructions": "x?", "criteria": [str(i) for i in range(11)]}}}, 400),
        ({"questions": {"q": {"type": "rank", "instructions": "x?"}}}, 400),
        ({"questions": {"q": {"type": "noul", "instructions": "x?", "temperature": 0}}}, 400),
        ({"state": None}, 400),
    ],
)
def test_validation_rejects(sim: ModuleType, patch: dict[str, Any], status: int) -> None:
    with pytest.raises(sim.ApiError) as err:
        sim.validate_request({"model": "d3", **SMOKE, **patch}, ["d3"])
    assert err.value.status == status
    assert err.value.body()["error"]["code"] == status


def test_validation_accepts_limits(sim: ModuleType) -> None:
    qs = {f"q{i}": {"type": "noul", "instructions": "ok?", "criteria": {"true": "y", "false": "n"}} for i in range(64)}
    qs["c"] = {"type": "choice", "instructions": "x?", "criteria": {chr(65 + i): None for i in range(26)}}
    qs.pop("q0")
    body = {"state": "s", "questions": qs, "instructions": "be brief", "chat_template_kwargs": {}, "seed": 3,
            "priority": -1, "request_id": "r-1"}
    assert sim.validate_request(body, ["d3"])[0] == "d3"
    assert sim.validate_request({**body, "decision_template": "{{ state }}"}, ["d3"], trust_template=True)


def test_unknown_request_fields_are_ignored_and_logged_like_vllm(sim: ModuleType,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's OpenAIBaseModel (extra="allow" + __log_extra_fields__): accepted, ignored, a warning logged."""
    model, _ = sim.validate_request({**SMOKE, "stream": True, "cache_salt": "x"}, ["d3"])
    assert model == "d3"
    assert "The following fields were present in the request but ignored" in capsys.readouterr().out


def test_cold_start_scales_with_checkpoint_size(sim: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("D3_SIM_COLD_START_S", raising=False)
    monkeypatch.delenv("D3_SIM_COLD_START_SCALE", raising=False)
    d3 = sim.Model("vllm-sr/d3", Path("/x"), {}, 52_200_000_000)
    mini = sim.Model("vllm-sr/d3-mini", Path("/x"), {}, 9_319_730_176)
    assert sim.cold_start_s(d3) == pytest.approx(150.0)  # the field report's 2.5 min
    assert sim.cold_start_s(mini) == pytest.approx(150.0 * 9_319_730_176 / 52_200_000_000)
    monkeypatch.setenv("D3_SIM_COLD_START_SCALE", "0.0333")  # what the lab image sets
    assert sim.cold_start_s(d3) == pytest.approx(5.0, abs=0.01)
    monkeypatch.setenv("D3_SIM_COLD_START_S", "1.5")  # absolute override (tests)
    assert sim.cold_start_s(d3) == 1.5


@pytest.mark.parametrize(("driver", "compat", "ok"), [
    ("580.95.05", False, True), ("590.10.01", False, True), ("570.195.03", False, False),
    ("570.195.03", True, True), ("535.274.02", True, True), ("530.30.02", True, False)])
def test_driver_check(sim: ModuleType, monkeypatch: pytest.MonkeyPatch, driver: str, compat: bool, ok: bool) -> None:
    monkeypatch.setenv("VLLM_ENABLE_CUDA_COMPATIBILITY", "1" if compat else "0")
    gpus = [sim.Gpu(0, "NVIDIA L4", "GPU-0", L4_MIB, 0, driver, "8.9")]
    if ok:
        sim.check_driver(gpus)
        return
    with pytest.raises(sim.SimExit) as err:
        sim.check_driver(gpus)
    assert err.value.message.startswith("The NVIDIA driver on your system is too old (found version 12")


def test_gpu_claim_is_seen_while_held_and_not_after(sim: ModuleType, tmp_path: Path) -> None:
    claim = sim.GpuClaim(str(tmp_path))
    claim.set({"GPU-a": 100})
    claim.set({"GPU-a": 200})
    [path] = tmp_path.glob("*.json")
    assert json.loads(path.read_text())["gpus"] == {"GPU-a": 200}
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY)\n"
             "try: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError: print('held')")
    held = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True)
    assert held.stdout.strip() == "held"
    claim.release()
    assert not list(tmp_path.glob("*.json"))


def test_cuda_visible_devices_subset_and_order(sim: ModuleType) -> None:
    gpus = [sim.Gpu(i, "NVIDIA L4", f"GPU-{i}000", L4_MIB, 0, "580", "8.9") for i in range(4)]
    assert [g.index for g in sim.apply_cuda_visible(gpus, "3,1")] == [3, 1]
    assert [g.index for g in sim.apply_cuda_visible(gpus, "GPU-2000")] == [2]
    assert [g.index for g in sim.apply_cuda_visible(gpus, "0,7,1")] == [0]  # invalid entry ends the list
    assert sim.apply_cuda_visible(gpus, None) == gpus


# ------------------------------------------------------------------------------------------- lab helpers
@dataclass
class Run:
    rc: int
    out: str


def http(method: str, url: str, body: Any = None, key: str | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def health(port: int) -> int | None:
    """HTTP status of /health, None when the connection is refused."""
    try:
        return http("GET", f"http://127.0.0.1:{port}/health")[0]
    except (ConnectionError, urllib.error.URLError):
        return None


def safetensors(path: Path, simulated_bytes: int) -> None:
    header = {"__metadata__": {"format": "pt", "d3_lab_simulated_bytes": str(simulated_bytes)},
              "score.weight": {"dtype": "BF16", "shape": [2, 4], "data_offsets": [0, 16]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 16)


ARCHITECTURES = json.loads((ROOT / "tests/contracts/d3-architectures.json").read_text())["models"]


def add_model(hub: Path, repo: str, rev: str, bf16_bytes: int, size: str, ref: bool,
              extra: dict[str, Any] | None = None) -> None:
    """HF cache layout: blobs/<sha256>, snapshots/<rev>/<file> -> ../../blobs/<sha256>, refs/main. config.json is the
    size's from tests/contracts/d3-architectures.json (as the lab HF mirror serves it), plus `extra` keys."""
    base = hub / ("models--" + repo.replace("/", "--"))
    snap, blobs = base / "snapshots" / rev, base / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir(exist_ok=True)
    config = {**ARCHITECTURES[size]["config"], **(extra or {})}
    tmp = base / "tmp.safetensors"
    safetensors(tmp, bf16_bytes)
    for name, content in (("config.json", json.dumps(config).encode()), ("model.safetensors", tmp.read_bytes())):
        digest = hashlib.sha256(content).hexdigest()
        (blobs / digest).write_bytes(content)
        (snap / name).symlink_to(f"../../blobs/{digest}")
    tmp.unlink()
    if ref:
        (base / "refs").mkdir()
        (base / "refs" / "main").write_text(rev)


@pytest.fixture(scope="session")
def image() -> str:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: the lab simulator tests need it")
    build = subprocess.run([str(SIM_DIR / "build.sh")], capture_output=True, text=True, timeout=900, check=False)
    if build.returncode != 0:
        pytest.fail(f"cannot build the simulator image (needs root + mmdebstrap): {build.stderr[-500:]}")
    return IMAGE


@pytest.fixture(scope="session")
def lab_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HF cache with d3 (27B-sized, pinned by SHA, no refs/main) and d3-mini (4B, refs/main); fake nvidia-smi."""
    d = tmp_path_factory.mktemp("d3sim")
    add_model(d / "hf" / "hub", "vllm-sr/d3", D3_REV, 52_200_000_000, "d3", ref=False)
    add_model(d / "hf" / "hub", "vllm-sr/d3-mini", MINI_REV, 9_300_000_000, "d3-mini", ref=True)
    add_model(d / "hf" / "hub", "vllm-sr/d3-lite", LITE_REV, 1_746_877_568, "d3-lite", ref=True)
    lines = "\n".join(f"{i}, NVIDIA L4, GPU-{i:08x}-1111-2222-3333-444444444444, {L4_MIB}, 0, 580.95.05, 8.9"
                      for i in range(4))
    smi = d / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n# fake nvidia-smi (test only): 4 x L4\ncat <<'EOF'\n{lines}\nEOF\n")
    smi.chmod(0o755)
    return d




def standin_driver(root: Path, driver: str = "580.95.05") -> Path:
    """The lab driver stand-in for containers: nvidia-smi, its NVML data for 4 x L4 at `driver`, claims dir."""
    root.mkdir(parents=True, exist_ok=True)
    for rel in ("usr/bin/nvidia-smi", "usr/lib/lab-nvidia/lab-nvidia-setup"):
        text = (NVIDIA_SRC / rel).read_text().replace("@DRIVER_VERSION@", "580.95.05").replace("@VERSION@", "lab")
        (root / Path(rel).name).write_text(text)
        (root / Path(rel).name).chmod(0o755)
    (root / "dev").mkdir(exist_ok=True)
    (root / "gpus.json").write_text(json.dumps({"count": 4, "name": "NVIDIA L4", "memory_mib": L4_MIB,
                                                "compute_cap": "8.9", "driver_version": driver}))
    env = dict(LAB_NVIDIA_NVML=str(root / "nvml.json"), LAB_NVIDIA_DEV_DIR=str(root / "dev"),
               LAB_NVIDIA_CONFIG=str(root / "gpus.json"), LAB_NVIDIA_HOSTNAME="d3simtest",
               LAB_NVIDIA_CLAIMS_DIR=str(root / "lab-nvidia" / "claims"),
               LAB_NVIDIA_DRIVER_STATE=str(root / "driver-version"))
    subprocess.run([sys.executable, str(root / "lab-nvidia-setup")], env=env, check=True, capture_output=True)
    return root


def smi_used(standin: Path) -> dict[int, int]:
    """memory.used per GPU index, as the stand-in nvidia-smi reports it on the "host" (this machine)."""
    env = dict(LAB_NVIDIA_NVML=str(standin / "nvml.json"), LAB_NVIDIA_DEV_DIR=str(standin / "dev"),
               LAB_NVIDIA_CLAIMS_DIR=str(standin / "lab-nvidia" / "claims"), PATH="/usr/bin:/bin")
    out = subprocess.run([sys.executable, str(standin / "nvidia-smi"), "--query-gpu=index,memory.used",
                          "--format=csv,noheader,nounits"], env=env, capture_output=True, text=True, check=True)
    return {int(i): int(u) for i, u in (line.split(", ") for line in out.stdout.splitlines())}


class Sim:
    """Starts the simulator image with podman; removes its containers afterwards."""

    def __init__(self, image: str, env_dir: Path) -> None:
        self.image, self.env_dir, self.names = image, env_dir, []  # type: ignore[var-annotated]

    def cmd(self, args: list[str], gpus: int = 1, tag: str = "nightly", env: dict[str, str] | None = None,
            smi: bool = True, detach: bool = False, standin: Path | None = None,
            first_gpu: int = 0) -> tuple[str, list[str]]:
        name = f"d3simtest-{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        c = ["run", "--name", name, "--network", "host",
             "-v", f"{self.env_dir / 'hf'}:/root/.cache/huggingface:ro"]
        c += ["-d"] if detach else []
        if standin is not None:  # the lab driver stand-in, as the lab CDI spec gives it
            c += ["-v", f"{standin / 'nvidia-smi'}:/usr/bin/nvidia-smi:ro",
                  "-v", f"{standin / 'nvml.json'}:/lab-nvml.json:ro", "-e", "LAB_NVIDIA_NVML=/lab-nvml.json",
                  "-v", f"{standin / 'lab-nvidia'}:/run/lab-nvidia", "--device", "/dev/null:/dev/nvidiactl"]
        elif smi:
            c += ["-v", f"{self.env_dir / 'nvidia-smi'}:/usr/bin/nvidia-smi:ro"]
        for i in range(first_gpu, first_gpu + gpus):
            c += ["--device", f"/dev/null:/dev/nvidia{i}"]
        for k, v in {"HF_HUB_OFFLINE": "1", "D3_SIM_COLD_START_S": "1", "D3_SIM_MS_PER_QUESTION": "5",
                     **(env or {})}.items():
            c += ["-e", f"{k}={v}"]
        return name, [*c, f"{self.image}:{tag}", *args]

    def run(self, args: list[str], **kw: Any) -> Run:
        """Run in the foreground until the simulator exits."""
        _, c = self.cmd(args, **kw)
        p = podman(*c, timeout=120)
        return Run(p.returncode, p.stdout + p.stderr)

    def start(self, args: list[str], port: int, **kw: Any) -> str:
        name, c = self.cmd([*args, "--host", "127.0.0.1", "--port", str(port)], detach=True, **kw)
        p = podman(*c)
        assert p.returncode == 0, p.stderr
        return name

    def wait_healthy(self, name: str, port: int, timeout: float = 30) -> float:
        t0 = time.monotonic()
        try:
            wait_until(f"{name} healthy", lambda: health(port) == 200, timeout)
        except AssertionError:
            raise AssertionError(f"not healthy after {timeout}s:\n{logs(name)}") from None
        return time.monotonic() - t0

    def wait_exit(self, name: str, timeout: float = 60) -> int:
        """Exit code of a detached simulator, once it has exited."""
        wait_until(f"{name} to exit", lambda: podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
                 in ("exited", "stopped"), timeout)
        return int(podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip())

    def cleanup(self) -> None:
        for n in self.names:
            podman("rm", "-f", "-t", "0", n)


def logs(name: str) -> str:
    p = podman("logs", name)
    return p.stdout + p.stderr


@pytest.fixture
def simr(image: str, lab_env: Path) -> Iterator[Sim]:
    s = Sim(image, lab_env)
    yield s
    s.cleanup()


MINI = ["--model", "vllm-sr/d3-mini", "--served-model-name", "d3-mini", "--max-model-len", "8192", "--enforce-eager"]
D3_TP2 = ["--model", "vllm-sr/d3", "--revision", D3_REV, "--tensor-parallel-size", "2", "--quantization", "fp8",
          "--gpu-memory-utilization", "0.95", "--enforce-eager"]


@pytest.fixture
def server(simr: Sim) -> Iterator[tuple[str, int]]:
    """d3-mini with an API key, healthy."""
    port = free_port()
    name = simr.start([*MINI, "--api-key", "k3y"], port)
    simr.wait_healthy(name, port)
    yield name, port


# ------------------------------------------------------------------------------------------- failure modes
@lab
def test_without_enforce_eager_ooms_at_cuda_graph_capture(simr: Sim) -> None:
    r = simr.run(["--model", "vllm-sr/d3-mini", "--max-model-len", "8192"])
    assert r.rc == 1
    assert "Capturing CUDA graphs" in r.out
    assert "torch.OutOfMemoryError: CUDA out of memory during CUDA graph capture" in r.out
    assert "18.40 GiB" in r.out


@lab
def test_unknown_flag_exits_2_with_argparse_usage(simr: Sim) -> None:
    r = simr.run([*MINI, "--limit-mm-per-prompt-typo", "0"])
    assert r.rc == 2
    assert "usage: vllm serve" in r.out
    assert "error: unrecognized arguments: --limit-mm-per-prompt-typo" in r.out


@lab
def test_tp_larger_than_visible_gpus(simr: Sim) -> None:
    # 4 device nodes, but CUDA_VISIBLE_DEVICES leaves one
    r = simr.run([*D3_TP2, "--max-model-len", "8192"], gpus=4, env={"CUDA_VISIBLE_DEVICES": "2"})
    assert r.rc == 1
    assert "world size (2) is larger than the number of available GPUs (1)" in r.out


@lab
@pytest.mark.parametrize(("gpus", "smi"), [(0, True), (1, False)], ids=["no-device-nodes", "no-nvidia-smi"])
def test_no_gpus(simr: Sim, gpus: int, smi: bool) -> None:
    r = simr.run(MINI, gpus=gpus, smi=smi)
    assert r.rc == 1
    assert "RuntimeError: No CUDA GPUs are available" in r.out


@lab
@pytest.mark.parametrize(
    "args",
    [["--model", "vllm-sr/d3-nano"], ["--model", "vllm-sr/d3"], ["--model", "vllm-sr/d3-mini", "--revision", "b" * 40]],
    ids=["repo-not-cached", "no-refs-main-without-revision", "revision-not-cached"],
)
def test_model_missing_offline(simr: Sim, args: list[str]) -> None:
    r = simr.run([*args, "--enforce-eager", "--max-model-len", "8192"])
    assert r.rc == 1
    assert "LocalEntryNotFoundError: Cannot find the requested files in the local cache" in r.out
    assert "HF_HUB_OFFLINE" in r.out


@lab
def test_weights_over_memory_ooms(simr: Sim) -> None:
    # d3 27B FP8 on ONE L4: ~24.3 GiB of weights > 22.03 GiB (torch's total)
    r = simr.run(["--model", "vllm-sr/d3", "--revision", D3_REV, "--quantization", "fp8", "--enforce-eager",
                  "--gpu-memory-utilization", "0.95", "--max-model-len", "8192"])
    assert r.rc == 1
    assert "torch.OutOfMemoryError: CUDA out of memory" in r.out


@lab
def test_kv_cache_over_memory_at_default_max_model_len(simr: Sim) -> None:
    # field-report recipe without --max-model-len, at 0.9 and with chunked prefill (a 2048-token profile run, so that
    # the profile itself fits): 262144 positions of KV do not fit next to the weights
    r = simr.run([*D3_TP2, "--gpu-memory-utilization", "0.9", "--enable-chunked-prefill"], gpus=2)
    assert r.rc == 1
    assert "ValueError: To serve at least one request with the models's max seq len (262144)" in r.out
    assert "estimated maximum model length is" in r.out


@lab
def test_max_model_len_above_max_position_embeddings(simr: Sim) -> None:
    r = simr.run([*MINI[:-3], "--max-model-len", "262145", "--enforce-eager"])
    assert r.rc == 1
    assert "User-specified max_model_len (262145) is greater than the derived max_model_len" in r.out


@lab
def test_field_report_recipe_starts_on_gpus_2_3(simr: Sim) -> None:
    port = free_port()
    name = simr.start([*D3_TP2, "--max-model-len", "8192", "--served-model-name", "d3"], port, gpus=4,
                      env={"CUDA_VISIBLE_DEVICES": "2,3"})
    simr.wait_healthy(name, port)
    out = logs(name)
    assert "GPU-00000002" in out and "GPU-00000003" in out and "GPU-00000000" not in out


@lab
def test_fp8_kv_cache_first_request_kills_engine(simr: Sim) -> None:
    port = free_port()
    name = simr.start([*MINI, "--kv-cache-dtype", "fp8"], port)
    simr.wait_healthy(name, port)
    status, body = http("POST", f"http://127.0.0.1:{port}/v1/systemone", {"model": "d3-mini", **SMOKE})
    assert status == 500
    assert "quantized KV cache is not supported for encoder attention" in json.loads(body)["error"]["message"]
    rc = podman("wait", name, timeout=30).stdout.strip()
    assert rc == "1"
    assert health(port) in (None, 503)
    assert "RuntimeError: quantized KV cache is not supported for encoder attention" in logs(name)


@lab
def test_never_ready_image_never_binds(simr: Sim) -> None:
    port = free_port()
    name = simr.start(MINI, port, tag="nightly-broken", env={"D3_SIM_COLD_START_S": "0.5"})
    wait_until("the never-ready log line", lambda: "never-ready" in logs(name))
    # from then on the port must stay closed: probe it for 3 s (10x the last startup step)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert health(port) is None
        time.sleep(0.2)
    state = podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
    assert state == "true"
    assert health(port) is None
    assert "never-ready" in logs(name)


# ------------------------------------------------------------------------------------------- endpoints
@lab
def test_health_refused_during_cold_start_then_200(simr: Sim) -> None:
    port = free_port()
    name = simr.start(MINI, port, env={"D3_SIM_COLD_START_S": "3"})
    wait_until("the model load to start", lambda: "Starting to load model" in logs(name))
    assert health(port) is None  # connection refused while "loading"
    waited = simr.wait_healthy(name, port)
    assert waited > 0.8  # ~2 s of the 3 s cold start remained
    status, body = http("GET", f"http://127.0.0.1:{port}/health")
    assert (status, body) == (200, b"")


@lab
def test_models_and_auth(server: tuple[str, int]) -> None:
    _, port = server
    base = f"http://127.0.0.1:{port}"
    assert http("GET", f"{base}/v1/models") == (401, b'{"error": "Unauthorized"}')
    assert http("GET", f"{base}/v1/models", key="wrong")[0] == 401
    assert http("POST", f"{base}/v1/systemone", {"model": "d3-mini", **SMOKE})[0] == 401
    status, body = http("GET", f"{base}/v1/models", key="k3y")
    assert status == 200
    models = json.loads(body)
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["d3-mini"]
    assert models["data"][0]["max_model_len"] == 8192
    assert http("GET", f"{base}/health")[0] == 200  # open without a key
    assert http("GET", f"{base}/debug/env", key="k3y")[0] == 404


@lab
@pytest.mark.parametrize("endpoint", ["/v1/systemone", "/v1/decisions"])
def test_decision_endpoints(server: tuple[str, int], endpoint: str) -> None:
    _, port = server
    status, body = http("POST", f"http://127.0.0.1:{port}{endpoint}", {"model": "d3-mini", **SMOKE}, key="k3y")
    assert status == 200, body
    out = json.loads(body)
    assert out["object"] == "structured_decision"
    assert out["model"] == "d3-mini"
    ans = out["answers"]
    assert set(ans) == {"team", "urgent", "tone"}
    assert ans["team"]["choice"] == "billing"
    assert 0.0 <= ans["urgent"]["noul"] <= 1.0
    assert 0.0 <= ans["tone"]["score"] <= 2.0 and ans["tone"]["legend"] == {"0": "calm", "1": "annoyed", "2": "furious"}
    for a in ans.values():
        assert abs(sum(a["probabilities"].values()) - 1.0) < 1e-6
        assert 0.0 <= a["confidence"] <= 1.0
    assert out["usage"]["input_tokens"] > 0
    assert "diagnostics" in out


@lab
def test_bad_requests_and_unknown_model(server: tuple[str, int]) -> None:
    _, port = server
    url = f"http://127.0.0.1:{port}/v1/systemone"
    bad_q = {"q": {"type": "score", "instructions": "x?", "criteria": ["one"]}}
    status, body = http("POST", url, {"model": "d3-mini", "state": "s", "questions": bad_q}, key="k3y")
    assert status == 400
    err = json.loads(body)["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError" and "questions.q" in err["message"]
    extra = {"model": "d3-mini", **SMOKE, "questions": {"q": {"type": "noul", "instructions": "x?", "top_k": 1}}}
    assert http("POST", url, extra, key="k3y")[0] == 400
    assert http("POST", url, {"model": "gpt-4", **SMOKE}, key="k3y")[0] == 404


@lab
def test_metrics_count_requests_and_questions(server: tuple[str, int]) -> None:
    _, port = server
    base = f"http://127.0.0.1:{port}"
    for _ in range(2):
        assert http("POST", f"{base}/v1/systemone", {"model": "d3-mini", **SMOKE}, key="k3y")[0] == 200
    status, body = http("GET", f"{base}/metrics")  # open without a key
    assert status == 200
    text = body.decode()
    # vLLM's names and labels (tests/contracts/metrics/names.yml; the in-process contract test checks them all)
    assert 'vllm:request_success_total{model_name="d3-mini",engine="0",finished_reason="length"} 2.0' in text
    assert 'vllm:e2e_request_latency_seconds_count{model_name="d3-mini",engine="0"} 2.0' in text
    assert 'vllm:num_requests_running{model_name="d3-mini",engine="0"} 0.0' in text
    assert "# TYPE vllm:request_success counter" in text


@lab
def test_latency_scales_with_questions(simr: Sim) -> None:
    port = free_port()
    name = simr.start(MINI, port, env={"D3_SIM_MS_PER_QUESTION": "50"})
    simr.wait_healthy(name, port)
    url = f"http://127.0.0.1:{port}/v1/decisions"
    many = {f"q{i}": {"type": "noul", "instructions": f"Question {i}?"} for i in range(10)}
    t0 = time.monotonic()
    assert http("POST", url, {"state": "s", "questions": many})[0] == 200
    assert time.monotonic() - t0 >= 0.5


# ------------------------------------------------------------------------------------------- image and registry
def inspect(ref: str, fmt: str) -> str:
    p = podman("image", "inspect", "--format", fmt, ref)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


@lab
def test_image_tags_labels_and_entrypoint(image: str) -> None:
    ids = {t: inspect(f"{image}:{t}", "{{.Id}}") for t in ("nightly", "nightly-next", "nightly-broken")}
    assert len(set(ids.values())) == 3
    title = '{{ index .Labels "org.opencontainers.image.title" }}'
    assert inspect(f"{image}:nightly", title) == "d3-fleet vLLM D3 simulator (lab stand-in)"
    assert inspect(f"{image}:nightly", "{{json .Config.Entrypoint}}") == '["python3","/opt/d3-sim/vllm_sim.py"]'
    assert "D3_SIM_BEHAVIOUR=never-ready" in inspect(f"{image}:nightly-broken", "{{json .Config.Env}}")
    assert "D3_SIM_BEHAVIOUR" not in inspect(f"{image}:nightly-next", "{{json .Config.Env}}")
    # the stand-in regression of the next nightly (issue 24): 1.5x slower answers, on nightly-next only
    assert "D3_SIM_LATENCY_SCALE=1.5" in inspect(f"{image}:nightly-next", "{{json .Config.Env}}")
    assert "D3_SIM_LATENCY_SCALE" not in inspect(f"{image}:nightly", "{{json .Config.Env}}")
    src = hashlib.sha256(b"".join((SIM_DIR / f).read_bytes() for f in ("vllm_sim.py", "Containerfile", "build.sh")))
    assert inspect(f"{image}:nightly", '{{ index .Labels "io.d3-fleet.lab.sim.source-sha256" }}') == src.hexdigest()


@lab
def test_registry_tags_match_local_images(image: str) -> None:
    """After the lab_simulator role ran: vllm/vllm-openai:<tag> in the lab registry holds the local image."""
    registry = "127.0.0.1:5000"
    try:
        urllib.request.urlopen(f"http://{registry}/v2/", timeout=2).close()
    except (OSError, urllib.error.URLError):
        pytest.fail("lab registry not running (make lab-images)")
    digests = set()
    for tag in ("nightly", "nightly-next", "nightly-broken"):
        req = urllib.request.Request(f"http://{registry}/v2/vllm/vllm-openai/manifests/{tag}", headers={
            "Accept": "application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                manifest, digest = json.load(resp), resp.headers["Docker-Content-Digest"]
        except urllib.error.HTTPError as err:
            pytest.fail(f"vllm/vllm-openai:{tag} missing in the lab registry ({err.code}); run the lab_simulator role")
        local = "sha256:" + inspect(f"{image}:{tag}", "{{.Id}}")
        assert manifest["config"]["digest"] == local, f"{tag}: registry holds another image; re-run lab_simulator"
        digests.add(digest)
    assert len(digests) == 3


# ------------------------------------------------------------------------------------------- GPU memory, driver
LITE = ["--model", "vllm-sr/d3-lite", "--max-model-len", "8192", "--enforce-eager"]
FREE_TEXT = "on startup is less than desired GPU memory utilization"


@pytest.fixture
def standin(tmp_path: Path) -> Path:
    return standin_driver(tmp_path / "driver")


@lab
def test_memory_held_while_running_and_freed_when_the_process_dies(simr: Sim, standin: Path) -> None:
    port = free_port()
    name = simr.start([*LITE, "--gpu-memory-utilization", "0.45"], port, standin=standin, first_gpu=1)
    simr.wait_healthy(name, port)
    budget = held_mib(0.45)
    assert smi_used(standin) == {0: 0, 1: budget, 2: 0, 3: 0}
    # inside another container on the same "host" it is the same
    inside = podman("run", "--rm", "-v", f"{standin / 'nvidia-smi'}:/usr/bin/nvidia-smi:ro",
                    "-v", f"{standin / 'nvml.json'}:/n.json:ro", "-e", "LAB_NVIDIA_NVML=/n.json",
                    "-v", f"{standin / 'lab-nvidia'}:/run/lab-nvidia", "--device", "/dev/null:/dev/nvidiactl",
                    "--device", "/dev/null:/dev/nvidia1", "--entrypoint", "nvidia-smi", f"{simr.image}:nightly",
                    "--query-gpu=index,memory.used,memory.free", "--format=csv,noheader,nounits")
    assert inside.stdout.split(", ") == ["1", str(budget), str(L4_MIB - 434 - budget) + "\n"], inside.stderr
    podman("kill", name)  # SIGKILL-like end: no cleanup code runs, the kernel drops the flock
    wait_until("the claim to disappear", lambda: smi_used(standin)[1] == 0)


@lab
# The clean-clone run of 2026-12-02 found the simulator comparing nvidia-smi's free memory with a share of torch's
# total; it now sees memory as torch does: 22,560 MiB less what each process holds (its share and CUDA context).
def test_shares_summing_to_one_cannot_both_start(simr: Sim, standin: Path) -> None:
    port = free_port()
    first = simr.start([*LITE, "--gpu-memory-utilization", "0.5"], port, standin=standin)
    simr.wait_healthy(first, port)
    r = simr.run([*LITE, "--gpu-memory-utilization", "0.5", "--port", str(free_port())], standin=standin)
    assert r.rc == 1, r.out
    free = (TORCH_L4_MIB - held_mib(0.5) - CONTEXT_MIB) * 2**20  # the first's share and context, the second's context
    want = (f"ValueError: Free memory on device cuda:0 ({round(free / 2**30, 2)}/{round(TORCH_L4_MIB / 1024, 2)} GiB) "
            f"{FREE_TEXT} (0.5, {round(int(0.5 * TORCH_L4_MIB * 2**20) / 2**30, 2)} GiB). Decrease GPU memory utilization or reduce GPU "
            "memory used by other processes.")
    assert want in r.out


@lab
def test_two_at_045_start_one_after_the_other(simr: Sim, standin: Path) -> None:
    ports = [free_port(), free_port()]
    names = []
    for port in ports:
        names.append(simr.start([*LITE, "--gpu-memory-utilization", "0.45"], port, standin=standin))
        simr.wait_healthy(names[-1], port)
    assert smi_used(standin)[0] == 2 * held_mib(0.45)
    for port in ports:
        assert http("GET", f"http://127.0.0.1:{port}/v1/models")[0] == 200


@lab
def test_a_neighbour_allocating_during_memory_profiling_breaks_the_start(simr: Sim, standin: Path) -> None:
    """vLLM charges the device's free-memory drop during its profiling to itself (gpu_worker.py NOTE(woosuk)):
    the second instance profiles while the first allocates its KV cache and has no memory left for its own."""
    port = free_port()
    slow = {"D3_SIM_COLD_START_S": "6"}
    first = simr.start([*LITE, "--gpu-memory-utilization", "0.45"], port, standin=standin, env=slow)
    wait_until("the first instance to load its weights", lambda: "Starting to load model" in logs(first))
    second = simr.start([*LITE, "--gpu-memory-utilization", "0.45"], free_port(), standin=standin, env=slow)
    assert simr.wait_exit(second) == 1
    out = logs(second)
    assert ("No available memory for the cache blocks" in out or "KV cache is needed, which is larger than the "
            "available KV cache memory" in out), out
    simr.wait_healthy(first, port)


@lab
@pytest.mark.parametrize("driver", ["570.195.03", "535.274.02"])
def test_driver_older_than_r580_refused_without_cuda_compat(simr: Sim, tmp_path: Path, driver: str) -> None:
    old = standin_driver(tmp_path / "old", driver)
    r = simr.run(LITE, standin=old)
    assert r.rc == 1, r.out
    cuda = {"570": "12080", "535": "12020"}[driver[:3]]
    assert f"RuntimeError: The NVIDIA driver on your system is too old (found version {cuda})" in r.out
    assert "CUDA driver version is insufficient for CUDA runtime version" in r.out
    port = free_port()
    name = simr.start(LITE, port, standin=old, env={"VLLM_ENABLE_CUDA_COMPATIBILITY": "1"})
    simr.wait_healthy(name, port)
    assert "forward-compatibility" in logs(name)


@lab
def test_driver_older_than_r535_refused_even_with_cuda_compat(simr: Sim, tmp_path: Path) -> None:
    r = simr.run(LITE, standin=standin_driver(tmp_path / "old", "530.30.02"),
                 env={"VLLM_ENABLE_CUDA_COMPATIBILITY": "1"})
    assert r.rc == 1, r.out
    assert "The NVIDIA driver on your system is too old (found version 12010)" in r.out


@lab
def test_cold_start_per_model_size(simr: Sim) -> None:
    """No D3_SIM_COLD_START_S: 150 s x size / 52.2 GB x D3_SIM_COLD_START_SCALE (here 0.1: d3-mini 2.7 s)."""
    assert "D3_SIM_COLD_START_SCALE=0.0333" in inspect(f"{simr.image}:nightly", "{{.Config.Env}}")
    port = free_port()
    name = simr.start(MINI, port, env={"D3_SIM_COLD_START_S": "", "D3_SIM_COLD_START_SCALE": "0.1"})
    wait_until("the model load to start", lambda: "Starting to load model" in logs(name))
    assert health(port) is None
    waited = simr.wait_healthy(name, port)
    assert 1.5 < waited < 10, waited
    assert "cold start 2.67 s for 9.3 GB" in logs(name)
