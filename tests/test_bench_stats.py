"""module_utils/d3_bench_stats: the percentile rule (the n a percentile needs), the Wilson interval, Brier's score and
the ranked probability score against worked values from their sources, the /metrics reader, and the metric names
against the contract (tests/contracts/metrics/names.yml, from vLLM's loggers.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.d3fleet.fleet.plugins.module_utils import d3_bench_stats as st  # noqa: E402


def test_the_n_each_percentile_needs() -> None:
    assert [st.min_n(q) for q in (0, 50, 90, 95, 99, 99.9)] == [1, 2, 10, 20, 100, 1000]
    for bad in (-1, 100, 101):
        with pytest.raises(ValueError, match="is not within 0-100"):
            st.min_n(bad)
    assert st.summary([1.0] * 19)["unsupported"] == ["p95", "p99"]
    assert st.summary([1.0] * 20)["unsupported"] == ["p99"] and st.summary([1.0] * 100)["unsupported"] == []
    assert st.summary([1.0])["unsupported"] == ["p50", "p95", "p99"]


def test_wilson_interval_worked_values() -> None:
    # the 17/26: about 0.46-0.81; NIST e-Handbook style checks: 0/10 and 10/10 reach the bounds
    assert st.wilson(17, 26) == pytest.approx((0.4622, 0.8059), abs=1e-4)
    assert st.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert st.wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert st.wilson(1, 2) == pytest.approx((0.0945, 0.9055), abs=1e-4)
    narrow, wide = st.wilson(5, 10, z=1.0), st.wilson(5, 10)
    assert wide[0] < narrow[0] < 0.5 < narrow[1] < wide[1] and narrow == pytest.approx((0.3492, 0.6508), abs=1e-4)
    assert st.wilson(0, 0) is None
    for k, n in ((-1, 3), (4, 3)):
        with pytest.raises(ValueError, match=f"{k} successes out of {n}"):
            st.wilson(k, n)


def test_brier_over_all_classes() -> None:
    assert st.brier({"a": 1.0, "b": 0.0}, "a") == 0.0
    assert st.brier({"a": 0.0, "b": 1.0}, "a") == 2.0  # the worst
    assert st.brier({"a": 0.7, "b": 0.2, "c": 0.1}, "a") == pytest.approx(0.09 + 0.04 + 0.01)
    assert st.brier({"a": 0.5, "b": 0.5}, "b") == pytest.approx(2 * (0.5 - 0.0) ** 2)  # twice the binary 0.25
    assert st.brier({"a": 0.6, "b": 0.4}, "c") == pytest.approx(0.36 + 0.16 + 1.0)  # a class with no probability
    assert st.brier({1: 0.6, 2: 0.4}, "1") == pytest.approx(0.16 + 0.16)  # keys compared as text


def test_ranked_probability_score() -> None:
    assert st.rps([0.0, 1.0, 0.0], 1) == 0.0
    assert st.rps([1.0, 0.0, 0.0], 2) == 1.0  # all the mass at the far end
    # cumulative (0.2, 0.7) against (0, 1) for level 1: (0.04 + 0.09) / 2; further is worse than nearer
    assert st.rps([0.2, 0.5, 0.3], 1) == pytest.approx(0.065)
    assert st.rps([0.5, 0.5, 0.0], 2) > st.rps([0.0, 0.5, 0.5], 2)
    assert st.rps([0.3, 0.7], 0) == pytest.approx(0.49)  # two levels: the binary Brier
    with pytest.raises(ValueError, match=r"^a ranked probability score needs at least two levels$"):
        st.rps([1.0], 0)


def test_parse_metrics_sums_engines_and_skips_what_is_not_there() -> None:
    page = "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0',
        "vllm:num_requests_waiting{} NaNx",
        "vllm:kv_cache_usage_perc 0.25",
        'vllm:request_queue_time_seconds_sum{engine="0"} 1.5e-01',
        "garbage line",
    ])
    got = st.parse_metrics(page, ["vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                                  "vllm:request_queue_time_seconds_sum", "vllm:num_requests_waiting"])
    assert got == {"vllm:num_requests_running": 5.0, "vllm:kv_cache_usage_perc": 0.25,
                   "vllm:request_queue_time_seconds_sum": 0.15, "vllm:num_requests_waiting": None}
    assert st.parse_metrics("", ["x"]) == {"x": None} and st.parse_metrics(None, []) == {}


def test_the_metrics_read_are_vllms_names() -> None:
    contract = yaml.safe_load((ROOT / "tests/contracts/metrics/names.yml").read_text())["vllm"]["metrics"]
    exposed = set()
    for name, kind in contract.items():
        exposed |= {f"{name}_sum", f"{name}_count"} if kind == "histogram" else {f"{name}_total"} if kind == "counter" else {name}
    assert set(st.METRICS) <= exposed
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count"} <= set(st.METRICS)
