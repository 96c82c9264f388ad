# ruff: noqa: E501  (each refusal is kept on one line, as the operator reads it)
"""Planner edges on a small synthetic catalog: an entry without variants, pre-quantized and explicitly not
pre-quantized variants, compute-capability refusals, exact fit boundaries, port and max-model-len bounds, shares that
add up, and refusals that keep going past the first bad instance."""

from __future__ import annotations

from typing import Any

import pytest
from d3_planner import Options, _Planner, d3_plan
from l4 import l4_gpus

MIB = 1024**2
COMMON = {"max_position_embeddings": 4096, "quantization": "fp8", "enforce_eager": False, "forbidden_kv_cache_dtypes": ["fp8"], "env": {},
          "container_hf_home": "/hf"}
# 2952 MiB of weights + 2048 MiB runtime = 5000 MiB: exactly half of a 10000 MiB GPU
WEIGHTS_GB = 2952 * MIB / 1e9
VARIANTS = {
    "fp8": {"hf_repo": "org/plain-FP8", "quant_method": "fp8", "measured_on_l4_tp": [1]},
    "w4": {"hf_repo": "org/plain-W4", "quant_method": "compressed-tensors", "pre_quantized": False, "quantization_flag": None,
           "weights_gb": 1, "measured_on_l4_tp": [1]},
    "nv": {"hf_repo": "org/plain-NV", "min_compute_capability": 10.0, "requires": "FP4 tensor cores"},
    "ampere": {"hf_repo": "org/plain-A", "min_compute_capability": 8.0},
    "null": None,
}  # fmt: skip


def entry(**changes: Any) -> dict[str, Any]:
    return {"hf_repo": "org/plain", "instance_name": "plain", "weights_fp8_gb": WEIGHTS_GB, "download_gb": 3,
            "release_revision_short": "abc123", "tensor_parallel_size": 1, "max_model_len": 4096, "gpu_memory_utilization": 0.5,
            "shm_size": "1g", **changes}  # fmt: skip


CATALOG = {
    "plain": entry(),
    "big": entry(hf_repo="org/big", instance_name="big", weights_fp8_gb=80),
    "multi": entry(hf_repo="org/multi", instance_name="multi", default_variant="fp8", variants=VARIANTS,
                   architecture={"text": {"num_hidden_layers": 16, "full_attention_interval": 4, "num_key_value_heads": 2, "head_dim": 128}}),
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
                            "--quantization", "fp8"]  # fmt: skip
    assert inst["vram_arithmetic_mib_per_gpu"] == {"weights_mib": 2952, "runtime_mib": 2048, "kv_cache_mib": 0, "encoder_probe_mib": 0,
                                                   "total_mib": 5000}  # fmt: skip
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
        "host h: d3_models[0] (big): big does not fit: needs 78342 MiB per GPU (weights 76294 MiB / TP 1 + 2048 MiB runtime) but --gpu-memory-utilization 0.5 of 10000 MiB allows 5000 MiB. Fix: raise --gpu-memory-utilization in d3_models[0].extra_args or pick a smaller model"]


def test_the_kv_cache_tips_a_variant_over_and_the_refusal_lists_every_way_out() -> None:
    assert plan([{"model": "multi"}])["errors"] == [
        "host h: d3_models[0] (multi): multi does not fit: needs 5016 MiB per GPU at TP 1 (weights 2952 + runtime 2048 + KV cache 16 for --max-model-len 4096) but --gpu-memory-utilization 0.5 of 10000 MiB allows 5000 MiB. Fix: lower --max-model-len or raise --tensor-parallel-size in d3_models[0].extra_args, or keep --enforce-eager, or pick a smaller variant"]
    assert plan([{"model": "multi", "variant": "ampere"}], gpus=[{**GPU[0], "compute_cap": ""}])["errors"] == [
        "host h: d3_models[0] (multi): multi variant ampere does not fit: needs 22564 MiB per GPU at TP 1 (weights 2952 + runtime 2048 + KV cache 16 for --max-model-len 4096 + encoder probe 17548 (CUDA graph capture without --enforce-eager)) but --gpu-memory-utilization 0.5 of 10000 MiB allows 5000 MiB. Fix: lower --max-model-len or raise --tensor-parallel-size in d3_models[0].extra_args, or keep --enforce-eager, or pick a smaller variant"]
    fits = plan([{"model": "multi", "extra_args": ["--gpu-memory-utilization=0.55"]}])
    assert fits["errors"] == []
    assert (fits["instances"][0]["measured_on_hardware"], fits["instances"][0]["hardware_note"]) == (
        True, "the field report ran this recipe on L4 hardware")


def test_pre_quantized_and_explicitly_not_pre_quantized_variants() -> None:
    assert plan([{"model": "multi", "extra_args": ["--quantization=awq"]}])["errors"] == [
        "host h: d3_models[0] (multi): variant 'fp8' (org/plain-FP8) is a pre-quantized checkpoint (quant_method fp8); with --quantization awq vLLM refuses to start: 'Quantization method specified in the model config (fp8) does not match the quantization method specified in the `quantization` argument (awq).'. Fix: remove --quantization from d3_models[0].extra_args (vLLM reads it from the checkpoint)"]
    w4 = plan([{"model": "multi", "variant": "w4", "extra_args": ["--quantization=fp8"]}])
    assert w4["errors"] == []
    assert w4["instances"][0]["args"][-2:] == ["--quantization", "fp8"]
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
        "host h: d3_models[3] (s3): VRAM over budget: no 1 GPU(s) with 0.25 of memory left within d3_gpu_share_cap 0.92 (GPU 0: 0.75 used). Fix: remove an instance from this host, lower --gpu-memory-utilization, or use another host"]
    fixed = [{**m, "gpus": [0]} for m in models]
    result = d3_plan(fixed, catalog, COMMON, l4_gpus(1, 20000), host="h", options={"allow_cuda_graphs": True})
    assert result["errors"] == [
        "host h: d3_models[3] (s3): VRAM over budget on GPU 0: --gpu-memory-utilization 0.25 on top of s0 (0.25), s1 (0.25), s2 (0.25) exceeds d3_gpu_share_cap 0.92 of a shared GPU's memory (vLLM needs its share free at start, and the driver keeps some). Fix: move an instance to another GPU, or lower --gpu-memory-utilization so the shares fit d3_gpu_share_cap"]
    two_gpus = d3_plan([*models, {"model": "s", "name": "s4", "extra_args": ["--gpu-memory-utilization=1"]}], catalog, COMMON,
                       l4_gpus(2, 20000), host="h", options={"allow_cuda_graphs": True, "gpu_share_cap": 0})  # fmt: skip
    assert two_gpus["errors"][0].endswith("within d3_gpu_share_cap 0 (GPU 0: 1 used; GPU 1: 0.25 used). Fix: remove an instance "
                                          "from this host, lower --gpu-memory-utilization, or use another host")


def test_listen_address_skips_unreadable_host_addresses() -> None:
    result = plan([{"model": "plain"}], listen_address="10.0.0.9", host_addresses=["junk", "fe80::1%eth0", "10.0.0.9"])
    assert result["errors"] == []


def test_models_that_are_not_a_list_and_the_default_host() -> None:
    planner = _Planner("h", "d3-mini", CATALOG, COMMON, GPU, Options())  # type: ignore[arg-type]
    assert planner.run() == {"host": "h", "hf_home": "/var/lib/d3/huggingface", "instances": [], "gpus": [{"index": 0, "name": "NVIDIA L4", "memory_total_mib": 10000,
                                                                       "budget": [], "budget_mib": 0, "free_mib": 10000}],
                             "errors": ["host h: d3_models: expected a list, got str. Fix: write a YAML list"]}  # fmt: skip
    assert d3_plan([{"model": "nope"}], CATALOG, COMMON, GPU)["errors"][0].startswith("host localhost: d3_models[0]: unknown model")


# --- refusals whose wording depends on the variant, the TP hint's boundaries (open gaps in docs/mutation.md) ----------

KV = {"text": {"num_hidden_layers": 16, "full_attention_interval": 4, "num_key_value_heads": 2, "head_dim": 128}}  # 4 KiB per token: 16 MiB at 4096 tokens


def sized(weights_mib: int) -> dict[str, Any]:
    """An entry without variants whose checkpoint is exactly weights_mib MiB."""
    return entry(hf_repo="org/sized", instance_name="sized", weights_fp8_gb=weights_mib * MIB / 1e9)


def test_a_pre_quantized_variant_whose_checkpoint_names_the_method() -> None:
    catalog = {"q": entry(hf_repo="org/q", instance_name="q", default_variant="q", variants={"q": {"pre_quantized": True}})}
    assert d3_plan([{"model": "q"}], catalog, COMMON, GPU, host="h")["errors"] == [
        "host h: d3_models[0] (q): variant 'q' (org/q) is a pre-quantized checkpoint (quant_method set by the checkpoint); with --quantization fp8 vLLM refuses to start: 'Quantization method specified in the model config (None) does not match the quantization method specified in the `quantization` argument (fp8).'. Fix: remove --quantization from d3_models[0].extra_args (vLLM reads it from the checkpoint)"]


def test_the_kv_cache_refusal_with_enforce_eager_does_not_offer_it() -> None:
    assert plan([{"model": "multi", "extra_args": ["--enforce-eager"]}])["errors"] == [
        "host h: d3_models[0] (multi): multi does not fit: needs 5016 MiB per GPU at TP 1 (weights 2952 + runtime 2048 + KV cache 16 for --max-model-len 4096) but --gpu-memory-utilization 0.5 of 10000 MiB allows 5000 MiB. Fix: lower --max-model-len or raise --tensor-parallel-size in d3_models[0].extra_args, or pick a smaller variant"]


@pytest.mark.parametrize(
    ("variants", "fix"),
    [({"only": {}}, ""),  # one variant: nothing smaller to pick
     ({"only": {}, "other": {"hf_repo": "org/other"}}, ", or pick a smaller variant")],
)  # fmt: skip
def test_the_kv_cache_refusal_offers_a_smaller_variant_only_when_there_is_another(variants: dict[str, Any], fix: str) -> None:
    catalog = {"kv": entry(hf_repo="org/kv", instance_name="kv", default_variant="only", variants=variants, architecture=KV)}
    for eager, keep in ((False, ", or keep --enforce-eager"), (True, "")):
        result = d3_plan([{"model": "kv"}], catalog, {**COMMON, "enforce_eager": eager}, GPU, host="h", options={"allow_cuda_graphs": True})
        assert result["errors"] == [
            "host h: d3_models[0] (kv): kv does not fit: needs 5016 MiB per GPU at TP 1 (weights 2952 + runtime 2048 + KV cache 16 for --max-model-len 4096) but --gpu-memory-utilization 0.5 of 10000 MiB allows 5000 MiB. Fix: lower --max-model-len or raise --tensor-parallel-size in d3_models[0].extra_args"
            + keep + fix]


def test_an_unpinned_variant_in_its_own_repository_has_no_release_record() -> None:
    assert plan([{"model": "multi", "variant": "w4"}], require_revisions=True)["errors"] == [
        "host h: d3_models[0] (multi): no pinned revision for plain-W4 (multi variant w4). Fix: set d3_model_revisions['plain-W4'] to the full commit SHA of org/plain-W4"]


@pytest.mark.parametrize(
    ("weights_mib", "memory_mib", "hint"),
    [(8 * 2952 + 1, 10000, "pick a smaller model"),  # TP 8 is 1 MiB short and TP 9 is past the search: none fits
     (9 * 2952, 10000, "pick a smaller model"),  # would fit exactly at TP 9, which is not searched
     (2 * 2952, 10000, "use --tensor-parallel-size 2"),  # TP 2 needs exactly the 5000 MiB allowed
     (2 * 2952 + 1, 10000, "use --tensor-parallel-size 3"),  # TP 2 is 1 MiB over (2953 + 2048 > 5000)
     # 10001 MiB x 0.5 = 5000.5 MiB allowed: 5905 / 2 = 2952.5 MiB would fit, but a GPU holds whole MiB (2953)
     (2 * 2952 + 1, 10001, "use --tensor-parallel-size 3")],
)  # fmt: skip
def test_the_tensor_parallel_hint_at_its_boundaries(weights_mib: int, memory_mib: int, hint: str) -> None:
    gpus = [{**GPU[0], "memory_total_mib": memory_mib}]
    result = d3_plan([{"model": "sized"}], {"sized": sized(weights_mib)}, COMMON, gpus, host="h", options={"allow_cuda_graphs": True})
    allowed = int(memory_mib * 0.5)
    assert result["errors"] == [
        f"host h: d3_models[0] (sized): sized does not fit: needs {weights_mib + 2048} MiB per GPU (weights {weights_mib} MiB / TP 1 + 2048 MiB runtime) but --gpu-memory-utilization 0.5 of {memory_mib} MiB allows {allowed} MiB. Fix: raise --gpu-memory-utilization in d3_models[0].extra_args or {hint}"]


def test_an_unknown_variant_of_a_size_with_variants_names_them_and_the_default() -> None:
    assert plan([{"model": "multi", "variant": "x"}])["errors"] == [
        "host h: d3_models[0] (multi): multi has no variant 'x'. Fix: set d3_models[0].variant to one of: fp8, w4, nv, ampere, null (or leave it out for fp8)"]


def test_a_variant_that_is_not_a_string_is_refused_not_a_crash() -> None:
    """`variant: [fp8]` in YAML is a list: refused with the variants to choose from (it raised TypeError: unhashable)."""
    (error,) = plan([{"model": "multi", "variant": ["fp8"]}])["errors"]
    assert error.startswith("host h: d3_models[0] (multi): multi has no variant ['fp8']. Fix: set d3_models[0].variant to one of: fp8")
