"""Issue 33: the planner's startup figures against the lab simulator's, computed independently from vLLM's source.

The planner (d3_plan / kv_cache_figures) and the simulator (lab/simulator/vllm_sim.py startup_memory, imported
in-process) are two ports of vLLM's startup accounting. On a grid of 80 configurations (every catalog size and
variant, four --max-model-len, two --gpu-memory-utilization) they must agree exactly: the same integer GPU KV cache
size, the same maximum concurrency to two decimals, the same attention block, or the same refusal. Both sides are
given the same inputs (the checkpoint's weights in GPU memory, the config.json numbers, the GPU); where an input
differs between the catalog and the lab mirror, a test names it (test_the_one_input_the_lab_mirror_gives_differently).

Inputs that are the same STAND-IN on both sides (so the grid cannot catch a wrong value of them, only a divergence):
the non-torch increase (512 MiB), the CUDA context (512 MiB), the activation peak per token (this project's reading of
the Qwen3.5 forward, written twice), the L4's total as torch sees it (tests/contracts/vllm/gpu-memory.json).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import testkit
from d3_planner import MIB, d3_plan, kv_cache_figures, mib_of_gb

ROOT = Path(__file__).resolve().parents[1]
SIM = testkit.load_file("vllm_sim_second_opinion", ROOT / "lab/simulator/vllm_sim.py")
MIRROR = testkit.load_file("build_repos_second_opinion", ROOT / "lab/hf/build_repos.py")
CONTRACT = json.loads((ROOT / "tests/contracts/vllm/gpu-memory.json").read_text())
LENGTHS = (4096, 8192, 16384, 32768)
L4 = {"name": "NVIDIA L4", "nvidia_smi": 23034, "compute_cap": "8.9"}
# NVFP4 is planned on compute capability 10.0 only (policy): it is compared on a Blackwell GPU the catalog does not
# know, where both sides count nvidia-smi's total (and vLLM's 8192-token default batch of a GPU of 70 GiB and more)
BLACKWELL = {"name": "NVIDIA RTX PRO 6000", "nvidia_smi": 97887, "compute_cap": "12.0"}


def grid(catalog_vars: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for size, entry in catalog_vars["d3_catalog"].items():
        for variant, spec in entry["variants"].items():
            spec = spec or {}
            repo = spec.get("hf_repo", entry["hf_repo"]).split("/")[1]
            gpu = BLACKWELL if float(spec.get("min_compute_capability", 0)) > 8.9 else L4
            base_util = float(spec.get("gpu_memory_utilization", entry["gpu_memory_utilization"]))
            for util in sorted({base_util, 0.9 if base_util < 0.9 else 0.6}):
                for length in LENGTHS:
                    out.append({"size": size, "variant": variant, "repo": repo, "gpu": gpu, "util": util, "length": length,
                                "tp": int(spec.get("tensor_parallel_size", entry["tensor_parallel_size"])),
                                "online_fp8": spec.get("quantization_flag", "fp8") == "fp8",
                                "weights_mib": mib_of_gb(float(spec.get("weights_gb", entry["weights_fp8_gb"])))})
    return out


def planner(catalog_vars: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """The plan of one instance on as many GPUs as its TP: its kv_cache figures, or its refusal."""
    gpus = [{"index": i, "name": c["gpu"]["name"], "memory_total_mib": c["gpu"]["nvidia_smi"], "compute_cap": c["gpu"]["compute_cap"]}
            for i in range(c["tp"])]  # fmt: skip
    item = {"model": c["size"], "variant": c["variant"],
            "extra_args": [f"--max-model-len={c['length']}", f"--gpu-memory-utilization={c['util']}"]}  # fmt: skip
    result = d3_plan([item], catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], gpus, "grid",
                     {"api_key_set": True, "allow_non_l4": True})  # fmt: skip
    if result["errors"]:
        return {"refused": result["errors"][0]}
    (inst,) = result["instances"]
    return {"tokens": inst["kv_cache"]["gpu_kv_cache_tokens"], "concurrency": inst["kv_cache"]["max_concurrency"],
            "block": inst["kv_cache"]["block_size"], "batched": inst["kv_cache"]["max_num_batched_tokens"]}  # fmt: skip


def simulator(c: dict[str, Any], weights_mib: int | None = None) -> dict[str, Any]:
    """The simulator's accounting for the same instance: the lab mirror's config.json (a variant's carries its
    quantization_config; NVFP4, not mirrored, its base size's), the same weights in GPU memory, the GPU's total as
    its stand-in table gives it."""
    name = c["repo"] if c["repo"] in {*MIRROR.MODELS, *MIRROR.VARIANTS} else c["size"]
    config = MIRROR.config_json(name)
    quantization = "fp8" if c["online_fp8"] else None
    args = SIM.parse_args(["--model", "x", "--max-model-len", str(c["length"]), "--gpu-memory-utilization", str(c["util"]),
                           "-tp", str(c["tp"]), "--enforce-eager", *(["--quantization", "fp8"] if quantization else [])])  # fmt: skip
    weights = (c["weights_mib"] if weights_mib is None else weights_mib) * MIB * (2 if c["online_fp8"] else 1)
    model = SIM.Model(c["repo"], Path("/nonexistent"), config, weights)
    SIM.verify_quantization(args, model)
    total = SIM.torch_total_mib(c["gpu"]["name"], c["gpu"]["nvidia_smi"]) * MIB
    mem = SIM.startup_memory(config, SIM.model_weight_bytes(args, model), c["tp"], c["util"], total, c["length"],
                             eager=True, fp8=SIM.activations_fp8(config, args.quantization))  # fmt: skip
    if mem["stop"]:
        return {"refused": mem["stop"][1]}
    return {"tokens": mem["tokens"], "concurrency": round(mem["concurrency"], 2), "block": mem["layout"].block_size,
            "batched": mem["max_num_batched_tokens"]}  # fmt: skip


def same(plan: dict[str, Any], sim: dict[str, Any]) -> bool:
    if "refused" in plan or "refused" in sim:  # the same stop: vLLM's own sentence begins both
        return "refused" in plan and "refused" in sim and kind(plan["refused"]) == kind(sim["refused"])
    return plan == sim


def kind(message: str) -> str:
    for words in ("To serve at least one request", "No available memory for the cache blocks", "out of memory",
                  "max_num_batched_tokens ("):  # fmt: skip
        if words in message:
            return words
    return message


def test_the_grid_covers_every_size_and_variant(catalog_vars: dict[str, Any]) -> None:
    cells = grid(catalog_vars)
    assert len(cells) >= 40
    assert {(c["size"], c["variant"]) for c in cells} == {(s, v) for s, e in catalog_vars["d3_catalog"].items() for v in e["variants"]}
    starts = [c for c in cells if "tokens" in planner(catalog_vars, c)]
    assert len(starts) >= 40  # most of the grid starts: the comparison is of figures, not only of refusals


def test_planner_and_simulator_agree_exactly_on_the_grid(catalog_vars: dict[str, Any]) -> None:
    differ = []
    for c in grid(catalog_vars):
        plan, sim = planner(catalog_vars, c), simulator(c)
        if not same(plan, sim):
            differ.append(f"{c['size']} {c['variant']} TP{c['tp']} {c['length']} at {c['util']}: planner {plan} simulator {sim}")
    assert differ == [], "\n".join(differ)


def test_the_one_input_the_lab_mirror_gives_differently(catalog_vars: dict[str, Any]) -> None:
    """The lab mirror's checkpoints carry the real checkpoints' bytes; the catalog carries the weights in GPU memory.
    For online FP8 they differ (the simulator halves the BF16 bytes; the catalog's 27B figure is vLLM's 13.0 GiB line,
    embeddings and the vision tower staying BF16): that is the weights input, named here, and the only one: given the
    mirror's weights, the planner's arithmetic gives the simulator's figures."""
    named = []
    for c in grid(catalog_vars):
        if c["repo"] not in {*MIRROR.MODELS, *MIRROR.VARIANTS} or c["length"] != 8192:
            continue
        mirror_mib = MIRROR.simulated_bytes(c["repo"]) // MIB // (2 if c["online_fp8"] else 1)
        if mirror_mib != c["weights_mib"]:
            named.append(c["repo"])
        sim = simulator(c, weights_mib=mirror_mib)
        arch = catalog_vars["d3_catalog"][c["size"]]["architecture"]
        fig = kv_cache_figures(arch, {"--max-model-len": c["length"], "--gpu-memory-utilization": c["util"],
                                      "--quantization": "fp8" if c["online_fp8"] else None,
                                      "fp8_activations": c["online_fp8"] or c["variant"] == "fp8"},
                               SIM.torch_total_mib(c["gpu"]["name"], c["gpu"]["nvidia_smi"]), c["tp"], mirror_mib)  # fmt: skip
        plan = {"refused": fig["refusal"]["message"]} if fig["refusal"] else {
            "tokens": fig["gpu_kv_cache_tokens"], "concurrency": round(fig["max_concurrency"], 2), "block": fig["block_size"],
            "batched": fig["max_num_batched_tokens"]}  # fmt: skip
        assert same(plan, sim), (c, plan, sim)
    assert "d3" in named  # the 27B: 52.2 GB / 2 in the mirror, 27.92 GB in the catalog


def test_the_field_reports_recipe_logs_the_hand_computed_figures(catalog_vars: dict[str, Any]) -> None:
    """docs/capacity.md's hand computation, from the simulator's side: 54,096 tokens / 19.93x at 8192 and 0.95."""
    c = next(c for c in grid(catalog_vars) if (c["size"], c["variant"], c["length"], c["util"]) == ("d3", "bf16-fp8-online", 8192, 0.95))
    assert simulator(c, weights_mib=2 * 13312) == {"tokens": 54096, "concurrency": 19.93, "block": 784, "batched": 8192}


def test_both_sides_take_the_l4_total_from_the_same_contract(catalog_vars: dict[str, Any]) -> None:
    l4 = CONTRACT["gpus"]["NVIDIA L4"]
    assert catalog_vars["d3_catalog_common"]["gpu_models"]["L4"] == {
        "nvidia_smi_total_mib": l4["nvidia_smi_total_mib"], "vllm_total_mib": l4["torch_total_mib"]}  # fmt: skip
    assert SIM.torch_total_mib("NVIDIA L4", l4["nvidia_smi_total_mib"]) == l4["torch_total_mib"]
    # "22.03 GiB" as PyTorch prints it (two decimals)
    assert f"{l4['torch_total_mib'] / 1024:.2f}" == l4["pytorch_says_gib"]
    assert math.isclose(l4["torch_total_mib"] / 1024, 22.03, abs_tol=0.005)


@pytest.mark.parametrize("changed", ["planner", "simulator"])
def test_the_comparison_fails_when_either_side_changes_alone(catalog_vars: dict[str, Any], changed: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Move one term of one side by 64 MiB (the simulator's non-torch stand-in, the planner's L4 total) and the grid
    disagrees."""
    if changed == "simulator":
        monkeypatch.setattr(SIM, "NON_TORCH_STAND_IN_MIB", SIM.NON_TORCH_STAND_IN_MIB + 64)
    else:
        monkeypatch.setitem(catalog_vars["d3_catalog_common"]["gpu_models"]["L4"], "vllm_total_mib", 22560 - 64)
    assert any(not same(planner(catalog_vars, c), simulator(c)) for c in grid(catalog_vars))
