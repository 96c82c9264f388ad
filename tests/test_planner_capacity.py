# ruff: noqa: E501  (each figure is kept on one line, as docs/capacity.md derives it)
"""kv_cache_figures: vLLM's startup memory, term by term, against numbers derived by hand from vLLM's source
(docs/capacity.md): the hybrid KV cache spec (attention block size, page size, groups), the profile run's activation
peak at max_num_batched_tokens, the KV pool the --gpu-memory-utilization share leaves, the two figures vLLM logs, and
each refusal with vLLM's message."""

from __future__ import annotations

from typing import Any

import pytest
from d3_planner import CUDA_CONTEXT_MIB, GIB, MIB, default_batched_tokens, kv_cache_figures, parse_bytes

# an L4's total as vLLM sees it (torch.cuda.mem_get_info: "total capacity of 22.03 GiB"; d3_catalog_common.gpu_models)
L4 = 22560


@pytest.fixture(scope="module")
def arch(catalog_vars: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {model: entry["architecture"] for model, entry in catalog_vars["d3_catalog"].items()}


def flags(max_len: int = 8192, util: float = 0.95, **more: Any) -> dict[str, Any]:
    return {"--max-model-len": max_len, "--gpu-memory-utilization": util, "--enforce-eager": True, **more}


def test_the_field_reports_recipe_27b_tp2_8192_at_095(arch: dict[str, Any]) -> None:
    """docs/capacity.md's hand computation, step by step."""
    f = kv_cache_figures(arch["d3"], flags(**{"--quantization": "fp8"}), L4, 2, weights_mib=2 * 13312)
    # attention: 2 (K, V) x 4/2 KV heads x 256 x 2 bytes = 2048 B per token; GDN: conv (4-1) x (2x16x128 + 48x128)/2
    # x 2 bytes = 30720 B + temporal 48/2 x 128 x 128 x 4 bytes (float32) = 1572864 B
    assert f["mamba_page_bytes"] == 30720 + 1572864 == 1603584
    # the smallest multiple of 16 tokens whose attention page holds a GDN state: 16 x cdiv(1603584, 16 x 2048) = 784
    assert (f["block_size"], f["page_size_bytes"]) == (784, 784 * 2048)
    # 16 full-attention and 48 GDN layers: groups of 16, one attention group and three GDN groups
    assert (f["group_size"], f["kv_groups"]) == (16, 4)
    # without chunked prefill `vllm serve` sets max_num_batched_tokens = max(max_model_len, 2048) = 8192
    assert f["max_num_batched_tokens"] == 8192
    # per token per GPU: residual 2 x 5120 x 2 + MLP (gate_up 2 x 8704 x 2 + act 8704 x 2 + FP8 copies 8704 + 5120 + down 5120 x 2)
    assert f["activation_bytes_per_token"] == 20480 + 34816 + 17408 + 8704 + 5120 + 10240 == 96768
    assert f["activation_peak_mib"] == 8192 * 96768 // MIB == 756
    assert (f["weights_mib"], f["non_torch_mib"], f["encoder_probe_mib"]) == (13312, 512, 0)
    assert f["non_kv_mib"] == 13312 + 756 + 512
    assert f["requested_mib"] == int(L4 * MIB * 0.95) // MIB == 21432
    available = int(L4 * MIB * 0.95) - (13312 + 756 + 512) * MIB
    assert f["num_gpu_blocks"] == available // (784 * 2048) // 16 == 279
    assert f["kv_pool_mib"] == 279 * 784 * 2048 * 16 // MIB == 6835
    # vLLM's log lines: tokens = blocks // groups x block size; concurrency = blocks / (cdiv(8192, 784) + 3 GDN blocks)
    assert f["gpu_kv_cache_tokens"] == 279 // 4 * 784 == 54096
    assert f["max_concurrency"] == 279 / 14 and round(279 / 14, 2) == 19.93
    assert f["sequence_mib"] == -(-16 * 784 * 2048 * 14 // MIB) == 343
    assert f["estimated_max_model_len"] == 8192
    assert f["refusal"] is None


def test_the_field_reports_measured_memory_within_the_stated_tolerance(arch: dict[str, Any]) -> None:
    """The field report: "VRAM: ~20.8 GB / 23.0 GB per GPU" (nvidia-smi's MiB read as GB: ~20,800 MiB in use). After
    startup a GPU holds weights + non-torch + the KV pool (the profile run's activations are freed) + the CUDA context
    and NCCL outside the share (CUDA_CONTEXT_MIB, 512: no source). Tolerance 5 % (1,040 MiB): the context, NCCL and
    non-torch sizes have no source, and "~20.8" is rounded to 0.1 GB."""
    f = kv_cache_figures(arch["d3"], flags(**{"--quantization": "fp8"}), L4, 2, weights_mib=2 * 13312)
    in_use = f["weights_mib"] + f["non_torch_mib"] + f["kv_pool_mib"] + CUDA_CONTEXT_MIB
    assert in_use == 13312 + 512 + 6835 + 512 == 21171
    assert abs(in_use - 20800) <= 0.05 * 20800  # +371 MiB, 1.8 %


def test_kv_tokens_at_8192_exceed_those_at_16384(arch: dict[str, Any]) -> None:
    """The profile batch grows with --max-model-len (no chunked prefill), so the pool shrinks."""
    at = {n: kv_cache_figures(arch["d3"], flags(n, **{"--quantization": "fp8"}), L4, 2, weights_mib=2 * 13312) for n in (8192, 16384)}
    assert at[8192]["gpu_kv_cache_tokens"] == 54096 > at[16384]["gpu_kv_cache_tokens"] == 48608
    assert at[16384]["activation_peak_mib"] == 2 * 756


def test_the_27b_at_62000_tokens_is_refused_on_22_03_gib(arch: dict[str, Any]) -> None:
    f = kv_cache_figures(arch["d3"], flags(62000, **{"--quantization": "fp8"}), L4, 2, weights_mib=2 * 13312)
    assert f["refusal"]["kind"] == "max_seq_len"
    assert f["refusal"]["message"].startswith("To serve at least one request with the models's max seq len (62000), (1.99 GiB KV cache")
    # on nvidia-smi's 23,034 MiB it would have been planned (the total vLLM does not see)
    assert kv_cache_figures(arch["d3"], flags(62000, **{"--quantization": "fp8"}), 23034, 2, weights_mib=2 * 13312)["refusal"] is None


def test_kv_cache_memory_bytes_skips_the_profile_share(arch: dict[str, Any]) -> None:
    """determine_available_memory returns --kv-cache-memory-bytes as given; --gpu-memory-utilization no longer sizes it."""
    given = 4 * GIB
    f = kv_cache_figures(arch["d3"], flags(util=0.5, **{"--kv-cache-memory-bytes": given}), L4, 2, weights_mib=2 * 13312)
    assert f["refusal"] is None and f["num_gpu_blocks"] == given // (784 * 2048) // 16 == 167
    assert f["kv_cache_memory_bytes"] == given and f["kv_pool_mib"] == 167 * 784 * 2048 * 16 // MIB
    # the weights, the profile run and the given KV cache must fit the GPU beside the CUDA context
    over = kv_cache_figures(arch["d3"], flags(**{"--kv-cache-memory-bytes": 9 * GIB}), L4, 2, weights_mib=2 * 13312)
    assert over["refusal"]["kind"] == "profile_oom"
    small = kv_cache_figures(arch["d3"], flags(**{"--kv-cache-memory-bytes": 100 * MIB}), L4, 2, weights_mib=2 * 13312)
    assert small["refusal"]["kind"] == "max_seq_len"


def test_the_default_batch_on_a_large_gpu_and_with_chunked_prefill() -> None:
    """get_batch_defaults: 2048 below 70 GiB, 8192 from 70 GiB; chunked prefill keeps the default, capped at 256 x len."""
    assert default_batched_tokens(8192, False, 22560) == 8192
    assert default_batched_tokens(1024, False, 22560) == 2048
    assert default_batched_tokens(1024, False, 70 * 1024) == 8192
    assert default_batched_tokens(1024, False, 70 * 1024 - 1) == 2048
    assert default_batched_tokens(65536, True, 22560) == 2048
    assert default_batched_tokens(4, True, 22560) == 1024  # 256 sequences x 4 tokens
    assert default_batched_tokens(4, False, 22560) == 1024


def test_kv_cache_memory_bytes_parses_like_vllms_human_readable_int() -> None:
    assert [parse_bytes(v) for v in ("123", " 4G", "1k", "2.5g", "3M", "1T", "1t")] == [
        123, 4 * GIB, 1000, 2_500_000_000, 3 * MIB, 1024**4, 10**12]
    for bad in ("1.5G", "lots", "4GB"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_qwen35_4b_gets_vllms_logged_528_token_block(arch: dict[str, Any]) -> None:
    # vLLM issue #40696 (v0.19.1, Qwen3.5-4B): "Setting attention block size to 528 tokens"
    f = kv_cache_figures(arch["d3-mini"], flags(32768, 0.45, **{"--quantization": "fp8"}), L4, 1, weights_mib=3815)
    assert f["block_size"] == 528 and f["mamba_page_bytes"] == 3 * 8192 * 2 + 32 * 128 * 128 * 4
    assert (f["group_size"], f["kv_groups"]) == (8, 4)
    assert f["activation_bytes_per_token"] == 82432


@pytest.mark.parametrize(
    ("model", "tp", "block", "groups", "group_size"),
    [("d3", 1, 784, 4, 16), ("d3", 2, 784, 4, 16), ("d3-flash", 1, 528, 4, 8), ("d3-mini", 1, 528, 4, 8), ("d3-nano", 1, 544, 4, 6),
     ("d3-lite", 1, 544, 4, 6), ("d3-edge", 1, 544, 4, 3)],
)  # fmt: skip
def test_kv_spec_of_every_size(arch: dict[str, Any], model: str, tp: int, block: int, groups: int, group_size: int) -> None:
    f = kv_cache_figures(arch[model], flags(), L4, tp)
    assert (f["block_size"], f["kv_groups"], f["group_size"]) == (block, groups, group_size)


def test_layer_counts_close_together_group_by_the_larger() -> None:
    # 6 full and 8 GDN layers (8 < 1.5 x 6): one group each of 8 layers, the full one padded
    text = {"num_hidden_layers": 14, "full_attention_interval": 2, "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 2,
            "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 1, "linear_num_value_heads": 1, "linear_key_head_dim": 32,
            "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32", "dtype": "bfloat16"}  # fmt: skip
    f = kv_cache_figures({"text": text}, flags(64, 0.5), 10000, 1)
    assert (f["group_size"], f["kv_groups"]) == (7, 2)
    text = {**text, "num_hidden_layers": 20, "full_attention_interval": 4}  # 5 full, 15 GDN: 15 >= 1.5 x 5
    assert kv_cache_figures({"text": text}, flags(64, 0.5), 10000, 1)["group_size"] == 5


def test_batched_tokens_chunked_prefill_and_the_encoder_probe(arch: dict[str, Any]) -> None:
    base = kv_cache_figures(arch["d3-edge"], flags(65536, 0.25), L4, 1, weights_mib=572)
    assert base["max_num_batched_tokens"] == 65536  # max_model_len without chunked prefill
    chunked = kv_cache_figures(arch["d3-edge"], flags(65536, 0.25, **{"--enable-chunked-prefill": True}), L4, 1, weights_mib=572)
    assert chunked["max_num_batched_tokens"] == 2048 and chunked["refusal"] is None
    given = kv_cache_figures(arch["d3-edge"], flags(8192, 0.25, **{"--max-num-batched-tokens": 8192}), L4, 1, weights_mib=572)
    assert given["max_num_batched_tokens"] == 8192 and given["activation_peak_mib"] == -(-8192 * 27648 // MIB)  # bf16 activations: residual 4096 + MLP 23552
    short = kv_cache_figures(arch["d3-edge"], flags(8192, 0.25, **{"--max-num-batched-tokens": 8191}), L4, 1)
    assert short["refusal"] == {"kind": "batched_tokens", "message": "max_num_batched_tokens (8191) is smaller than max_model_len (8192). "
                                "This effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
                                "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len."}  # fmt: skip
    assert kv_cache_figures(arch["d3-edge"], flags(8192, 0.25, **{"--max-num-batched-tokens": 100, "--enable-chunked-prefill": True}),
                            L4, 1)["refusal"] is None  # fmt: skip
    graphs = kv_cache_figures(arch["d3-edge"], flags(8192, 0.95, **{"--enforce-eager": False}), L4, 1, weights_mib=572)
    assert graphs["encoder_probe_mib"] == -(-round(18.4 * GIB) // MIB) == 18842
    assert kv_cache_figures(arch["d3-edge"], {"--max-model-len": 8192, "--gpu-memory-utilization": 0.95}, L4, 1)["encoder_probe_mib"] == 0


def test_fp8_activations_follow_the_quantization_unless_told(arch: dict[str, Any]) -> None:
    plain = kv_cache_figures(arch["d3"], flags(), L4, 2)["activation_bytes_per_token"]
    online = kv_cache_figures(arch["d3"], flags(**{"--quantization": "fp8"}), L4, 2)["activation_bytes_per_token"]
    w8a8 = kv_cache_figures(arch["d3"], flags(fp8_activations=True), L4, 2)["activation_bytes_per_token"]
    told_not = kv_cache_figures(arch["d3"], flags(fp8_activations=False, **{"--quantization": "fp8"}), L4, 2)["activation_bytes_per_token"]
    assert online == w8a8 == plain + 8704 + 5120 and told_not == plain


def test_each_layer_kind_can_set_the_peak() -> None:
    """The largest transient of the MLP, the GDN mixer and the attention layer sets the peak (plus the residual)."""
    base = {"num_hidden_layers": 4, "full_attention_interval": 4, "hidden_size": 100, "intermediate_size": 100, "num_attention_heads": 1,
            "num_key_value_heads": 1, "head_dim": 8, "linear_num_key_heads": 1, "linear_num_value_heads": 1, "linear_key_head_dim": 8,
            "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32", "dtype": "bfloat16"}  # fmt: skip
    per = lambda text: kv_cache_figures({"text": text}, flags(64, 0.5), 10000, 1)["activation_bytes_per_token"]  # noqa: E731
    # MLP: (200 + 100) x 2 + 100 x 2 = 800; GDN: (32 + 8 + 100) x 2 = 280; attention: (24 + 16 + 100) x 2 = 280
    assert per(base) == 400 + 800
    # a wide GDN: key dim 8 x 64 = 512, value dim 8 x 64: in_proj_qkvz 2048, core output 512, out_proj 100:
    # (2048 + 512 + 100) x 2 = 5320; no convolution output (_forward_core returns early in the profile run)
    assert per({**base, "linear_num_key_heads": 64, "linear_num_value_heads": 64}) == 400 + 5320
    # a wide attention: 64 heads x 8: (3 x 512 + 2 x 8 + 100) x 2 = 3304
    assert per({**base, "num_attention_heads": 64}) == 400 + 3304


def test_tensor_parallel_splits_heads_but_keeps_one_kv_head(arch: dict[str, Any]) -> None:
    f8 = kv_cache_figures(arch["d3"], flags(), L4, 8)
    # 4 KV heads over 8 GPUs: one each (vLLM replicates), so 512 B per token; GDN: 48/8 value heads
    assert f8["mamba_page_bytes"] == 3 * (10240 // 8) * 2 + 6 * 128 * 128 * 4
    assert f8["page_size_bytes"] == f8["block_size"] * 2 * 1 * 256 * 2


@pytest.mark.parametrize(
    ("model", "max_len", "util", "tp", "weights", "kind", "message"),
    [
        ("d3", 8192, 0.95, 1, 26627, "profile_oom", "CUDA out of memory. GPU 0 has a total capacity of 22.03 GiB (weights 26.00 GiB, "
         "profile run 1.03 GiB at 8192 tokens, non-torch 0.50 GiB, CUDA graphs 0.00 GiB)."),
        ("d3-flash", 8192, 0.3, 1, 8583, "no_kv_memory",
         "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine. "
         "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."),
        ("d3", 32768, 0.95, 1, 15450, "max_seq_len",
         "To serve at least one request with the models's max seq len (32768), (2.15 GiB KV cache is needed, which is larger than the "
         "available KV cache memory (1.22 GiB). Based on the available memory, the estimated maximum model length is 17248. Try increasing "
         "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. "
         "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."),
    ],
)  # fmt: skip
def test_refusals_carry_vllms_messages(arch: dict[str, Any], model: str, max_len: int, util: float, tp: int, weights: int,
                                       kind: str, message: str) -> None:  # fmt: skip
    f = kv_cache_figures(arch[model], flags(max_len, util), L4, tp, weights_mib=weights)
    assert f["refusal"] == {"kind": kind, "message": message}


def test_the_boundaries_of_each_refusal(arch: dict[str, Any]) -> None:
    edge = arch["d3-edge"]
    need = kv_cache_figures(edge, flags(8192, 0.25), L4, 1, weights_mib=572)["non_kv_mib"]
    # the profile run fits exactly what the GPU holds beside the CUDA context, not a MiB more
    assert kv_cache_figures(edge, flags(8192, 0.25), need + 512, 1, weights_mib=572)["refusal"]["kind"] == "no_kv_memory"
    assert kv_cache_figures(edge, flags(8192, 0.25), need + 511, 1, weights_mib=572)["refusal"]["kind"] == "profile_oom"
    assert kv_cache_figures(edge, flags(8192, 0.25), need + 1, 1, weights_mib=572, cuda_context_mib=1)["refusal"]["kind"] == "no_kv_memory"
    # a share exactly the non-KV need leaves nothing; one sequence's worth more starts with a concurrency of 1
    exact = kv_cache_figures(edge, flags(8192, need / 10000), 10000, 1, weights_mib=572, cuda_context_mib=0)
    assert exact["refusal"]["kind"] == "no_kv_memory" and exact["num_gpu_blocks"] == 0
    one = kv_cache_figures(edge, flags(8192, 0.25), L4, 1, weights_mib=572)
    seq = one["sequence_mib"]
    fits = kv_cache_figures(edge, flags(8192, (need + seq) / 10000), 10000, 1, weights_mib=572)
    assert fits["refusal"] is None and fits["max_concurrency"] >= 1
    short = kv_cache_figures(edge, flags(8192, (need + seq - 1) / 10000), 10000, 1, weights_mib=572)
    assert short["refusal"]["kind"] == "max_seq_len" and short["estimated_max_model_len"] < 8192
    assert "the estimated maximum model length is" in short["refusal"]["message"]
    # so little KV memory that not even one block per group is left: no estimate in the message
    tiny = kv_cache_figures(edge, flags(8192, (need + 1) / 10000), 10000, 1, weights_mib=572)
    assert tiny["estimated_max_model_len"] == 0 and "Based on" not in tiny["refusal"]["message"]
    assert tiny["refusal"]["message"].startswith("To serve at least one request with the models's max seq len (8192), (")


def test_non_torch_and_weights_split_over_tp(arch: dict[str, Any]) -> None:
    f = kv_cache_figures(arch["d3"], flags(), L4, 2, weights_mib=101, non_torch_mib=7)
    assert (f["weights_mib"], f["non_torch_mib"]) == (51, 7)
    assert f["non_kv_mib"] == 51 + f["activation_peak_mib"] + 7


def test_no_weights_given_counts_none(arch: dict[str, Any]) -> None:
    f = kv_cache_figures(arch["d3-edge"], flags(), L4, 1)
    assert f["weights_mib"] == 0 and f["non_kv_mib"] == f["activation_peak_mib"] + 512


@pytest.mark.parametrize(("layers", "interval", "group_size"), [(9, 2, 5), (5, 2, 2), (9, 3, 3)])
def test_the_one_and_a_half_rule_at_its_edges(layers: int, interval: int, group_size: int) -> None:
    # 4 full / 5 GDN: 5 < 6, the larger; 2 / 3: exactly 1.5 x, the smaller; 3 / 6: 6 < 2.5 x 3 yet >= 1.5 x 3, the smaller
    text = {"num_hidden_layers": layers, "full_attention_interval": interval, "hidden_size": 64, "intermediate_size": 64,
            "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 1, "linear_num_value_heads": 1,
            "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32",
            "dtype": "bfloat16"}  # fmt: skip
    assert kv_cache_figures({"text": text}, flags(64, 0.5), 10000, 1)["group_size"] == group_size


def test_a_wide_attention_layer_at_tp_2_with_fp8_activations() -> None:
    text = {"num_hidden_layers": 4, "full_attention_interval": 4, "hidden_size": 100, "intermediate_size": 100, "num_attention_heads": 3,
            "num_key_value_heads": 4, "head_dim": 45, "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 8,
            "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32", "dtype": "bfloat16"}  # fmt: skip
    # attention: (3 x 3 x 45 // 2 = 202, + 2 x 2 KV heads x 45 = 180, + 100) x 2 + 100 FP8 = 1064; MLP: (100 + 50) x 2 + 150 + 200 = 650
    f = kv_cache_figures({"text": text}, flags(64, 0.5, fp8_activations=True), 10000, 2)
    assert f["activation_bytes_per_token"] == 400 + 1064


def test_the_profile_run_makes_no_gdn_convolution_output(arch: dict[str, Any]) -> None:
    """GatedDeltaNetAttention._forward_core returns when attn_metadata is None (the V1 profile run): the conv output
    (2 key dims + value dim per token) is never allocated, so d3-edge's peak is its MLP's: residual 4,096 + gate_up
    7,168 x 2 + SiluAndMul 3,584 x 2 + FP8 copies 3,584 + 1,024 + down 1,024 x 2 = 32,256 B per token (39,936 with a
    conv output), 1,008 MiB at 32,768 tokens."""
    f = kv_cache_figures(arch["d3-edge"], flags(32768, 0.25, **{"--quantization": "fp8"}), L4, 1, weights_mib=572)
    assert f["activation_bytes_per_token"] == 32256 and f["activation_peak_mib"] == 1008
    assert (f["gpu_kv_cache_tokens"], round(f["max_concurrency"], 2)) == (151232, 17.39)
