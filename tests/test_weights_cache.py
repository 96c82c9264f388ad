"""Unit tests for the d3_weights filters (d3_weights.py): where the snapshots and completion markers live, which
models to download, the download's environment (roles/d3_weights/tasks/install.yml and download.yml). The lab runs
them on every converge (tests/lab/test_site_runner.py, tests/lab/test_hf_mirror.py)."""

from __future__ import annotations

from typing import Any

import pytest
from d3_weights import FilterModule, weights_env, weights_locations, weights_missing

HOME = "/var/lib/d3/hf"
REV = "0123456789abcdef0123456789abcdef01234567"
REV2 = "fedcba9876543210fedcba9876543210fedcba98"


def test_locations_follow_the_hub_cache_layout() -> None:
    assert weights_locations([{"repo": "vllm-sr/d3-flash", "revision": REV, "extra": 1}, {"repo": "org/a/b", "revision": REV2}], HOME) == [
        {
            "repo": "vllm-sr/d3-flash",
            "revision": REV,
            "snapshot": f"{HOME}/hub/models--vllm-sr--d3-flash/snapshots/{REV}",
            "marker_dir": f"{HOME}/d3-complete/models--vllm-sr--d3-flash",
            "marker": f"{HOME}/d3-complete/models--vllm-sr--d3-flash/{REV}.json",
        },
        {
            "repo": "org/a/b",
            "revision": REV2,
            "snapshot": f"{HOME}/hub/models--org--a--b/snapshots/{REV2}",
            "marker_dir": f"{HOME}/d3-complete/models--org--a--b",
            "marker": f"{HOME}/d3-complete/models--org--a--b/{REV2}.json",
        },
    ]  # fmt: skip
    assert weights_locations([], HOME) == []


@pytest.mark.parametrize(
    ("case", "entries", "marker", "missing"),
    [
        ("complete", 3, True, False),
        ("complete, even an empty snapshot (verify.yml refuses that)", 0, True, False),
        ("no snapshot", -1, True, True),
        ("snapshot without marker (interrupted download)", 3, False, True),
        ("neither", -1, False, True),
    ],
)
def test_missing(case: str, entries: int, marker: bool, missing: bool) -> None:
    [loc] = weights_locations([{"repo": "vllm-sr/d3", "revision": REV}], HOME)
    cache = {"snapshots": {loc["snapshot"]: entries}, "markers": {loc["marker"]: marker}}
    assert weights_missing([loc], cache) == ([loc] if missing else []), case


def test_missing_keeps_the_order_and_only_the_incomplete() -> None:
    locs = weights_locations([{"repo": f"o/m{i}", "revision": REV} for i in range(4)], HOME)
    cache: dict[str, Any] = {"snapshots": {loc["snapshot"]: [1, -1, 2, -1][i] for i, loc in enumerate(locs)},
                             "markers": {loc["marker"]: [True, True, False, False][i] for i, loc in enumerate(locs)}}  # fmt: skip
    assert weights_missing(locs, cache) == locs[1:]


BASE = {"HF_HOME": HOME, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


@pytest.mark.parametrize(
    ("endpoint", "token_file", "extra"),
    [
        ("", "", {}),
        ("https://hf-mirror.example", "", {"HF_ENDPOINT": "https://hf-mirror.example", "HF_HUB_DISABLE_XET": "1"}),
        ("", "/etc/d3/hf-token", {"HF_TOKEN_PATH": "/etc/d3/hf-token"}),
        ("http://lab-hf:8090", "/t", {"HF_ENDPOINT": "http://lab-hf:8090", "HF_HUB_DISABLE_XET": "1", "HF_TOKEN_PATH": "/t"}),
    ],
)
def test_env(endpoint: str, token_file: str, extra: dict[str, str]) -> None:
    assert weights_env(HOME, endpoint, token_file) == {**BASE, **extra}


def test_the_filters_are_registered() -> None:
    assert FilterModule().filters() == {"d3_weights_locations": weights_locations, "d3_weights_missing": weights_missing,
                                        "d3_weights_env": weights_env}  # fmt: skip
