# ruff: noqa: E501  (vLLM's messages are kept on one line)
"""The vLLM engineer's review of issue 33 (after items 1-5 landed): what vLLM refuses or counts that the planner and
the lab simulator did not. Each finding is checked on both sides, each side on its own: the planner
(plugins/filter/d3_planner.py) and the simulator (lab/simulator/vllm_sim.py), with vLLM's words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import testkit
from d3_planner import d3_plan, kv_cache_figures, mib_of_gb, tp_refusal, tp_sizes
from l4 import l4_gpus

ROOT = Path(__file__).resolve().parents[1]
SIM = testkit.load_file("vllm_sim_review", ROOT / "lab/simulator/vllm_sim.py")
L4 = 22560  # an L4's total as torch sees it (tests/contracts/vllm/gpu-memory.json)


def plan(catalog_vars: dict[str, Any], gpus: int, *items: dict[str, Any]) -> dict[str, Any]:
    return d3_plan(list(items), catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], l4_gpus(gpus), "h",
                   {"api_key_set": True})  # fmt: skip


def sim_stop(config: dict[str, Any], tp: int) -> str | None:
    err = SIM.tensor_parallel_error(config, tp)
    return None if err is None else f"{err[0]}: {err[1]}"


# -- 1. tensor parallel sizes vLLM's divide() refuses ------------------------------------------------------------------
@pytest.mark.parametrize("tp", [3, 6, 12, 24])
def test_the_27b_at_a_tp_that_splits_its_heads_but_not_its_vision_tower_is_refused(catalog_vars: dict[str, Any], tp: int) -> None:
    """24 attention heads split over 3, 6, 12 and 24; the vision tower's 16 heads do not, and vLLM builds the vision
    tower before the language model (qwen3_5.py): Qwen2_5_VisionAttention's divide(num_heads, tp) asserts before the
    Gated DeltaNet's conv_dim (2 x 16 x 128 + 48 x 128 = 10,240, which does not split either) is reached."""
    result = plan(catalog_vars, tp, {"model": "d3", "extra_args": [f"--tensor-parallel-size={tp}"]})
    assert result["errors"] == [
        f"host h: d3_models[0] (d3-27b): vLLM refuses to start d3 at --tensor-parallel-size {tp}: 'AssertionError: 16 is "
        f"not divisible by {tp}'. Fix: set --tensor-parallel-size to one of 1, 2, 4, 8 in d3_models[0].extra_args"]
    arch = catalog_vars["d3_catalog"]["d3"]["architecture"]
    assert sim_stop({"text_config": arch["text"], "vision_config": arch["vision"]}, tp) == f"AssertionError: 16 is not divisible by {tp}"
    # without the vision tower, the language model's first Gated DeltaNet layer
    assert tp_refusal(arch["text"], tp) == sim_stop(arch["text"], tp) == f"AssertionError: 10240 is not divisible by {tp}"


@pytest.mark.parametrize("model", ["d3-edge", "d3-lite"])
def test_twelve_vision_heads_do_not_split_over_8_ranks(catalog_vars: dict[str, Any], model: str) -> None:
    """d3-edge and d3-lite: 8 attention heads split over 8 ranks, their vision tower's 12 heads do not: vLLM stops
    building the vision tower with divide()'s assertion; TP 1, 2 and 4 remain."""
    arch = catalog_vars["d3_catalog"][model]["architecture"]
    assert tp_refusal(arch["text"], 8) is None  # the language model alone would split
    result = plan(catalog_vars, 8, {"model": model, "extra_args": ["--tensor-parallel-size=8"]})
    name = catalog_vars["d3_catalog"][model]["instance_name"]
    assert result["errors"] == [
        f"host h: d3_models[0] ({name}): vLLM refuses to start {model} at --tensor-parallel-size 8: 'AssertionError: 12 is "
        "not divisible by 8'. Fix: set --tensor-parallel-size to one of 1, 2, 4 in d3_models[0].extra_args"]
    assert tp_sizes(arch["text"], arch["vision"]) == [1, 2, 4]
    assert sim_stop({"text_config": arch["text"], "vision_config": arch["vision"]}, 8) == "AssertionError: 12 is not divisible by 8"
    # the vision MLP's linear_fc1 (ColumnParallelLinear(dim, intermediate_size)) comes after the heads
    vision = {**arch["vision"], "num_heads": 16, "intermediate_size": 3076}
    assert tp_refusal(arch["text"], 8, vision) == "AssertionError: 3076 is not divisible by 8"
    assert sim_stop({"text_config": arch["text"], "vision_config": vision}, 8) == "AssertionError: 3076 is not divisible by 8"


def test_the_27b_at_tp_8_replicates_its_four_kv_heads_and_is_planned(catalog_vars: dict[str, Any]) -> None:
    """8 ranks, 4 KV heads: vLLM replicates them (Qwen3NextAttention: tp_size % total_num_kv_heads == 0), one per rank;
    the GDN state halves again while the attention page does not, so the block is 400 tokens, not 784."""
    text = catalog_vars["d3_catalog"]["d3"]["architecture"]["text"]
    assert tp_refusal(text, 8) is None and sim_stop(text, 8) is None
    assert tp_sizes(text) == [1, 2, 4, 8]
    (inst,) = plan(catalog_vars, 8, {"model": "d3", "extra_args": ["--tensor-parallel-size=8"]})["instances"]
    assert inst["kv_cache"]["block_size"] == 400
    assert SIM.kv_layout(text, "auto", 8).block_size == 400
    assert [SIM.kv_layout(text, "auto", t).block_size for t in (1, 2, 4)] == [784, 784, 784]


# (architecture change, tp, vLLM's refusal): each check alone, in vLLM's order
SPLITS = [
    ({"num_attention_heads": 24}, 5, "ValueError: Total number of attention heads (24) must be divisible by tensor parallel size (5)."),
    ({}, 3, "AssertionError: 10240 is not divisible by 3"),
    # conv_dim 2 x 4 x 128 + 6 x 64 = 1408 and the key dims 512 split over 4; the six value heads do not (A_log)
    ({"num_attention_heads": 8, "linear_num_key_heads": 4, "linear_num_value_heads": 6, "linear_value_head_dim": 64}, 4,
     "AssertionError: 6 is not divisible by 4"),
    # the key dims (2 x 256) split over 4, the two key heads do not: no assertion, the forward's num_k_heads // tp
    ({"num_attention_heads": 8, "linear_num_key_heads": 2, "linear_key_head_dim": 256, "linear_num_value_heads": 4}, 4,
     "RuntimeError: the linear-attention key heads (2) do not split over 4 ranks (GatedDeltaNetAttention forward: num_k_heads // tp_size)"),
    ({"num_attention_heads": 8, "num_key_value_heads": 6, "linear_num_key_heads": 8, "linear_num_value_heads": 8}, 4,
     "AssertionError: assert self.total_num_kv_heads % tp_size == 0"),
    ({"num_attention_heads": 12, "num_key_value_heads": 8, "linear_num_key_heads": 12, "linear_num_value_heads": 12}, 12,
     "AssertionError: assert tp_size % self.total_num_kv_heads == 0"),
    ({"num_attention_heads": 12, "num_key_value_heads": 4, "linear_num_key_heads": 12, "linear_num_value_heads": 12}, 12, None),
]


@pytest.mark.parametrize(("change", "tp", "refusal"), SPLITS)
def test_every_split_vllm_checks_on_both_sides(catalog_vars: dict[str, Any], change: dict[str, Any], tp: int, refusal: str | None) -> None:
    text = {**catalog_vars["d3_catalog"]["d3"]["architecture"]["text"], **change}
    assert tp_refusal(text, tp) == refusal
    assert sim_stop(text, tp) == refusal


def test_the_simulator_refuses_to_start_at_such_a_tp_in_vllms_words(catalog_vars: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """check_and_plan: the heads' ValueError before any GPU is looked at (VllmConfig); divide()'s assertion once the
    model is being built (after the free-memory check, before the weights)."""
    text = catalog_vars["d3_catalog"]["d3"]["architecture"]["text"]
    gpus = [SIM.Gpu(i, "NVIDIA L4", f"GPU-{i}", 23034, 0, "580.65", "8.9") for i in range(3)]
    monkeypatch.setattr(SIM, "free_mib", lambda used: {g.uuid: L4 for g in used})
    args = SIM.parse_args(["--model", "x", "--max-model-len", "8192", "-tp", "3", "--enforce-eager", "--gpu-memory-utilization", "0.5"])
    with pytest.raises(SIM.SimExit) as err:
        SIM.check_and_plan(args, gpus, SIM.Model("vllm-sr/d3", Path("/nonexistent"), {"text_config": text}, 2**30), lambda _: None)
    assert (err.value.exc_type, err.value.message, err.value.where) == ("AssertionError", "10240 is not divisible by 3", "vllm/distributed/utils.py")
    heads = {"text_config": {**text, "num_attention_heads": 20}}
    with pytest.raises(SIM.SimExit) as err:  # no GPU at all: the configuration is refused first
        SIM.check_and_plan(args, [], SIM.Model("x", Path("/nonexistent"), heads, 2**30), lambda _: None)
    assert (err.value.exc_type, err.value.message, err.value.where) == (
        "ValueError", "Total number of attention heads (20) must be divisible by tensor parallel size (3).", "vllm/config/model.py")


# -- 2. a context shorter than the attention block ---------------------------------------------------------------------
def test_a_context_shorter_than_the_block_counts_its_own_tokens(catalog_vars: dict[str, Any]) -> None:
    """_report_kv_cache_config multiplies by the smallest block_size of the groups; a GDN group's block_size is
    max_model_len (MambaModelConfig.verify_and_update_config, prefix caching off). The 27B at 512 tokens: 75 blocks
    per group x 512 = 38,400 tokens, not x 784 = 58,800."""
    (inst,) = plan(catalog_vars, 2, {"model": "d3", "extra_args": ["--max-model-len=512"]})["instances"]
    assert inst["kv_cache"]["block_size"] == 784
    assert inst["kv_cache"]["gpu_kv_cache_tokens"] == 38400
    text = catalog_vars["d3_catalog"]["d3"]["architecture"]["text"]
    mem = SIM.startup_memory({"text_config": text}, mib_of_gb(catalog_vars["d3_catalog"]["d3"]["weights_fp8_gb"]) * 2**20, 2, 0.95, L4 * 2**20, 512, fp8=True)
    assert (mem["tokens"], round(mem["concurrency"], 2)) == (38400, round(inst["kv_cache"]["max_concurrency"], 2))
    # at the block size and above, the block counts
    fig = kv_cache_figures(catalog_vars["d3_catalog"]["d3"]["architecture"], {"--max-model-len": 784, "--gpu-memory-utilization": 0.95}, L4, 2, 2 * 13312)
    assert fig["gpu_kv_cache_tokens"] == fig["num_gpu_blocks"] // 4 * 784


# -- 3. max_num_batched_tokens below max_num_seqs --------------------------------------------------------------------
SEQS = "max_num_batched_tokens (128) must be greater than or equal to max_num_seqs (256)."


def test_fewer_batched_tokens_than_max_num_seqs_is_refused_in_vllms_words(catalog_vars: dict[str, Any]) -> None:
    """SchedulerConfig.verify_max_model_len: `if self.max_num_batched_tokens < self.max_num_seqs: raise ValueError`,
    chunked prefill or not; with chunked prefill --max-num-batched-tokens may be below --max-model-len."""
    args = ["--enable-chunked-prefill", "--max-num-batched-tokens=128", "--max-num-seqs=256"]
    result = plan(catalog_vars, 1, {"model": "d3-lite", "extra_args": args})
    assert len(result["errors"]) == 1
    assert f"d3-lite at TP 1 is refused by vLLM at startup: '{SEQS}' (vllm/config/scheduler.py). Fix: in d3_models[0].extra_args remove --max-num-seqs" in result["errors"][0]
    text = catalog_vars["d3_catalog"]["d3-lite"]["architecture"]["text"]
    mem = SIM.startup_memory({"text_config": text}, 2**30, 1, 0.25, L4 * 2**20, 8192, batched=128, chunked=True, max_num_seqs=256)
    assert mem["stop"] == ("ValueError", SEQS)


def test_without_max_num_seqs_vllm_lowers_it_to_the_batch(catalog_vars: dict[str, Any]) -> None:
    """_set_default_max_num_seqs_and_batched_tokens_args: an unset max_num_seqs is min(256, max_num_batched_tokens)."""
    args = ["--enable-chunked-prefill", "--max-num-batched-tokens=128"]
    (inst,) = plan(catalog_vars, 1, {"model": "d3-lite", "extra_args": args})["instances"]
    assert inst["kv_cache"]["max_num_batched_tokens"] == 128
    text = catalog_vars["d3_catalog"]["d3-lite"]["architecture"]["text"]
    mem = SIM.startup_memory({"text_config": text}, 2**30, 1, 0.25, L4 * 2**20, 8192, batched=128, chunked=True)
    assert (mem["stop"], mem["max_num_seqs"]) == (None, 128)


def test_max_num_seqs_caps_the_default_batch_and_is_checked_without_chunked_prefill(catalog_vars: dict[str, Any]) -> None:
    arch = catalog_vars["d3_catalog"]["d3-lite"]["architecture"]
    # max(512, 2048) capped at 2 x 512
    fig = kv_cache_figures(arch, {"--max-model-len": 512, "--gpu-memory-utilization": 0.25, "--max-num-seqs": 2}, L4, 1)
    assert (fig["max_num_batched_tokens"], fig["max_num_seqs"], fig["refusal"]) == (1024, 2, None)
    fig = kv_cache_figures(arch, {"--max-model-len": 128, "--gpu-memory-utilization": 0.25, "--max-num-seqs": 256,
                                  "--max-num-batched-tokens": 200}, L4, 1)  # fmt: skip
    assert fig["refusal"] == {"kind": "max_num_seqs", "message": "max_num_batched_tokens (200) must be greater than or equal to max_num_seqs (256)."}
    mem = SIM.startup_memory({"text_config": arch["text"]}, 0, 1, 0.25, L4 * 2**20, 128, batched=200, max_num_seqs=256)
    assert mem["stop"] == ("ValueError", fig["refusal"]["message"])
    mem = SIM.startup_memory({"text_config": arch["text"]}, 0, 1, 0.25, L4 * 2**20, 512, max_num_seqs=2)
    assert (mem["max_num_batched_tokens"], mem["stop"]) == (1024, None)


# -- 4. processes sharing a GPU: each holds its share and a CUDA context -------------------------------------------------
def edges(count: int, util: str) -> list[dict[str, Any]]:
    return [{"model": "d3-edge", "name": f"e{i}", "gpus": [0], "extra_args": [f"--gpu-memory-utilization={util}"]}
            for i in range(count)]  # fmt: skip


def mib_text(nbytes: int) -> str:
    return str(nbytes // 2**20) if nbytes % 2**20 == 0 else f"{nbytes / 2**20:.2f}"


@pytest.mark.parametrize(("count", "util", "total"), [(6, "0.15", "23376"), (4, "0.23", "22803.20")])
def test_shares_within_the_cap_that_do_not_fit_beside_the_contexts(catalog_vars: dict[str, Any], count: int, util: str, total: int) -> None:
    """Six d3-edge at 0.15 (0.90 in shares) or four at 0.23 (0.92) pass d3_gpu_share_cap 0.92, but the shares and one
    CUDA context per process pass the 22,560 MiB torch sees: the planner refuses the last, in its own words and with
    its arithmetic. Not vLLM's startup refusal: memory_profiling empties the cache after the profile run, so the
    started ones hold less than their shares and vLLM may start it; under load they grow towards their shares."""
    (error,) = plan(catalog_vars, 1, *edges(count, util))["errors"]
    share_b = int(L4 * 2**20 * float(util))  # request_memory's bytes; the message prints MiB to two decimals
    share, others = mib_text(share_b), mib_text((count - 1) * share_b)
    assert (f"d3_models[{count - 1}] (e{count - 1}): its share does not fit on GPU 0 beside e0 {share} MiB ({util}), " in error
            and f": {others} MiB of their shares + its {share} MiB + {count * 512} MiB of CUDA contexts ({count} x 512) = "
            f"{total} MiB" in error
            and ", more than the 22560 MiB torch sees (this is the planner's refusal, not vLLM's startup check: a "
            "started instance frees its profile run's activations and holds less than its share, so vLLM may start this "
            "one, but under load each instance grows towards its share and the GPU runs out of memory)" in error)  # fmt: skip
    assert "Free memory on device" not in error  # not vLLM's words: vLLM would not print them here
    assert float(total) > L4
    # one fewer fits: 22,560 - 512 - (count - 2) x (share + 512) covers the share
    assert plan(catalog_vars, 1, *edges(count - 1, util))["errors"] == []


def test_the_share_refusal_prints_the_arithmetic_it_checks(catalog_vars: dict[str, Any]) -> None:
    """The check compares bytes (request_memory: int(total x util)); the message once summed whole-MiB shares, so
    three d3-edge at 0.2273 and one at 0.22733 were refused with "= 22557 MiB, more than the 22560 MiB" (third
    review). The message now prints the same byte sum, in MiB to two decimals and in bytes."""
    items = [{"model": "d3-edge", "name": f"e{i}", "gpus": [0], "extra_args": [f"--gpu-memory-utilization={u}"]}
             for i, u in enumerate(("0.2273", "0.2273", "0.2273", "0.22733"))]  # fmt: skip
    (error,) = plan(catalog_vars, 1, *items)["errors"]
    mine, theirs, total = int(L4 * 2**20 * 0.22733), 3 * int(L4 * 2**20 * 0.2273), L4 * 2**20
    assert mine + theirs + 4 * 512 * 2**20 > total  # what the check found
    assert ("beside e0 5127.89 MiB (0.2273), e1 5127.89 MiB (0.2273), e2 5127.89 MiB (0.2273): 15383.66 MiB of their "
            "shares + its 5128.56 MiB + 2048 MiB of CUDA contexts (4 x 512) = 22560.23 MiB (in bytes: "
            f"{theirs} + {mine} + {4 * 512 * 2**20} = {mine + theirs + 4 * 512 * 2**20} > {total}), more than the 22560 "
            "MiB torch sees" in error)  # fmt: skip
    assert "22557" not in error


def test_the_cap_refusal_prints_the_fractions_it_compares(catalog_vars: dict[str, Any]) -> None:
    """d3_gpu_share_cap compares the fractions (0.46 + 0.46001 > 0.92); the message once summed whole-MiB floors and
    printed the shares to 4 decimals: "... (--gpu-memory-utilization 0.46 x 22560 MiB) ... makes 20754 MiB, over the
    20755 MiB" (fourth review). It now prints the sum it compares, every digit, and its MiB exactly."""
    items = [{"model": "d3-edge", "name": f"e{i}", "gpus": [0], "extra_args": [f"--gpu-memory-utilization={u}"]}
             for i, u in enumerate(("0.46", "0.46001"))]  # fmt: skip
    (error,) = plan(catalog_vars, 1, *items)["errors"]
    assert error.startswith(
        "host h: d3_models[1] (e1): VRAM over budget on GPU 0: its share of 10377.83 MiB (--gpu-memory-utilization 0.46001 "
        "x 22560 MiB) on top of e0 10377.60 MiB (0.46) makes 0.46 + 0.46001 = 0.92001 of the GPU (20755.4256 MiB), over "
        "the 0.92 (20755.2 MiB) that d3_gpu_share_cap allows on a shared GPU (vLLM needs its share free at start, and the "
        "driver keeps some). Fix: ")  # fmt: skip
    # a share already on the GPU reads as given too (it printed 0.22733 as 0.2273)
    items = [{"model": "d3-edge", "name": f"e{i}", "gpus": [0], "extra_args": [f"--gpu-memory-utilization={u}"]}
             for i, u in enumerate(("0.22733", "0.2273", "0.2273", "0.2273"))]  # fmt: skip
    (error,) = plan(catalog_vars, 1, *items)["errors"]
    assert "beside e0 5128.56 MiB (0.22733), e1 5127.89 MiB (0.2273), e2 5127.89 MiB (0.2273): " in error


def test_automatic_placement_uses_vllms_free_memory_too(catalog_vars: dict[str, Any]) -> None:
    items = [{"model": "d3-edge", "name": f"e{i}", "extra_args": ["--gpu-memory-utilization=0.15"]} for i in range(6)]
    (error,) = plan(catalog_vars, 1, *items)["errors"]
    assert "d3_models[5] (e5): its share does not fit on GPU 0 beside e0 3384 MiB (0.15)" in error
    # what is left (0.11) holds d3-edge's profile run (1008 MiB at 32,768 tokens, its MLP's peak)
    assert "Fix: set --gpu-memory-utilization=0.11 in d3_models[5].extra_args (what is left), or move d3_models[5]" in error
    assert [i["gpus"] for i in plan(catalog_vars, 2, *items)["instances"]] == [[0]] * 5 + [[1]]


def test_the_budget_lines_print_vllms_total(catalog_vars: dict[str, Any]) -> None:
    result = plan(catalog_vars, 1, *edges(5, "0.15"))
    (gpu,) = result["gpus"]
    assert (gpu["memory_total_mib"], gpu["vllm_total_mib"], gpu["budget_mib"], gpu["cuda_context_mib"]) == (23034, 22560, 5 * 3384, 5 * 512)
    assert gpu["free_mib"] == 22560 - 5 * 3384 - 5 * 512
    refused = plan(catalog_vars, 1, *edges(6, "0.15"))
    assert refused["partial"][-1].startswith("GPU 0: 16920/22560 MiB in shares (")


def test_the_lab_inventorys_shared_gpus_still_plan(catalog_vars: dict[str, Any]) -> None:
    """lab/vars/lab.yml's hosts (4 L4s each, lab_hosts_gpus_default): d3-lab-host1 shares a GPU between d3-mini
    and d3-edge (0.45 + 0.25), d3-lab-host2 one among d3-nano and the two d3-lite (0.35 + 0.25 + 0.25)."""
    import yaml

    lab = yaml.safe_load((ROOT / "lab/vars/lab.yml").read_text())
    for host, models in lab["lab_hosts_models"].items():
        result = plan(catalog_vars, 4, *models)
        assert result["errors"] == [], host
        shared = [g for g in result["gpus"] if len(g["budget"]) > 1]
        assert shared and all(g["free_mib"] >= 0 for g in shared), host


# -- 7. the simulator sees memory as torch does ----------------------------------------------------------------------
def sim_start(monkeypatch: pytest.MonkeyPatch, used_mib: int, util: str) -> Any:
    """check_and_plan for d3-lite on one L4 whose nvidia-smi says used_mib (other processes: shares and contexts)."""
    l4 = SIM.Gpu(0, "NVIDIA L4", "GPU-0", 23034, used_mib, "580.95.05", "8.9", free_mib=23034 - 434 - used_mib)
    monkeypatch.setattr(SIM, "CLAIM", SIM.GpuClaim("/nonexistent-claims"))  # unpublished: free_mib takes its own off
    monkeypatch.setattr(SIM, "query_gpus", lambda: [l4])
    config = {"text_config": {**SIM.QWEN3_5_DEFAULTS, "num_hidden_layers": 24, "hidden_size": 1024, "intermediate_size": 3584,
                              "num_attention_heads": 8, "num_key_value_heads": 2, "linear_num_value_heads": 16}}  # fmt: skip
    model = SIM.Model("vllm-sr/d3-lite", Path("/x"), config, 2 * 10**9)
    args = SIM.parse_args(["--model", model.repo, "--max-model-len", "8192", "--enforce-eager", "--gpu-memory-utilization", util])
    return SIM.check_and_plan(args, [l4], model, lambda _: None)


def test_a_second_half_share_is_refused_as_vllm_refuses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first 0.5 holds 11,280 MiB of torch's 22,560 and a 512 MiB context; the second's own context leaves
    10,256 MiB free for its 11,280 (nvidia-smi's total, 23,034 less its 434 reserved, said 11,320: enough)."""
    with pytest.raises(SIM.SimExit) as err:
        sim_start(monkeypatch, 11280 + 512, "0.5")
    assert (err.value.exc_type, err.value.message) == ("ValueError",
        "Free memory on device cuda:0 (10.02/22.03 GiB) on startup is less than desired GPU memory utilization (0.5, 11.02 GiB). "
        "Decrease GPU memory utilization or reduce GPU memory used by other processes.")  # fmt: skip
    # 0.45 beside it fits: 10,256 MiB free for 10,152; and the claim it holds is its share and its context
    sim_start(monkeypatch, 11280 + 512, "0.45")
    assert SIM.CLAIM.current == {"GPU-0": 10152 + 512}


# -- 6. the simulator's parser: vLLM's human_readable_int, and the KV dtypes -------------------------------------------
@pytest.mark.parametrize(("text", "value"), [("8192", 8192), (" 8k ", 8000), ("25.6k", 25600), ("1K", 1024), ("2G", 2 * 2**30),
                                             ("1.5g", 1_500_000_000), ("1t", 10**12), ("1T", 2**40)])  # fmt: skip
def test_lengths_parse_as_vllms_human_readable_int(text: str, value: int) -> None:
    assert SIM.parse_len(text) == value


@pytest.mark.parametrize("text", ["1.5G", "1.5K", "8 k", "x", "1.5"])
def test_what_vllms_human_readable_int_refuses(text: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        SIM.parse_len(text)


def test_the_simulator_takes_float16_kv_cache_as_two_bytes() -> None:
    args = SIM.parse_args(["--model", "x", "--kv-cache-dtype", "float16"])
    config = {"text_config": dict(SIM.QWEN3_5_DEFAULTS)}
    assert SIM.kv_layout(config, args.kv_cache_dtype, 1) == SIM.kv_layout(config, "auto", 1)


# -- the second review: flags that change vLLM's accounting, and --max-model-len auto ------------------------------------
UNMODELLED = [["--block-size=32"], ["--mamba-ssm-cache-dtype", "float16"], ["--mamba-cache-dtype=float32"],
              ["--performance-mode", "throughput"], ["--num-gpu-blocks-override=100"], ["--no-enable-chunked-prefill"],
              ["--skip-mm-profiling"], ["--language-model-only"], ["--mm-encoder-tp-mode=data"],
              ["--num-gpu-blocks=100"], ["--block_size", "32"],
              # the third review: they passed through and changed the accounting
              ["--dtype", "float16"], ["--cpu-offload-gb", "2"], ["--hf-overrides", '{"text_config": {}}'],
              ["--mamba-block-size=1024"], ["--mamba-cache-mode", "align"], ["--pooler-config", '{"pooling_type": "LAST"}'],
              ["--runner", "generate"], ["--convert=embed"], ["--compilation-config", '{"mode": 3}'],
              ["--compilation-config.mode=3"], ["--optimization-level=3"], ["--speculative-config", "{}"],
              # the fourth review: the mirror of --language-model-only, and weight offloading beside --cpu-offload-gb
              ["--mm-encoder-only"], ["--mm-encoder-o"], ["--offload-group-size", "8"], ["--offload-num-in-group=2"],
              ["--offload-prefetch-step", "2"], ["--offload-params", "experts"], ["--cpu-offload-params", "experts"],
              ["--offload-backend", "prefetch"], ["--offload_backend=uva"],
              # the fourth review's leftover: KV cache offloading sets a KV connector (vllm/config/vllm.py)
              ["--kv-offloading-size", "8"], ["--kv_offloading_size=8"], ["--kv-offloading-backend", "native"],
              ["--kv-transfer-config", '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}']]  # fmt: skip


@pytest.mark.parametrize("args", UNMODELLED, ids=[a[0] for a in UNMODELLED])
def test_a_flag_that_changes_vllms_accounting_is_refused_by_name(catalog_vars: dict[str, Any], args: list[str]) -> None:
    """The planner would print figures it cannot predict: it names the flag (as vLLM's parser reads it: a unique
    prefix, '_' for '-') and says it does not model it."""
    from d3_inputs import canonical_flag
    from d3_planner import KNOWN_FLAGS, UNMODELLED_FLAGS

    flag, _, key = canonical_flag(args[0], KNOWN_FLAGS)
    assert flag in UNMODELLED_FLAGS
    (error,) = plan(catalog_vars, 1, {"model": "d3-edge", "extra_args": args})["errors"]
    assert error == (f"host h: d3_models[0] (d3-edge): extra_args sets {flag}, which changes {UNMODELLED_FLAGS[flag]}; the "
                     "planner does not model it, so it cannot predict vLLM's startup figures or refusals with it. Fix: "
                     f"remove {flag}{'.' + key if key else ''} from d3_models[0].extra_args")  # fmt: skip


@pytest.mark.parametrize("args", [["--disable-hybrid-kv-cache-manager"], ["--disable_hybrid_kv_cache_manager"],
                                  ["--disable-hybrid", "--enforce-eager"]])  # fmt: skip
def test_disabling_the_hybrid_kv_cache_manager_is_refused_in_vllms_words(catalog_vars: dict[str, Any], args: list[str]) -> None:
    """Every D3 size mixes Gated DeltaNet layers (MambaSpec) with full attention (FullAttentionSpec): without the hybrid
    KV cache manager vLLM's unify_hybrid_kv_cache_specs (vllm/v1/core/kv_cache_utils.py) finds no one spec and raises
    (fourth review). The planner says so, with vLLM's message and the size's own layer counts."""
    for model, name, full, linear in (("d3-edge", "d3-edge", 3, 9), ("d3", "d3-27b", 16, 48)):
        (error,) = plan(catalog_vars, 2, {"model": model, "extra_args": args})["errors"]
        assert error == (f"host h: d3_models[0] ({name}): extra_args sets --disable-hybrid-kv-cache-manager, with which "
                         f"vLLM refuses to start {model}: 'ValueError: Hybrid KV cache manager is disabled but failed to "
                         "convert the KV cache specs to one unified type.' (unify_hybrid_kv_cache_specs, "
                         f"vllm/v1/core/kv_cache_utils.py: its {linear} Gated DeltaNet layers (MambaSpec) and {full} "
                         "full-attention layers (FullAttentionSpec) convert to no one spec). Fix: remove --disable-hybrid-kv-cache-manager from "
                         "d3_models[0].extra_args (the planner counts vLLM's hybrid KV cache manager)")  # fmt: skip
    # a size of one layer type would convert: there the flag is only not modelled (the planner counts two groups)
    import copy

    from d3_planner import UNMODELLED_FLAGS

    uniform = copy.deepcopy(catalog_vars)
    uniform["d3_catalog"]["d3-edge"]["architecture"]["text"]["full_attention_interval"] = 1
    (error,) = plan(uniform, 1, {"model": "d3-edge", "extra_args": args})["errors"]
    assert ("extra_args sets --disable-hybrid-kv-cache-manager, which changes "
            f"{UNMODELLED_FLAGS['--disable-hybrid-kv-cache-manager']}; the planner does not model it") in error  # fmt: skip


@pytest.mark.parametrize(("args", "flag"), [(["-O3"], "--optimization-level"), (["-O", "0"], "--optimization-level"),
                                           (["-cc.mode=3"], "--compilation-config"),
                                           (["-cc", '{"mode": 3}'], "--compilation-config"),
                                           (["-sc", '{"method":"mtp","num_speculative_tokens":2}'], "--speculative-config"),
                                           (['-sc={"method": "mtp"}'], "--speculative-config"),
                                           (["-sc.method=mtp", "-sc.num_speculative_tokens", "2"], "--speculative-config")])  # fmt: skip
def test_the_single_dash_spellings_are_refused_too(catalog_vars: dict[str, Any], args: list[str], flag: str) -> None:
    """vLLM's -O and -cc (VllmConfig.compilation_config's docstring: -cc.mode=3, -cc='{"mode":3}') and -sc
    (`add_argument("--speculative-config", "-sc", ...)`, vllm/engine/arg_utils.py; -sc.KEY, as FlexibleArgumentParser
    reads a JSON key after a single-dash name) name the same unmodelled settings: d3-edge with an MTP draft was planned
    (fourth review)."""
    from d3_planner import UNMODELLED_FLAGS

    (error,) = plan(catalog_vars, 1, {"model": "d3-edge", "extra_args": args})["errors"]
    assert f"extra_args sets {flag}, which changes {UNMODELLED_FLAGS[flag]}; the planner does not model it" in error
    assert f"Fix: remove {args[0].split('=')[0]} from d3_models[0].extra_args" in error


@pytest.mark.parametrize("args", [["--dtype", "bfloat16"], ["--dtype=auto"], ["--runner", "pooling"], ["--runner=auto"],
                                  ["--convert", "none"], ["--offload-backend=auto"], ["--limit-mm-per-prompt", '{"image": 0}'],
                                  ["--limit-mm-per-prompt", '{"image": {"count": 1, "width": 448, "height": 448}, "video": 0}'],
                                  ["--limit-mm-per-prompt.video=0"], ["--limit-mm-per-prompt.image.count=0"],
                                  ["--limit-mm-per-prompt.image.width=448", "--limit-mm-per-prompt.video=0"]])  # fmt: skip
def test_values_the_planner_already_assumes_are_planned(catalog_vars: dict[str, Any], args: list[str]) -> None:
    """config.json's dtype, the pooling runner of a classification model, no conversion, and limits that keep the
    vision tower (one modality, size hints: domain facts 2.3 suggests the image hint) change nothing the planner
    counts; they reach vLLM as given."""
    result = plan(catalog_vars, 1, {"model": "d3-edge", "extra_args": args})
    assert result["errors"] == []
    tokens = [part for arg in args for part in arg.split("=", 1)]
    assert result["instances"][0]["args"][-len(tokens):] == tokens


@pytest.mark.parametrize("args", [["--limit-mm-per-prompt", '{"image": 0, "video": 0}'],
                                  ["--limit-mm-per-prompt", '{"image": {"count": 0}, "video": 0}'],
                                  ["--limit-mm-per-prompt.image=0", "--limit-mm-per-prompt.video", "0"],
                                  ["--limit_mm", '{"video": 0, "image": 0}'],
                                  # the fourth review: vLLM's parser nests a dotted key (--json-arg.key2.key3 value)
                                  ["--limit-mm-per-prompt.image.count=0", "--limit-mm-per-prompt.video=0"],
                                  ["--limit-mm-per-prompt.image.count", "0", "--limit-mm-per-prompt.video.count=0"],
                                  ["--limit-mm-per-prompt", '{"image": 0}', "--limit-mm-per-prompt.video.count=0"]])  # fmt: skip
def test_limits_that_skip_the_vision_tower_are_refused_like_language_model_only(catalog_vars: dict[str, Any], args: list[str]) -> None:
    """Every modality of Qwen3.5's tower (image, video) at 0 builds no vision tower, as --language-model-only does
    (vLLM: "setting all multimodal modalities to 0 using --language-model-only"): its TP checks and weights go, which
    the planner does not model (d3-edge at TP 8 would otherwise be refused for its 12 vision heads)."""
    for extra in ([], ["--tensor-parallel-size=8"]):
        (error,) = plan(catalog_vars, 1, {"model": "d3-edge", "extra_args": [*args, *extra]})["errors"]
        assert error == ("host h: d3_models[0] (d3-edge): extra_args sets --limit-mm-per-prompt to 0 for image and video, "
                         "which builds no vision tower, as --language-model-only does (its TP checks, its weights in GPU "
                         "memory); the planner does not model it, so it cannot predict vLLM's startup figures or refusals "
                         "with it. Fix: remove the 0 limits from d3_models[0].extra_args (a limit above 0, or size hints, "
                         "are planned)")  # fmt: skip


def test_a_dotted_limit_nests_as_vllms_parser_reads_it() -> None:
    """FlexibleArgumentParser (vllm/utils/argparse_utils.py): `--json-arg.key2.key3 value` is {"key2": {"key3": value}};
    MultiModalConfig takes a mapping's "count" (999 when absent), so image.count=0 is an image limit of 0 (it was read
    as a modality named "image.count")."""
    from d3_planner import mm_limits

    assert mm_limits([("--limit-mm-per-prompt.image.count", "0"), ("--limit-mm-per-prompt.video", "0")]) == {"image": 0, "video": 0}
    assert mm_limits([("--limit-mm-per-prompt.image.width", "448"), ("--limit-mm-per-prompt.image.count", "2")]) == {"image": 2}
    assert mm_limits([("--limit-mm-per-prompt.image.width", "448")]) == {"image": 999}
    assert mm_limits([("--limit-mm-per-prompt", '{"image": {"count": 0, "width": 448}}')]) == {"image": 0}


@pytest.mark.parametrize("value", ["auto", "-1", "AUTO"])
def test_max_model_len_auto_asks_for_a_number_and_says_why(catalog_vars: dict[str, Any], value: str) -> None:
    """vLLM accepts auto / -1 (_auto_fit_max_model_len fits the length at startup); the planner's figures start from
    the length, so it asks for an explicit one instead of saying the value does not parse."""
    (error,) = plan(catalog_vars, 1, {"model": "d3-edge", "extra_args": [f"--max-model-len={value}"]})["errors"]
    assert error == (f"host h: d3_models[0] (d3-edge): --max-model-len {value}: vLLM would fit the length to the memory "
                     "left at startup (_auto_fit_max_model_len), but the planner needs an explicit number: the profile "
                     "run's batch, the KV cache figures and the refusals all depend on it. Fix: give a number in "
                     "d3_models[0].extra_args, e.g. --max-model-len=32768 (the catalog's)")  # fmt: skip
    assert "does not parse" in plan(catalog_vars, 1, {"model": "d3-edge", "extra_args": ["--max-model-len=long"]})["errors"][0]


def test_the_simulator_makes_no_gdn_convolution_output_in_the_profile_run(catalog_vars: dict[str, Any]) -> None:
    """The simulator's own reading of GatedDeltaNetAttention.forward (the profile run returns from _forward_core before
    the convolution): a wide GDN layer holds in_proj_qkvz's output, the core output and out_proj's, no conv output."""
    text = catalog_vars["d3_catalog"]["d3-edge"]["architecture"]["text"]
    assert SIM.profile_activation_bytes_per_token({"text_config": text}, 1, True) == 32256  # d3-edge: its MLP's
    wide = {**text, "linear_num_key_heads": 64, "linear_num_value_heads": 64}  # key and value dims 8,192 each
    residual = 2 * 1024 * 2
    assert SIM.profile_activation_bytes_per_token({"text_config": wide}, 1, False) == residual + (4 * 8192 + 8192 + 1024) * 2


# -- the third review: the default max_num_seqs on a GPU of 70 GiB or more -------------------------------------------
@pytest.mark.parametrize(("total_mib", "name", "seqs"), [(80 * 1024, "NVIDIA H100 80GB HBM3", 1024), (70 * 1024, "", 1024),
                                                      (70 * 1024 - 1, "", 256), (L4, "NVIDIA L4", 256),
                                                      (80 * 1024, "NVIDIA A100-SXM4-80GB", 256),
                                                      (80 * 1024, "nvidia a100 80gb pcie", 256)])  # fmt: skip
def test_the_default_max_num_seqs_follows_the_gpus_memory_on_both_sides(catalog_vars: dict[str, Any], total_mib: int,
                                                                         name: str, seqs: int) -> None:  # fmt: skip
    """EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py): `vllm serve` defaults max_num_seqs to 1024 when
    `device_memory >= 70 * GiB_bytes and "a100" not in device_name` (the name lowercased), else 256;
    _set_default_max_num_seqs_and_batched_tokens_args then takes min(max_num_seqs, max_num_batched_tokens). The planner
    and the simulator, each from that source (the A100 exception since the fourth review)."""
    arch = catalog_vars["d3_catalog"]["d3-edge"]["architecture"]
    flags = {"--max-model-len": 4, "--gpu-memory-utilization": 0.9, "--enable-chunked-prefill": True, "gpu_name": name}
    fig = kv_cache_figures(arch, {**flags, "--max-num-batched-tokens": 4096}, total_mib, 1)
    mem = SIM.startup_memory({"text_config": arch["text"]}, 0, 1, 0.9, total_mib * 2**20, 4, batched=4096, chunked=True,
                             device_name=name)  # fmt: skip
    assert fig["max_num_seqs"] == mem["max_num_seqs"] == seqs
    # the default batch, capped at max_num_seqs x max_model_len (8192 with the large defaults, 2048 without)
    default = kv_cache_figures(arch, flags, total_mib, 1)["max_num_batched_tokens"]
    assert default == SIM.startup_memory({"text_config": arch["text"]}, 0, 1, 0.9, total_mib * 2**20, 4, chunked=True,
                                         device_name=name)["max_num_batched_tokens"] == min(seqs * 4, 8192 if seqs == 1024 else 2048)  # fmt: skip


A100 = {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920, "compute_cap": "8.0"}


def test_an_a100_80gb_is_planned_with_vllms_small_batch_defaults(catalog_vars: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The fourth review: d3-edge at 4,096 tokens on an A100-SXM4-80GB (81,920 MiB) profiles vLLM's 4,096 tokens
    (max(max_model_len, 2048) without chunked prefill), not the 8,192 of a large non-A100 GPU: 821,984 tokens, not
    816,544. The planner reads the name it is given; the simulator its first GPU's, as vLLM's get_device_name()."""
    def on(gpu: dict[str, Any]) -> dict[str, Any]:
        result = d3_plan([{"model": "d3-edge", "extra_args": ["--max-model-len=4096"]}], catalog_vars["d3_catalog"],
                         catalog_vars["d3_catalog_common"], [gpu], "h", {"api_key_set": True, "allow_non_l4": True})  # fmt: skip
        assert result["errors"] == []
        return result["instances"][0]["kv_cache"]

    a100 = on(A100)
    assert (a100["max_num_batched_tokens"], a100["gpu_kv_cache_tokens"]) == (4096, 821984)
    h100 = on({**A100, "name": "NVIDIA H100 80GB HBM3"})
    assert (h100["max_num_batched_tokens"], h100["gpu_kv_cache_tokens"]) == (8192, 816544)
    # the simulator's startup on that GPU logs the same figure
    gpu = SIM.Gpu(0, A100["name"], "GPU-0", 81920, 0, "580.95.05", "8.0")
    monkeypatch.setattr(SIM, "CLAIM", SIM.GpuClaim("/nonexistent-claims"))
    monkeypatch.setattr(SIM, "query_gpus", lambda: [gpu])
    weights = mib_of_gb(catalog_vars["d3_catalog"]["d3-edge"]["weights_fp8_gb"]) * 2**20
    model = SIM.Model("vllm-sr/d3-edge", Path("/x"), {"text_config": catalog_vars["d3_catalog"]["d3-edge"]["architecture"]["text"]},
                      2 * weights)  # fmt: skip
    args = SIM.parse_args(["--model", model.repo, "--max-model-len", "4096", "--enforce-eager", "--quantization", "fp8",
                           "--gpu-memory-utilization", "0.25"])  # fmt: skip
    assert SIM.check_and_plan(args, [gpu], model, lambda _: None).kv_tokens == 821984


def test_memory_taken_during_profiling_keeps_max_num_seqs(catalog_vars: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """check_and_plan recomputes the pool when another process allocated during the profile run (vLLM charges it to
    this instance); the recompute dropped --max-num-seqs, so at 512 tokens with chunked prefill and --max-num-seqs 2
    the default batch went from 2 x 512 = 1,024 to 2,048 tokens (fourth review: 181,760 -> 180,736 tokens in its
    case; here d3-edge at 0.25 beside 100 MiB taken, 177,664 -> 176,128). The simulator's own startup_memory with
    that neighbour's memory is what it must log."""
    others_mib = 100
    calls = []

    def query() -> list[Any]:  # nothing else on the GPU at the startup snapshot, 100 MiB more after the profile run
        calls.append(1)
        return [SIM.Gpu(0, "NVIDIA L4", "GPU-0", 23034, 0 if len(calls) == 1 else others_mib, "580.95.05", "8.9")]

    monkeypatch.setattr(SIM, "CLAIM", SIM.GpuClaim("/nonexistent-claims"))
    monkeypatch.setattr(SIM, "query_gpus", query)
    text = catalog_vars["d3_catalog"]["d3-edge"]["architecture"]["text"]
    weights = mib_of_gb(catalog_vars["d3_catalog"]["d3-edge"]["weights_fp8_gb"]) * 2**20
    model = SIM.Model("vllm-sr/d3-edge", Path("/x"), {"text_config": text}, 2 * weights)
    args = SIM.parse_args(["--model", model.repo, "--max-model-len", "512", "--enforce-eager", "--quantization", "fp8",
                           "--gpu-memory-utilization", "0.25", "--enable-chunked-prefill", "--max-num-seqs", "2"])  # fmt: skip
    plan_ = SIM.check_and_plan(args, [SIM.Gpu(0, "NVIDIA L4", "GPU-0", 23034, 0, "580.95.05", "8.9")], model, lambda _: None)
    assert len(calls) == 2  # the startup snapshot and the one after profiling
    expect = SIM.startup_memory({"text_config": text}, weights, 1, 0.25, L4 * 2**20, 512, chunked=True, fp8=True,
                                others=others_mib * 2**20, max_num_seqs=2)  # fmt: skip
    assert expect["max_num_batched_tokens"] == 1024
    assert plan_.kv_tokens == expect["tokens"] == 177664
    # what the recompute gave without --max-num-seqs: vLLM's 2,048-token batch
    assert SIM.startup_memory({"text_config": text}, weights, 1, 0.25, L4 * 2**20, 512, chunked=True, fp8=True,
                              others=others_mib * 2**20)["tokens"] == 176128  # fmt: skip
