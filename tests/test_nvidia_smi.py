"""Tests of the d3fleet.fleet collection's plugins/filter/nvidia_smi.py on real (H200) and synthesized (4 x L4) nvidia-smi outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from nvidia_smi import FilterModule, nvidia_smi_list, nvidia_smi_query_gpus, nvidia_smi_table

HERE = Path(__file__).resolve().parent
COMMITTED = HERE / "fixtures/nvidia-smi"
SHARED = Path(__file__).resolve().parents[2] / "shared/fixtures/nvidia-smi"
H200_DIRS = [d for d in (COMMITTED / "h200-driver580", SHARED / "h200-driver580") if d.is_dir()]
L4 = COMMITTED / "l4x4"
H200_UUID = "GPU-cf2acb7f-3742-2fd9-e71f-713aa12e33e3"


def test_committed_h200_copy_equals_shared_fixtures() -> None:
    shared = SHARED / "h200-driver580"
    if not shared.is_dir():
        pytest.skip("../shared/fixtures not beside this clone")
    names = sorted(p.name for p in shared.iterdir())
    assert names == sorted(p.name for p in (COMMITTED / "h200-driver580").iterdir())
    for name in names:
        assert (shared / name).read_bytes() == (COMMITTED / "h200-driver580" / name).read_bytes(), name


@pytest.mark.parametrize("fixtures", H200_DIRS, ids=lambda d: d.parent.parent.parent.name)
def test_h200_real_outputs(fixtures: Path) -> None:
    bare = nvidia_smi_query_gpus((fixtures / "query-gpu-noheader-nounits.csv").read_text())
    assert bare == [{"index": 0, "name": "NVIDIA H200", "uuid": H200_UUID, "memory_total_mib": 143771,
                     "memory_used_mib": 0, "driver_version": "580.159.04", "compute_cap": "9.0"}]
    # --format=csv with a different field list: matched by header, units stripped
    [full] = nvidia_smi_query_gpus((fixtures / "query-gpu.csv").read_text())
    assert {k: full[k] for k in bare[0]} == bare[0]
    assert (full["pci_bus_id"], full["memory_free_mib"], full["persistence_mode"], full["mig_mode_current"]) == (
        "00000000:00:06.0", 143156, "Enabled", "Disabled")
    assert nvidia_smi_list((fixtures / "nvidia-smi-L.txt").read_text()) == [
        {"index": 0, "name": "NVIDIA H200", "uuid": H200_UUID, "mig_devices": []}]
    table = nvidia_smi_table((fixtures / "nvidia-smi.txt").read_text())
    assert (table["driver_version"], table["cuda_version"]) == ("580.159.04", "13.0")
    assert table["gpus"] == [{"index": 0, "name": "NVIDIA H200", "persistence_mode": "On",
                              "pci_bus_id": "00000000:00:06.0", "memory_used_mib": 0, "memory_total_mib": 143771}]


def test_l4x4_all_formats_agree() -> None:
    bare = nvidia_smi_query_gpus((L4 / "query-gpu-noheader-nounits.csv").read_text())
    full = nvidia_smi_query_gpus((L4 / "query-gpu.csv").read_text())
    listed = nvidia_smi_list((L4 / "nvidia-smi-L.txt").read_text())
    table = nvidia_smi_table((L4 / "nvidia-smi.txt").read_text())
    assert [g["index"] for g in bare] == [0, 1, 2, 3]
    assert {(g["name"], g["memory_total_mib"], g["memory_used_mib"], g["compute_cap"], g["driver_version"])
            for g in bare} == {("NVIDIA L4", 23034, 0, "8.9", "580.95.05")}
    assert [{k: g[k] for k in bare[0]} for g in full] == bare
    assert all(g["mig_mode_current"] is None for g in full)  # "[N/A]" on L4
    assert [(g["index"], g["name"], g["uuid"]) for g in listed] == [(g["index"], g["name"], g["uuid"]) for g in bare]
    assert len({g["uuid"] for g in bare}) == 4
    assert table["driver_version"] == "580.95.05"
    assert [(g["index"], g["pci_bus_id"], g["memory_total_mib"]) for g in table["gpus"]] == [
        (g["index"], g["pci_bus_id"], g["memory_total_mib"]) for g in full]


def test_header_variant_any_order_and_custom_fields() -> None:
    text = "uuid, memory.used [MiB], index\nGPU-1, 12 MiB, 3\n"
    assert nvidia_smi_query_gpus(text) == [{"uuid": "GPU-1", "memory_used_mib": 12, "index": 3}]
    assert nvidia_smi_query_gpus("7, 100\n", fields=["index", "memory.total"]) == [
        {"index": 7, "memory_total_mib": 100}]
    assert nvidia_smi_query_gpus("") == []
    assert nvidia_smi_query_gpus("No devices were found\n") == []


def test_mig_lines_attach_to_their_gpu() -> None:
    text = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa-1)\n"
            "  MIG 1g.10gb     Device  0: (UUID: MIG-bbbb-2)\n"
            "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-cccc-3)\n")
    gpus = nvidia_smi_list(text)
    assert gpus[0]["mig_devices"] == [{"profile": "1g.10gb", "index": 0, "uuid": "MIG-bbbb-2"}]
    assert (gpus[1]["index"], gpus[1]["mig_devices"]) == (1, [])


@pytest.mark.parametrize(
    ("func", "text", "message"),
    [
        (nvidia_smi_query_gpus, "0, NVIDIA L4, GPU-x\n", "expected 7 fields"),
        (nvidia_smi_query_gpus, "0, NVIDIA L4, GPU-x, lots, 0, 580.95.05, 8.9\n", "'memory.total' is not an integer"),
        (nvidia_smi_query_gpus, "index, memory.total [MiB]\n0, 12 MiB, 5\n", "line 2: expected 2 fields"),
        (nvidia_smi_query_gpus, None, "must be a string"),
        (nvidia_smi_list, "NVIDIA-SMI has failed because it couldn't communicate\n", "line 1 not understood"),
        (nvidia_smi_table, "<html>\n", "no 'NVIDIA-SMI"),
    ],
)
def test_garbage_raises_clear_value_error(func, text, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        func(text)


def test_filter_plugin_exports() -> None:
    assert set(FilterModule().filters()) == {"nvidia_smi_query_gpus"}


def test_committed_cdi_copy_equals_shared_fixture() -> None:
    shared = SHARED.parent / "cdi/h200-driver580-nvidia.yaml"
    if not shared.is_file():
        pytest.skip("../shared/fixtures not beside this clone")
    assert shared.read_bytes() == (COMMITTED.parent / "cdi/h200-driver580-nvidia.yaml").read_bytes()


def test_query_errors_name_the_line_and_the_expected_fields() -> None:
    fields = "index, name, uuid, memory.total, memory.used, driver_version, compute_cap"
    with pytest.raises(ValueError) as short:
        nvidia_smi_query_gpus("0, NVIDIA L4, GPU-x\n")
    assert str(short.value) == f"nvidia-smi line 1: expected 7 fields ({fields}), got 3: '0, NVIDIA L4, GPU-x'"
    good = "0, NVIDIA L4, GPU-a, 23034, 0, 580.95.05, 8.9\n"
    with pytest.raises(ValueError) as bad:
        nvidia_smi_query_gpus(good + "1, NVIDIA L4, GPU-b, lots, 0, 580.95.05, 8.9\n")
    assert str(bad.value) == "nvidia-smi line 2: field 'memory.total' is not an integer: 'lots'"
    with pytest.raises(ValueError) as not_text:
        nvidia_smi_query_gpus(42)  # type: ignore[arg-type]
    assert str(not_text.value) == "nvidia-smi output must be a string, got int"


def test_query_single_field_and_data_that_looks_like_names() -> None:
    assert nvidia_smi_query_gpus("index\n3\n") == [{"index": 3}]
    assert nvidia_smi_query_gpus("3\n", fields=["index"]) == [{"index": 3}]
    # a first row starting with a name is data, not a header: header cells are lower-case field names
    assert nvidia_smi_query_gpus("NVIDIA L4, 0\n", fields=["name", "index"]) == [{"name": "NVIDIA L4", "index": 0}]
    assert nvidia_smi_query_gpus("name, index\nNVIDIA L4, 0\n") == [{"name": "NVIDIA L4", "index": 0}]


def test_list_skips_no_devices_and_refuses_an_orphan_mig_line() -> None:
    text = "No devices were found\nGPU 0: NVIDIA L4 (UUID: GPU-aaaa-1)\n"
    assert nvidia_smi_list(text) == [{"index": 0, "name": "NVIDIA L4", "uuid": "GPU-aaaa-1", "mig_devices": []}]
    with pytest.raises(ValueError, match=r"^nvidia-smi -L line 1 not understood: '  MIG 1g.10gb"):
        nvidia_smi_list("  MIG 1g.10gb     Device  0: (UUID: MIG-bbbb-2)\n")
    with pytest.raises(ValueError, match=r"^nvidia-smi -L line 2 not understood: 'garbage'$"):
        nvidia_smi_list("GPU 0: NVIDIA L4 (UUID: GPU-aaaa-1)\ngarbage\n")


TABLE = """\
| NVIDIA-SMI 575.1.2                Driver Version: 580.95.05      CUDA Version: 13.0     |
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
|  stray                                  |       9MiB /     99MiB |                      |
|   0  NVIDIA L4                      Off |   00000000:00:03.0 Off |                    0 |
| N/A   34C    P8             16W /   72W |       5MiB /  23034MiB |      0%      Default |
|  mig                                    |       7MiB /   1000MiB |                      |
"""


def test_table_versions_and_the_first_memory_row_under_each_gpu() -> None:
    table = nvidia_smi_table(TABLE)
    assert (table["smi_version"], table["driver_version"], table["cuda_version"]) == ("575.1.2", "580.95.05", "13.0")
    assert table["gpus"] == [{"index": 0, "name": "NVIDIA L4", "persistence_mode": "Off", "pci_bus_id": "00000000:00:03.0",
                              "memory_used_mib": 5, "memory_total_mib": 23034}]


def test_table_refuses_non_text_with_the_header_message() -> None:
    for text in (None, "<html>\n"):
        with pytest.raises(ValueError) as refused:
            nvidia_smi_table(text)  # type: ignore[arg-type]
        assert str(refused.value) == "nvidia-smi table: no 'NVIDIA-SMI ... Driver Version: ... CUDA Version:' header"


def test_filter_plugin_maps_names_to_the_parsers() -> None:
    # nvidia_smi_list and nvidia_smi_table are parsers, not filters: no role reads `nvidia-smi -L` or the table
    assert FilterModule().filters() == {"nvidia_smi_query_gpus": nvidia_smi_query_gpus}
