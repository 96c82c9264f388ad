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
L4_BUDGET_095 = int(23034 * 0.95)  # 21882 MiB


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
    assert implicit["vram_need_mib_per_gpu"] == 12398 + 2048  # as before variants (tests/test_planner.py)
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
    # 27B KV: 16 full-attention layers x 2 KV heads per GPU at TP 2 x 256 x 2 (K, V) x 2 bytes = 32 KiB per token
    assert a["kv_cache_mib"] == 32 * 8192 // 1024
    assert a["weights_mib"] == -(-mib(31.9) // 2) and a["encoder_probe_mib"] == 0
    assert a["total_mib"] == a["weights_mib"] + 2048 + a["kv_cache_mib"] <= L4_BUDGET_095
    assert inst["measured_on_hardware"] is False


def test_w4a16_puts_the_27b_on_one_l4_when_the_arithmetic_allows(catalog_vars: dict[str, Any]) -> None:
    result = plan(catalog_vars, [{"model": "d3", "variant": "w4a16-awq"}], gpus=1, revisions={"d3-W4A16-AWQ": SHA})
    inst = one(result)
    assert inst["gpus"] == [0] and flags(inst)["--tensor-parallel-size"] == "1"
    assert "--quantization" not in flags(inst)
    a = inst["vram_arithmetic_mib_per_gpu"]
    # weights 16.2 GB + 2048 MiB runtime + 64 KiB/token x 8192 (no encoder probe under --enforce-eager)
    assert (a["weights_mib"], a["kv_cache_mib"], a["encoder_probe_mib"]) == (mib(16.2), 512, 0)
    assert a["total_mib"] == mib(16.2) + 2048 + 512 == 18010 <= L4_BUDGET_095
    assert inst["download_bytes"] == 16_200_000_000
    assert inst["measured_on_hardware"] is False
    report = "\n".join(d3_plan_report(result))
    assert "NOT YET MEASURED ON HARDWARE: d3 w4a16-awq at TP 1 on NVIDIA L4" in report
    assert "variant w4a16-awq (compressed-tensors), download 16.2 GB" in report


def test_w4a16_on_one_l4_refused_when_the_kv_cache_for_max_model_len_does_not_fit(catalog_vars: dict[str, Any]) -> None:
    ok = one(plan(catalog_vars, [{"model": "d3", "variant": "w4a16-awq", "extra_args": ["--max-model-len=65536"]}], gpus=1))
    assert ok["vram_arithmetic_mib_per_gpu"]["total_mib"] == 18010 - 512 + 4096
    refused(
        plan(catalog_vars, [{"model": "d3", "variant": "w4a16-awq", "extra_args": ["--max-model-len=131072"]}], gpus=1),
        "d3 variant w4a16-awq does not fit: needs 25690 MiB per GPU at TP 1",
        "KV cache 8192 for --max-model-len 131072",
        "allows 21882 MiB",
        "lower --max-model-len",
    )


def test_w4a16_without_enforce_eager_counts_the_encoder_probe(catalog_vars: dict[str, Any]) -> None:
    item = {"model": "d3", "variant": "w4a16-awq", "extra_args": ["--no-enforce-eager"]}
    refused(
        plan(catalog_vars, [item], gpus=1, allow_cuda_graphs=True),
        f"encoder probe {mib(18.4)} (CUDA graph capture without --enforce-eager)",
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
        "needs compute capability 10.0 (Blackwell FP4 tensor cores)",
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
        f"d3 variant fp8 does not fit: needs {mib(31.9) + 2048} MiB per GPU (weights {mib(31.9)} MiB / TP 1",
        "allows 21882 MiB",
        "use --tensor-parallel-size 2",
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
