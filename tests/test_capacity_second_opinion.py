# ruff: noqa: E501  (each branch of the grid is kept on one line)
"""Issue 33: the planner's startup figures against the lab simulator's, each computed from vLLM's source.

The planner (d3_plan / kv_cache_figures) and the simulator (lab/simulator/vllm_sim.py startup_memory, imported
in-process) are two ports of vLLM's startup accounting, separate code written from vLLM's source (what they share:
docs/capacity.md "The second opinion"). On a grid of 188 configurations (every catalog size and
variant, four --max-model-len, two --gpu-memory-utilization; then per size the TP, CUDA-graph, chunked-prefill,
--kv-cache-memory-bytes, short-context and A100 branches: grid()) they must agree exactly: the same integer GPU KV cache
size, the same maximum concurrency to two decimals, the same attention block and batch, or the same refusal (its
exception and whole message). Both sides are
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
from d3_planner import MIB, d3_plan, kv_cache_figures, mib_of_gb, parse_bytes, tp_refusal, vllm_total_mib

ROOT = Path(__file__).resolve().parents[1]
SIM = testkit.load_file("vllm_sim_second_opinion", ROOT / "lab/simulator/vllm_sim.py")
MIRROR = testkit.load_file("build_repos_second_opinion", ROOT / "lab/hf/build_repos.py")
CONTRACT = json.loads((ROOT / "tests/contracts/vllm/gpu-memory.json").read_text())
LENGTHS = (4096, 8192, 16384, 32768)
L4 = {"name": "NVIDIA L4", "nvidia_smi": 23034, "compute_cap": "8.9"}
# NVFP4 is planned on compute capability 10.0 only (policy): it is compared on a Blackwell GPU the catalog does not
# know, where both sides count nvidia-smi's total (and vLLM's 8192-token default batch of a GPU of 70 GiB and more)
BLACKWELL = {"name": "NVIDIA RTX PRO 6000", "nvidia_smi": 97887, "compute_cap": "12.0"}
# 80 GiB, but an A100: vLLM's get_batch_defaults keeps the small defaults (`"a100" not in device_name`)
A100 = {"name": "NVIDIA A100-SXM4-80GB", "nvidia_smi": 81920, "compute_cap": "8.0"}


def config(size: str, variant: str, spec: dict[str, Any], entry: dict[str, Any], gpu: dict[str, Any], util: float,
           length: int, tp: int | None = None, extra: tuple[str, ...] = (), eager: bool = True) -> dict[str, Any]:
    return {"size": size, "variant": variant, "repo": spec.get("hf_repo", entry["hf_repo"]).split("/")[1], "gpu": gpu,
            "util": util, "length": length, "tp": tp or int(spec.get("tensor_parallel_size", entry["tensor_parallel_size"])),
            "online_fp8": spec.get("quantization_flag", "fp8") == "fp8", "extra": extra, "eager": eager,
            "branch": tp is not None or bool(extra) or not eager,
            "weights_mib": mib_of_gb(float(spec.get("weights_gb", entry["weights_fp8_gb"])))}  # fmt: skip


def grid(catalog_vars: dict[str, Any]) -> list[dict[str, Any]]:
    """Every size and variant at four lengths and two shares (eager, chunked prefill off), then the branches: TP sizes
    (split, replicated KV heads, refused by vLLM's checks), CUDA graphs (no --enforce-eager: refused at capture on an
    L4, figures on a large GPU), chunked prefill (a 2048-token batch, an explicit one, max_num_seqs above it),
    --kv-cache-memory-bytes (a pool that fits, one that overflows the GPU, one too small for a sequence) and a
    context shorter than the attention block (and one of 4 tokens, whose default batch max_num_seqs caps)."""
    out = []
    catalog = catalog_vars["d3_catalog"]
    for size, entry in catalog.items():
        for variant, spec in entry["variants"].items():
            spec = spec or {}
            gpu = BLACKWELL if float(spec.get("min_compute_capability", 0)) > 8.9 else L4
            base_util = float(spec.get("gpu_memory_utilization", entry["gpu_memory_utilization"]))
            for util in sorted({base_util, 0.9 if base_util < 0.9 else 0.6}):
                for length in LENGTHS:
                    out.append(config(size, variant, spec, entry, gpu, util, length))
    for size, entry in catalog.items():
        variant = entry["default_variant"]
        spec, util = entry["variants"][variant] or {}, float(entry["gpu_memory_utilization"])

        def add(gpu: dict[str, Any] = L4, length: int = 8192, **more: Any) -> None:
            out.append(config(size, variant, spec, entry, gpu, util, length, **more))  # noqa: B023

        for tp in (2, 3, 4, 8):
            add(tp=tp)
        add(eager=False)  # the encoder probe at capture on 22.03 GiB
        add(BLACKWELL, eager=False)
        add(BLACKWELL, 32768, eager=False)
        add(length=32768, extra=("--enable-chunked-prefill",))
        add(length=131072, extra=("--enable-chunked-prefill", "--max-num-batched-tokens=4096"))
        add(extra=("--enable-chunked-prefill", "--max-num-batched-tokens=128", "--max-num-seqs=256"))
        add(extra=("--enable-chunked-prefill", "--max-num-batched-tokens=128"))
        add(extra=("--kv-cache-memory-bytes=2G",))
        add(length=32768, extra=("--kv-cache-memory-bytes=1.5g",))
        add(extra=("--kv-cache-memory-bytes=30G",))
        add(extra=("--kv-cache-memory-bytes=1M",))
        add(length=512)
        add(length=4)  # the default batch capped at max_num_seqs x max_model_len
        add(A100, length=4096)  # 80 GiB with the small defaults: a 4096-token batch, not 8192
    return out


def flag(c: dict[str, Any], name: str) -> str | None:
    return next((f.split("=", 1)[1] for f in c["extra"] if f.startswith(name + "=")), None)


def planner(catalog_vars: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """The plan of one instance on as many GPUs as its TP: its kv_cache figures, or the refusal it quotes: vLLM's
    exception and message (tp_refusal, kv_cache_figures' refusal), which the plan's error must contain verbatim."""
    gpus = [{"index": i, "name": c["gpu"]["name"], "memory_total_mib": c["gpu"]["nvidia_smi"], "compute_cap": c["gpu"]["compute_cap"]}
            for i in range(c["tp"])]  # fmt: skip
    args = [f"--max-model-len={c['length']}", f"--gpu-memory-utilization={c['util']}", f"--tensor-parallel-size={c['tp']}",
            *c["extra"], *([] if c["eager"] else ["--no-enforce-eager"])]  # fmt: skip
    item = {"model": c["size"], "variant": c["variant"], "extra_args": args}
    result = d3_plan([item], catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], gpus, "grid",
                     {"api_key_set": True, "allow_non_l4": True, "allow_cuda_graphs": True})  # fmt: skip
    if result["errors"]:
        (error,) = result["errors"]
        arch = catalog_vars["d3_catalog"][c["size"]]["architecture"]
        reason = tp_refusal(arch["text"], c["tp"], arch.get("vision"))
        if reason is None:
            kv_bytes, batched, seqs = flag(c, "--kv-cache-memory-bytes"), flag(c, "--max-num-batched-tokens"), flag(c, "--max-num-seqs")
            fig = kv_cache_figures(arch, {
                "--max-model-len": c["length"], "--gpu-memory-utilization": c["util"], "--enforce-eager": c["eager"],
                "--quantization": "fp8" if c["online_fp8"] else None, "--enable-chunked-prefill": "--enable-chunked-prefill" in c["extra"],
                "--max-num-batched-tokens": None if batched is None else parse_bytes(batched),
                "--max-num-seqs": None if seqs is None else int(seqs),
                "--kv-cache-memory-bytes": None if kv_bytes is None else parse_bytes(kv_bytes),
                "fp8_activations": c["online_fp8"] or c["variant"] == "fp8", "gpu_name": c["gpu"]["name"]},
                vllm_total_mib(gpus[0], catalog_vars["d3_catalog_common"]["gpu_models"]), c["tp"], c["weights_mib"])  # fmt: skip
            assert fig["refusal"], error
            reason = f"{EXCEPTION[fig['refusal']['kind']]}: {fig['refusal']['message']}"
        assert reason.split(": ", 1)[1] in error, (reason, error)
        return {"refused": reason}
    (inst,) = result["instances"]
    return {"tokens": inst["kv_cache"]["gpu_kv_cache_tokens"], "concurrency": inst["kv_cache"]["max_concurrency"],
            "block": inst["kv_cache"]["block_size"], "batched": inst["kv_cache"]["max_num_batched_tokens"]}  # fmt: skip


# the exception each of the planner's refusal kinds stands for in vLLM
EXCEPTION = {"batched_tokens": "ValueError", "max_num_seqs": "ValueError", "profile_oom": "torch.OutOfMemoryError",
             "no_kv_memory": "ValueError", "max_seq_len": "ValueError"}  # fmt: skip


def simulator(c: dict[str, Any], weights_mib: int | None = None) -> dict[str, Any]:
    """The simulator's accounting for the same instance, from its own argument parser: the lab mirror's config.json (a
    variant's carries its quantization_config; NVFP4, not mirrored, its base size's), the same weights in GPU memory,
    the GPU's total as its stand-in table gives it; tensor_parallel_error before the memory."""
    name = c["repo"] if c["repo"] in {*MIRROR.MODELS, *MIRROR.VARIANTS} else c["size"]
    config = MIRROR.config_json(name)
    quantization = "fp8" if c["online_fp8"] else None
    args = SIM.parse_args(["--model", "x", "--max-model-len", str(c["length"]), "--gpu-memory-utilization", str(c["util"]),
                           "-tp", str(c["tp"]), *(["--enforce-eager"] if c["eager"] else []), *c["extra"],
                           *(["--quantization", "fp8"] if quantization else [])])  # fmt: skip
    weights = (c["weights_mib"] if weights_mib is None else weights_mib) * MIB * (2 if c["online_fp8"] else 1)
    model = SIM.Model(c["repo"], Path("/nonexistent"), config, weights)
    SIM.verify_quantization(args, model)
    split = SIM.tensor_parallel_error(config, c["tp"])
    if split:
        return {"refused": f"{split[0]}: {split[1]}"}
    total = SIM.torch_total_mib(c["gpu"]["name"], c["gpu"]["nvidia_smi"]) * MIB
    mem = SIM.startup_memory(config, SIM.model_weight_bytes(args, model), c["tp"], c["util"], total, c["length"],
                             batched=args.max_num_batched_tokens, chunked=bool(args.enable_chunked_prefill),
                             eager=args.enforce_eager, kv_dtype=args.kv_cache_dtype,
                             kv_cache_memory_bytes=args.kv_cache_memory_bytes, fp8=SIM.activations_fp8(config, args.quantization),
                             max_num_seqs=args.max_num_seqs, device_name=c["gpu"]["name"])  # fmt: skip
    if mem["stop"]:
        return {"refused": f"{mem['stop'][0]}: {mem['stop'][1]}"}
    return {"tokens": mem["tokens"], "concurrency": round(mem["concurrency"], 2), "block": mem["layout"].block_size,
            "batched": mem["max_num_batched_tokens"]}  # fmt: skip


def same(plan: dict[str, Any], sim: dict[str, Any]) -> bool:
    """Exactly the same: the figures (integer tokens, concurrency to two decimals, block, batch), or the same refusal,
    exception and whole message."""
    return plan == sim


def test_the_grid_covers_every_size_and_variant_and_each_branch(catalog_vars: dict[str, Any]) -> None:
    cells = grid(catalog_vars)
    assert len(cells) >= 40
    assert {(c["size"], c["variant"]) for c in cells} == {(s, v) for s, e in catalog_vars["d3_catalog"].items() for v in e["variants"]}
    plans = [(c, planner(catalog_vars, c)) for c in cells]
    starts = [c for c, p in plans if "tokens" in p]
    assert len(starts) >= 40  # most of the grid starts: the comparison is of figures, not only of refusals
    reasons = {p["refused"].split(" ", 1)[0] for _, p in plans if "refused" in p}
    assert reasons == {"ValueError:", "AssertionError:", "torch.OutOfMemoryError:"} or reasons >= {"ValueError:", "AssertionError:"}
    branch = {
        "a TP vLLM's divide() refuses": any(c["tp"] == 3 and c["size"] == "d3" and "not divisible" in p.get("refused", "") for c, p in plans),
        "the vision tower's heads (d3-edge at TP 8)": any(c["tp"] == 8 and c["size"] == "d3-edge"
                                                         and p.get("refused") == "AssertionError: 12 is not divisible by 8" for c, p in plans),
        "replicated KV heads (the 27B at TP 8)": any(c["tp"] == 8 and c["size"] == "d3" and p.get("block") == 400 for c, p in plans),
        "CUDA graphs refused at capture on an L4": any(not c["eager"] and "CUDA graph capture" in p.get("refused", "") for c, p in plans),
        "CUDA graphs counted on a large GPU": any(not c["eager"] and "tokens" in p for c, p in plans),
        "chunked prefill's 2048-token batch": any("--enable-chunked-prefill" in c["extra"] and p.get("batched") == 2048 for c, p in plans),
        "max_num_seqs above the batch": any("must be greater than or equal to max_num_seqs" in p.get("refused", "") for _, p in plans),
        "--kv-cache-memory-bytes figures": any(flag(c, "--kv-cache-memory-bytes") and "tokens" in p for c, p in plans),
        "--kv-cache-memory-bytes beyond the GPU": any(flag(c, "--kv-cache-memory-bytes") and "KV cache" in p.get("refused", "")
                                                     and "out of memory" in p.get("refused", "") for c, p in plans),
        "--kv-cache-memory-bytes below one sequence": any(flag(c, "--kv-cache-memory-bytes") and "To serve at least one request" in p.get("refused", "") for c, p in plans),
        "a context below the attention block": any(c["length"] == 512 and p.get("tokens", 1) % 512 == 0 and p.get("block", 0) > 512 for c, p in plans),
        "the A100 exception (80 GiB, small defaults)": any(c["gpu"] is A100 and p.get("batched") == 4096 for c, p in plans),
    }  # fmt: skip
    assert [name for name, seen in branch.items() if not seen] == []


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
        if c["repo"] not in {*MIRROR.MODELS, *MIRROR.VARIANTS} or c["length"] != 8192 or c["branch"]:
            continue
        mirror_mib = MIRROR.simulated_bytes(c["repo"]) // MIB // (2 if c["online_fp8"] else 1)
        if mirror_mib != c["weights_mib"]:
            named.append(c["repo"])
        sim = simulator(c, weights_mib=mirror_mib)
        arch = catalog_vars["d3_catalog"][c["size"]]["architecture"]
        fig = kv_cache_figures(arch, {"--max-model-len": c["length"], "--gpu-memory-utilization": c["util"],
                                      "--quantization": "fp8" if c["online_fp8"] else None,
                                      "fp8_activations": c["online_fp8"] or c["variant"] == "fp8", "gpu_name": c["gpu"]["name"]},
                               SIM.torch_total_mib(c["gpu"]["name"], c["gpu"]["nvidia_smi"]), c["tp"], mirror_mib)  # fmt: skip
        plan = {"refused": f"{EXCEPTION[fig['refusal']['kind']]}: {fig['refusal']['message']}"} if fig["refusal"] else {
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


PERTURBATIONS = {
    # one term of one side moved: the grid must disagree
    "simulator's non-torch stand-in": ("sim", "NON_TORCH_STAND_IN_MIB", lambda v: v + 64),
    "planner's L4 total": ("catalog", None, None),
    "simulator's CUDA-graph probe": ("sim", "VISION_PROBE_GIB", lambda v: v + 0.01),
    "planner's CUDA-graph probe": ("planner", "ENCODER_PROBE_GIB", lambda v: v + 0.01),
    "simulator's TP checks": ("sim", "tensor_parallel_error", lambda v: lambda config, tp: None),
    "planner's TP checks": ("planner", "tp_refusal", lambda v: lambda text, tp, vision=None: None),
    "planner's refusal text": ("planner", "CONSERVING_MEMORY", lambda v: v.replace("latest", "stable")),
    "simulator's default max_num_seqs": ("sim", "SERVE_MAX_NUM_SEQS", lambda v: v - 1),
    "planner's default max_num_seqs": ("planner", "DEFAULT_MAX_NUM_SEQS", lambda v: v - 1),
    "simulator's block alignment": ("sim", "KV_ALIGNMENT", lambda v: 2 * v),
    "simulator's A100 exception": ("sim", "serve_large_defaults", lambda v: lambda total, name: total >= 70 * 2**30),
    "planner's A100 exception": ("planner", "large_batch_defaults", lambda v: lambda total, name="": total >= 70 * 1024),
}


@pytest.mark.parametrize("change", sorted(PERTURBATIONS))
def test_the_comparison_fails_when_either_side_changes_alone(catalog_vars: dict[str, Any], change: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Move one term of one side (a stand-in, a constant, a check, a word of a refusal) and the grid disagrees."""
    import d3_planner

    side, name, how = PERTURBATIONS[change]
    if side == "catalog":
        monkeypatch.setitem(catalog_vars["d3_catalog_common"]["gpu_models"]["L4"], "vllm_total_mib", 22560 - 64)
    else:
        module = SIM if side == "sim" else d3_planner
        monkeypatch.setattr(module, name, how(getattr(module, name)))
    assert any(not same(planner_or_refusal(catalog_vars, c), simulator(c)) for c in grid(catalog_vars))


def planner_or_refusal(catalog_vars: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """planner(), or what differs when a perturbed planner quotes a refusal its functions no longer give."""
    try:
        return planner(catalog_vars, c)
    except AssertionError as exc:
        return {"planner inconsistent": str(exc)}
