"""d3_firewall's monitor hunk (docs/metrics.md): the exporters' ports answer loopback and the monitors only, and the
monitors reach the model ports (Prometheus scrapes /metrics); without monitors the rules are what they were. The
template is rendered as Ansible renders it (trim_blocks) and, where nft is installed, checked with `nft -c`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = (ROOT / "roles/d3_firewall/templates/d3-firewall.nft.j2").read_text()


def render(**overrides: Any) -> str:
    values: dict[str, Any] = {
        "ansible_managed": "managed", "_d3_firewall_v4": ["10.0.0.0/24"], "_d3_firewall_v6": [],
        "d3_firewall_ports": [8000, 8001], "_d3_firewall_port_list": "{ 8000, 8001 }",
        "_d3_firewall_mon_v4": ["10.0.0.5"], "_d3_firewall_mon_v6": ["2001:db8::5"],
        "d3_firewall_monitor_ports": [9100], "_d3_firewall_mon_ports": "{ 9100 }",
    }  # fmt: skip
    values.update(overrides)
    return jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined).from_string(TEMPLATE).render(**values)


def rules(text: str) -> list[str]:
    return [line.strip() for line in text.split("chain input {")[1].splitlines() if line.strip()]


def test_the_exporters_answer_loopback_and_the_monitors_only() -> None:
    text = render()
    assert rules(text)[1:6] == [
        "# the exporters (node exporter) answer loopback and the monitors (d3_firewall_monitors) only",
        "tcp dport { 9100 } ip saddr 127.0.0.0/8 accept", "tcp dport { 9100 } ip6 saddr ::1 accept",
        "tcp dport { 9100 } ip saddr @monitors_v4 accept", "tcp dport { 9100 } ip6 saddr @monitors_v6 accept"]  # fmt: skip
    assert "tcp dport { 9100 } counter reject with tcp reset" in rules(text)
    assert "ip saddr @monitors_v4 accept" in rules(text) and "ip6 saddr @monitors_v6 accept" in rules(text)
    assert "elements = { 10.0.0.5 }" in text and "type ipv6_addr" in text
    if shutil.which("nft"):
        check = subprocess.run(["nft", "-c", "-f", "-"], input=text, capture_output=True, text=True, check=False)
        assert check.returncode == 0 or "Operation not permitted" in check.stderr, check.stderr


def test_without_monitors_the_rules_are_the_model_ports_only() -> None:
    text = render(_d3_firewall_mon_v4=[], _d3_firewall_mon_v6=[], d3_firewall_monitor_ports=[], _d3_firewall_mon_ports="{  }")
    assert "monitor" not in text and "9100" not in text
    assert rules(text)[1] == "tcp dport != { 8000, 8001 } accept"


@pytest.mark.parametrize("v4", [[], ["10.0.0.5"]])
def test_monitor_ports_without_monitors_answer_loopback_only(v4: list[str]) -> None:
    text = render(_d3_firewall_mon_v4=v4, _d3_firewall_mon_v6=[])
    assert ("tcp dport { 9100 } ip saddr @monitors_v4 accept" in text) == bool(v4)
    assert "monitors_v6" not in text and "tcp dport { 9100 } counter reject with tcp reset" in text
