"""Unit tests for the preflight (d3_host) filters and the smoke table (the decision check: tests/contracts/)."""

from __future__ import annotations

from typing import Any

import pytest
from d3_host import apt_candidate, df_line, download_bytes, upstream_version
from d3_smoke import smoke_table


def test_smoke_table_aligns_columns() -> None:
    rows = [
        {"host": "h1", "instance": "d3-27b", "model": "d3", "digest": "sha256:" + "a" * 64, "health": "ready",
         "q2_ms": 12, "q4_ms": 20, "baseline": {"q2": 240, "q4": 470}},
        {"host": "h2", "instance": "d3-mini", "model": "d3-mini", "digest": "sha256:" + "b" * 64, "health": "ready"},
    ]  # fmt: skip
    lines = smoke_table(rows)
    assert lines[0].split() == ["host", "instance", "model", "digest", "health", "2q", "ms", "4q", "ms", "field", "report", "2q/4q", "ms"]
    assert lines[1].split() == ["h1", "d3-27b", "d3", "sha256:aaaaaaaaaaaa", "ready", "12", "20", "240/470"]
    assert lines[2].split()[-3:] == ["-", "-", "-/-"]
    assert len({line.index("d3") for line in lines[1:]}) == 1


def test_df_line() -> None:
    assert df_line("/var/lib 123456") == {"mount": "/var/lib", "size_available": 123456}
    assert df_line("/mnt/my disk 7") == {"mount": "/mnt/my disk", "size_available": 7}
    with pytest.raises(ValueError, match="cannot read free space"):
        df_line("garbage")


def test_apt_candidate_and_upstream_version() -> None:
    policy = "podman:\n  Installed: (none)\n  Candidate: 4.3.1+ds1-8+deb12u1+b3\n  Version table:\n"
    assert apt_candidate(policy) == "4.3.1"
    assert apt_candidate("podman:\n  Installed: (none)\n  Candidate: (none)\n") == ""
    assert upstream_version("1:5.4.2+ds1-2+b2") == "5.4.2"


def test_download_bytes_prefers_hub_sizes(catalog_vars: dict[str, Any]) -> None:
    item = {"item": {"hf_repo": "vllm-sr/d3"}}
    tree = [
        {"type": "file", "path": "a", "size": 10},
        {"type": "directory", "path": "d", "size": 0},
        {"type": "file", "path": "d/b", "size": 32},
    ]
    assert download_bytes({**item, "json": tree}, catalog_vars["d3_catalog"]) == 42
    assert download_bytes({**item, "json": [{"type": "file", "path": "a"}]}, catalog_vars["d3_catalog"]) == 52_200_000_000
    assert download_bytes({**item, "status": -1}, catalog_vars["d3_catalog"]) == 52_200_000_000


def test_df_line_refusals_name_the_line() -> None:
    for line in ("/var/lib lots", " 123", "garbage"):
        with pytest.raises(ValueError) as refused:
            df_line(line)
        assert str(refused.value) == f"cannot read free space from {line!r}"


def test_apt_candidate_without_a_candidate_line_and_versions_without_digits() -> None:
    assert apt_candidate("") == ""
    assert apt_candidate("N: Unable to locate package podman\n") == ""
    assert upstream_version("abc") == ""
    # only the epoch is cut: the upstream part may contain a colon of its own
    assert upstream_version("2:1.0:rc1-3") == "1.0"


def test_download_bytes_counts_files_only_and_names_an_unknown_repo(catalog_vars: dict[str, Any]) -> None:
    catalog = catalog_vars["d3_catalog"]
    item = {"item": {"hf_repo": "vllm-sr/d3"}}
    tree = [{"type": "file", "path": "a", "size": 10}, {"type": "directory", "path": "d", "size": 4096}, "noise"]
    assert download_bytes({**item, "json": tree}, catalog) == 10
    # a directory entry without a size does not make the Hub's file sizes unusable
    assert download_bytes({**item, "json": [{"type": "file", "path": "a", "size": 7}, {"type": "directory"}]}, catalog) == 7
    with pytest.raises(ValueError) as unknown:
        download_bytes({"item": {"hf_repo": "nobody/else"}, "json": {"error": "x"}}, catalog)
    assert str(unknown.value) == "nobody/else is not in the catalog"


def test_host_filter_plugin_exports() -> None:
    from d3_host import FilterModule, file_differs

    assert FilterModule().filters() == {
        "d3_df_line": df_line,
        "d3_apt_candidate": apt_candidate,
        "d3_download_bytes": download_bytes,
        "d3_file_differs": file_differs,
    }


def test_download_bytes_of_a_variant_repository() -> None:
    catalog = {"d3": {"hf_repo": "vllm-sr/d3", "download_gb": 55, "variants": {
        "fp8": {"hf_repo": "vllm-sr/d3-FP8", "download_gb": 30.5}, "same": {"hf_repo": "vllm-sr/d3-same"}, "empty": None}}}  # fmt: skip
    assert download_bytes({"item": {"hf_repo": "vllm-sr/d3-FP8"}}, catalog) == 30_500_000_000
    # a variant without its own size downloads as much as its size's checkpoint
    assert download_bytes({"item": {"hf_repo": "vllm-sr/d3-same"}}, catalog) == 55_000_000_000
    assert download_bytes({"item": {"hf_repo": "x", "download_bytes": 7}}, catalog) == 7
