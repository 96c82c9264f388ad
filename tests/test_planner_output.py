"""The planner's outputs word for word: a whole planned instance, the plan report, the GPU budget, the deployment
record's part, systemd quoting (what reaches ExecStart=/Environment= lines), and the small helpers."""

from __future__ import annotations

from typing import Any

import d3_render
import pytest
from d3_planner import (
    FilterModule,
    Options,
    PlanError,
    d3_plan,
    host_gpus,
    split_args,
    state_instances,
)
from d3_render import plan_report as d3_plan_report
from d3_render import podman_run, systemd_quote
from l4 import l4_gpus

SHA = "0123456789abcdef0123456789abcdef01234567"


def plan(catalog_vars: dict[str, Any], models: list[Any], gpus: int = 1, **options: Any) -> dict[str, Any]:
    options.setdefault("api_key_set", True)  # the key rule has its own tests (test_planner_hardening.py)
    return d3_plan(models, catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], l4_gpus(gpus), host="l4-a",
                   options=options)


def test_a_whole_instance(catalog_vars: dict[str, Any]) -> None:
    item = {"model": "d3-mini", "extra_args": ["--max-num-seqs", "4", "--trust-remote-code"], "env": {"A": 1}}
    result = plan(catalog_vars, [item], gpus=2, listen_address="::", port_base=9000)
    assert result["errors"] == []
    assert result["instances"] == [{
        "name": "d3-mini", "unit": "d3-mini", "model": "d3-mini", "hf_repo": "vllm-sr/d3-mini", "revision": None,
        "served_model_name": "d3-mini", "gpus": [0], "cdi_devices": ["nvidia.com/gpu=0"], "port": 9000,
        "tensor_parallel_size": 1, "gpu_memory_utilization": 0.45, "max_model_len": 32768,
        "args": ["--model", "vllm-sr/d3-mini", "--served-model-name", "d3-mini", "--host", "::", "--port", "9000",
                 "--tensor-parallel-size", "1", "--max-model-len", "32768", "--gpu-memory-utilization", "0.45",
                 "--quantization", "fp8", "--enforce-eager", "--max-num-seqs", "4", "--trust-remote-code"],
        "env": {"HF_HOME": "/root/.cache/huggingface", "A": "1", "HF_HUB_OFFLINE": "1",
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        "shm_size": "2g", "image": "IMAGE", "bind_address": "::", "url": "http://[::1]:9000",
        "hf_home": "/var/lib/d3/huggingface",
        "cache_path": "/var/lib/d3/huggingface/hub/models--vllm-sr--d3-mini/snapshots/UNPINNED",
        "volumes": ["/var/lib/d3/huggingface:/root/.cache/huggingface:ro"],
        "labels": {"io.d3-fleet.instance": "d3-mini", "io.d3-fleet.model": "d3-mini", "io.d3-fleet.revision": "unpinned"},
        "secret_env": "VLLM_API_KEY", "no_new_privileges": True, "capabilities": [],
        "weights_mib": 3815, "vram_need_mib_per_gpu": 7992, "variant": "bf16-fp8-online",
        "quant_method": None, "download_bytes": 9_400_000_000,
        "vram_arithmetic_mib_per_gpu": {"weights_mib": 3815, "activation_peak_mib": 2576, "non_torch_mib": 512,
                                        "encoder_probe_mib": 0, "requested_mib": 10152, "kv_pool_mib": 3234,
                                        "sequence_kv_mib": 1089, "total_mib": 7992},
        "kv_cache": {"gpu_kv_cache_tokens": 25872, "max_concurrency": 2.97, "block_size": 528, "max_num_batched_tokens": 32768,
                     "measured_on_hardware": False,
                     "note": "predicted from vLLM's source (docs/capacity.md); not yet measured on hardware; not modelled: "
                             "the vision encoder's own profiling, whether D3's attention is causal (and chunked prefill off), "
                             "the GDN state's dtype"},
        "measured_on_hardware": None,
        "hardware_note": "the field report's sizing table lists this size on one L4 (no run of it is recorded)",
        "health_url": "http://[::1]:9000/health", "start_after": [], "wait_ready": False,
    }]  # fmt: skip
    assert result["gpus"] == [
        {"index": 0, "name": "NVIDIA L4", "memory_total_mib": 23034, "vllm_total_mib": 22560,
         "budget": [{"instance": "d3-mini", "utilization": 0.45, "budget_mib": 10152}], "budget_mib": 10152,
         "cuda_context_mib": 512, "free_mib": 22560 - 10152 - 512},
        {"index": 1, "name": "NVIDIA L4", "memory_total_mib": 23034, "vllm_total_mib": 22560, "budget": [], "budget_mib": 0,
         "cuda_context_mib": 0, "free_mib": 22560},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("address", "url"),
    [("0.0.0.0", "http://127.0.0.1:8000/health"), ("127.0.0.1", "http://127.0.0.1:8000/health"),
     ("::1", "http://[::1]:8000/health"), ("10.0.0.5", "http://10.0.0.5:8000/health")],
)  # fmt: skip
def test_health_url_is_where_the_host_reaches_the_instance(catalog_vars: dict[str, Any], address: str, url: str) -> None:
    result = plan(catalog_vars, [{"model": "d3-edge"}], listen_address=address, host_addresses=["10.0.0.5"])
    assert result["instances"][0]["health_url"] == url


def test_plan_report_lines(catalog_vars: dict[str, Any]) -> None:
    result = plan(catalog_vars, [{"model": "d3-mini"}, {"model": "d3-edge"}], revisions={"d3-mini": SHA})

    def run(name: str, rev: str) -> str:
        return (f"  podman run --name {name} --pull never --device nvidia.com/gpu=0 --network host --shm-size 2g "
                "--security-opt label=disable --security-opt no-new-privileges --cap-drop all "
                "-v /var/lib/d3/huggingface:/root/.cache/huggingface:ro "
                "-e HF_HOME=/root/.cache/huggingface -e HF_HUB_OFFLINE=1 -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                f"--label io.d3-fleet.instance={name} --label io.d3-fleet.model={name} --label io.d3-fleet.revision={rev} "
                f"img --model vllm-sr/{name}")

    assert d3_plan_report(result, "img") == [
        f"d3-mini: d3-mini (vllm-sr/d3-mini@{SHA}) on GPU 0, port 8000, unit d3-mini.service, needs 7992 MiB/GPU of its "
        "10152 MiB share",
        "  per GPU: weights 3815 + profile-run peak 2576 + non-torch 512 + encoder probe 0 + one 32768-token sequence 1089 = "
        "7992 MiB; the share's rest is KV cache (3234 MiB in all)",
        "  vLLM will log: GPU KV cache size: 25,872 tokens; Maximum concurrency for 32,768 tokens per request: 2.97x "
        "(predicted from vLLM's source (docs/capacity.md); not yet measured on hardware; "
        "not modelled: the vision encoder's own profiling, whether D3's attention is causal (and chunked prefill off), "
        "the GDN state's dtype)",
        "  variant bf16-fp8-online (no quantization_config), download 9.4 GB",
        run("d3-mini", SHA) + f" --revision {SHA} --served-model-name d3-mini --host 127.0.0.1 --port 8000 "
        "--tensor-parallel-size 1 --max-model-len 32768 --gpu-memory-utilization 0.45 --quantization fp8 --enforce-eager",
        "d3-edge: d3-edge (vllm-sr/d3-edge@UNPINNED) on GPU 0, port 8001, unit d3-edge.service, needs 2296 MiB/GPU of its "
        "5640 MiB share",
        "  per GPU: weights 572 + profile-run peak 1008 + non-torch 512 + encoder probe 0 + one 32768-token sequence 204 = "
        "2296 MiB; the share's rest is KV cache (3547 MiB in all)",
        "  vLLM will log: GPU KV cache size: 151,232 tokens; Maximum concurrency for 32,768 tokens per request: 17.39x "
        "(predicted from vLLM's source (docs/capacity.md); not yet measured on hardware; "
        "not modelled: the vision encoder's own profiling, whether D3's attention is causal (and chunked prefill off), "
        "the GDN state's dtype)",
        "  variant bf16-fp8-online (no quantization_config), download 1.4 GB",
        run("d3-edge", "unpinned") + " --served-model-name d3-edge --host 127.0.0.1 --port 8001 "
        "--tensor-parallel-size 1 --max-model-len 32768 --gpu-memory-utilization 0.25 --quantization fp8 --enforce-eager",
        "GPU 0 NVIDIA L4: 15792/22560 MiB budgeted (d3-mini 10152 MiB, d3-edge 5640 MiB; MiB as vLLM sees the GPU), 1024 MiB "
        "of CUDA contexts, 5744 MiB free",
    ]
    assert d3_plan_report(plan(catalog_vars, [], gpus=1)) == [
        "GPU 0 NVIDIA L4: 0/22560 MiB budgeted (idle; MiB as vLLM sees the GPU), 0 MiB of CUDA contexts, 22560 MiB free"]
    # the plan's image unless the caller passes the resolved one; the secret only when named
    assert " IMAGE --model " in d3_plan_report(result)[4]
    assert " --secret k,type=env,target=VLLM_API_KEY --label " in d3_plan_report(result, "img", "k")[4]
    # capabilities given back follow the drop of all
    (inst,) = plan(catalog_vars, [{"model": "d3-edge"}], capabilities=["cap_sys_nice", "SYS_NICE", "IPC_LOCK"])["instances"]
    assert inst["capabilities"] == ["IPC_LOCK", "SYS_NICE"]
    assert " --cap-drop all --cap-add IPC_LOCK --cap-add SYS_NICE -v " in podman_run(inst)
    assert plan(catalog_vars, [{"model": "d3-edge"}], capabilities=["SYS NICE\n"])["errors"] == [
        "host l4-a: d3_container_capabilities: ['SYS NICE\\n'] is not a list of capability names (e.g. SYS_NICE). "
        "Fix: fix the inventory"]


def test_the_report_states_one_need_per_instance(catalog_vars: dict[str, Any]) -> None:
    """The first line's "needs N MiB/GPU" is the per-GPU line's total and the plan's vram_need_mib_per_gpu (one
    number, issue 23), for every size; the third line carries vLLM's two startup figures."""
    for model in catalog_vars["d3_catalog"]:
        result = plan(catalog_vars, [{"model": model}], gpus=4)
        (inst,) = result["instances"]
        a = inst["vram_arithmetic_mib_per_gpu"]
        total = a["total_mib"]
        assert total == inst["vram_need_mib_per_gpu"] == (
            a["weights_mib"] + a["activation_peak_mib"] + a["non_torch_mib"] + a["encoder_probe_mib"] + a["sequence_kv_mib"])
        first, per_gpu, logged = d3_plan_report(result)[:3]
        assert first.endswith(f", needs {total} MiB/GPU of its {a['requested_mib']} MiB share"), first
        assert f" = {total} MiB; the share's rest is KV cache ({a['kv_pool_mib']} MiB in all)" in per_gpu, per_gpu
        assert logged.startswith(f"  vLLM will log: GPU KV cache size: {inst['kv_cache']['gpu_kv_cache_tokens']:,} tokens;")
        assert "not yet measured on hardware" in logged


def test_report_of_a_default_variant_and_of_an_unmeasured_one() -> None:
    inst = {"name": "x", "model": "m", "hf_repo": "r/m", "revision": None, "gpus": [0, 1], "port": 8000, "unit": "x",
            "vram_need_mib_per_gpu": 1, "variant": "default", "max_model_len": 4096,
            "vram_arithmetic_mib_per_gpu": {"total_mib": 7, "requested_mib": 9, "weights_mib": 1, "activation_peak_mib": 2,
                                            "non_torch_mib": 1, "encoder_probe_mib": 0, "sequence_kv_mib": 3, "kv_pool_mib": 2},
            "kv_cache": {"gpu_kv_cache_tokens": 1234, "max_concurrency": 1.5, "note": "predicted"},
            "measured_on_hardware": False, "hardware_note": "arithmetic only", "cdi_devices": [], "env": {}, "shm_size": "1g",
            "args": ["--a"], "volumes": [], "labels": {}, "image": "IMAGE", "secret_env": "S"}  # fmt: skip
    bare = "  podman run --name x --pull never --network host --shm-size 1g --security-opt label=disable"
    assert d3_plan_report({"instances": [inst], "gpus": []}, "img") == [
        "x: m (r/m@UNPINNED) on GPU 0,1, port 8000, unit x.service, needs 7 MiB/GPU of its 9 MiB share",  # the arithmetic's
        "  per GPU: weights 1 + profile-run peak 2 + non-torch 1 + encoder probe 0 + one 4096-token sequence 3 = 7 MiB; the "
        "share's rest is KV cache (2 MiB in all)",
        "  vLLM will log: GPU KV cache size: 1,234 tokens; Maximum concurrency for 4,096 tokens per request: 1.50x (predicted)",
        "  NOT YET MEASURED ON HARDWARE: arithmetic only",
        bare + " img --a",
    ]
    assert d3_plan_report({"instances": [{**inst, "variant": None, "measured_on_hardware": None}], "gpus": []})[3] == (
        bare + " IMAGE --a")
    # shell quoting: a value with a space or a quote is one word for a shell
    assert podman_run({**inst, "cdi_devices": ["nvidia.com/gpu=0"], "env": {"A": "1 2"}, "args": ["--x", "it's"]}) == (
        "podman run --name x --pull never --device nvidia.com/gpu=0 --network host --shm-size 1g --security-opt "
        "label=disable -e 'A=1 2' IMAGE --x 'it'\"'\"'s'")


def test_state_instances_keeps_what_runs_where(catalog_vars: dict[str, Any]) -> None:
    result = plan(catalog_vars, [{"model": "d3-mini"}, {"model": "d3-edge", "port": 9000}], revisions={"d3-mini": SHA})
    assert state_instances(result["instances"]) == {
        "d3-mini": {"model": "d3-mini", "hf_repo": "vllm-sr/d3-mini", "revision": SHA, "port": 8000, "gpus": [0], "unit": "d3-mini"},
        "d3-edge": {"model": "d3-edge", "hf_repo": "vllm-sr/d3-edge", "revision": None, "port": 9000, "gpus": [0], "unit": "d3-edge"},
    }


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        ("plain", "plain"),
        ("x=y,z:/a@b+c_-.", "x=y,z:/a@b+c_-."),
        ("100%", "100%%"),  # %-specifiers
        ("$HOME", '"$$HOME"'),  # $VARIABLES
        ("a b", '"a b"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("tab\there", '"tab\there"'),
        ("", '""'),
        (42, "42"),
    ],
)
def test_systemd_quote(word: Any, quoted: str) -> None:
    assert systemd_quote(word) == quoted


@pytest.mark.parametrize("word", ["plain\n", "a\nExecStartPre=/bin/sh", "cr\r", "nul\x00"])
def test_systemd_quote_refuses_what_cannot_stay_on_one_unit_line(word: str) -> None:
    with pytest.raises(ValueError, match="line break or NUL"):
        systemd_quote(word)


def test_split_args() -> None:
    assert split_args(["-tp", "2", "--zz=b=c", "--flag", "--x", "--enforce-eager", "--last"]) == [
        ("--tensor-parallel-size", "2"), ("--zz", "b=c"), ("--flag", None), ("--x", None), ("--enforce-eager", None),
        ("--last", None)]  # fmt: skip
    assert split_args(["-tp=4", "--max-num-seqs", 8]) == [("--tensor-parallel-size", "4"), ("--max-num-seqs", "8")]
    assert split_args(["--enforce-eager", "-1"]) == [("--enforce-eager", None), ("-1", None)]
    assert split_args(["--seed", "-1"]) == [("--seed", "-1")]
    with pytest.raises(ValueError) as refused:
        split_args(["--a", "b", "c"])
    assert str(refused.value) == "'c' is not a flag (extra_args items are --flag, --flag=value or --flag value)"


def test_formatting_of_shares_in_messages(catalog_vars: dict[str, Any]) -> None:
    for given, shown in (("0.5", "0.5"), ("1", "1.0"), ("0.12345", "0.12345"), ("1.0", "1.0")):
        result = plan(catalog_vars, [{"model": "d3-edge", "extra_args": [f"--gpu-memory-utilization={given}"]}])
        if float(given) < 1:
            assert result["instances"][0]["args"][-5:-3] == ["--gpu-memory-utilization", given]
        else:  # the whole GPU leaves no room for the CUDA context: vLLM refuses (Worker.init_device)
            assert f"less than desired GPU memory utilization ({shown}, 22.03 GiB)" in result["errors"][0]
        flash = plan(catalog_vars, [{"model": "d3-flash", "gpus": [0]}, {"model": "d3-edge", "gpus": [0],
                                                                          "extra_args": [f"--gpu-memory-utilization={given}"]}])
        assert f"(--gpu-memory-utilization {shown} x 22560 MiB) on top of d3-flash 20304 MiB (0.9)" in flash["errors"][0]


def test_options_and_helpers() -> None:
    with pytest.raises(PlanError) as unknown:
        Options.from_dict({"port_base": 1, "zzz": 2, "aaa": 3})
    assert str(unknown.value) == "unknown planner option(s): aaa, zzz"
    assert Options.from_dict(None) == Options()
    assert Options.from_dict({"port_base": 9}).port_base == 9
    assert (Options().gpu_share_cap, Options().vram_overhead_mib, Options().listen_address) == (0.92, 512, "127.0.0.1")
    assert Options().min_concurrency == 1.0 and Options.from_dict({"min_concurrency": "2.5"}).min_concurrency == 2.5
    # None = not set in the inventory; numbers from an inventory may be strings
    assert Options.from_dict({"port_base": None, "gpu_share_cap": "0.5", "vram_overhead_mib": "10"}) == Options(
        gpu_share_cap=0.5, vram_overhead_mib=10)
    with pytest.raises(PlanError, match=r"^d3_port_base: 'x' is not a number$"):
        Options.from_dict({"port_base": "x"})
    assert host_gpus(2, 100, "NVIDIA X") == [{"index": 0, "name": "NVIDIA X", "memory_total_mib": 100},
                                             {"index": 1, "name": "NVIDIA X", "memory_total_mib": 100}]
    assert host_gpus("1", "23034", "NVIDIA L4") == [{"index": 0, "name": "NVIDIA L4", "memory_total_mib": 23034}]  # type: ignore[arg-type]


def test_filter_plugin_exports() -> None:
    assert FilterModule().filters() == {"d3_plan": d3_plan, "d3_host_gpus": host_gpus, "d3_state_instances": state_instances}
    # podman_args and systemd_quote are helpers of the others, not filters (no role calls them)
    assert d3_render.FilterModule().filters() == {
        "d3_podman_run": podman_run, "d3_quadlet_container": d3_render.quadlet_container,
        "d3_exec_lines": d3_render.exec_lines, "d3_plan_report": d3_plan_report}
