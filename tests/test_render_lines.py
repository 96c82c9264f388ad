"""d3_render line by line on a synthetic instance: the Quadlet [Container] lines, the classic unit's ExecStart= lines
(d3_exec_lines: no quick test reached them before, only the playbook tests of test_unit_files.py), the podman run
arguments, the defaults (no secret, the plan's image) and the report's download size at its rounding boundary."""

from __future__ import annotations

from typing import Any

import pytest
from d3_render import container_spec, exec_lines, plan_report, podman_args, quadlet_container, systemd_quote


def instance(**changes: Any) -> dict[str, Any]:
    inst = {
        "unit": "d3-x", "cdi_devices": ["nvidia.com/gpu=0", "nvidia.com/gpu=1"], "shm_size": "2g",
        "no_new_privileges": True, "capabilities": ["SYS_NICE"],
        "volumes": ["/var/lib/d3/hf:/root/.cache/huggingface:ro"], "env": {"A": "x y", "P": "50%"},
        "labels": {"io.d3-fleet.instance": "d3-x"}, "image": "IMAGE", "secret_env": "VLLM_API_KEY",
        "args": ["--model", "r/m", "--x", "a b", "$HOME"],
    }  # fmt: skip
    return {**inst, **changes}


HEAD = ["ContainerName=d3-x", "Pull=never", "AddDevice=nvidia.com/gpu=0", "AddDevice=nvidia.com/gpu=1", "Network=host",
        "ShmSize=2g", "SecurityLabelDisable=true", "NoNewPrivileges=true", "DropCapability=all",
        "AddCapability=SYS_NICE", "Volume=/var/lib/d3/hf:/root/.cache/huggingface:ro", 'Environment="A=x y"',
        "Environment=P=50%%"]  # fmt: skip
EXEC = 'Exec=--model r/m --x "a b" "$$HOME"'


def test_the_quadlet_lines_without_a_secret_name_the_plans_image() -> None:
    assert quadlet_container(instance()) == [*HEAD, "Label=io.d3-fleet.instance=d3-x", "Image=IMAGE", EXEC]
    # the defaults are those of an explicit empty secret and no resolved image
    assert quadlet_container(instance(), None, "") == quadlet_container(instance())


def test_the_quadlet_lines_with_the_resolved_image_and_a_secret() -> None:
    assert quadlet_container(instance(), "img@sha256:ab", "d3-key") == [
        *HEAD, "Secret=d3-key,type=env,target=VLLM_API_KEY", "Label=io.d3-fleet.instance=d3-x", "Image=img@sha256:ab",
        EXEC]  # fmt: skip


def test_the_quadlet_exec_line_quotes_each_argument_and_joins_them_with_one_space() -> None:
    assert quadlet_container(instance(args=["--a", "1"]))[-1] == "Exec=--a 1"
    assert quadlet_container(instance(args=["100%", 'say "hi"']))[-1] == 'Exec=100%% "say \\"hi\\""'
    assert quadlet_container(instance(args=[]))[-1] == "Exec="


def test_an_instance_without_hardening_keys_has_no_such_lines() -> None:
    inst = instance(no_new_privileges=False)
    del inst["capabilities"]
    keys = [line.split("=", 1)[0] for line in quadlet_container(inst)]
    assert keys == ["ContainerName", "Pull", "AddDevice", "AddDevice", "Network", "ShmSize", "SecurityLabelDisable",
                    "Volume", "Environment", "Environment", "Label", "Image", "Exec"]  # fmt: skip
    assert container_spec(instance(capabilities=[]))[8:10] == [("DropCapability", "all"), ("Volume", inst["volumes"][0])]


def test_container_spec_defaults_and_order() -> None:
    spec = container_spec(instance())
    assert [k for k, _ in spec][-2:] == ["Label", "Image"]
    assert ("Image", "IMAGE") in spec and not any(k == "Secret" for k, _ in spec)
    assert container_spec(instance()) == container_spec(instance(), None, "")
    assert ("Secret", "s,type=env,target=VLLM_API_KEY") in container_spec(instance(), "img", "s")
    assert ("Image", "img") in container_spec(instance(), "img", "s")


def test_podman_args_default_to_no_secret_and_the_plans_image() -> None:
    args = podman_args(instance())
    assert "--secret" not in args
    assert args == podman_args(instance(), None, "")
    assert args[-6:] == ["IMAGE", "--model", "r/m", "--x", "a b", "$HOME"]
    assert args[:4] == ["--name", "d3-x", "--pull", "never"]
    assert args[12:16] == ["--security-opt", "label=disable", "--security-opt", "no-new-privileges"]


def test_exec_lines_one_option_and_its_value_per_line_then_the_image_and_vllms_arguments() -> None:
    assert exec_lines(instance()) == [
        "--name d3-x", "--pull never", "--device nvidia.com/gpu=0", "--device nvidia.com/gpu=1", "--network host",
        "--shm-size 2g", "--security-opt label=disable", "--security-opt no-new-privileges", "--cap-drop all",
        "--cap-add SYS_NICE", "-v /var/lib/d3/hf:/root/.cache/huggingface:ro", '-e "A=x y"', "-e P=50%%",
        "--label io.d3-fleet.instance=d3-x", 'IMAGE --model r/m --x "a b" "$$HOME"',
    ]  # fmt: skip
    assert exec_lines(instance()) == exec_lines(instance(), None, "")


def test_exec_lines_with_the_resolved_image_and_a_secret() -> None:
    lines = exec_lines(instance(args=["--a"]), "img@sha256:ab", "d3-key")
    assert lines[-3:] == ["--secret d3-key,type=env,target=VLLM_API_KEY", "--label io.d3-fleet.instance=d3-x",
                          "img@sha256:ab --a"]  # fmt: skip
    # no vLLM arguments: the last line is the image alone
    assert exec_lines(instance(args=[]))[-2:] == ["--label io.d3-fleet.instance=d3-x", "IMAGE"]


def test_the_quoting_refusal_names_the_word() -> None:
    with pytest.raises(ValueError) as refused:
        systemd_quote("a\nExecStartPre=/bin/sh")
    assert str(refused.value) == (
        "systemd quoting: 'a\\nExecStartPre=/bin/sh' contains a line break or NUL and cannot go into a unit file")
    with pytest.raises(ValueError, match=r"^systemd quoting: 'x\\nExec' contains a line break"):
        exec_lines(instance(args=["x\nExec"]))


def test_the_reports_download_size_is_in_units_of_1e9_bytes() -> None:
    inst = {**instance(), "name": "x", "model": "m", "hf_repo": "r/m", "revision": None, "gpus": [0], "port": 8000,
            "variant": "fp8", "quant_method": "fp8", "download_bytes": 1_250_000_001,
            "max_model_len": 16, "kv_cache": {"gpu_kv_cache_tokens": 1, "max_concurrency": 1.0, "note": "n"},
            "vram_arithmetic_mib_per_gpu": {"weights_mib": 1, "activation_peak_mib": 2, "non_torch_mib": 1, "sequence_kv_mib": 2,
                                            "encoder_probe_mib": 0, "total_mib": 6, "requested_mib": 8, "kv_pool_mib": 2}}  # fmt: skip
    # 1.250000001 GB rounds up; one byte less than a gigabyte per 1e9 would round it down
    assert plan_report({"instances": [inst], "gpus": []})[3] == "  variant fp8 (fp8), download 1.3 GB"
