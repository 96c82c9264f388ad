"""Rendered units: the `podman run` line plan.yml prints, the Quadlet file and the classic unit carry the same
container (needs only plan.yml). The real tools' checks of the same units (Quadlet generator, systemd-analyze):
tests/lab/test_unit_files_lab.py."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from unitfiles import normalized, plan_units, quadlet_as_podman_args


@pytest.fixture(scope="module")
def plan_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]]]:
    return plan_units(tmp_path_factory.mktemp("units"))


@pytest.mark.playbook
def test_plan_line_quadlet_and_classic_unit_carry_the_same_container(plan_run: tuple[Path, dict[str, list[str]]]) -> None:
    """For every catalog model: the `podman run` line plan.yml prints, the Quadlet file and the classic unit carry
    the same arguments, environment, devices, volumes, labels and secret (one renderer, d3_render.py)."""
    rendered, printed = plan_run
    units = {p.stem: p for p in rendered.glob("*/*.container")}
    assert sorted(printed) == sorted(units) == sorted(["d3-27b", "d3-flash", "d3-mini", "d3-nano", "d3-lite", "d3-edge"])
    for name, path in units.items():
        line = printed[name]
        image = next(w for w in line if w.startswith("docker.io/vllm/"))
        quadlet = quadlet_as_podman_args(path.read_text())
        service = path.with_suffix(".service").read_text()
        exec_start = service.split("ExecStart=", 1)[1].split("\nExecStop=", 1)[0].replace("\\\n\t", " ")
        classic = [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(exec_start)][2:]  # podman run
        want = normalized(line, image)
        assert normalized(quadlet, image) == want, name
        assert normalized(classic, image) == want, name
        assert ("-v", "/var/lib/d3/huggingface:/root/.cache/huggingface:ro") in want[0]
        assert ("-e", "HF_HOME=/root/.cache/huggingface") in want[0]
        assert ("--label", f"io.d3-fleet.instance={name}") in want[0]
        assert any(p[0] == "--device" for p in want[0])
        assert ("--security-opt", "no-new-privileges") in want[0] and ("--cap-drop", "all") in want[0]
        secret = ("--secret", "d3-api-key,type=env,target=VLLM_API_KEY")
        assert (secret in want[0]) == (name != "d3-27b"), name  # the key is set on l4-small only
    # the whole line, as a reader of plan.yml sees it, for the 27B
    assert printed["d3-27b"][:8] == ["--name", "d3-27b", "--pull", "never", "--device", "nvidia.com/gpu=0", "--device",
                                     "nvidia.com/gpu=1"]
