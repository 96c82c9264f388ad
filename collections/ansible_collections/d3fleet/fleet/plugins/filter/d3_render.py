"""The one renderer of a planned instance's container: the same tokens become the Quadlet ``[Container]`` keys, the
classic unit's ``podman run`` and the ``podman run`` line that ``plan.yml`` prints.

Every fact comes from the plan (``d3_plan``'s instance: unit, devices, shm size, volumes, environment, labels,
image, vLLM arguments, the variable the API key reaches vLLM as); the caller adds only what the plan cannot know:
the image reference resolved to the fleet's digest and the name of the podman secret (empty: no API key).

The Quadlet keys and the ``podman run`` options they stand for are podman's own mapping (podman
``pkg/systemd/quadlet/quadlet.go``, ``docs/source/markdown/podman-systemd.unit.5.md``); tests/test_unit_files.py
holds the three renderings to the same tokens, and to what podman's Quadlet generator writes.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_LINE_BREAKING = re.compile(r"[\n\r\x00]")


def systemd_quote(word: Any) -> str:
    """Quote one word for ExecStart=/Exec=/Environment= lines: systemd splits on whitespace, honours double
    quotes and backslashes, and expands %-specifiers and $VARIABLES, so those are escaped. A line break or NUL
    cannot be quoted into one unit line: such inputs are refused before anything renders (d3_inputs), so this is the
    last guard, not the message a user meets."""
    if _LINE_BREAKING.search(str(word)):
        raise ValueError(f"systemd quoting: {str(word)!r} contains a line break or NUL and cannot go into a unit file")
    text = str(word).replace("%", "%%").replace("$", "$$")
    if _PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def container_spec(instance: dict[str, Any], image: str | None = None, secret: str = "") -> list[tuple[str, str]]:
    """The container as (Quadlet key, value) pairs in a fixed order; ``Image`` and ``Exec`` come last."""
    spec: list[tuple[str, str]] = [("ContainerName", instance["unit"]), ("Pull", "never")]
    spec += [("AddDevice", d) for d in instance["cdi_devices"]]
    spec += [("Network", "host"), ("ShmSize", str(instance["shm_size"])), ("SecurityLabelDisable", "true")]
    if instance.get("no_new_privileges"):
        spec.append(("NoNewPrivileges", "true"))
    if "capabilities" in instance:
        spec.append(("DropCapability", "all"))
        spec += [("AddCapability", c) for c in instance["capabilities"]]
    spec += [("Volume", v) for v in instance["volumes"]]
    spec += [("Environment", f"{k}={v}") for k, v in instance["env"].items()]
    if secret:
        spec.append(("Secret", f"{secret},type=env,target={instance['secret_env']}"))
    spec += [("Label", f"{k}={v}") for k, v in instance["labels"].items()]
    spec.append(("Image", image or instance["image"]))
    return spec


# Quadlet key -> the podman run option it stands for (podman's quadlet.go); value None: a flag with a fixed value.
_OPTION = {
    "ContainerName": "--name",
    "Pull": "--pull",
    "AddDevice": "--device",
    "Network": "--network",
    "ShmSize": "--shm-size",
    "Volume": "-v",
    "Environment": "-e",
    "Secret": "--secret",
    "Label": "--label",
    "DropCapability": "--cap-drop",
    "AddCapability": "--cap-add",
}


def podman_args(instance: dict[str, Any], image: str | None = None, secret: str = "") -> list[str]:
    """``podman run`` arguments (without ``podman run``): options, the image, then vLLM's arguments."""
    args: list[str] = []
    for key, value in container_spec(instance, image, secret):
        if key == "Image":
            args.append(value)
        elif key == "SecurityLabelDisable":
            args += ["--security-opt", "label=disable"]
        elif key == "NoNewPrivileges":
            args += ["--security-opt", "no-new-privileges"]
        else:
            args += [_OPTION[key], value]
    return args + [str(a) for a in instance["args"]]


def podman_run(instance: dict[str, Any], image: str | None = None, secret: str = "") -> str:
    """The ``podman run`` command line a shell would take (what plan.yml prints)."""
    return shlex.join(["podman", "run", *podman_args(instance, image, secret)])


def quadlet_container(instance: dict[str, Any], image: str | None = None, secret: str = "") -> list[str]:
    """The ``[Container]`` section's lines of the Quadlet ``.container`` file."""
    lines = []
    for key, value in container_spec(instance, image, secret):
        lines.append(f"{key}={systemd_quote(value) if key == 'Environment' else value}")
    lines.append("Exec=" + " ".join(systemd_quote(a) for a in instance["args"]))
    return lines


def exec_lines(instance: dict[str, Any], image: str | None = None, secret: str = "") -> list[str]:
    """The classic unit's ``podman run`` arguments quoted for an ``ExecStart=`` line: one option and its value per
    line, then the image and vLLM's arguments on the last line (the template joins them with ``\\``)."""
    words = [systemd_quote(a) for a in podman_args(instance, image, secret)]
    options = words[: len(words) - len(instance["args"]) - 1]
    return [" ".join(options[i : i + 2]) for i in range(0, len(options), 2)] + [" ".join(words[len(options) :])]


def plan_report(plan: dict[str, Any], image: str | None = None, secret: str = "") -> list[str]:
    """Human-readable plan lines: one block per instance ending with its exact ``podman run`` line, then the VRAM
    budget per GPU."""
    lines: list[str] = []
    for i in plan["instances"]:
        # the per-GPU need (everything but the KV cache, plus one --max-model-len sequence of it) out of the
        # instance's share, then the two figures vLLM logs at startup, as the planner predicts them
        a = i["vram_arithmetic_mib_per_gpu"]
        kv = i["kv_cache"]
        lines.append(
            f"{i['name']}: {i['model']} ({i['hf_repo']}@{i['revision'] or 'UNPINNED'}) on GPU "
            f"{','.join(str(g) for g in i['gpus'])}, port {i['port']}, unit {i['unit']}.service, "
            f"needs {a['total_mib']} MiB/GPU of its {a['requested_mib']} MiB share"
        )
        lines.append(
            f"  per GPU: weights {a['weights_mib']} + profile-run peak {a['activation_peak_mib']} + non-torch "
            f"{a['non_torch_mib']} + encoder probe {a['encoder_probe_mib']} + one {i['max_model_len']}-token sequence "
            f"{a['sequence_kv_mib']} = {a['total_mib']} MiB; the share's rest is KV cache ({a['kv_pool_mib']} MiB in all)"
        )
        lines.append(
            f"  vLLM will log: GPU KV cache size: {kv['gpu_kv_cache_tokens']:,} tokens; Maximum concurrency for "
            f"{i['max_model_len']:,} tokens per request: {kv['max_concurrency']:.2f}x ({kv['note']})"
        )
        if i.get("variant") not in (None, "default"):  # "default": a catalog entry without variants
            lines.append(
                f"  variant {i['variant']} ({i['quant_method'] or 'no quantization_config'}), download "
                f"{i['download_bytes'] / 1e9:.1f} GB"
            )
        if i.get("measured_on_hardware") is False:
            lines.append(f"  NOT YET MEASURED ON HARDWARE: {i['hardware_note']}")
        lines.append("  " + podman_run(i, image, secret))
    for g in plan["gpus"]:
        users = ", ".join(f"{b['instance']} {b['budget_mib']} MiB" for b in g["budget"]) or "idle"
        lines.append(
            f"GPU {g['index']} {g['name']}: {g['budget_mib']}/{g['vllm_total_mib']} MiB budgeted ({users}; MiB as vLLM "
            f"sees the GPU), {g['cuda_context_mib']} MiB of CUDA contexts, {g['free_mib']} MiB free"
        )
    return lines


class FilterModule:
    """Ansible filters: d3_podman_run (public, for operators: no role calls it), d3_quadlet_container, d3_exec_lines,
    d3_plan_report. podman_args and systemd_quote are their helpers, not filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "d3_podman_run": podman_run,
            "d3_quadlet_container": quadlet_container,
            "d3_exec_lines": exec_lines,
            "d3_plan_report": plan_report,
        }
