"""Issue 33: the started simulator logs what its accounting function computes, and refuses what the planner refuses.

The figures themselves are compared in the quick tier: tests/test_capacity_second_opinion.py runs the simulator's
accounting (lab/simulator/vllm_sim.py startup_memory, a port of vLLM's source) in-process against the planner on a
grid of 80 configurations, exactly. This lab check only shows that a simulator started with podman, as the units start
it (the lab image, the lab HF mirror's config.json and checkpoint bytes, simulated L4s of 23034 MiB in nvidia-smi),
logs those same lines: "Setting attention block size to N tokens", "Available KV cache memory: X GiB", "GPU KV cache
size: N tokens", "Maximum concurrency for M tokens per request: Xx", equal to the in-process function's for the same
inputs (three configurations: the field report's recipe, the FP8 W8A8 and the W4A16 checkpoints, one per weight and
activation path), and that one configuration the planner refuses makes the simulator exit 1 with vLLM's message.

Four containers, started at once (detached, no port bound: the figures are logged before serving); this replaced 17.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import testkit
import yaml
from labkit import ROOT, podman, wait_until

sys.path.insert(0, str(ROOT / "collections"))
from ansible_collections.d3fleet.fleet.plugins.filter.d3_planner import kv_cache_figures

pytestmark = pytest.mark.lab
IMAGE = "localhost/d3-vllm-sim:nightly"
L4_MIB = 23034
LENGTH = 8192
CATALOG = yaml.safe_load((ROOT / "roles/d3/vars/main.yml").read_text())["d3_catalog"]
# one configuration per weight and activation path: online FP8 of a BF16 checkpoint (TP 2), compressed-tensors W8A8
# (FP8 activations, TP 2), compressed-tensors W4A16 (BF16 activations, TP 1)
REPOS = ("vllm-sr/d3", "vllm-sr/d3-FP8", "vllm-sr/d3-W4A16-AWQ")


def simulator() -> ModuleType:
    return testkit.load_file("vllm_sim_capacity", ROOT / "lab/simulator/vllm_sim.py")


def builder() -> ModuleType:
    return testkit.load_file("build_repos_capacity", ROOT / "lab/hf/build_repos.py")


def configurations() -> list[dict[str, Any]]:
    """(size, variant) of every repository the lab mirror serves, with the catalog's flags for it."""
    out = []
    for size, entry in CATALOG.items():
        for variant, v in entry["variants"].items():
            repo = v.get("hf_repo", entry["hf_repo"])
            if repo not in REPOS or any(c["repo"] == repo for c in out):
                continue
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


def in_process(c: dict[str, Any], length: int) -> dict[str, Any]:
    """The simulator's accounting function for the same inputs as the started one: the mirror's config.json and bytes,
    torch's total of an L4, the catalog's flags."""
    sim, b = simulator(), builder()
    name = c["repo"].split("/")[1]
    config = b.config_json(name)
    args = sim.parse_args(sim_args(c, length))
    model = sim.Model(c["repo"], Path("/nonexistent"), config, b.simulated_bytes(name))
    sim.verify_quantization(args, model)
    total = sim.torch_total_mib("NVIDIA L4", L4_MIB) * 2**20
    return sim.startup_memory(config, sim.model_weight_bytes(args, model), c["tp"], c["util"], total, length,
                              fp8=sim.activations_fp8(config, args.quantization))


def planner(c: dict[str, Any], length: int, **flags: Any) -> dict[str, Any]:
    """kv_cache_figures for the configuration with the mirror's weights (online FP8 halves a BF16 checkpoint)."""
    weights = builder().simulated_bytes(c["repo"].split("/")[1]) / (2 if c["quant"] == "fp8" else 1)
    return kv_cache_figures(CATALOG[c["size"]]["architecture"],
                            {"--max-model-len": length, "--gpu-memory-utilization": c["util"], "--enforce-eager": True,
                             **({"--quantization": c["quant"]} if c["quant"] else {}), **flags},
                            22560, c["tp"], weights_mib=int(weights / 2**20))


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


def test_the_started_simulator_logs_its_accounting(env: Path, names: list[str]) -> None:
    runs = {c["repo"]: (c, start(env, names, sim_args(c, LENGTH), c["tp"])) for c in configurations()}
    assert sorted(runs) == sorted(REPOS)
    got = {repo: wait_until(f"{repo} to log its KV cache figures", lambda n=name: figures(logs(n)), timeout=90)
           for repo, (_, name) in runs.items()}
    rows = []
    for repo, (c, _) in runs.items():
        mem = in_process(c, LENGTH)
        assert mem["stop"] is None, (repo, mem["stop"])
        want = {"pool_gib": float(f"{mem['kv'] / 2**30:.2f}"), "tokens": float(mem["tokens"]),
                "concurrency": float(f"{mem['concurrency']:.2f}"), "block": float(mem["layout"].block_size)}
        assert got[repo] == want, (repo, got[repo], want)
        rows.append(f"{repo:22} TP{c['tp']} {LENGTH}: block {int(want['block'])}, {int(want['tokens']):,} tokens, "
                    f"{want['concurrency']:.2f}x, pool {want['pool_gib']} GiB")
    print("\n" + "\n".join(rows))


def test_a_configuration_the_planner_refuses_the_simulator_refuses_too(env: Path, names: list[str]) -> None:
    """The field report's recipe (d3 BF16 + online FP8, TP 2) at 0.9 and the default 262144 positions, with chunked
    prefill (a 2048-token profile run): one sequence's KV cache (8.09 GiB by both) does not fit; both refuse with
    vLLM's message, the simulator exiting 1."""
    c = {**next(c for c in configurations() if c["repo"] == "vllm-sr/d3"), "util": 0.9}
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
