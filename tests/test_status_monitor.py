"""status.yml's monitor section (filter d3_status_monitor): each instance's last scrape and the firing alerts, decided
from Prometheus' HTTP API answers as recorded in tests/contracts/prometheus/api-v1.json (prometheus/prometheus
docs/querying/api.md)."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
from d3_status import FilterModule, status_monitor

API = json.loads((Path(__file__).resolve().parent / "contracts/prometheus/api-v1.json").read_text())


@pytest.fixture
def api() -> dict[str, Any]:
    return copy.deepcopy(API)


def test_each_instance_s_last_scrape_other_targets_down_and_the_firing_alerts(api: dict[str, Any]) -> None:
    assert status_monitor(api["targets"], api["alerts"], "mon") == [
        "monitor mon: last scrape of each instance (UTC)",
        "host  instance  model     health   last scrape           error",
        "l4-a  d3-flash  d3-flash  up       2026-12-01T23:07:44Z",
        "l4-a  d3-nano   d3-nano   unknown  never",
        'l4-b  d3        d3        down     2026-12-01T23:07:41Z  Get "http://10.0.0.12:8000/metrics": dial tcp '
        "10.0.0.12:8000: connect: connection refused",
        "monitor mon: other targets not up: none",
        "monitor mon: FIRING D3InstanceDown (critical) host l4-b instance d3 model d3 since 2026-12-01T23:06:12Z: "
        "d3 on l4-b does not answer /metrics [docs/runbook.md#d3instancedown]",
        "monitor mon: 1 alert(s) pending (not yet held for their for:)",
    ]


def test_a_node_or_router_target_down_is_named_with_its_error(api: dict[str, Any]) -> None:
    node = api["targets"]["data"]["activeTargets"][2]
    node.update(health="down", lastError="connection refused")
    router = copy.deepcopy(node)
    router["labels"] = {"host": "r1", "instance": "r1", "job": "d3-router"}
    router.update(health="unknown", lastError="")
    api["targets"]["data"]["activeTargets"] += [router]
    lines = status_monitor(api["targets"], api["alerts"], "mon")
    assert "monitor mon: other targets not up: d3-node l4-b (down: connection refused); d3-router r1 (unknown: no error)" in lines
    assert not any("l4-b  l4-b" in line for line in lines)  # node targets are not in the instances' table


def test_no_alert_firing_says_so_and_pending_ones_are_only_counted(api: dict[str, Any]) -> None:
    api["alerts"]["data"]["alerts"] = [a for a in api["alerts"]["data"]["alerts"] if a["state"] == "pending"] * 2
    lines = status_monitor(api["targets"], api["alerts"], "mon")
    assert lines[-2:] == ["monitor mon: no alert firing", "monitor mon: 2 alert(s) pending (not yet held for their for:)"]
    api["alerts"]["data"]["alerts"] = []
    assert status_monitor(api["targets"], api["alerts"], "mon")[-1] == "monitor mon: no alert firing"


def test_alerts_are_sorted_and_a_fleet_wide_one_says_fleet(api: dict[str, Any]) -> None:
    first = api["alerts"]["data"]["alerts"][0]
    fleet = {"labels": {"alertname": "D3AFleetAlert"}, "annotations": {}, "state": "firing", "activeAt": "2026-12-01T23:00:00+01:00"}
    gpu = {"labels": {"alertname": "D3GpuErrors", "severity": "critical", "host": "l4-a", "gpu": "1"},
           "annotations": {"summary": "s"}, "state": "firing", "activeAt": "bad"}  # fmt: skip
    api["alerts"]["data"]["alerts"] = [first, gpu, fleet]
    lines = status_monitor(api["targets"], api["alerts"], "m")
    assert lines[-3:] == [
        "monitor m: FIRING D3AFleetAlert (?) fleet since 2026-12-01T22:00:00Z:  [no runbook]",
        "monitor m: FIRING D3GpuErrors (critical) host l4-a gpu 1 since ?: s [no runbook]",
        "monitor m: FIRING D3InstanceDown (critical) host l4-b instance d3 model d3 since 2026-12-01T23:06:12Z: "
        "d3 on l4-b does not answer /metrics [docs/runbook.md#d3instancedown]",
    ]


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (None, "no answer"),
        ("x", "not a Prometheus API answer"),
        ({"status": "error", "errorType": "bad_data", "error": "invalid parameter"}, "bad_data: invalid parameter"),
        ({"status": "error", "error": "boom"}, "error: boom"),
        ({"status": "success", "data": []}, "not a Prometheus API answer"),
        ({"status": "success", "data": {"activeTargets": "x", "alerts": "x"}}, "not a Prometheus API answer"),
        ({"status": "successful", "data": {"activeTargets": [], "alerts": []}}, "not a Prometheus API answer"),
    ],
)
def test_an_answer_that_is_missing_or_failed_is_one_line(answer: Any, says: str) -> None:
    assert status_monitor(answer, answer, "mon") == [
        f"monitor mon: Prometheus' /api/v1/targets failed ({says})",
        f"monitor mon: Prometheus' /api/v1/alerts failed ({says})",
    ]


def test_rows_that_are_not_mappings_are_skipped_and_missing_fields_shown_as_unknown() -> None:
    targets = {"status": "success", "data": {"activeTargets": ["x", {"labels": "x"}, {"labels": {"job": "d3-vllm"}}]}}
    alerts = {"status": "success", "data": {"alerts": ["x", {"state": "firing", "labels": "x", "annotations": "x"}]}}
    assert status_monitor(targets, alerts, "m") == [
        "monitor m: last scrape of each instance (UTC)",
        "host  instance  model  health  last scrape  error",
        "?     ?                ?       ?",
        "monitor m: other targets not up: ? ? (?: no error)",
        "monitor m: FIRING ? (?) fleet since ?:  [no runbook]",
    ]


def test_the_filter_is_exported() -> None:
    assert FilterModule().filters()["d3_status_monitor"] is status_monitor


def test_times_are_utc_whatever_the_controller_s_zone(monkeypatch: pytest.MonkeyPatch, api: dict[str, Any]) -> None:
    api["targets"]["data"]["activeTargets"][0]["lastScrape"] = "2026-12-01T23:07:44.5-05:30"
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        lines = status_monitor(api["targets"], api["alerts"], "mon")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert "l4-a  d3-flash  d3-flash  up       2026-12-02T04:37:44Z" in lines


def test_a_router_alert_names_its_proxy(api: dict[str, Any]) -> None:
    api["alerts"]["data"]["alerts"] = [{"labels": {"alertname": "D3RouterErrors", "severity": "critical", "host": "r1",
                                                   "proxy": "fe_d3"}, "annotations": {"summary": "s", "runbook_url": "u"},
                                        "state": "firing", "activeAt": "2026-12-01T23:00:00Z"}]  # fmt: skip
    assert status_monitor(api["targets"], api["alerts"], "m")[-1] == (
        "monitor m: FIRING D3RouterErrors (critical) host r1 proxy fe_d3 since 2026-12-01T23:00:00Z: s [u]")
