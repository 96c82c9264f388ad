"""Checkpoint variants (issue 16) in the lab: the lab HF mirror serves the 27B's official FP8 variant
(vllm-sr/d3-FP8, compressed-tensors) next to the BF16 default; the simulator detects the quantization from the
checkpoint like vLLM and refuses --quantization fp8 on it with vLLM's message.

Unit part (no lab): the stand-in repositories carry the real sizes and the quantization_config shape, and the
simulator's detection follows vLLM's ModelConfig._verify_quantization.
Lab part (@lab): the default d3 on the converged fleet (this file) and the variant fp8 on another host
(tests/lab/test_real_stack.py, in its sequence of runs); both pass the smoke test (d3_smoke in site.yml); the
downloaded bytes are each checkpoint's.
The lab is a STAND-IN (lab/README.md): the weights are tiny, their metadata carries the real checkpoint sizes."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import labkit
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VLLM_MESSAGE = (
    "Quantization method specified in the model config (compressed-tensors) does not match the quantization "
    "method specified in the `quantization` argument (fp8)."
)


def load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def catalog() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "roles/d3/vars/main.yml").read_text())["d3_catalog"]


# --- unit: the stand-in repositories and the simulator's detection ---------------------------------------------


def test_variant_repositories_carry_real_sizes_and_quantization_config() -> None:
    b = load("build_repos", ROOT / "lab/hf/build_repos.py")
    variants = catalog()["d3"]["variants"]
    for variant in ("fp8", "w4a16-awq"):
        spec = variants[variant]
        name = spec["hf_repo"].split("/", 1)[1]
        assert name in b.VARIANTS, name
        assert b.simulated_bytes(name) == int(spec["download_gb"] * 1e9)
        config = b.config_json(name)
        assert config["quantization_config"]["quant_method"] == spec["quant_method"] == "compressed-tensors"
        assert config["architectures"] == b.config_json("d3")["architectures"]
    fp8 = b.config_json("d3-FP8")["quantization_config"]
    assert fp8["format"] == "float-quantized"
    assert fp8["config_groups"]["group_0"]["weights"]["num_bits"] == 8
    assert fp8["config_groups"]["group_0"]["input_activations"]["dynamic"] is True  # FP8_DYNAMIC
    awq = b.config_json("d3-W4A16-AWQ")["quantization_config"]
    assert awq["format"] == "pack-quantized" and awq["config_groups"]["group_0"]["input_activations"] is None
    assert awq["config_groups"]["group_0"]["weights"]["group_size"] == 128
    assert "quantization_config" not in b.config_json("d3")  # the BF16 checkpoint: online FP8 only


def test_simulator_detects_the_quantization_like_vllm() -> None:
    b = load("build_repos", ROOT / "lab/hf/build_repos.py")
    sim = load("vllm_sim_variants", ROOT / "lab/simulator/vllm_sim.py")
    fp8 = sim.Model("vllm-sr/d3-FP8", Path("/nonexistent"), b.config_json("d3-FP8"), 31_900_000_000)
    with pytest.raises(sim.QuantizationMismatch) as err:
        sim.verify_quantization(argparse.Namespace(quantization="fp8"), fp8)
    assert str(err.value) == VLLM_MESSAGE
    args = argparse.Namespace(quantization=None)
    sim.verify_quantization(args, fp8)
    assert args.quantization == fp8.quant_method == "compressed-tensors"
    args = argparse.Namespace(quantization="compressed-tensors")  # agreeing with the checkpoint: accepted
    sim.verify_quantization(args, fp8)
    bf16 = sim.Model("vllm-sr/d3", Path("/nonexistent"), b.config_json("d3"), 52_180_000_000)
    args = argparse.Namespace(quantization="fp8")  # online FP8 on the BF16 checkpoint
    sim.verify_quantization(args, bf16)
    assert args.quantization == "fp8" and bf16.quant_method is None
    # compression_config and the multimodal text_config are read too; compressed_tensors is normalised
    assert sim.checkpoint_quantization({"compression_config": {"quant_method": "compressed_tensors"}}) == (
        True,
        "compressed-tensors",
    )
    assert sim.checkpoint_quantization({"text_config": {"quantization_config": {"quant_method": "AWQ"}}}) == (True, "awq")
    assert sim.checkpoint_quantization({"quantization_config": {}}) == (True, None)


# --- lab: the default on the converged fleet ---------------------------------------------------------------------


@pytest.mark.lab
def test_the_default_27b_runs_the_bf16_checkpoint_in_online_fp8(converge_run: labkit.Run, converged: list[str]) -> None:
    """The lab host that plans the 27B without a variant runs the BF16 checkpoint with --quantization fp8 (online FP8):
    the path planner -> download -> unit -> smoke test of the session's converge; the downloaded bytes are the mirror's
    files of that revision, whose metadata carries the real checkpoint's size from the catalog (52.2 GB). The official
    FP8 variant (vllm-sr/d3-FP8, 31.9 GB) on another host: test_real_stack.py, in its sequence of runs."""
    host = next(h for h in converged if {"model": "d3", "gpus": [0, 1]} in labkit.host_vars(h)["d3_models"])
    revisions = yaml.safe_load((labkit.LAB_INVENTORY / "group_vars" / labkit.LAB_GROUP / "lab.yml").read_text())[
        "d3_model_revisions"
    ]
    assert "d3_smoke" in converge_run.roles_run(host), f"{host}: the smoke test did not run"
    assert converge_run.failed(host) == 0
    args = labkit.container_args(host, "d3-27b")
    assert args[args.index("--model") + 1] == "vllm-sr/d3"
    assert args[args.index("--revision") + 1] == revisions["d3"]
    assert args[args.index("--quantization") + 1] == "fp8"
    bf16_facts = labkit.snapshot_facts(host, "vllm-sr/d3", revisions["d3"])
    assert bf16_facts["bytes"] == labkit.tree_bytes("vllm-sr/d3", revisions["d3"])
    assert round(int(bf16_facts["meta"]["d3_lab_simulated_bytes"]) / 1e9, 1) == catalog()["d3"]["download_gb"]
    assert bf16_facts["meta"]["d3_model_id"] == "vllm-sr/d3" and bf16_facts["quant"] is None
