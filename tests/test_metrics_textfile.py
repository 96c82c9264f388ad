"""The host's textfile collector (roles/d3_metrics/files/d3_textfile.py): nvidia-smi's query, the kernel log's Xid
lines, the deployment record and the rollout marker into node exporter's textfile, which promtool accepts; the lab's
NVIDIA stand-in answers the same query (run from its source, as root: it creates device nodes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import testkit
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "roles/d3_metrics/files/d3_textfile.py"
STAND_IN = ROOT / "lab/nvidia/src/lab-nvidia-driver"
CONTRACT = yaml.safe_load((ROOT / "tests/contracts/metrics/names.yml").read_text())

textfile = testkit.load_file("d3_textfile", SCRIPT)

# the values of the real H200 capture (tests/fixtures/nvidia-smi/h200-driver580/nvidia-smi-q.txt: 0 MiB of 143771 used,
# 38 C, 82.15 W instantaneous, ECC on with 0 uncorrected volatile errors, bus 00000000:00:06.0) in QUERY's order
H200 = "0, GPU-cf2acb7f-3742-2fd9-e71f-713aa12e33e3, 00000000:00:06.0, 0, 143771, 0, 38, 82.15, 0\n"
L4_NO_ECC = "1, GPU-b, 00000000:00:07.0, 1024, 23034, 57, 61, [N/A], [N/A]\n"
STATE = {"image_ref": "lab-registry:5000/vllm/vllm-openai@sha256:" + "a" * 64, "instances": {"d3-flash": {}, "d3-mini": {}}}


def test_the_query_parses_into_one_row_per_gpu() -> None:
    rows = textfile.gpu_rows(H200 + "\n" + L4_NO_ECC)
    assert [r["index"] for r in rows] == ["0", "1"]
    assert rows[0]["ecc.errors.uncorrected.volatile.total"] == "0" and rows[1]["power.draw"] == "[N/A]"
    with pytest.raises(ValueError, match="with 3 fields, expected 9"):
        textfile.gpu_rows("0, a, b\n")


def test_xid_lines_are_counted_per_bus_and_code_and_named_by_gpu_where_listed() -> None:
    rows = textfile.gpu_rows(H200 + L4_NO_ECC)
    log = ("NVRM: Xid (PCI:0000:00:07): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
           "NVRM: Xid (PCI:0000:00:07): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error\n"
           "NVRM: Xid (PCI:0000:00:99): 13, another GPU\nsome other line\n")  # fmt: skip
    assert textfile.xid_counts(log + log.splitlines()[0], rows) == {("0000:00:07", "79"): 2, ("0000:00:07", "48"): 1,
                                                                   ("0000:00:99", "13"): 1}  # fmt: skip
    text = textfile.render(rows, textfile.xid_counts(log, rows), None, None, [])
    assert 'd3_gpu_xid_events_total{pci_bus="0000:00:07",xid="79",gpu="1"} 1' in text
    assert 'd3_gpu_xid_events_total{pci_bus="0000:00:99",xid="13"} 1' in text  # a bus nvidia-smi no longer lists
    # nvidia-smi failing (the GPU off the bus): the Xid lines are still reported, by bus
    assert 'd3_gpu_xid_events_total{pci_bus="0000:00:07",xid="79"} 1' in textfile.render([], textfile.xid_counts(log, []), None, None, [])


def test_the_textfile_has_every_series_of_the_contract(tmp_path: Path) -> None:
    rows = textfile.gpu_rows(H200 + L4_NO_ECC)
    text = textfile.render(rows, {("0000:00:07", "79"): 2}, STATE, 1700000000.4, [])
    assert 'd3_gpu_memory_total_bytes{gpu="0",uuid="GPU-cf2acb7f-3742-2fd9-e71f-713aa12e33e3"} 150754820096' in text
    assert 'd3_gpu_memory_used_bytes{gpu="1",uuid="GPU-b"} 1073741824' in text
    assert 'd3_gpu_utilization_ratio{gpu="1",uuid="GPU-b"} 0.57' in text
    assert 'd3_gpu_temperature_celsius{gpu="0",uuid="GPU-cf2acb7f-3742-2fd9-e71f-713aa12e33e3"} 38' in text
    assert 'd3_gpu_power_watts{gpu="0",uuid="GPU-cf2acb7f-3742-2fd9-e71f-713aa12e33e3"} 82.15' in text
    assert 'd3_gpu_power_watts{gpu="1"' not in text  # [N/A] is left out, not 0
    assert 'd3_gpu_ecc_uncorrected_errors{gpu="0",uuid="GPU-cf2acb7f-3742-2fd9-e71f-713aa12e33e3"} 0' in text
    assert 'd3_gpu_ecc_uncorrected_errors{gpu="1"' not in text
    assert 'd3_gpu_xid_events_total{pci_bus="0000:00:07",xid="79",gpu="1"} 2' in text
    assert f'd3_instance_image_info{{name="d3-flash",digest="sha256:{"a" * 64}"}} 1' in text
    assert 'd3_instance_image_info{name="d3-mini",' in text
    assert "d3_rollout_marker_timestamp_seconds 1700000000\n" in text
    assert text.endswith("d3_textfile_success 1\n")
    for name, kind in CONTRACT["d3"]["metrics"].items():
        assert f"# TYPE {name} {kind}" in text
    promtool = shutil.which("promtool") or str(Path(sys.executable).parent / "promtool")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert check.returncode == 0 and not check.stdout + check.stderr, check.stdout + check.stderr


def test_missing_sources_are_said_and_nothing_is_invented() -> None:
    text = textfile.render([], None, None, None, ["nvidia-smi", "journalctl"])
    assert text == ('# HELP d3_textfile_success 1 when every source of d3.prom answered\n# TYPE d3_textfile_success gauge\n'
                    'd3_textfile_success{failed="nvidia-smi,journalctl"} 0\n')  # fmt: skip
    text = textfile.render([], {}, {"image_ref": "x:tag", "instances": {}}, None, [])
    assert "d3_instance_image_info" not in text and "d3_gpu_" not in text
    bad = textfile.render([], None, {"image_ref": "r@sha256:x", "instances": {'a"}\nevil 1': {}}}, None, [])
    assert 'name="invalid"' in bad and "evil" not in bad


def stand_in_env(tmp: Path, count: int) -> dict[str, str]:
    (tmp / "dev").mkdir()
    (tmp / "gpus.json").write_text(json.dumps({"count": count, "name": "NVIDIA L4", "memory_mib": 23034, "compute_cap": "8.9"}))
    env = dict(os.environ, LAB_NVIDIA_NVML=str(tmp / "nvml.json"), LAB_NVIDIA_DEV_DIR=str(tmp / "dev"),
               LAB_NVIDIA_CONFIG=str(tmp / "gpus.json"), LAB_NVIDIA_HOSTNAME="l4-host-1",
               LAB_NVIDIA_CLAIMS_BASE=str(tmp / "claims"), LAB_NVIDIA_CLAIMS_DIR=str(tmp / "claims/c"),
               LAB_NVIDIA_DRIVER_STATE=str(tmp / "state/v"))  # fmt: skip
    subprocess.run([sys.executable, str(STAND_IN / "usr/lib/lab-nvidia/lab-nvidia-setup")], env=env, check=True,
                   capture_output=True)  # fmt: skip
    return env


@pytest.mark.skipif(os.geteuid() != 0, reason="the stand-in's setup creates device nodes (root)")
def test_the_collector_runs_against_the_lab_stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = stand_in_env(tmp_path, 2)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} {STAND_IN / "usr/bin/nvidia-smi"} "$@"\n')
    smi.chmod(0o755)
    (tmp_path / "out").mkdir()
    (tmp_path / "deployed.json").write_text(json.dumps(STATE))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert textfile.main(["--directory", str(tmp_path / "out"), "--nvidia-smi", str(smi),
                          "--state-file", str(tmp_path / "deployed.json"), "--marker", str(tmp_path / "no-marker")]) == 0  # fmt: skip
    text = (tmp_path / "out/d3.prom").read_text()
    assert 'd3_gpu_memory_total_bytes{gpu="1",' in text and 'd3_gpu_ecc_uncorrected_errors{gpu="0",' in text
    assert 'd3_gpu_temperature_celsius{gpu="0",' in text and 'd3_gpu_power_watts{gpu="1",' in text
    assert "d3_rollout_marker_timestamp_seconds" not in text
    assert oct((tmp_path / "out/d3.prom").stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["d3.prom"]
    # journalctl may be missing or find nothing here: either way the GPUs are reported
    assert "d3_textfile_success" in text


@pytest.mark.skipif(os.geteuid() != 0, reason="the stand-in's setup creates device nodes (root)")
def test_the_stand_in_s_lost_gpu_switch_fails_the_collector_s_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lab's STAND-IN nvidia-smi with its gpu-lost switch (LAB_NVIDIA_GPU_LOST) fails the collector's query (exit 15):
    the textfile has no GPU rows and says nvidia-smi failed; without the switch the same query answers."""
    env = stand_in_env(tmp_path, 2)
    lost = tmp_path / "gpu-lost"
    env["LAB_NVIDIA_GPU_LOST"] = str(lost)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} {STAND_IN / 'usr/bin/nvidia-smi'} \"$@\"\n")
    smi.chmod(0o755)
    assert 'd3_gpu_memory_total_bytes{gpu="1",' in textfile.collect(str(smi), tmp_path / "none.json", tmp_path / "m")
    lost.touch()
    answer = subprocess.run([str(smi), "-L"], capture_output=True, text=True, check=False)
    assert answer.returncode == 15 and "GPU is lost" in answer.stdout
    text = textfile.collect(str(smi), tmp_path / "none.json", tmp_path / "m")
    assert "d3_gpu_" not in text.replace("d3_gpu_xid", "") and 'failed="nvidia-smi' in text


def test_a_failing_nvidia_smi_is_reported(tmp_path: Path) -> None:
    text = textfile.collect(str(tmp_path / "no-such-nvidia-smi"), tmp_path / "none.json", tmp_path / "marker")
    assert 'failed="nvidia-smi' in text and "d3_gpu_" not in text
    (tmp_path / "marker").touch()
    (tmp_path / "bad.json").write_text("{")
    text = textfile.collect(str(tmp_path / "no-such-nvidia-smi"), tmp_path / "bad.json", tmp_path / "marker")
    assert "state" in text.rsplit("failed=", 1)[1] and "d3_rollout_marker_timestamp_seconds " in text


def test_a_host_without_gpus_runs_no_nvidia_smi_and_reports_success(tmp_path: Path) -> None:
    """A router or a monitor (--no-gpu): no nvidia-smi, no Xid scan, so d3_textfile_success means its own sources."""
    text = textfile.collect(str(tmp_path / "no-such-nvidia-smi"), tmp_path / "none.json", tmp_path / "marker", gpus=False)
    assert text.endswith("d3_textfile_success 1\n") and "d3_gpu_" not in text


def test_xid_lines_count_from_their_acknowledgement(tmp_path: Path) -> None:
    """journalctl reads this boot's kernel log from the acknowledgement file's time on (--since=@mtime)."""
    log = tmp_path / "args"
    fake = tmp_path / "journalctl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {log}\necho 'NVRM: Xid (PCI:0000:00:07): 79, off the bus'\n")
    fake.chmod(0o755)
    ack = tmp_path / "xid-acknowledged"
    env_path = f"{tmp_path}:{os.environ['PATH']}"
    old = os.environ["PATH"]
    os.environ["PATH"] = env_path
    try:
        text = textfile.collect(str(tmp_path / "no-smi"), tmp_path / "none.json", tmp_path / "marker", True, ack)
        assert "--since" not in log.read_text() and 'xid="79"' in text
        ack.touch()
        os.utime(ack, (1700000000, 1700000000))
        textfile.collect(str(tmp_path / "no-smi"), tmp_path / "none.json", tmp_path / "marker", True, ack)
        assert "-k -b --since=@1700000000 --no-pager" in log.read_text()
    finally:
        os.environ["PATH"] = old
