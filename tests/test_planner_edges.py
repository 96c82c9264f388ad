# ruff: noqa: E501  (each refusal is kept on one line, as the operator reads it)
"""Planner edges on a small synthetic catalog: an entry without variants, pre-quantized and explicitly not
pre-quantized variants, compute-capability refusals, exact fit boundaries, port and max-model-len bounds, shares that
add up, and refusals that keep going past the first bad instance."""

from __future__ import annotations

from typing import Any

from d3_planner import Options, _Planner, d3_plan
from l4 import l4_gpus

MIB = 1024**2
COMMON = {"max_position_embeddings": 4096, "quantization": "fp8", "enforce_eager": True, "env": {},
          "container_hf_home": "/hf"}
# 2952 MiB of weights on half of a 10000 MiB GPU
WEIGHTS_GB = 2952 * MIB / 1e9
VARIANTS = {
    "fp8": {"hf_repo": "org/plain-FP8", "quant_method": "fp8", "measured_on_l4_tp": [1]},
    "w4": {"hf_repo": "org/plain-W4", "quant_method": "compressed-tensors", "pre_quantized": False, "quantization_flag": None,
           "weights_gb": 1, "measured_on_l4_tp": [1]},
    "nv": {"hf_repo": "org/plain-NV", "min_compute_capability": 10.0, "requires": "FP4 tensor cores"},
    "ampere": {"hf_repo": "org/plain-A", "min_compute_capability": 8.0},
    "null": None,
}  # fmt: skip


# A small hybrid (8 layers, 2 of them full attention) whose profile run at its 4096 tokens (max_num_batched_tokens =
# --max-model-len without chunked prefill) takes 21 MiB of activations (5376 B per token: docs/capacity.md), and whose
# 4096-token sequence takes 1 MiB of KV cache.
ARCH = {"text": {"num_hidden_layers": 8, "full_attention_interval": 4, "hidden_size": 256, "intermediate_size": 512,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 2,
                 "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                 "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32", "dtype": "bfloat16", "vocab_size": 1000}}


def entry(**changes: Any) -> dict[str, Any]:
    return {"hf_repo": "org/plain", "instance_name": "plain", "weights_fp8_gb": WEIGHTS_GB, "download_gb": 3,
            "release_revision_short": "abc123", "tensor_parallel_size": 1, "max_model_len": 4096, "gpu_memory_utilization": 0.5,
            "shm_size": "1g", "architecture": ARCH, **changes}  # fmt: skip


CATALOG = {
    "plain": entry(),
    "big": entry(hf_repo="org/big", instance_name="big", weights_fp8_gb=80),
    "multi": entry(hf_repo="org/multi", instance_name="multi", default_variant="fp8", variants=VARIANTS,
                   ),
    "local": entry(hf_repo="local-model", instance_name="local"),
}  # fmt: skip
GPU = [{"index": 0, "name": "NVIDIA L4", "memory_total_mib": 10000}]
PROBE = "the field report's sizing table lists this size on one L4 (no run of it is recorded)"


def plan(models: list[Any], gpus: list[dict[str, Any]] = GPU, **options: Any) -> dict[str, Any]:
    options.setdefault("api_key_set", True)  # the key rule has its own tests (test_planner_hardening.py)
    options.setdefault("allow_cuda_graphs", True)
    return d3_plan(models, CATALOG, COMMON, gpus, host="h", options=options)


def test_an_entry_without_variants_plans_its_own_checkpoint_at_exactly_its_share() -> None:
    result = plan([{"model": "plain"}])
    assert result["errors"] == []
    assert result["host"] == "h"
    (inst,) = result["instances"]
    assert inst["variant"] == "default"
    assert inst["args"] == ["--model", "org/plain", "--served-model-name", "plain", "--host", "127.0.0.1", "--port", "8000",
                            "--tensor-parallel-size", "1", "--max-model-len", "4096", "--gpu-memory-utilization", "0.5",
                            "--quantization", "fp8", "--enforce-eager"]  # fmt: skip
    # docs/capacity.md by hand for ARCH: 48-token blocks (a 17920 B mamba state over 512 B per token), pages of
    # 24576 B, 2 layers per group, 4 groups: 5000 - 2952 - 21 - 512 = 1515 MiB of KV cache hold 32320 blocks, 387840
    # tokens
    assert inst["vram_arithmetic_mib_per_gpu"] == {"weights_mib": 2952, "activation_peak_mib": 21, "non_torch_mib": 512,
                                                   "encoder_probe_mib": 0, "requested_mib": 5000, "kv_pool_mib": 1515,
                                                   "sequence_kv_mib": 5, "total_mib": 3490}  # fmt: skip
    assert 1515 * MIB // 24576 // 2 == 32320
    assert inst["kv_cache"]["gpu_kv_cache_tokens"] == 32320 // 4 * 48 and inst["kv_cache"]["max_concurrency"] == round(32320 / 89, 2)
    assert (inst["measured_on_hardware"], inst["hardware_note"]) == (None, PROBE)
    assert plan([{"model": "plain", "variant": "x"}])["errors"] == [
        "host h: d3_models[0] (plain): plain has no variant 'x': it has only its default checkpoint (org/plain), no variants to choose from. Fix: remove `variant:` from d3_models[0] to run that checkpoint"]
    assert plan([{"model": "plain"}], require_revisions=True)["errors"] == [
        "host h: d3_models[0] (plain): no pinned revision for plain. Fix: set d3_model_revisions['plain'] to the full commit SHA of org/plain (vllm-sr v3.1.0 record: abc123...)"]
    eager = plan([{"model": "plain", "extra_args": ["--enforce-eager"]}], allow_cuda_graphs=False)
    assert eager["errors"] == []
    assert eager["instances"][0]["args"][-1] == "--enforce-eager"
    local = plan([{"model": "local"}], revisions={"local-model": "0" * 40})
    assert local["instances"][0]["revision"] == "0" * 40


def test_a_model_too_big_for_any_tensor_parallel_size() -> None:
    assert plan([{"model": "big"}])["errors"] == [
        "host h: d3_models[0] (big): big at TP 1 runs out of memory in vLLM's profile run ('torch.OutOfMemoryError: CUDA out of memory'): weights 76294 + profile-run peak 21 (4096 tokens x 5376 B) + non-torch 512 = 76827 MiB per GPU, more than the GPU holds beside the CUDA context (CUDA out of memory. GPU 0 has a total capacity of 9.77 GiB (weights 74.51 GiB, profile run 0.02 GiB at 4096 tokens, non-torch 0.50 GiB, CUDA graphs 0.00 GiB).). Fix: pick a smaller model or variant for d3_models[0]"]


def test_a_chosen_variant_without_enforce_eager_counts_the_encoder_probe() -> None:
    assert plan([{"model": "multi", "variant": "ampere", "extra_args": ["--no-enforce-eager"]}], gpus=[{**GPU[0], "compute_cap": ""}])["errors"] == [
        "host h: d3_models[0] (multi): multi variant ampere at TP 1 runs out of memory in vLLM's profile run ('torch.OutOfMemoryError: CUDA out of memory'): weights 2952 + profile-run peak 21 (4096 tokens x 5376 B) + non-torch 512 + encoder probe 18842 (CUDA graph capture without --enforce-eager) = 22327 MiB per GPU, more than the GPU holds beside the CUDA context (CUDA out of memory during CUDA graph capture. Tried to allocate 18.40 GiB (fixed vision-encoder profiling allocation). GPU 0 has a total capacity of 9.77 GiB of which 6.36 GiB is free. Use --enforce-eager.). Fix: pick a smaller model or variant for d3_models[0]; or keep --enforce-eager (remove --no-enforce-eager)"]
    fits = plan([{"model": "multi", "extra_args": ["--gpu-memory-utilization=0.37"]}])  # eager: no probe
    assert fits["errors"] == []
    assert fits["instances"][0]["vram_arithmetic_mib_per_gpu"]["kv_pool_mib"] == 214
    # the default recipe without --enforce-eager counts the probe too (it used to be left out for a measured recipe)
    (error,) = plan([{"model": "multi", "extra_args": ["--gpu-memory-utilization=0.37", "--no-enforce-eager"]}])["errors"]
    assert "+ encoder probe 18842 (CUDA graph capture without --enforce-eager)" in error
    assert (fits["instances"][0]["measured_on_hardware"], fits["instances"][0]["hardware_note"]) == (
        True, "the field report ran this recipe on L4 hardware")


def test_a_kv_cache_too_small_for_one_sequence_gets_vllms_refusal_and_every_way_out() -> None:
    assert plan([{"model": "multi", "extra_args": ["--gpu-memory-utilization=0.3486"]}])["errors"] == [
        "host h: d3_models[0] (multi): multi at TP 1 is refused by vLLM at startup, its KV cache being too small for one sequence of --max-model-len 4096 (5 MiB): 'To serve at least one request with the models's max seq len (4096), (0.0 GiB KV cache is needed, which is larger than the available KV cache memory (0.0 GiB). Based on the available memory, the estimated maximum model length is 864. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.' (weights 2952 + profile-run peak 21 (4096 tokens x 5376 B) + non-torch 512 = 3485 MiB per GPU of its share (--gpu-memory-utilization x GPU memory) of 3486 MiB). Fix: in d3_models[0].extra_args set --max-model-len=3577 (the longest that fits), or set --gpu-memory-utilization=0.36, or set --tensor-parallel-size=2 (2 GPUs; the host has 1)"]
    # a shorter context also profiles fewer tokens: 3577 fits where vLLM's estimate (at 4096's profile) says 864
    assert plan([{"model": "multi", "extra_args": ["--gpu-memory-utilization=0.3486", "--max-model-len=3577"]}])["errors"] == []


def test_concurrency_below_the_floor_is_refused_with_the_figures_vllm_would_log() -> None:
    assert plan([{"model": "plain"}], min_concurrency=400)["errors"] == [
        "host h: d3_models[0] (plain): plain at TP 1 would start with 'GPU KV cache size: 387,840 tokens' and 'Maximum concurrency for 4,096 tokens per request: 363.15x', below d3_min_concurrency 400 (weights 2952 + profile-run peak 21 (4096 tokens x 5376 B) + non-torch 512 = 3485 MiB per GPU of its share (--gpu-memory-utilization x GPU memory) of 5000 MiB leave a KV cache of 1515 MiB; one 4096-token sequence takes 5 MiB). Fix: in d3_models[0].extra_args set --max-model-len=3696 (the longest that fits), or set --gpu-memory-utilization=0.52, or set --tensor-parallel-size=2 (2 GPUs; the host has 1)"]
    assert plan([{"model": "plain", "extra_args": ["--max-model-len=3696"]}], min_concurrency=400)["errors"] == []
    assert plan([{"model": "plain"}], min_concurrency=363.1)["errors"] == []
    for bad in (0, -1, float("inf"), float("nan"), True):
        assert plan([{"model": "plain"}], min_concurrency=bad)["errors"] == [
            f"host h: d3_min_concurrency: {bad if bad is True else float(bad)!r} is not a number above 0. Fix: set the least maximum concurrency vLLM may log, e.g. 1 (what vLLM needs to start) or 4"]


def test_pre_quantized_and_explicitly_not_pre_quantized_variants() -> None:
    assert plan([{"model": "multi", "extra_args": ["--quantization=awq"]}])["errors"] == [
        "host h: d3_models[0] (multi): variant 'fp8' (org/plain-FP8) is a pre-quantized checkpoint (quant_method fp8); with --quantization awq vLLM refuses to start: 'Quantization method specified in the model config (fp8) does not match the quantization method specified in the `quantization` argument (awq).'. Fix: remove --quantization from d3_models[0].extra_args (vLLM reads it from the checkpoint)"]
    w4 = plan([{"model": "multi", "variant": "w4", "extra_args": ["--quantization=fp8"]}])
    assert w4["errors"] == []
    assert w4["instances"][0]["args"][-3:] == ["--quantization", "fp8", "--enforce-eager"]
    assert "--quantization" not in plan([{"model": "multi", "variant": "w4"}])["instances"][0]["args"]


def test_compute_capability_refusals_name_the_gpu_and_the_variants_that_would_do() -> None:
    assert plan([{"model": "multi", "variant": "nv"}])["errors"] == [
        "host h: d3_models[0] (multi): variant 'nv' (org/plain-NV) needs compute capability 10.0 (FP4 tensor cores); GPU 0 is a NVIDIA L4 (compute capability 8.9). Fix: choose another variant for d3_models[0].variant: fp8, w4, ampere, null"]
    unknown = [{"index": 0, "name": "NVIDIA X", "memory_total_mib": 10000}]
    assert plan([{"model": "multi", "variant": "ampere"}], gpus=unknown, allow_non_l4=True)["errors"] == [
        "host h: d3_models[0] (multi): variant 'ampere' (org/plain-A) needs compute capability 8.0; GPU 0 is a NVIDIA X (compute capability unknown). Fix: choose another variant for d3_models[0].variant: fp8, w4, null"]


def test_bounds_that_are_allowed() -> None:
    edges = [{"model": "plain", "extra_args": ["--max-model-len=1", "--gpu-memory-utilization=0.5"], "port": 1024},
             {"model": "plain", "name": "p2", "extra_args": ["--max-model-len=4096", "--gpu-memory-utilization=0.5"], "port": 65535}]  # fmt: skip
    result = plan(edges, gpus=l4_gpus(2, 10000))
    assert result["errors"] == []
    assert [(i["max_model_len"], i["port"]) for i in result["instances"]] == [(1, 1024), (4096, 65535)]
    assert plan([{"model": "plain"}], port_base=65535)["instances"][0]["port"] == 65535


def test_every_bad_port_is_reported() -> None:
    two = plan([{"model": "plain", "port": 1023}, {"model": "plain", "name": "p2", "port": 65536}, {"model": "plain", "name": "p3"}],
               gpus=l4_gpus(3, 10000))  # fmt: skip
    assert two["errors"] == [
        "host h: d3_models[0] (plain): port 1023 is outside 1024-65535. Fix: choose a port in 1024-65535",
        "host h: d3_models[1] (p2): port 65536 is outside 1024-65535. Fix: choose a port in 1024-65535",
    ]
    clash = plan([{"model": "plain", "port": 9000}, {"model": "plain", "name": "p2", "port": 9000},
                  {"model": "plain", "name": "p3", "port": 9000}], gpus=l4_gpus(3, 10000))  # fmt: skip
    assert [e.split(": ", 2)[1] for e in clash["errors"]] == ["d3_models[1] (p2)", "d3_models[2] (p3)"]
    full = plan([{"model": "plain"}, {"model": "plain", "name": "p2"}], gpus=l4_gpus(2, 10000), port_base=65536)
    assert full["errors"] == ["host h: d3_models[0] (plain): no free port left. Fix: lower d3_port_base",
                              "host h: d3_models[1] (p2): no free port left. Fix: lower d3_port_base"]


def test_shares_add_up_on_a_gpu() -> None:
    quarter = ["--gpu-memory-utilization=0.25", "--max-model-len=16"]
    small = entry(weights_fp8_gb=0.1)
    catalog = {"s": small}
    models = [{"model": "s", "name": f"s{i}", "extra_args": quarter} for i in range(4)]
    result = d3_plan(models, catalog, COMMON, l4_gpus(1, 20000), host="h", options={"allow_cuda_graphs": True})
    assert result["errors"] == [
        "host h: d3_models[3] (s3): VRAM over budget: no 1 GPU(s) with 5000 MiB (--gpu-memory-utilization 0.25) left within d3_gpu_share_cap 0.92 of each GPU's memory (GPU 0: s0 5000 MiB (0.25), s1 5000 MiB (0.25), s2 5000 MiB (0.25)). Fix: set --gpu-memory-utilization=0.14 in d3_models[3].extra_args (what is left), or move d3_models[3] to another GPU (its `gpus:`) or host"]
    fixed = [{**m, "gpus": [0]} for m in models]
    result = d3_plan(fixed, catalog, COMMON, l4_gpus(1, 20000), host="h", options={"allow_cuda_graphs": True})
    assert result["errors"] == [
        "host h: d3_models[3] (s3): VRAM over budget on GPU 0: its share of 5000 MiB (--gpu-memory-utilization 0.25 x 20000 MiB) on top of s0 5000 MiB (0.25), s1 5000 MiB (0.25), s2 5000 MiB (0.25) makes 0.25 + 0.25 + 0.25 + 0.25 = 1 of the GPU (20000 MiB), over the 0.92 (18400 MiB) that d3_gpu_share_cap allows on a shared GPU (vLLM needs its share free at start, and the driver keeps some). Fix: set --gpu-memory-utilization=0.14 in d3_models[3].extra_args (what is left), or move d3_models[3] to another GPU (its `gpus:`) or host"]
    # the partial plan: what would run where once the refused instance is fixed
    assert result["partial"][:1] == ["s0: s on GPU 0, port 8000, needs 619 MiB/GPU of its 5000 MiB share; GPU KV cache size: 373,968 tokens, maximum concurrency 23373.25x at 16 tokens (predicted)"]
    assert result["partial"][-1] == "GPU 0: 15000/20000 MiB in shares (s0 5000 MiB, s1 5000 MiB, s2 5000 MiB)"
    two_gpus = d3_plan([*models, {"model": "s", "name": "s4", "extra_args": ["--gpu-memory-utilization=0.9"]}], catalog, COMMON,
                       l4_gpus(2, 20000), host="h", options={"allow_cuda_graphs": True, "gpu_share_cap": 0})  # fmt: skip
    assert two_gpus["errors"][0].endswith("within d3_gpu_share_cap 0.0 of each GPU's memory (GPU 0: s4 18000 MiB (0.9); GPU 1: s0 5000 MiB (0.25)). "
                                          "Fix: move d3_models[1] to another GPU (its `gpus:`) or host")
    # what is left does not start the instance: the fix says so, with the reason
    # (the cap leaves 0.05, vLLM's free memory 552 MiB beside the three shares and four CUDA contexts)
    tight = d3_plan([{**m, "extra_args": ["--gpu-memory-utilization=0.29", "--max-model-len=16"]} for m in fixed], catalog, COMMON,
                    l4_gpus(1, 20000), host="h", options={"allow_cuda_graphs": True})  # fmt: skip
    assert tight["errors"][0].endswith(
        "Fix: move d3_models[3] to another GPU (its `gpus:`) or host (at the 0.02 left, s3 itself would not start: is refused by vLLM at startup: 'No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.': weights 95 + profile-run peak 11 (2048 tokens x 5376 B) + non-torch 512 = 618 MiB per GPU fill its share (--gpu-memory-utilization x GPU memory) of 400 MiB)")


def test_listen_address_skips_unreadable_host_addresses() -> None:
    result = plan([{"model": "plain"}], listen_address="10.0.0.9", host_addresses=["junk", "fe80::1%eth0", "10.0.0.9"])
    assert result["errors"] == []


def test_models_that_are_not_a_list_and_the_default_host() -> None:
    planner = _Planner("h", "d3-mini", CATALOG, COMMON, GPU, Options())  # type: ignore[arg-type]
    assert planner.run() == {"host": "h", "hf_home": "/var/lib/d3/huggingface", "instances": [], "gpus": [{"index": 0, "name": "NVIDIA L4", "memory_total_mib": 10000,
                                                                       "vllm_total_mib": 10000, "budget": [], "budget_mib": 0,
                                                                       "cuda_context_mib": 0, "free_mib": 10000}],
                             "errors": ["host h: d3_models: expected a list, got str. Fix: write a YAML list"],
                             "partial": ["GPU 0: 0/10000 MiB in shares (idle)"]}  # fmt: skip
    assert d3_plan([{"model": "nope"}], CATALOG, COMMON, GPU)["errors"][0].startswith("host localhost: d3_models[0]: unknown model")


# --- refusals whose wording depends on the variant, the TP hint's boundaries (open gaps in docs/mutation.md) ----------

def sized(weights_mib: int) -> dict[str, Any]:
    """An entry without variants whose checkpoint is exactly weights_mib MiB."""
    return entry(hf_repo="org/sized", instance_name="sized", weights_fp8_gb=weights_mib * MIB / 1e9)


def test_a_pre_quantized_variant_whose_checkpoint_names_the_method() -> None:
    catalog = {"q": entry(hf_repo="org/q", instance_name="q", default_variant="q", variants={"q": {"pre_quantized": True}})}
    assert d3_plan([{"model": "q"}], catalog, COMMON, GPU, host="h")["errors"] == [
        "host h: d3_models[0] (q): variant 'q' (org/q) is a pre-quantized checkpoint (quant_method set by the checkpoint); with --quantization fp8 vLLM refuses to start: 'Quantization method specified in the model config (None) does not match the quantization method specified in the `quantization` argument (fp8).'. Fix: remove --quantization from d3_models[0].extra_args (vLLM reads it from the checkpoint)"]








def test_an_unpinned_variant_in_its_own_repository_has_no_release_record() -> None:
    assert plan([{"model": "multi", "variant": "w4"}], require_revisions=True)["errors"] == [
        "host h: d3_models[0] (multi): no pinned revision for plain-W4 (multi variant w4). Fix: set d3_model_revisions['plain-W4'] to the full commit SHA of org/plain-W4"]


def test_the_tensor_parallel_fix_only_offers_a_size_the_heads_divide() -> None:
    assert d3_plan([{"model": "sized"}], {"sized": sized(5904)}, COMMON, GPU, host="h", options={"allow_cuda_graphs": True})["errors"] == [
        "host h: d3_models[0] (sized): sized at TP 1 is refused by vLLM at startup: 'No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.': weights 5904 + profile-run peak 21 (4096 tokens x 5376 B) + non-torch 512 = 6437 MiB per GPU fill its share (--gpu-memory-utilization x GPU memory) of 5000 MiB. Fix: in d3_models[0].extra_args set --gpu-memory-utilization=0.65, or set --tensor-parallel-size=2 (2 GPUs; the host has 1)"]
    # 4 needs more than TP 2 and ARCH's 2 key heads do not split 4 ways: no TP is offered
    (error,) = d3_plan([{"model": "sized"}], {"sized": sized(4 * 5904)}, COMMON, GPU, host="h", options={"allow_cuda_graphs": True})["errors"]
    assert error.endswith("Fix: pick a smaller model or variant for d3_models[0]")


def test_an_unknown_variant_of_a_size_with_variants_names_them_and_the_default() -> None:
    assert plan([{"model": "multi", "variant": "x"}])["errors"] == [
        "host h: d3_models[0] (multi): multi has no variant 'x'. Fix: set d3_models[0].variant to one of: fp8, w4, nv, ampere, null (or leave it out for fp8)"]


def test_a_variant_that_is_not_a_string_is_refused_not_a_crash() -> None:
    """`variant: [fp8]` in YAML is a list: refused with the variants to choose from (it raised TypeError: unhashable)."""
    (error,) = plan([{"model": "multi", "variant": ["fp8"]}])["errors"]
    assert error.startswith("host h: d3_models[0] (multi): multi has no variant ['fp8']. Fix: set d3_models[0].variant to one of: fp8")


def test_replicas_on_one_host_share_a_served_name_and_a_bad_one_is_refused() -> None:
    """d3_fleet_place's spread: false replicas: instances NAME-1, NAME-2 (units, ports), one model name for clients."""
    two = [{"model": "plain", "name": "plain-1", "served_name": "plain"}, {"model": "plain", "name": "plain-2", "served_name": "plain"}]
    result = plan(two, [*GPU, {**GPU[0], "index": 1}])
    assert result["errors"] == []
    assert [(i["name"], i["unit"], i["served_model_name"], i["port"]) for i in result["instances"]] == [
        ("plain-1", "plain-1", "plain", 8000), ("plain-2", "plain-2", "plain", 8001)]
    assert [i["args"][3] for i in result["instances"]] == ["plain", "plain"]  # --served-model-name
    # without one, the instance's name is its served name
    assert plan([{"model": "plain", "name": "other"}])["instances"][0]["served_model_name"] == "other"
    for bad in ("Plain", "", 3, None, "a b", "plain\n"):
        errors = plan([{"model": "plain", "served_name": bad}])["errors"]
        assert errors == [f"host h: d3_models[0] (plain): served_name {bad!r} is not a valid model name. Fix: use lowercase letters, "
                          "digits and '-'"], bad

# --- the fixes a memory refusal offers, at their edges --------------------------------------------------------------


def test_the_longest_max_model_len_is_one_below_a_block_boundary() -> None:
    # with the profile run fixed at 4096 tokens: 864 tokens (18 blocks of 48) fit; 865 needs a 19th block
    (error,) = plan([{"model": "multi", "extra_args": ["--gpu-memory-utilization=0.3486", "--max-model-len=865",
                                                        "--max-num-batched-tokens=4096"]}])["errors"]  # fmt: skip
    assert error.endswith("Fix: in d3_models[0].extra_args set --max-model-len=864 (the longest that fits), or set --gpu-memory-utilization=0.36, or set --tensor-parallel-size=2 (2 GPUs; the host has 1)")


def test_no_share_above_097_is_offered() -> None:
    # 96815 MiB of weights need a 0.98 share of a 100000 MiB GPU: more than the CUDA context leaves, so not offered
    big = [{**GPU[0], "memory_total_mib": 100000}]
    (error,) = d3_plan([{"model": "sized"}], {"sized": sized(96815)}, COMMON, big, host="h", options={"allow_cuda_graphs": True})["errors"]
    assert "--gpu-memory-utilization=" not in error.split("Fix: ", 1)[1]
    assert d3_plan([{"model": "sized", "extra_args": ["--gpu-memory-utilization=0.98"]}], {"sized": sized(96815)}, COMMON, big, host="h",
                   options={"allow_cuda_graphs": True})["errors"] == []  # fmt: skip


def test_the_tensor_parallel_fix_goes_up_to_8(catalog_vars: dict[str, Any]) -> None:
    result = d3_plan([{"model": "d3-nano", "extra_args": ["--max-model-len=262144"]}], catalog_vars["d3_catalog"],
                     catalog_vars["d3_catalog_common"], l4_gpus(2), host="h", options={"api_key_set": True})  # fmt: skip
    assert result["errors"][0].endswith("or set --tensor-parallel-size=8 (8 GPUs; the host has 2)")
    # d3-lite's vision tower (12 heads) does not split over 8 ranks: TP 8 is not offered
    result = d3_plan([{"model": "d3-lite", "extra_args": ["--max-model-len=262144"]}], catalog_vars["d3_catalog"],
                     catalog_vars["d3_catalog_common"], l4_gpus(2), host="h", options={"api_key_set": True})  # fmt: skip
    assert "--tensor-parallel-size" not in result["errors"][0].split("Fix: ", 1)[1]


def test_batched_tokens_equal_to_the_context_are_not_blamed() -> None:
    # exactly --max-model-len (4096): allowed, so not blamed when the instance is refused for memory
    (error,) = plan([{"model": "multi", "extra_args": ["--gpu-memory-utilization=0.3486", "--max-num-batched-tokens=4096"]}])["errors"]
    assert "remove --max-num-batched-tokens" not in error and "max_num_batched_tokens (" not in error
    (error,) = plan([{"model": "multi", "extra_args": ["--gpu-memory-utilization=0.3486", "--max-num-batched-tokens=32768"]}])["errors"]
    assert "remove --max-num-batched-tokens" not in error and "max_num_batched_tokens (" not in error


def test_an_invalid_floor_is_refused_alone_and_the_instance_judged_at_1(catalog_vars: dict[str, Any]) -> None:
    item = {"model": "d3", "variant": "w4a16-awq", "extra_args": ["--max-model-len=24304"]}  # concurrency 1.0
    result = d3_plan([item], catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], l4_gpus(1), host="h",
                     options={"api_key_set": True, "min_concurrency": 0})  # fmt: skip
    assert [e.split(": ", 2)[1] for e in result["errors"]] == ["d3_min_concurrency"]


def test_share_fixes_at_their_edges() -> None:
    catalog = {"s": entry(weights_fp8_gb=0.1)}
    opts = {"allow_cuda_graphs": True}
    share = lambda name, util, **more: {"model": "s", "name": name, "gpus": [0], "extra_args": [f"--gpu-memory-utilization={util}"], **more}  # noqa: E731
    # less than 0.01 left: no share offered, nothing computed at 0
    (error,) = d3_plan([share("a", 0.5), share("b", 0.35), share("c", 0.1)], catalog, COMMON, GPU, host="h", options=opts)["errors"]
    assert error.endswith("Fix: move d3_models[2] to another GPU (its `gpus:`) or host")
    # what is left starts the instance but below the floor: the fix says so, with the instance's own context
    (error,) = d3_plan([share("a", 0.9), share("c", 0.1)], catalog, COMMON, l4_gpus(1, 100000), host="h",
                       options={**opts, "min_concurrency": 1000})["errors"]  # fmt: skip
    assert "(at the 0.02 left, c itself would not start: would start with 'GPU KV cache size:" in error
    assert "'Maximum concurrency for 4,096 tokens per request:" in error
    # automatic placement: the fix offers the least used GPU's room
    auto = [share("a", 0.9), {"model": "s", "name": "b", "gpus": [1], "extra_args": ["--gpu-memory-utilization=0.5"]},
            {"model": "s", "name": "c", "extra_args": ["--gpu-memory-utilization=0.5"]}]  # fmt: skip
    (error,) = d3_plan(auto, catalog, COMMON, l4_gpus(2, 10000), host="h", options=opts)["errors"]
    assert "(GPU 0: a 9000 MiB (0.9); GPU 1: b 5000 MiB (0.5)). Fix: set --gpu-memory-utilization=0.39 in d3_models[2].extra_args" in error
    # what is left, 0.92 - 0.245 = 0.675, rounds down to whole hundredths: 0.67
    left = [share("a", 0.245), {"model": "s", "name": "c", "gpus": [0], "extra_args": ["--gpu-memory-utilization=0.7"]}]
    (error,) = d3_plan(left, catalog, COMMON, l4_gpus(1, 100000), host="h", options=opts)["errors"]
    assert "Fix: set --gpu-memory-utilization=0.67 in d3_models[1].extra_args" in error
    # on a smaller GPU vLLM's free memory is the smaller room: (10000 - 512 - 2450 - 512) / 10000 = 0.6526 -> 0.65
    (error,) = d3_plan(left, catalog, COMMON, l4_gpus(1, 10000), host="h", options=opts)["errors"]
    assert "Fix: set --gpu-memory-utilization=0.65 in d3_models[1].extra_args" in error
    # an idle GPU is named as such; a TP 2 instance's partial plan names both GPUs
    two = dict(entry(weights_fp8_gb=0.1), tensor_parallel_size=2)
    result = d3_plan([{"model": "t", "gpus": [0, 1]}, {"model": "t", "name": "u", "extra_args": ["--gpu-memory-utilization=0.5"]}],
                     {"t": two}, COMMON, l4_gpus(3, 10000), host="h", options=opts)  # fmt: skip
    assert "(GPU 0: plain 5000 MiB (0.5); GPU 1: plain 5000 MiB (0.5); GPU 2: nothing)" in result["errors"][0]
    assert result["partial"][0].startswith("plain: t on GPU 0,1, port 8000")


def test_the_non_torch_margin_option_reaches_the_arithmetic() -> None:
    (inst,) = plan([{"model": "plain"}], vram_overhead_mib=100)["instances"]
    assert inst["vram_arithmetic_mib_per_gpu"]["non_torch_mib"] == 100


def test_json_keys_of_known_flags_and_a_harmless_kv_cache_dtype() -> None:
    assert plan([{"model": "plain", "extra_args": ["--max-model-len.x=1"]}])["errors"] == [
        "host h: d3_models[0] (plain): extra_args sets --max-model-len.x (a JSON key of --max-model-len), which the planner reads as a whole. Fix: give --max-model-len VALUE instead"]
    assert plan([{"model": "plain", "extra_args": ["--kv-cache-dtype=auto"]}])["errors"] == []


def test_batched_tokens_that_do_not_parse() -> None:
    assert plan([{"model": "plain", "extra_args": ["--max-num-batched-tokens=lots"]}])["errors"] == [
        "host h: d3_models[0] (plain): --max-num-batched-tokens, --max-num-seqs or --kv-cache-memory-bytes in extra_args does not parse (invalid literal for int() with base 10: 'lots'). Fix: give a number (e.g. 8192, 8k or 4G)"]
