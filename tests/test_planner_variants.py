"""Checkpoint variants (issue 16): per variant the repository, the flags, the VRAM arithmetic, the download size and
the refusals (a variant that does not exist, NVFP4 on an L4, a variant that does not fit, --quantization on a
pre-quantized checkpoint), the revision key, and what the plan says about hardware measurements."""

from __future__ import annotations

from typing import Any

import pytest
from d3_host import download_bytes
from d3_planner import d3_plan, split_args
from d3_render import plan_report as d3_plan_report
from l4 import l4_gpus

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER = "89abcdef0123456789abcdef0123456789abcdef"
L4_BUDGET_095 = int(22560 * 0.95)  # 21432 MiB: 0.95 of an L4's 22.03 GiB as vLLM sees it


def plan(catalog_vars: dict[str, Any], models: list[Any], gpus: int = 2, **opts: Any) -> dict[str, Any]:
    gpu_list = opts.pop("gpu_list", None) or l4_gpus(gpus)
    return d3_plan(models, catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], gpu_list, "l4-a", opts)


def one(result: dict[str, Any]) -> dict[str, Any]:
    assert result["errors"] == [], result["errors"]
    (inst,) = result["instances"]
    return inst


def refused(result: dict[str, Any], *needles: str) -> str:
    assert result["instances"] == []
    text = "\n".join(result["errors"])
    for needle in needles:
        assert needle in text, text
    assert text.startswith("host l4-a: ") and "Fix: " in text
    return text


def flags(inst: dict[str, Any]) -> dict[str, str | None]:
    return dict(split_args(inst["args"]))


def mib(gb: float) -> int:
    return round(gb * 1e9 / 1024**2)


# --- the catalog ------------------------------------------------------------------------------------------------


def test_every_size_has_a_default_variant_that_is_the_field_report_recipe(catalog_vars: dict[str, Any]) -> None:
    for model, entry in catalog_vars["d3_catalog"].items():
        default = entry["variants"][entry["default_variant"]]
        assert default["quantization_flag"] == "fp8", model  # online FP8 on the BF16 checkpoint (seed)
        assert default["quant_method"] is None, model
        assert "hf_repo" not in default, model  # the size's own repository
        for name, variant in entry["variants"].items():
            assert variant.get("source"), (model, name)  # every variant names its source


def test_the_27b_variants_carry_the_model_cards_sizes(catalog_vars: dict[str, Any]) -> None:
    variants = catalog_vars["d3_catalog"]["d3"]["variants"]
    assert variants["fp8"]["hf_repo"] == "vllm-sr/d3-FP8" and variants["fp8"]["download_gb"] == 31.9
    assert variants["w4a16-awq"]["hf_repo"] == "vllm-sr/d3-W4A16-AWQ" and variants["w4a16-awq"]["download_gb"] == 16.2
    assert {variants[v]["download_gb"] for v in ("nvfp4", "nvfp4-awq")} == {17.2}
    for name in ("fp8", "w4a16-awq"):
        assert variants[name]["quant_method"] == "compressed-tensors"  # config.json quantization_config.quant_method
        assert variants[name]["quantization_flag"] is None


# --- flags, VRAM, disk per variant ------------------------------------------------------------------------------


def test_default_variant_is_unchanged(catalog_vars: dict[str, Any]) -> None:
    implicit = one(plan(catalog_vars, [{"model": "d3"}], revisions={"d3": SHA}))
    explicit = one(plan(catalog_vars, [{"model": "d3", "variant": "bf16-fp8-online"}], revisions={"d3": SHA}))
    assert implicit["args"] == explicit["args"]
    assert implicit["variant"] == "bf16-fp8-online"
    f = flags(implicit)
    assert (f["--model"], f["--quantization"], f["--tensor-parallel-size"]) == ("vllm-sr/d3", "fp8", "2")
    assert implicit["download_bytes"] == 52_200_000_000
    assert implicit["vram_need_mib_per_gpu"] == 13314 + 756 + 512 + 343  # tests/test_planner.py
    assert implicit["measured_on_hardware"] is True  # the field report's 2xL4 recipe


def test_official_fp8_variant_flags_vram_and_download(catalog_vars: dict[str, Any]) -> None:
    inst = one(plan(catalog_vars, [{"model": "d3", "variant": "fp8"}], revisions={"d3-FP8": SHA}))
    f = flags(inst)
    assert f["--model"] == "vllm-sr/d3-FP8" and f["--revision"] == SHA
    assert "--quantization" not in f  # pre-quantized: vLLM reads compressed-tensors from config.json
    assert f["--tensor-parallel-size"] == "2" and "--enforce-eager" in f
    assert inst["hf_repo"] == "vllm-sr/d3-FP8" and inst["quant_method"] == "compressed-tensors"
    assert inst["download_bytes"] == 31_900_000_000  # 40 % less than the BF16 checkpoint's 52.2 GB
    assert inst["weights_mib"] == mib(31.9)
    a = inst["vram_arithmetic_mib_per_gpu"]
    # 27B at TP 2: 784-token blocks of 16 full-attention layers x 2 KV heads per GPU x 256 x 2 (K, V) x 2 bytes; one
    # 8192-token sequence takes 11 of them plus 3 Gated DeltaNet state blocks, in each of 16 layer pools: 343 MiB
    assert a["sequence_kv_mib"] == -(-16 * 784 * 2048 * (11 + 3) // 1024**2) == 343
    assert a["weights_mib"] == -(-mib(31.9) // 2) and a["encoder_probe_mib"] == 0
    # FP8 activations (W8A8) like the online recipe: the same peak per token
    assert a["activation_peak_mib"] == 756
    assert a["total_mib"] == a["weights_mib"] + 756 + 512 + 343 == inst["vram_need_mib_per_gpu"] <= L4_BUDGET_095
    # 21432 - 15211 - 756 - 512 = 4953 MiB: 202 blocks of 16 x 784 x 2048 B
    assert inst["kv_cache"] == {"gpu_kv_cache_tokens": 202 // 4 * 784, "max_concurrency": round(202 / 14, 2), "block_size": 784,
                                "max_num_batched_tokens": 8192, "measured_on_hardware": False,
                                "note": "predicted from vLLM's source (docs/capacity.md); not yet measured on hardware; not modelled: "
                             "the vision encoder's own profiling, whether D3's attention is causal (and chunked prefill off), "
                             "the GDN state's dtype"}
    assert inst["measured_on_hardware"] is False


def test_w4a16_puts_the_27b_on_one_l4_when_the_arithmetic_allows(catalog_vars: dict[str, Any]) -> None:
    result = plan(catalog_vars, [{"model": "d3", "variant": "w4a16-awq"}], gpus=1, revisions={"d3-W4A16-AWQ": SHA})
    inst = one(result)
    assert inst["gpus"] == [0] and flags(inst)["--tensor-parallel-size"] == "1"
    assert "--quantization" not in flags(inst)
    a = inst["vram_arithmetic_mib_per_gpu"]
    # weights 16.2 GB + the profile run's peak at 8192 tokens (bf16 activations: W4A16) + non-torch 512 + one 8192-token
    # sequence (no encoder probe under --enforce-eager): vLLM would start
    assert (a["weights_mib"], a["activation_peak_mib"], a["sequence_kv_mib"], a["encoder_probe_mib"]) == (mib(16.2), 1056, 686, 0)
    assert a["total_mib"] == mib(16.2) + 1056 + 512 + 686 == 17704 <= L4_BUDGET_095
    assert (inst["kv_cache"]["gpu_kv_cache_tokens"], inst["kv_cache"]["max_concurrency"]) == (17248, 6.43)
    assert inst["download_bytes"] == 16_200_000_000
    assert inst["measured_on_hardware"] is False
    report = "\n".join(d3_plan_report(result))
    assert "NOT YET MEASURED ON HARDWARE: d3 w4a16-awq at TP 1 on NVIDIA L4" in report
    assert "variant w4a16-awq (compressed-tensors), download 16.2 GB" in report


def test_w4a16_on_one_l4_refused_at_65536_tokens(catalog_vars: dict[str, Any]) -> None:
    # issue 23: this was planned with 288 MiB to spare; vLLM's profile run at 65536 tokens (chunked prefill off) needs
    # 8448 MiB of activations beside 15450 MiB of weights: more than an L4 holds
    refused(
        plan(catalog_vars, [{"model": "d3", "variant": "w4a16-awq", "extra_args": ["--max-model-len=65536"]}], gpus=1),
        "d3 variant w4a16-awq at TP 1 runs out of memory in vLLM's profile run ('torch.OutOfMemoryError: CUDA out of memory')",
        "weights 15450 + profile-run peak 8448 (65536 tokens x 135168 B) + non-torch 512 = 24410 MiB per GPU",
        "Fix: in d3_models[0].extra_args set --max-model-len=27609 (the longest that fits), or set --tensor-parallel-size=2",
    )
    # at 32768 tokens the profile run fits but one sequence does not: vLLM's own refusal, with its estimate
    refused(
        plan(catalog_vars, [{"model": "d3", "variant": "w4a16-awq", "extra_args": ["--max-model-len=32768"]}], gpus=1),
        "its KV cache being too small for one sequence of --max-model-len 32768 (2205 MiB)",
        "'To serve at least one request with the models's max seq len (32768), (2.15 GiB KV cache is needed, which is "
        "larger than the available KV cache memory (1.22 GiB). Based on the available memory, the estimated maximum model "
        "length is 17248.",
        # vLLM estimates at the profile it ran; a shorter --max-model-len also profiles fewer tokens, so more fits
        "--max-model-len=27609 (the longest that fits)",
    )
    longest = one(plan(catalog_vars, [{"model": "d3", "variant": "w4a16-awq", "extra_args": ["--max-model-len=27609"]}], gpus=1))
    assert longest["kv_cache"]["max_concurrency"] == 1.0


def test_w4a16_without_enforce_eager_counts_the_encoder_probe(catalog_vars: dict[str, Any]) -> None:
    item = {"model": "d3", "variant": "w4a16-awq", "extra_args": ["--no-enforce-eager"]}
    refused(
        plan(catalog_vars, [item], gpus=1, allow_cuda_graphs=True),
        f"encoder probe {-(-round(18.4 * 1024**3) // 1024**2)} (CUDA graph capture without --enforce-eager)",
        "keep --enforce-eager",
    )


def test_disk_fallback_uses_the_planned_variants_size(catalog_vars: dict[str, Any]) -> None:
    catalog = catalog_vars["d3_catalog"]
    inst = one(plan(catalog_vars, [{"model": "d3", "variant": "fp8"}]))
    assert download_bytes({"item": inst, "status": -1}, catalog) == 31_900_000_000
    # an instance record without download_bytes (older plan): found by the variant's repository
    assert download_bytes({"item": {"hf_repo": "vllm-sr/d3-W4A16-AWQ"}, "status": -1}, catalog) == 16_200_000_000
    tree = [{"type": "file", "path": "model.safetensors", "size": 123}]
    assert download_bytes({"item": inst, "json": tree}, catalog) == 123  # the Hub's sizes first


# --- refusals ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["nvfp4", "nvfp4-awq"])
def test_refuses_nvfp4_on_l4_naming_the_gpu(catalog_vars: dict[str, Any], variant: str) -> None:
    refused(
        plan(catalog_vars, [{"model": "d3", "variant": variant}]),
        f"variant '{variant}'",
        "is planned on compute capability 10.0 and newer only (policy: FP4 tensor cores are compute capability 10.0; below "
        "it vLLM runs an NVFP4 checkpoint as weight-only FP4 through Marlin (marlin_utils_fp4 is_fp4_marlin_supported: "
        "compute capability 7.5 and newer, with a warning), a path nobody has run for D3",
        "GPU 0 is a NVIDIA L4 (compute capability 8.9)",
        "bf16-fp8-online, fp8, w4a16-awq",
    )


def test_nvfp4_plans_on_a_blackwell_gpu_declared_with_its_compute_capability(catalog_vars: dict[str, Any]) -> None:
    gpus = [{"index": i, "name": "NVIDIA RTX PRO 6000", "memory_total_mib": 97887, "compute_cap": "12.0"} for i in range(2)]
    inst = one(plan(catalog_vars, [{"model": "d3", "variant": "nvfp4"}], gpu_list=gpus, allow_non_l4=True))
    assert flags(inst)["--model"] == "vllm-sr/d3-NVFP4" and "--quantization" not in flags(inst)
    # a non-L4 GPU whose compute capability is not known is refused, not guessed
    unknown = [{"index": 0, "name": "Some GPU", "memory_total_mib": 97887}, {"index": 1, "name": "Some GPU", "memory_total_mib": 97887}]
    refused(plan(catalog_vars, [{"model": "d3", "variant": "nvfp4"}], gpu_list=unknown, allow_non_l4=True), "compute capability unknown")


def test_refuses_a_variant_that_does_not_exist(catalog_vars: dict[str, Any]) -> None:
    refused(
        plan(catalog_vars, [{"model": "d3-mini", "variant": "fp8"}]),
        "d3-mini has no variant 'fp8'",
        "d3_models[0].variant to one of: bf16-fp8-online",
    )
    refused(plan(catalog_vars, [{"model": "d3", "variant": "FP8"}]), "d3 has no variant 'FP8'", "fp8, w4a16-awq")


def test_refuses_a_variant_that_does_not_fit_with_the_numbers(catalog_vars: dict[str, Any]) -> None:
    refused(
        plan(catalog_vars, [{"model": "d3", "variant": "fp8", "extra_args": ["--tensor-parallel-size=1"]}], gpus=1),
        f"d3 variant fp8 at TP 1 runs out of memory in vLLM's profile run ('torch.OutOfMemoryError: CUDA out of memory'): "
        f"weights {mib(31.9)} + profile-run peak 1232 (8192 tokens x 157696 B) + non-torch 512 = 32166 MiB per GPU",
        "Fix: in d3_models[0].extra_args set --tensor-parallel-size=2",
    )


@pytest.mark.parametrize("variant", ["fp8", "w4a16-awq"])
def test_refuses_quantization_fp8_on_a_pre_quantized_checkpoint(catalog_vars: dict[str, Any], variant: str) -> None:
    refused(
        plan(catalog_vars, [{"model": "d3", "variant": variant, "extra_args": ["--quantization", "fp8"]}]),
        "is a pre-quantized checkpoint",
        "'Quantization method specified in the model config (compressed-tensors) does not match the quantization "
        "method specified in the `quantization` argument (fp8).'",
        "remove --quantization",
    )


def test_quantization_matching_the_checkpoint_is_accepted(catalog_vars: dict[str, Any]) -> None:
    inst = one(plan(catalog_vars, [{"model": "d3", "variant": "fp8", "extra_args": ["--quantization=compressed-tensors"]}]))
    assert flags(inst)["--quantization"] == "compressed-tensors"


# --- revisions --------------------------------------------------------------------------------------------------


def test_revisions_key_by_the_variants_repository_name(catalog_vars: dict[str, Any]) -> None:
    revisions = {"d3": SHA, "d3-FP8": OTHER}
    default, fp8 = plan(
        catalog_vars,
        [{"model": "d3", "name": "big"}, {"model": "d3", "variant": "fp8", "name": "big-fp8"}],
        gpus=4,
        revisions=revisions,
        require_revisions=True,
    )["instances"]
    assert (default["revision"], fp8["revision"]) == (SHA, OTHER)
    # the full repository id is accepted as a key too
    inst = one(plan(catalog_vars, [{"model": "d3", "variant": "fp8"}], revisions={"vllm-sr/d3-FP8": OTHER}))
    assert inst["revision"] == OTHER


def test_an_unpinned_variant_names_its_key(catalog_vars: dict[str, Any]) -> None:
    refused(
        plan(catalog_vars, [{"model": "d3", "variant": "w4a16-awq"}], gpus=1, revisions={"d3": SHA}, require_revisions=True),
        "no pinned revision for d3-W4A16-AWQ (d3 variant w4a16-awq)",
        "set d3_model_revisions['d3-W4A16-AWQ'] to the full commit SHA of vllm-sr/d3-W4A16-AWQ",
    )
    refused(plan(catalog_vars, [{"model": "d3", "variant": "fp8"}], revisions={"d3-FP8": "main"}), "d3_model_revisions['d3-FP8']")


# --- what the plan says about hardware --------------------------------------------------------------------------


def test_hardware_marks(catalog_vars: dict[str, Any]) -> None:
    flash = one(plan(catalog_vars, [{"model": "d3-flash"}], gpus=1))
    mini = one(plan(catalog_vars, [{"model": "d3-mini"}], gpus=1))
    assert flash["measured_on_hardware"] is True  # the field report's benchmark ran d3-flash on one L4
    assert mini["measured_on_hardware"] is None  # listed in the field report's sizing table only
    result = plan(catalog_vars, [{"model": "d3-mini"}, {"model": "d3", "variant": "fp8"}], gpus=3)
    report = "\n".join(d3_plan_report(result))
    assert report.count("NOT YET MEASURED ON HARDWARE") == 1
    assert "NOT YET MEASURED ON HARDWARE: d3 fp8 at TP 2 on NVIDIA L4" in report
    assert "variant fp8 (compressed-tensors), download 31.9 GB" in report
    assert "variant bf16-fp8-online (no quantization_config), download 9.4 GB" in report  # the default's arithmetic
