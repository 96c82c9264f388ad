"""Planner golden tests (all six sizes) and one test per refusal."""

from __future__ import annotations

from typing import Any

import pytest
from d3_planner import d3_plan, split_args
from d3_render import podman_run
from l4 import l4_gpus

SHA = "0123456789abcdef0123456789abcdef01234567"


def plan(catalog_vars: dict[str, Any], models: list[Any], gpus: int = 2, **opts: Any) -> dict[str, Any]:
    gpu_list = opts.pop("gpu_list", None) or l4_gpus(gpus)
    return d3_plan(
        models,
        catalog_vars["d3_catalog"],
        catalog_vars["d3_catalog_common"],
        gpu_list,
        host="l4-a",
        options=opts,
    )


def ok(result: dict[str, Any]) -> list[dict[str, Any]]:
    assert result["errors"] == [], result["errors"]
    return result["instances"]


def refused(result: dict[str, Any], *needles: str) -> str:
    assert result["instances"] == []
    assert len(result["errors"]) >= 1
    text = "\n".join(result["errors"])
    for needle in needles:
        assert needle in text, text
    assert text.startswith("host l4-a: ")
    assert "Fix: " in text
    return text


# -- golden: every size ------------------------------------------------------------------------------

GOLDEN = {
    # model: (TP, max-model-len, gpu-memory-utilization, shm)
    "d3-edge": (1, "32768", "0.25", "2g"),
    "d3-lite": (1, "32768", "0.25", "2g"),
    "d3-nano": (1, "32768", "0.35", "2g"),
    "d3-mini": (1, "32768", "0.45", "2g"),
    "d3-flash": (1, "8192", "0.9", "4g"),
    "d3": (2, "8192", "0.95", "10g"),
}


@pytest.mark.parametrize("model", sorted(GOLDEN))
def test_golden_each_size(catalog_vars: dict[str, Any], model: str) -> None:
    tp, max_len, util, shm = GOLDEN[model]
    (inst,) = ok(plan(catalog_vars, [{"model": model}], revisions={model: SHA}))
    repo = f"vllm-sr/{model}"
    name = "d3-27b" if model == "d3" else model
    assert inst["args"] == [
        "--model", repo,
        "--revision", SHA,
        "--served-model-name", name,
        "--host", "127.0.0.1",
        "--port", "8000",
        "--tensor-parallel-size", str(tp),
        "--max-model-len", max_len,
        "--gpu-memory-utilization", util,
        "--quantization", "fp8",
        "--enforce-eager",
    ]  # fmt: skip
    assert inst["env"] == {"HF_HOME": "/root/.cache/huggingface", "HF_HUB_OFFLINE": "1",
                           "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert inst["shm_size"] == shm
    assert inst["gpus"] == list(range(tp))
    assert inst["cdi_devices"] == [f"nvidia.com/gpu={i}" for i in range(tp)]
    assert inst["unit"] == name


def test_27b_renders_the_seed_recipe(catalog_vars: dict[str, Any]) -> None:
    """Seed: --model vllm-sr/d3 -tp 2 --max-model-len 8192 --gpu-memory-utilization 0.95 --quantization fp8
    --enforce-eager, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, --shm-size 10G, two L4s."""
    result = plan(catalog_vars, [{"model": "d3"}], gpus=2)
    (inst,) = ok(result)
    pairs = dict(split_args(inst["args"]))
    assert pairs["--model"] == "vllm-sr/d3"
    assert pairs["--tensor-parallel-size"] == "2"
    assert pairs["--max-model-len"] == "8192"
    assert pairs["--gpu-memory-utilization"] == "0.95"
    assert pairs["--quantization"] == "fp8"
    assert "--enforce-eager" in pairs and pairs["--enforce-eager"] is None
    assert inst["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert inst["shm_size"].lower() == "10g"
    assert inst["cdi_devices"] == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    # VRAM per GPU (docs/capacity.md): 13.0 GiB of weights + the profile run's peak at 8192 tokens (max_num_batched_tokens
    # = --max-model-len without chunked prefill) + the non-torch margin + one 8192-token sequence (11 blocks of 784
    # tokens + 3 GDN states), on an L4's 22.03 GiB as vLLM sees it
    assert inst["vram_need_mib_per_gpu"] == 13314 + 756 + 512 + 343
    assert inst["kv_cache"]["gpu_kv_cache_tokens"] == 54096 and inst["kv_cache"]["max_concurrency"] == 19.93
    assert inst["vram_arithmetic_mib_per_gpu"]["requested_mib"] == int(22560 * 0.95)
    # the shares are of vLLM's total (22,560 MiB), the GPU's own nvidia-smi total kept beside it
    assert [g["budget_mib"] for g in result["gpus"]] == [21432, 21432]
    assert [(g["memory_total_mib"], g["vllm_total_mib"], g["free_mib"]) for g in result["gpus"]] == [(23034, 22560, 616)] * 2
    line = podman_run(inst, "docker.io/vllm/vllm-openai@sha256:x")
    assert "--device nvidia.com/gpu=0 --device nvidia.com/gpu=1" in line
    assert "--shm-size 10g" in line


def test_lab_layout_27b_and_two_small_models_share(catalog_vars: dict[str, Any]) -> None:
    result = plan(catalog_vars, [{"model": "d3-mini"}, {"model": "d3"}, {"model": "d3-edge"}], gpus=3)
    insts = {i["name"]: i for i in ok(result)}
    assert insts["d3-27b"]["gpus"] == [0, 1]
    assert insts["d3-mini"]["gpus"] == [2]
    assert insts["d3-edge"]["gpus"] == [2]
    # ports follow the list order
    assert [insts[n]["port"] for n in ("d3-mini", "d3-27b", "d3-edge")] == [8000, 8001, 8002]
    gpu2 = result["gpus"][2]
    assert [b["instance"] for b in gpu2["budget"]] == ["d3-mini", "d3-edge"]
    assert gpu2["budget_mib"] == int(22560 * 0.45) + int(22560 * 0.25)


def test_explicit_gpus_ports_extra_args_and_env(catalog_vars: dict[str, Any]) -> None:
    (inst,) = ok(
        plan(
            catalog_vars,
            [
                {
                    "model": "d3-mini",
                    "name": "triage",
                    "gpus": [1],
                    "port": 9100,
                    "extra_args": ["--max-model-len=16384", "--gpu-memory-utilization", "0.5", "--max-num-batched-tokens", "32768"],
                    "env": {"VLLM_BATCH_INVARIANT": "1"},
                }
            ],
        )
    )
    pairs = dict(split_args(inst["args"]))
    assert inst["gpus"] == [1] and inst["port"] == 9100
    assert pairs["--max-model-len"] == "16384"
    assert pairs["--gpu-memory-utilization"] == "0.5"
    assert pairs["--max-num-batched-tokens"] == "32768"
    assert pairs["--served-model-name"] == "triage"
    assert inst["env"]["VLLM_BATCH_INVARIANT"] == "1"
    assert inst["args"].count("--max-model-len") == 1


def test_auto_ports_skip_explicit_ones(catalog_vars: dict[str, Any]) -> None:
    insts = ok(plan(catalog_vars, [{"model": "d3-edge", "port": 8000}, {"model": "d3-lite"}], gpus=1))
    assert [i["port"] for i in insts] == [8000, 8001]


# -- refusals: one test each ----------------------------------------------------------------------------


def test_refuses_unknown_model(catalog_vars: dict[str, Any]) -> None:
    refused(plan(catalog_vars, [{"model": "d3-ultra"}]), "d3_models[0]", "unknown model 'd3-ultra'", "d3-mini")


def test_refuses_tp_larger_than_gpus_given(catalog_vars: dict[str, Any]) -> None:
    refused(plan(catalog_vars, [{"model": "d3", "gpus": [0]}]), "(d3-27b)", "tensor parallel size 2 needs 2", "gives 1")


def test_refuses_tp_larger_than_host_gpus(catalog_vars: dict[str, Any]) -> None:
    refused(plan(catalog_vars, [{"model": "d3"}], gpus=1), "larger than the 1 GPU(s)", "d3_gpu_count")


def test_refuses_gpu_listed_twice(catalog_vars: dict[str, Any]) -> None:
    refused(plan(catalog_vars, [{"model": "d3", "gpus": [1, 1]}]), "GPU [1] listed twice", "d3_models[0].gpus")


def test_refuses_gpu_out_of_range(catalog_vars: dict[str, Any]) -> None:
    refused(plan(catalog_vars, [{"model": "d3-mini", "gpus": [3]}]), "GPU index [3] out of range", "2 GPU(s)")


def test_refuses_vram_over_budget_when_sharing(catalog_vars: dict[str, Any]) -> None:
    text = refused(
        plan(catalog_vars, [{"model": "d3-flash", "gpus": [0]}, {"model": "d3-mini", "gpus": [0]}], gpus=1),
        "VRAM over budget on GPU 0",
        "on top of d3-flash 20304 MiB (0.9) makes 0.9 + 0.45 = 1.35 of the GPU (30456 MiB), over the 0.92 (20755.2 MiB) that "
        "d3_gpu_share_cap allows",
    )
    assert "(d3-mini)" in text


def test_refuses_vram_over_budget_auto(catalog_vars: dict[str, Any]) -> None:
    refused(plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3-flash", "name": "flash-b"}], gpus=1), "(flash-b)", "VRAM over budget")


def test_refuses_model_that_does_not_fit_l4(catalog_vars: dict[str, Any]) -> None:
    refused(
        plan(catalog_vars, [{"model": "d3", "extra_args": ["--tensor-parallel-size=1"]}]),
        "d3 at TP 1 runs out of memory in vLLM's profile run",
        "weights 26627 + profile-run peak 1232 (8192 tokens x 157696 B) + non-torch 512 = 28371 MiB per GPU",
        "Fix: in d3_models[0].extra_args set --tensor-parallel-size=2",
    )


def test_refuses_utilization_too_low_for_weights(catalog_vars: dict[str, Any]) -> None:
    refused(
        plan(catalog_vars, [{"model": "d3-flash", "extra_args": ["--gpu-memory-utilization=0.3"]}]),
        "'No available memory for the cache blocks.",
        "= 9991 MiB per GPU fill its share (--gpu-memory-utilization x GPU memory) of 6768 MiB",
        "Fix: in d3_models[0].extra_args set --gpu-memory-utilization=0.46",
    )


def test_refuses_fewer_batched_tokens_than_the_context_without_chunked_prefill(catalog_vars: dict[str, Any]) -> None:
    # the field report: "--max-num-batched-tokens 512 -> rejected: must be >= max_model_len"
    refused(
        plan(catalog_vars, [{"model": "d3-mini", "extra_args": ["--max-num-batched-tokens=512"]}]),
        "is refused by vLLM at startup: 'max_num_batched_tokens (512) is smaller than max_model_len (32768). This "
        "effectively limits the maximum sequence length to max_num_batched_tokens",
        "Fix: in d3_models[0].extra_args remove --max-num-batched-tokens (vLLM then takes --max-model-len), "
        "or set --max-model-len=512",
    )


def test_refuses_port_collision(catalog_vars: dict[str, Any]) -> None:
    refused(
        plan(catalog_vars, [{"model": "d3-edge", "port": 8100}, {"model": "d3-lite", "port": 8100}]),
        "port 8100 collides with instance d3-edge",
    )


@pytest.mark.parametrize("port", [80, 70000, "8000"])
def test_refuses_port_out_of_range(catalog_vars: dict[str, Any], port: Any) -> None:
    refused(plan(catalog_vars, [{"model": "d3-edge", "port": port}]), "outside 1024-65535")


def test_refuses_duplicate_instance_names(catalog_vars: dict[str, Any]) -> None:
    refused(plan(catalog_vars, [{"model": "d3-edge"}, {"model": "d3-edge"}]), "also used by d3_models[0]", "distinct `name:`")


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_refuses_fp8_kv_cache(catalog_vars: dict[str, Any], dtype: str) -> None:
    refused(
        plan(catalog_vars, [{"model": "d3-mini", "extra_args": ["--kv-cache-dtype", dtype]}]),
        f"--kv-cache-dtype {dtype}",
        "not supported for encoder attention",
    )


def test_refuses_dropping_enforce_eager_without_ack(catalog_vars: dict[str, Any]) -> None:
    item = {"model": "d3-mini", "extra_args": ["--no-enforce-eager"]}
    refused(plan(catalog_vars, [item]), "OOMs on a 24 GB L4", "d3_allow_cuda_graphs: true")
    # acknowledged, the CUDA-graph term (the field report's 18.4 GiB capture allocation) is counted: no D3 fits an L4
    refused(plan(catalog_vars, [item], allow_cuda_graphs=True), "+ encoder probe 18842 (CUDA graph capture without --enforce-eager)")
    big = [{"index": 0, "name": "NVIDIA H100", "memory_total_mib": 81559}]
    (inst,) = ok(plan(catalog_vars, [item], allow_cuda_graphs=True, allow_non_l4=True, gpu_list=big))
    assert "--enforce-eager" not in inst["args"]
    assert inst["vram_arithmetic_mib_per_gpu"]["encoder_probe_mib"] == 18842


def test_refuses_max_model_len_above_position_embeddings(catalog_vars: dict[str, Any]) -> None:
    refused(plan(catalog_vars, [{"model": "d3-edge", "extra_args": ["--max-model-len=300000"]}]), "262144")


def test_refuses_non_l4_gpu_unless_allowed(catalog_vars: dict[str, Any]) -> None:
    h200 = [{"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771}]
    refused(plan(catalog_vars, [{"model": "d3-mini"}], gpu_list=h200), "NVIDIA H200, not an NVIDIA L4", "d3_allow_non_l4")
    ok(plan(catalog_vars, [{"model": "d3-mini"}], gpu_list=h200, allow_non_l4=True))


def test_refuses_planner_owned_flags(catalog_vars: dict[str, Any]) -> None:
    refused(plan(catalog_vars, [{"model": "d3-edge", "extra_args": ["--port=9000"]}]), "sets --port", "instance `port:`")
    refused(plan(catalog_vars, [{"model": "d3-edge", "extra_args": ["--api-key", "x"]}]), "d3_units_api_key")


def test_refuses_unpinned_revision_in_deploy_mode(catalog_vars: dict[str, Any]) -> None:
    refused(plan(catalog_vars, [{"model": "d3-mini"}], require_revisions=True), "no pinned revision", "a475367d")
    refused(plan(catalog_vars, [{"model": "d3-mini"}], revisions={"d3-mini": "main"}), "not a 40-hex commit SHA")


def test_refuses_unknown_item_key(catalog_vars: dict[str, Any]) -> None:
    refused(plan(catalog_vars, [{"model": "d3-mini", "gpu": [0]}]), "unknown key(s) ['gpu']")


def test_every_catalog_entry_fits_its_own_defaults(catalog_vars: dict[str, Any]) -> None:
    """The catalog's defaults must be plannable on a host with exactly the TP it asks for."""
    for model, entry in catalog_vars["d3_catalog"].items():
        ok(plan(catalog_vars, [{"model": model}], gpus=entry["tensor_parallel_size"]))
