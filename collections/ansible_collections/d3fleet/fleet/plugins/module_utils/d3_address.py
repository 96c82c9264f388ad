"""Where one host reaches another: the one check of an address that goes into a configuration line (HAProxy's
``server`` lines, Prometheus' scrape targets). Shared by the filters d3_router (``d3_router_backends``) and d3_metrics
(``d3_metrics_scrape``).

An address is an IP address (IPv4 or IPv6, an IPv6 zone only of letters, digits, ``_ . -``) or a DNS host name (labels of
letters, digits and ``-``, none starting or ending with ``-``, at most 63 characters each, 253 in all, an optional final
dot; not digits and dots only, which is an IPv4 address or nothing: 1.2.3.999). Nothing else: no blank, no control
character, no port, no brackets, no URL.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

# RFC 1123 host names
HOSTNAME = re.compile(r"\A(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?\Z")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# digits and dots only: an IPv4 address or nothing (1.2.3.999 is no host name: its last label would be all digits)
DIGITS = re.compile(r"\A[0-9.]+\Z")
# every character an IP address or a host name may hold (Python's ipaddress takes any text as an IPv6 zone: "%a b")
ADDRESS_CHARS = re.compile(r"\A[A-Za-z0-9.:%_-]+\Z")


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def address_problem(value: Any) -> str | None:
    """None when ``value`` is an IP address or a DNS host name, else what is wrong with it (to follow the value in a
    message: ``host x: d3_router_backend_address = 'a b' is not an IP address or a DNS host name``)."""
    if not isinstance(value, str) or CONTROL.search(value):
        return "is not one line of text"
    if not ADDRESS_CHARS.match(value) or (not is_ip(value) and (not HOSTNAME.match(value) or DIGITS.match(value))):
        return "is not an IP address or a DNS host name"
    return None
