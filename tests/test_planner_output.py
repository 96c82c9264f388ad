"""The planner's outputs word for word: a whole planned instance, the plan report, the GPU budget, the deployment
record's part, systemd quoting (what reaches ExecStart=/Environment= lines), and the small helpers."""

from __future__ import annotations

from typing import Any

import pytest
from d3_planner import (
    FilterModule,
    Options,
    PlanError,
    d3_command_line,
    d3_plan,
    d3_plan_report,
    host_gpus,
    split_args,
    state_instances,
    systemd_quote,
)

SHA = "0123456789abcdef0123456789abcdef01234567"


def plan(catalog_vars: dict[str, Any], models: list[Any], gpus: int = 1, **options: Any) -> dict[str, Any]:
    return d3_plan(models, catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], host_gpus(gpus), host="l4-a",
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
        "env": {"A": "1", "HF_HUB_OFFLINE": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        "shm_size": "2g", "weights_mib": 3815, "vram_need_mib_per_gpu": 5863, "variant": "bf16-fp8-online",
        "quant_method": None, "download_bytes": 9_400_000_000,
        "vram_arithmetic_mib_per_gpu": {"weights_mib": 3815, "runtime_mib": 2048, "kv_cache_mib": 1024, "encoder_probe_mib": 0,
                                        "total_mib": 6887},
        "measured_on_hardware": None,
        "hardware_note": "the field report's sizing table lists this size on one L4 (no run of it is recorded)",
        "health_url": "http://[::1]:9000/health", "start_after": [], "wait_ready": False,
    }]  # fmt: skip
    assert result["gpus"] == [
        {"index": 0, "name": "NVIDIA L4", "memory_total_mib": 23034,
         "budget": [{"instance": "d3-mini", "utilization": 0.45, "budget_mib": 10365}], "budget_mib": 10365, "free_mib": 12669},
        {"index": 1, "name": "NVIDIA L4", "memory_total_mib": 23034, "budget": [], "budget_mib": 0, "free_mib": 23034},
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
    common = "--net host --shm-size 2g img --model"
    assert d3_plan_report(result, "img") == [
        f"d3-mini: d3-mini (vllm-sr/d3-mini@{SHA}) on GPU 0, port 8000, unit d3-mini.service, needs 6887 MiB/GPU",
        "  variant bf16-fp8-online (no quantization_config), download 9.4 GB; per GPU: weights 3815 + runtime 2048 + KV cache 1024"
        " + encoder probe 0 = 6887 MiB",
        "  podman run --name d3-mini --device nvidia.com/gpu=0 -e HF_HUB_OFFLINE=1 -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        f"{common} vllm-sr/d3-mini --revision {SHA} --served-model-name d3-mini --host 127.0.0.1 --port 8000 "
        "--tensor-parallel-size 1 --max-model-len 32768 --gpu-memory-utilization 0.45 --quantization fp8 --enforce-eager",
        "d3-edge: d3-edge (vllm-sr/d3-edge@UNPINNED) on GPU 0, port 8001, unit d3-edge.service, needs 2812 MiB/GPU",
        "  variant bf16-fp8-online (no quantization_config), download 1.4 GB; per GPU: weights 572 + runtime 2048 + KV cache 192"
        " + encoder probe 0 = 2812 MiB",
        "  podman run --name d3-edge --device nvidia.com/gpu=0 -e HF_HUB_OFFLINE=1 -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        f"{common} vllm-sr/d3-edge --served-model-name d3-edge --host 127.0.0.1 --port 8001 "
        "--tensor-parallel-size 1 --max-model-len 32768 --gpu-memory-utilization 0.25 --quantization fp8 --enforce-eager",
        "GPU 0 NVIDIA L4: 16123/23034 MiB budgeted (d3-mini 10365 MiB, d3-edge 5758 MiB), 6911 MiB free",
    ]
    assert d3_plan_report(plan(catalog_vars, [], gpus=1)) == ["GPU 0 NVIDIA L4: 0/23034 MiB budgeted (idle), 23034 MiB free"]


def test_the_report_states_one_need_per_instance(catalog_vars: dict[str, Any]) -> None:
    """The first line's "needs N MiB/GPU" is the variant line's total (KV cache included), for every size."""
    for model in catalog_vars["d3_catalog"]:
        result = plan(catalog_vars, [{"model": model}], gpus=4)
        (inst,) = result["instances"]
        total = inst["vram_arithmetic_mib_per_gpu"]["total_mib"]
        first, variant = d3_plan_report(result)[:2]
        assert first.endswith(f", needs {total} MiB/GPU"), first
        assert variant.endswith(f" = {total} MiB"), variant


def test_report_of_a_default_variant_and_of_an_unmeasured_one() -> None:
    inst = {"name": "x", "model": "m", "hf_repo": "r/m", "revision": None, "gpus": [0, 1], "port": 8000, "unit": "x",
            "vram_need_mib_per_gpu": 1, "vram_arithmetic_mib_per_gpu": {"total_mib": 7}, "variant": "default",
            "measured_on_hardware": False, "hardware_note": "arithmetic only", "cdi_devices": [], "env": {}, "shm_size": "1g",
            "args": ["--a"]}  # fmt: skip
    assert d3_plan_report({"instances": [inst], "gpus": []}, "img") == [
        "x: m (r/m@UNPINNED) on GPU 0,1, port 8000, unit x.service, needs 7 MiB/GPU",  # the arithmetic's total
        "  NOT YET MEASURED ON HARDWARE: arithmetic only",
        "  podman run --name x --net host --shm-size 1g img --a",
    ]
    assert d3_plan_report({"instances": [{**inst, "variant": None, "measured_on_hardware": None}], "gpus": []})[1] == (
        "  podman run --name x --net host --shm-size 1g IMAGE --a")
    assert d3_command_line({**inst, "cdi_devices": ["nvidia.com/gpu=0"], "env": {"A": "1"}}) == (
        "podman run --name x --device nvidia.com/gpu=0 -e A=1 --net host --shm-size 1g IMAGE --a")


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


def test_split_args() -> None:
    assert split_args(["-tp", "2", "--a=b=c", "--flag", "--x", "--enforce-eager", "--last"]) == [
        ("--tensor-parallel-size", "2"), ("--a", "b=c"), ("--flag", None), ("--x", None), ("--enforce-eager", None),
        ("--last", None)]  # fmt: skip
    assert split_args(["-tp=4", "--max-num-seqs", 8]) == [("--tensor-parallel-size", "4"), ("--max-num-seqs", "8")]
    assert split_args(["--enforce-eager", "-1"]) == [("--enforce-eager", None), ("-1", None)]
    assert split_args(["--seed", "-1"]) == [("--seed", "-1")]
    with pytest.raises(ValueError) as refused:
        split_args(["--a", "b", "c"])
    assert str(refused.value) == "'c' is not a flag (extra_args items are --flag, --flag=value or --flag value)"


def test_formatting_of_shares_in_messages(catalog_vars: dict[str, Any]) -> None:
    for given, shown in (("0.5", "0.5"), ("1", "1"), ("0.12345", "0.1235"), ("1.0", "1")):
        result = plan(catalog_vars, [{"model": "d3-edge", "extra_args": [f"--gpu-memory-utilization={given}"]}])
        assert result["instances"][0]["args"][-5:-3] == ["--gpu-memory-utilization", given]
        flash = plan(catalog_vars, [{"model": "d3-flash", "gpus": [0]}, {"model": "d3-edge", "gpus": [0],
                                                                          "extra_args": [f"--gpu-memory-utilization={given}"]}])
        assert f"--gpu-memory-utilization {shown} on top of d3-flash (0.9)" in flash["errors"][0]


def test_options_and_helpers() -> None:
    with pytest.raises(PlanError) as unknown:
        Options.from_dict({"port_base": 1, "zzz": 2, "aaa": 3})
    assert str(unknown.value) == "unknown planner option(s): aaa, zzz"
    assert Options.from_dict(None) == Options()
    assert Options.from_dict({"port_base": 9}).port_base == 9
    assert (Options().gpu_share_cap, Options().vram_overhead_mib, Options().listen_address) == (0.92, 2048, "127.0.0.1")
    assert host_gpus(2, 100, "NVIDIA X") == [{"index": 0, "name": "NVIDIA X", "memory_total_mib": 100},
                                             {"index": 1, "name": "NVIDIA X", "memory_total_mib": 100}]
    assert host_gpus("1") == [{"index": 0, "name": "NVIDIA L4", "memory_total_mib": 23034}]  # type: ignore[arg-type]


def test_filter_plugin_exports() -> None:
    assert FilterModule().filters() == {"d3_plan": d3_plan, "d3_host_gpus": host_gpus, "d3_plan_report": d3_plan_report,
                                        "d3_state_instances": state_instances, "d3_systemd_quote": systemd_quote}
