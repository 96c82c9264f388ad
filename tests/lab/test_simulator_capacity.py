"""Issue 23: the planner's startup figures against the vLLM simulator's, for every size and variant the lab serves.

The simulator (lab/simulator/vllm_sim.py, written from vLLM's source) is started with podman on this machine, each
size and variant of the lab HF mirror (its config.json and checkpoint bytes, from lab/hf/build_repos.py) at two
context lengths, with the flags the catalog gives the unit (tensor parallel size, --gpu-memory-utilization,
--enforce-eager, --quantization fp8 for a BF16 checkpoint), on simulated L4s (23034 MiB). Its log lines are compared
with the planner's pure function (d3_planner.kv_cache_figures) for the same configuration.

Tolerance, and why: the KV cache arithmetic must agree exactly (attention block size, and the GPU KV cache size and
maximum concurrency of the simulator's KV pool, within one block per group: the log rounds the pool to 0.01 GiB).
The KV pools themselves differ by the non-KV term only: vLLM measures its profile run's activation peak and non-torch
memory, which neither side can; the planner estimates them (activation_peak_mib + non_torch_mib), the simulator takes
a fixed 1.5 GiB stand-in. The test asserts that this difference is the whole difference (budget and weights agree
within 10 MiB of rounding) and prints the figures side by side.

All starts run at once (detached containers, no port bound: the figures are logged before serving), so the test
costs about one start's time plus podman's per-container overhead.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from labkit import ROOT, podman, wait_until

sys.path.insert(0, str(ROOT / "collections"))
from ansible_collections.d3fleet.fleet.plugins.filter.d3_planner import kv_cache_figures

pytestmark = pytest.mark.lab
IMAGE = "localhost/d3-vllm-sim:nightly"
L4_MIB = 23034
LENGTHS = (8192, 16384)
CATALOG = yaml.safe_load((ROOT / "roles/d3/vars/main.yml").read_text())["d3_catalog"]
STAND_IN_OVERHEAD_MIB = 1536  # vllm_sim.RUNTIME_OVERHEAD_GIB


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_repos_capacity", ROOT / "lab/hf/build_repos.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def configurations() -> list[dict[str, Any]]:
    """(size, variant) of every repository the lab mirror serves, with the catalog's flags for it."""
    out = []
    for size, entry in CATALOG.items():
        for variant, v in entry["variants"].items():
            repo = v.get("hf_repo", entry["hf_repo"])
            if repo.split("/")[1] not in {*builder().MODELS, *builder().VARIANTS}:
                continue  # NVFP4: not served by the lab (the planner refuses it on L4)
            out.append({"size": size, "variant": variant, "repo": repo,
                        "tp": int(v.get("tensor_parallel_size", entry["tensor_parallel_size"])),
                        "util": float(entry["gpu_memory_utilization"]), "quant": v.get("quantization_flag")})
    return out


def add_repo(hub: Path, name: str, b: ModuleType) -> None:
    """The mirror's pinned revision of vllm-sr/<name> in HF cache layout, found through refs/main."""
    base = hub / f"models--vllm-sr--{name}"
    rev = hashlib.sha1(name.encode()).hexdigest()
    snap = base / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(b.config_json(name)))
    (snap / "model.safetensors").write_bytes(b.safetensors_file(name, b.RELEASES[-1][0], 2))
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(rev)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("d3simcap")
    b = builder()
    for name in [*b.MODELS, *b.VARIANTS]:
        add_repo(d / "hf" / "hub", name, b)
    lines = "\n".join(f"{i}, NVIDIA L4, GPU-{i:08x}-1111-2222-3333-444444444444, {L4_MIB}, 0, 580.95.05, 8.9"
                      for i in range(2))
    (d / "nvidia-smi").write_text(f"#!/bin/sh\n# fake nvidia-smi (test only): 2 x L4\ncat <<'EOF'\n{lines}\nEOF\n")
    (d / "nvidia-smi").chmod(0o755)
    return d


@pytest.fixture
def names() -> Iterator[list[str]]:
    created: list[str] = []
    yield created
    if created:
        podman("rm", "-f", "-t", "0", *created)


def start(env: Path, names: list[str], argv: list[str], tp: int) -> str:
    name = f"d3simcap-{uuid.uuid4().hex[:10]}"
    names.append(name)
    cmd = ["run", "-d", "--name", name, "--network", "none", "-v", f"{env / 'hf'}:/root/.cache/huggingface:ro",
           "-v", f"{env / 'nvidia-smi'}:/usr/bin/nvidia-smi:ro", "-e", "HF_HUB_OFFLINE=1",
           "-e", "D3_SIM_COLD_START_S=0"]
    for i in range(tp):
        cmd += ["--device", f"/dev/null:/dev/nvidia{i}"]
    podman(*cmd, IMAGE, *argv, check=True)
    return name


def logs(name: str) -> str:
    p = podman("logs", name)
    return p.stdout + p.stderr


def sim_args(c: dict[str, Any], length: int) -> list[str]:
    args = ["--model", c["repo"], "--served-model-name", c["size"], "--tensor-parallel-size", str(c["tp"]),
            "--max-model-len", str(length), "--gpu-memory-utilization", str(c["util"]), "--enforce-eager"]
    return args + (["--quantization", c["quant"]] if c["quant"] else [])


def planner(c: dict[str, Any], length: int, **flags: Any) -> dict[str, Any]:
    """kv_cache_figures for the configuration: weights_mib = the checkpoint's bytes in GPU memory (online FP8 halves
    a BF16 checkpoint), as the mirror's safetensors metadata gives them to the simulator."""
    b = builder()
    weights = b.simulated_bytes(c["repo"].split("/")[1]) / (2 if c["quant"] == "fp8" else 1)
    return kv_cache_figures(CATALOG[c["size"]]["architecture"],
                            {"--max-model-len": length, "--gpu-memory-utilization": c["util"], "--enforce-eager": True,
                             **({"--quantization": c["quant"]} if c["quant"] else {}), **flags},
                            L4_MIB, c["tp"], weights_mib=int(weights / 2**20))


FIGURES = {
    "pool_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "tokens": r"GPU KV cache size: ([\d,]+) tokens",
    "concurrency": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "block": r"Setting attention block size to (\d+) tokens",
}


def figures(text: str) -> dict[str, float] | None:
    found = {k: re.search(rx, text) for k, rx in FIGURES.items()}
    if not found["concurrency"]:
        return None
    return {k: float(m.group(1).replace(",", "")) for k, m in found.items() if m}


def test_every_lab_size_and_variant_starts_with_the_planners_kv_figures(env: Path, names: list[str]) -> None:
    runs = {(c["repo"], length): (c, length, start(env, names, sim_args(c, length), c["tp"]))
            for c in configurations() for length in LENGTHS}
    assert len(runs) == 2 * 8  # six sizes, d3-FP8 and d3-W4A16-AWQ, two lengths each
    got = {key: wait_until(f"{key} to log its KV cache figures", lambda n=name: figures(logs(n)), timeout=90)
           for key, (_, _, name) in runs.items()}
    rows = []
    for key, (c, length, _) in runs.items():
        sim, plan = got[key], planner(c, length)
        assert plan["refusal"] is None, (key, plan["refusal"])
        # the KV cache spec: the same attention block (raised to hold a Gated DeltaNet state)
        assert sim["block"] == plan["block_size"], key
        # the same KV arithmetic: the planner's spec applied to the simulator's pool gives the simulator's figures
        # (the pool is logged to 0.01 GiB: its figures lie between those of the pool -/+ 0.005 GiB)
        per_seq = plan["num_gpu_blocks"] / plan["max_concurrency"]  # blocks one max-length sequence takes
        span = []
        for pool in ((sim["pool_gib"] - 0.005) * 2**30, (sim["pool_gib"] + 0.005) * 2**30):
            blocks = int(pool // plan["page_size_bytes"] // plan["group_size"])
            span.append((blocks // plan["kv_groups"] * plan["block_size"], blocks / per_seq))
        assert span[0][0] <= sim["tokens"] <= span[1][0], (key, sim, span)
        assert round(span[0][1], 2) - 0.005 <= sim["concurrency"] <= round(span[1][1], 2) + 0.005, (key, sim, span)
        # the pools differ by the non-KV term only: the same budget and weights; the planner's non-KV memory besides
        # the weights (requested - weights - its pool) against the simulator's 1.5 GiB stand-in
        planner_non_kv_extra = plan["requested_mib"] - plan["weights_mib"] - plan["kv_pool_mib"]
        assert abs(sim["pool_gib"] * 1024 - (plan["requested_mib"] - plan["weights_mib"] - STAND_IN_OVERHEAD_MIB)) < 10, (
            key, sim, plan)
        rows.append(f"{c['repo']:22} {length:>6} TP{c['tp']} block {plan['block_size']:>5}  KV tokens planner "
                    f"{plan['gpu_kv_cache_tokens']:>9,} simulator {int(sim['tokens']):>9,}  concurrency "
                    f"{plan['max_concurrency']:7.2f}x / {sim['concurrency']:7.2f}x  non-KV extra {planner_non_kv_extra} "
                    f"MiB / {STAND_IN_OVERHEAD_MIB} MiB")
    print("\n" + "\n".join(rows))


def test_a_configuration_the_planner_refuses_the_simulator_refuses_too(env: Path, names: list[str]) -> None:
    """The field report's recipe (d3 BF16 + online FP8, TP 2, 0.95) at the default 262144 positions: one sequence's
    KV cache (8.09 GiB by both) does not fit; both refuse with vLLM's message, the simulator exiting 1."""
    c = next(c for c in configurations() if c["repo"] == "vllm-sr/d3" and c["variant"] == "bf16-fp8-online")
    plan = planner(c, 262144, **{"--enable-chunked-prefill": True})
    assert plan["refusal"] is not None and plan["refusal"]["kind"] == "max_seq_len", plan["refusal"]
    name = start(env, names, [*sim_args(c, 262144), "--enable-chunked-prefill"], c["tp"])
    wait_until(f"{name} to exit", lambda: podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
               in ("exited", "stopped"), timeout=60)
    assert podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "1"
    out = logs(name)
    needed = re.search(r"\((\d+\.\d+) GiB KV cache is needed", plan["refusal"]["message"])
    assert needed, plan["refusal"]["message"]
    assert (f"ValueError: To serve at least one request with the models's max seq len (262144), ({needed.group(1)} "
            "GiB KV cache is needed, which is larger than the available KV cache memory") in out, out
    assert "GPU KV cache size" not in out
