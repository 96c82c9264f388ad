"""module_utils/d3_address.py: the one check of an address that reaches a configuration line (the router's server
lines, the monitor's scrape targets)."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_address import address_problem, is_ip

NOT_ADDRESS = "is not an IP address or a DNS host name"


@pytest.mark.parametrize(
    "value",
    ["10.0.0.1", "0.0.0.0", "::1", "fe80::1%eth0", "fe80::1%br-0_a.1", "2001:db8::2", "l4-a", "L4-A.example.org",
     "l4-a.example.org.", "a", "9a", "a" * 63, ".".join(["a" * 63] * 3) + "." + "a" * 61, "a-b.c-d", "1a.b2"],
)  # fmt: skip
def test_ip_addresses_and_host_names_pass(value: str) -> None:
    assert address_problem(value) is None


@pytest.mark.parametrize(
    "value",
    ["1.2.3.999", "9", "1.2.3.4.", "a..b", "-host", "host-", "::::", ".a", "a_b", "10.0.0.1:9100", "[::1]", "http://a", "a b", "",
     "fe80::1%a b", "fe80::1%a/b", "a" * 64, ".".join(["a" * 63] * 4), "a%b", "a:b", "ä.example"],
)  # fmt: skip
def test_anything_else_is_not_an_address(value: str) -> None:
    assert address_problem(value) == NOT_ADDRESS


@pytest.mark.parametrize("value", [None, 10, ["a"], "a\nb", "10.0.0.1\nbind *:1", "a\x7f", "a\tb", "\x00"])
def test_no_text_or_more_than_one_line_says_so(value: Any) -> None:
    assert address_problem(value) == "is not one line of text"


def test_is_ip_tells_addresses_from_names() -> None:
    assert is_ip("10.0.0.1") and is_ip("::1") and is_ip("fe80::1%eth0")
    assert not is_ip("l4-a") and not is_ip("1.2.3.999") and not is_ip("")
