# ruff: noqa: E501  (each refusal is kept on one line, as the operator reads it)
"""Every planner refusal, word for word: each names the host, the instance or variable, and the fix (a refusal
is the product: an operator reads it, so a changed word is a changed behaviour)."""

from __future__ import annotations

from typing import Any

import pytest
from d3_planner import d3_plan
from l4 import l4_gpus

H = "host l4-a: "

# name: (d3_models, number of L4s, planner options, the errors)
REFUSALS: dict[str, tuple[list[Any], int, dict[str, Any], list[str]]] = {
    "not_a_mapping": (
        ["d3-mini"],
        2,
        {},
        [
            H + "d3_models[0]: expected a mapping with a `model:` key, got 'd3-mini'. Fix: write `- model: d3-mini`",
        ],
    ),
    "unknown_key": (
        [{"model": "d3-mini", "gpu": [0]}],
        2,
        {},
        [
            H
            + "d3_models[0]: unknown key(s) ['gpu']. Fix: use only ['env', 'extra_args', 'gpus', 'model', 'name', 'port', 'served_name', 'variant']",
        ],
    ),
    "unknown_model": (
        [{"model": "d3-ultra"}],
        2,
        {},
        [
            H
            + "d3_models[0]: unknown model 'd3-ultra'. Fix: set d3_models[0].model to one of: d3, d3-edge, d3-flash, d3-lite, d3-mini, d3-nano",
        ],
    ),
    "bad_name": (
        [{"model": "d3-mini", "name": "Triage_1"}],
        2,
        {},
        [
            H + "d3_models[0] (Triage_1): name 'Triage_1' is not a valid unit name. Fix: use lowercase letters, digits and '-'",
        ],
    ),
    "extra_not_flag": (
        [{"model": "d3-mini", "extra_args": ["16384"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-mini): d3_models[0].extra_args: '16384' is not a flag (extra_args items are --flag, --flag=value or --flag value). Fix: write each flag as '--flag=value'",
        ],
    ),
    "owned_port": (
        [{"model": "d3-edge", "extra_args": ["--port=9000"]}],
        2,
        {},
        [
            H + "d3_models[0] (d3-edge): extra_args sets --port, which the planner owns. Fix: remove it; set the instance `port:`",
        ],
    ),
    "owned_api_key": (
        [{"model": "d3-edge", "extra_args": ["--api-key", "x"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-edge): extra_args sets --api-key, which the planner owns. Fix: remove it; set d3_units_api_key (the key must not appear on a command line)",
        ],
    ),
    "owned_host": (
        [{"model": "d3-edge", "extra_args": ["--host", "0.0.0.0"]}],
        2,
        {},
        [
            H + "d3_models[0] (d3-edge): extra_args sets --host, which the planner owns. Fix: remove it; set d3_listen_address",
        ],
    ),
    "kv_fp8": (
        [{"model": "d3-mini", "extra_args": ["--kv-cache-dtype", "fp8"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-mini): --kv-cache-dtype fp8 is a quantized KV cache, which crashes D3 on the first request that reaches encoder attention ('quantized KV cache is not supported for encoder attention'). Fix: remove --kv-cache-dtype from d3_models[0].extra_args",
        ],
    ),
    "no_eager": (
        [{"model": "d3-mini", "extra_args": ["--no-enforce-eager"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-mini): dropping --enforce-eager makes vLLM capture CUDA graphs, which OOMs on a 24 GB L4 (fixed 18.4 GB vision-encoder profiling allocation). Fix: remove --no-enforce-eager, or set d3_allow_cuda_graphs: true to acknowledge the risk",
            H
            + "d3_models[0] (d3-mini): d3-mini at TP 1 runs out of memory in vLLM's profile run ('torch.OutOfMemoryError: CUDA out of memory'): weights 3815 + profile-run peak 2576 (32768 tokens x 82432 B) + non-torch 512 + encoder probe 18842 (CUDA graph capture without --enforce-eager) = 25745 MiB per GPU, more than the GPU holds beside the CUDA context (CUDA out of memory during CUDA graph capture. Tried to allocate 18.40 GiB (fixed vision-encoder profiling allocation). GPU 0 has a total capacity of 22.03 GiB of which 15.29 GiB is free. Use --enforce-eager.). Fix: pick a smaller model or variant for d3_models[0]; or keep --enforce-eager (remove --no-enforce-eager)",
        ],
    ),
    "not_number": (
        [{"model": "d3-mini", "extra_args": ["--max-model-len=lots"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-mini): a numeric flag in extra_args does not parse (invalid literal for int() with base 10: 'lots'). Fix: give numbers",
        ],
    ),
    "tp_zero": (
        [{"model": "d3-mini", "extra_args": ["-tp", "0"]}],
        2,
        {},
        [
            H + "d3_models[0] (d3-mini): --tensor-parallel-size 0 is below 1. Fix: use 1 or more",
        ],
    ),
    "max_len_high": (
        [{"model": "d3-edge", "extra_args": ["--max-model-len=300000"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-edge): --max-model-len 300000 is outside 1..262144 (max_position_embeddings). Fix: set --max-model-len within 1..262144 in d3_models[0].extra_args",
        ],
    ),
    "max_len_zero": (
        [{"model": "d3-edge", "extra_args": ["--max-model-len=0"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-edge): --max-model-len 0 is outside 1..262144 (max_position_embeddings). Fix: set --max-model-len within 1..262144 in d3_models[0].extra_args",
        ],
    ),
    "util_high": (
        [{"model": "d3-edge", "extra_args": ["--gpu-memory-utilization=1.5"]}],
        2,
        {},
        [
            H + "d3_models[0] (d3-edge): --gpu-memory-utilization 1.5 is outside (0, 1]. Fix: use a fraction such as 0.45",
        ],
    ),
    "util_zero": (
        [{"model": "d3-edge", "extra_args": ["--gpu-memory-utilization=0"]}],
        2,
        {},
        [
            H + "d3_models[0] (d3-edge): --gpu-memory-utilization 0.0 is outside (0, 1]. Fix: use a fraction such as 0.45",
        ],
    ),
    "heads_tp": (
        [{"model": "d3-flash", "extra_args": ["--tensor-parallel-size=3"]}],
        4,
        {},
        [
            H
            + "d3_models[0] (d3-flash): vLLM refuses to start d3-flash at --tensor-parallel-size 3: 'ValueError: Total number of attention heads (16) must be divisible by tensor parallel size (3).'. Fix: set --tensor-parallel-size to one of 1, 2, 4, 8, 16 in d3_models[0].extra_args",
        ],
    ),
    "prefix": (
        [{"model": "d3-mini", "extra_args": ["--enable-prefix-caching"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-mini): --enable-prefix-caching on a Gated DeltaNet hybrid selects vLLM's mamba cache mode 'align', which D3 cannot start with, chunked prefill being off: vLLM refuses at startup with 'Chunked prefill is required for mamba cache mode 'align'.' (vllm/model_executor/models/config.py). Fix: remove --enable-prefix-caching from d3_models[0].extra_args",
        ],
    ),
    "prefix_chunked": (
        [{"model": "d3-mini", "extra_args": ["--enable-prefix-caching", "--enable-chunked-prefill"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-mini): --enable-prefix-caching on a Gated DeltaNet hybrid selects vLLM's mamba cache mode 'align', whose block size and per-request state blocks the planner does not model (docs/capacity.md). Fix: remove --enable-prefix-caching from d3_models[0].extra_args",
        ],
    ),
    "kv_token_head": (
        [{"model": "d3-mini", "extra_args": ["--kv-cache-dtype=fp8_per_token_head"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-mini): --kv-cache-dtype fp8_per_token_head is a quantized KV cache, which crashes D3 on the first request that reaches encoder attention ('quantized KV cache is not supported for encoder attention'). Fix: remove --kv-cache-dtype from d3_models[0].extra_args",
        ],
    ),
    "kv_unknown": (
        [{"model": "d3-mini", "extra_args": ["--kv-cache-dtype=int2"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-mini): --kv-cache-dtype int2 is not one of vLLM's KV cache dtypes: vLLM's argument parser refuses it (\"argument --kv-cache-dtype: invalid choice: 'int2'\", vllm/config/cache.py CacheDType). Fix: remove --kv-cache-dtype from d3_models[0].extra_args (auto: the model's BF16)",
        ],
    ),
    "len_62000": (
        [{"model": "d3", "extra_args": ["--max-model-len=62000"]}],
        4,
        {},
        [
            H
            + "d3_models[0] (d3-27b): d3 at TP 2 is refused by vLLM at startup, its KV cache being too small for one sequence of --max-model-len 62000 (2034 MiB): 'To serve at least one request with the models's max seq len (62000), (1.99 GiB KV cache is needed, which is larger than the available KV cache memory (1.84 GiB). Based on the available memory, the estimated maximum model length is 57232. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.' (weights 13314 + profile-run peak 5722 (62000 tokens x 96768 B) + non-torch 512 = 19548 MiB per GPU of its share (--gpu-memory-utilization x GPU memory) of 21432 MiB). Fix: in d3_models[0].extra_args set --max-model-len=60919 (the longest that fits), or set --gpu-memory-utilization=0.96, or set --tensor-parallel-size=4 (4 GPUs; the host has 4)",
        ],
    ),
    "does_not_fit_tp": (
        [{"model": "d3", "extra_args": ["--tensor-parallel-size=1"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-27b): d3 at TP 1 runs out of memory in vLLM's profile run ('torch.OutOfMemoryError: CUDA out of memory'): weights 26627 + profile-run peak 1232 (8192 tokens x 157696 B) + non-torch 512 = 28371 MiB per GPU, more than the GPU holds beside the CUDA context (CUDA out of memory. GPU 0 has a total capacity of 22.03 GiB (weights 26.00 GiB, profile run 1.20 GiB at 8192 tokens, non-torch 0.50 GiB, CUDA graphs 0.00 GiB).). Fix: in d3_models[0].extra_args set --tensor-parallel-size=2 (2 GPUs; the host has 2)",
        ],
    ),
    "does_not_fit_util": (
        [{"model": "d3-flash", "extra_args": ["--gpu-memory-utilization=0.3"]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-flash): d3-flash at TP 1 is refused by vLLM at startup: 'No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.': weights 8583 + profile-run peak 896 (8192 tokens x 114688 B) + non-torch 512 = 9991 MiB per GPU fill its share (--gpu-memory-utilization x GPU memory) of 6768 MiB. Fix: in d3_models[0].extra_args set --gpu-memory-utilization=0.46, or set --tensor-parallel-size=2 (2 GPUs; the host has 2)",
        ],
    ),
    "bad_revision": (
        [{"model": "d3-mini"}],
        2,
        {"revisions": {"d3-mini": "main"}},
        [
            H
            + "d3_models[0] (d3-mini): d3_model_revisions['d3-mini'] = 'main' is not a 40-hex commit SHA. Fix: pin the full commit SHA from the Hub (a branch or tag can move)",
        ],
    ),
    "unpinned": (
        [{"model": "d3-mini"}],
        2,
        {"require_revisions": True},
        [
            H
            + "d3_models[0] (d3-mini): no pinned revision for d3-mini. Fix: set d3_model_revisions['d3-mini'] to the full commit SHA of vllm-sr/d3-mini (vllm-sr v3.1.0 record: a475367d...)",
        ],
    ),
    "gpus_not_list": (
        [{"model": "d3-mini", "gpus": 0}],
        2,
        {},
        [
            H + "d3_models[0] (d3-mini): gpus 0 is not a list of GPU indices. Fix: write `gpus: [0, 1]`",
        ],
    ),
    "gpus_bool": (
        [{"model": "d3-mini", "gpus": [True]}],
        2,
        {},
        [
            H + "d3_models[0] (d3-mini): gpus [True] is not a list of GPU indices. Fix: write `gpus: [0, 1]`",
        ],
    ),
    "gpu_twice": (
        [{"model": "d3", "gpus": [1, 1]}],
        2,
        {},
        [
            H + "d3_models[0] (d3-27b): GPU [1] listed twice in d3_models[0].gpus. Fix: list each GPU once",
        ],
    ),
    "gpu_range": (
        [{"model": "d3-mini", "gpus": [3]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-mini): GPU index [3] out of range: the host has 2 GPU(s) (0, 1). Fix: use indices from nvidia-smi, or correct d3_gpu_count",
        ],
    ),
    "gpu_range_none": (
        [{"model": "d3-mini", "gpus": [0]}],
        0,
        {"allow_non_l4": False},
        [
            H
            + "d3_models[0] (d3-mini): GPU index [0] out of range: the host has 0 GPU(s) (none). Fix: use indices from nvidia-smi, or correct d3_gpu_count",
        ],
    ),
    "tp_vs_gpus": (
        [{"model": "d3", "gpus": [0]}],
        2,
        {},
        [
            H
            + "d3_models[0] (d3-27b): tensor parallel size 2 needs 2 GPU(s) but d3_models[0].gpus gives 1. Fix: list exactly 2 GPU(s), or set --tensor-parallel-size=1 in extra_args",
        ],
    ),
    "share_fixed": (
        [{"model": "d3-flash", "gpus": [0]}, {"model": "d3-mini", "gpus": [0]}],
        1,
        {},
        [
            H
            + "d3_models[1] (d3-mini): VRAM over budget on GPU 0: its share of 10152 MiB (--gpu-memory-utilization 0.45 x 22560 MiB) on top of d3-flash 20304 MiB (0.9) makes 0.9 + 0.45 = 1.35 of the GPU (30456 MiB), over the 0.92 (20755.2 MiB) that d3_gpu_share_cap allows on a shared GPU (vLLM needs its share free at start, and the driver keeps some). Fix: move d3_models[1] to another GPU (its `gpus:`) or host (at the 0.02 left, d3-mini itself would not start: is refused by vLLM at startup: 'No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.': weights 3815 + profile-run peak 2576 (32768 tokens x 82432 B) + non-torch 512 = 6903 MiB per GPU fill its share (--gpu-memory-utilization x GPU memory) of 451 MiB)",
        ],
    ),
    "share_auto": (
        [{"model": "d3-flash"}, {"model": "d3-flash", "name": "flash-b"}],
        1,
        {},
        [
            H
            + "d3_models[1] (flash-b): VRAM over budget: no 1 GPU(s) with 20304 MiB (--gpu-memory-utilization 0.9) left within d3_gpu_share_cap 0.92 of each GPU's memory (GPU 0: d3-flash 20304 MiB (0.9)). Fix: move d3_models[1] to another GPU (its `gpus:`) or host (at the 0.02 left, flash-b itself would not start: is refused by vLLM at startup: 'No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.': weights 8583 + profile-run peak 896 (8192 tokens x 114688 B) + non-torch 512 = 9991 MiB per GPU fill its share (--gpu-memory-utilization x GPU memory) of 451 MiB)",
        ],
    ),
    "tp_host": (
        [{"model": "d3"}],
        1,
        {},
        [
            H
            + "d3_models[0] (d3-27b): tensor parallel size 2 is larger than the 1 GPU(s) the host has. Fix: place this model on a host with enough GPUs, or correct d3_gpu_count",
        ],
    ),
    "port_range": (
        [{"model": "d3-edge", "port": 80}],
        2,
        {},
        [
            H + "d3_models[0] (d3-edge): port 80 is outside 1024-65535. Fix: choose a port in 1024-65535",
        ],
    ),
    "port_str": (
        [{"model": "d3-edge", "port": "8000"}],
        2,
        {},
        [
            H + "d3_models[0] (d3-edge): port '8000' is outside 1024-65535. Fix: choose a port in 1024-65535",
        ],
    ),
    "port_bool": (
        [{"model": "d3-edge", "port": True}],
        2,
        {},
        [
            H + "d3_models[0] (d3-edge): port True is outside 1024-65535. Fix: choose a port in 1024-65535",
        ],
    ),
    "port_collide": (
        [{"model": "d3-edge", "port": 8100}, {"model": "d3-lite", "port": 8100}],
        2,
        {},
        [
            H + "d3_models[1] (d3-lite): port 8100 collides with instance d3-edge. Fix: give each instance its own port",
        ],
    ),
    "no_port_left": (
        [{"model": "d3-edge"}],
        2,
        {"port_base": 65536},
        [
            H + "d3_models[0] (d3-edge): no free port left. Fix: lower d3_port_base",
        ],
    ),
    "dup_name": (
        [{"model": "d3-edge"}, {"model": "d3-edge"}],
        2,
        {},
        [
            H + "d3_models[1] (d3-edge): instance name 'd3-edge' is also used by d3_models[0]. Fix: give d3_models[1] a distinct `name:`",
        ],
    ),
    "listen_not_ip": (
        [{"model": "d3-edge"}],
        2,
        {"listen_address": "localhost"},
        [
            H
            + "d3_listen_address: 'localhost' is not an IP address (vLLM binds it with --host). Fix: set d3_listen_address to 127.0.0.1, 0.0.0.0 or one of the host's own addresses",
        ],
    ),
    "listen_foreign": (
        [{"model": "d3-edge"}],
        2,
        {"listen_address": "10.0.0.9", "host_addresses": ["10.0.0.5", "fe80::1%eth0", "junk"]},
        [
            H
            + "d3_listen_address: 10.0.0.9 is not an address of this host (its addresses: 10.0.0.5, fe80::1), so vLLM could not bind it and would crash-loop. Fix: set d3_listen_address to one of those, to 127.0.0.1 (local clients only) or to 0.0.0.0 (e.g. \"{{ ansible_facts['default_ipv4']['address'] }}\")",
        ],
    ),
    "listen_none": (
        [{"model": "d3-edge"}],
        2,
        {"listen_address": "10.0.0.9", "host_addresses": []},
        [
            H
            + "d3_listen_address: 10.0.0.9 is not an address of this host (its addresses: none), so vLLM could not bind it and would crash-loop. Fix: set d3_listen_address to one of those, to 127.0.0.1 (local clients only) or to 0.0.0.0 (e.g. \"{{ ansible_facts['default_ipv4']['address'] }}\")",
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusal_text(catalog_vars: dict[str, Any], case: str) -> None:
    models, count, options, errors = REFUSALS[case]
    options = {"api_key_set": True, **options}  # the key rule has its own tests (test_planner_hardening.py)
    result = d3_plan(models, catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], l4_gpus(count), host="l4-a", options=options)
    assert result["errors"] == errors
    assert result["instances"] == []


def test_non_l4_refusal_text(catalog_vars: dict[str, Any]) -> None:
    h200 = [{"index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771}]
    result = d3_plan([{"model": "d3-mini"}], catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], h200, host="l4-a")
    assert result["errors"] == [
        H + "GPU 0: is a NVIDIA H200, not an NVIDIA L4; the catalog's flags are tuned for L4. Fix: set d3_allow_non_l4: true "
        "to plan for it anyway"
    ]
