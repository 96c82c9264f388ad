"""Checkpoint variants (issue 16) in the lab: the lab HF mirror serves the 27B's official FP8 variant
(vllm-sr/d3-FP8, compressed-tensors) next to the BF16 default; the simulator detects the quantization from the
checkpoint like vLLM and refuses --quantization fp8 on it with vLLM's message.

Unit part (no lab): the stand-in repositories carry the real sizes and the quantization_config shape, and the
simulator's detection follows vLLM's ModelConfig._verify_quantization.
Lab part (@lab, on the shared converged fleet, restored at the end): one host converged with d3 variant fp8, another
with the default d3; both pass the smoke test (d3_smoke in site.yml); the downloaded bytes are the variant's.
The lab is a STAND-IN (lab/README.md): the weights are tiny, their metadata carries the real checkpoint sizes."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import labkit
import pytest
import yaml
from labkit import on_host, run_playbook

ROOT = Path(__file__).resolve().parents[2]
HF_HOME = "/var/lib/d3/huggingface"  # d3_hf_home, the planner's default (d3_planner.Options.hf_home)
MIRROR = "http://127.0.0.1:8090"
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


# --- lab: converge a variant and the default, then restore -----------------------------------------------------


def tree_bytes(repo: str, sha: str) -> int:
    with urllib.request.urlopen(f"{MIRROR}/api/models/{repo}/tree/{sha}?recursive=true", timeout=30) as resp:
        return sum(e["size"] for e in json.load(resp) if e.get("type") == "file")


def snapshot_facts(host: str, repo: str, sha: str) -> dict[str, Any]:
    """Bytes on disk of the host's snapshot and the safetensors metadata of its weights (read on the host)."""
    snap = f"{HF_HOME}/hub/models--{repo.replace('/', '--')}/snapshots/{sha}"
    script = (
        "import json, pathlib, struct, sys\n"
        f"snap = pathlib.Path({snap!r})\n"
        "files = [p for p in snap.rglob('*') if p.is_file()]\n"
        "raw = (snap / 'model.safetensors').read_bytes()\n"
        "(n,) = struct.unpack('<Q', raw[:8])\n"
        "meta = json.loads(raw[8:8 + n])['__metadata__']\n"
        "config = json.loads((snap / 'config.json').read_text())\n"
        "print(json.dumps({'bytes': sum(p.stat().st_size for p in files), 'meta': meta,\n"
        "                  'quant': (config.get('quantization_config') or {}).get('quant_method')}))\n"
    )
    return json.loads(on_host(host, f"python3 - <<'EOF'\n{script}EOF\n"))


def container_args(host: str, name: str) -> list[str]:
    info = labkit.d3_containers(host)[name]
    assert info["State"]["Status"] == "running", info["State"]
    return list(info["Config"]["Cmd"] or info["Args"])


# other models on converged hosts: the read-only head (tag always), the weights, the units (with podman and the image,
# whose facts they need), the smoke test and the record; the toolkit and the firewall have nothing to change
MODELS_ONLY = "--tags weights,units,smoke,state"


@pytest.mark.lab
def test_official_fp8_on_one_host_and_the_default_on_another(converged: list[str]) -> None:
    fp8_host, default_host = converged[0], converged[1]
    revisions = yaml.safe_load((labkit.LAB_INVENTORY / "group_vars" / labkit.LAB_GROUP / "lab.yml").read_text())[
        "d3_model_revisions"
    ]
    cat = catalog()
    fp8_spec = cat["d3"]["variants"]["fp8"]
    # the FP8 host: its own instances with the 27B switched to the official FP8 checkpoint
    fp8_models = [
        {**item, "variant": "fp8"} if item["model"] == "d3" else item for item in labkit.host_vars(fp8_host)["d3_models"]
    ]
    assert any(item.get("variant") == "fp8" for item in fp8_models), fp8_models
    # the default host: its own instances plus the 27B from the BF16 checkpoint (online FP8) on two free GPUs
    default_models = [*labkit.host_vars(default_host)["d3_models"], {"model": "d3", "gpus": [2, 3]}]
    started = time.monotonic()
    # one site.yml run for both hosts, each with its own d3_models (an extra var templated per host)
    per_host = json.dumps({fp8_host: fp8_models, default_host: default_models})
    try:
        run = run_playbook("site.yml", limit=f"{fp8_host}:{default_host}", cmdline=MODELS_ONLY,
                           extravars={"d3_models": "{{ " + per_host + "[inventory_hostname] }}"})  # fmt: skip
        assert run.status == "successful", run.failure_text()
        for host in (fp8_host, default_host):
            assert "d3_smoke" in run.roles_run(host), f"{host}: the smoke test did not run"
            assert run.failed(host) == 0

        # what runs: vllm-sr/d3-FP8 without --quantization, vllm-sr/d3 with --quantization fp8
        args = container_args(fp8_host, "d3-27b")
        assert args[args.index("--model") + 1] == "vllm-sr/d3-FP8"
        assert args[args.index("--revision") + 1] == revisions["d3-FP8"]
        assert "--quantization" not in args
        log = on_host(fp8_host, "podman logs d3-27b 2>&1 | head -60")
        assert "quantization compressed-tensors detected from the checkpoint's config.json" in log
        args = container_args(default_host, "d3-27b")
        assert args[args.index("--model") + 1] == "vllm-sr/d3"
        assert args[args.index("--quantization") + 1] == "fp8"

        # the downloaded bytes are the variant's: the mirror's files of that repository at that revision, whose
        # metadata carries the real checkpoint's size from the catalog (31.9 GB vs the BF16 52.2 GB)
        fp8_facts = snapshot_facts(fp8_host, "vllm-sr/d3-FP8", revisions["d3-FP8"])
        assert fp8_facts["bytes"] == tree_bytes("vllm-sr/d3-FP8", revisions["d3-FP8"])
        assert int(fp8_facts["meta"]["d3_lab_simulated_bytes"]) == int(fp8_spec["download_gb"] * 1e9)
        assert fp8_facts["meta"]["d3_model_id"] == "vllm-sr/d3-FP8" and fp8_facts["quant"] == "compressed-tensors"
        bf16_facts = snapshot_facts(default_host, "vllm-sr/d3", revisions["d3"])
        assert bf16_facts["bytes"] == tree_bytes("vllm-sr/d3", revisions["d3"])
        assert round(int(bf16_facts["meta"]["d3_lab_simulated_bytes"]) / 1e9, 1) == cat["d3"]["download_gb"]
        assert bf16_facts["quant"] is None
        print(
            f"\nvariant fp8 on {fp8_host}: {fp8_facts['bytes']} bytes downloaded (stand-in for "
            f"{fp8_facts['meta']['d3_lab_simulated_bytes']}); default on {default_host}: {bf16_facts['bytes']} bytes "
            f"(stand-in for {bf16_facts['meta']['d3_lab_simulated_bytes']}); {time.monotonic() - started:.0f} s"
        )
    finally:
        restored = run_playbook("site.yml", limit=f"{fp8_host}:{default_host}", cmdline=MODELS_ONLY)
        assert restored.status == "successful", restored.failure_text()
    args = container_args(fp8_host, "d3-27b")
    assert args[args.index("--model") + 1] == "vllm-sr/d3" and "d3-27b" not in labkit.d3_containers(default_host)
