"""The runtime-API filters the rollout drains with (d3_router_command, d3_router_stat), against HAProxy's `show stat`
CSV: the header and field order of HAProxy's management guide, section "9.1. CSV format" (0 pxname, 1 svname, 2 qcur,
3 qmax, 4 scur, ..., 17 status), and a `show stat` captured from Debian's HAProxy on the lab router
(tests/contracts/haproxy/show-stat.csv, when present: see its header)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections/ansible_collections/d3fleet/fleet/plugins/filter"))
sys.path.insert(0, str(ROOT / "collections"))  # the filter's module_utils import (d3_haproxy)
from d3_router_api import FilterModule, router_api_problems, router_command, router_stat, router_status  # noqa: E402

FIELDS = "pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,weight,act,bck"


def row(px: str, sv: str, scur: int, status: str) -> str:
    values = [px, sv, "0", "0", str(scur), "0", "", "0", "0", "0", "", "0", "", "0", "0", "0", "0", status, "1", "1", "0"]
    return ",".join(values)


STAT = "\n".join([
    "# " + FIELDS,
    row("fe_d3-lite", "FRONTEND", 3, "OPEN"),
    row("be_d3-lite", "h1-d3-lite", 2, "DRAIN"),
    row("be_d3-lite", "h2-d3-lite", 1, "UP"),
    row("be_d3-lite", "BACKEND", 3, "UP"),
    row("be_d3-nano", "h2-d3-nano", 0, "DOWN 1/2"),
]) + "\n\n"  # fmt: skip


def test_command_sets_one_servers_state() -> None:
    assert router_command({"backend": "be_d3-lite", "server": "h1-d3-lite"}, "drain") == "set server be_d3-lite/h1-d3-lite state drain"
    assert router_command({"backend": "be_d3-lite", "server": "h1-d3-lite"}, "ready").endswith("state ready")


@pytest.mark.parametrize("server", [
    {"backend": "be_x; shutdown sessions", "server": "s"},
    {"backend": "be_x", "server": "s\nshow stat"},
    {"backend": "be_x", "server": ""},
    {"backend": None, "server": "s"},
])  # fmt: skip
def test_command_refuses_names_that_are_not_haproxy_names(server: dict) -> None:
    with pytest.raises(ValueError, match="is not an HAProxy name"):
        router_command(server, "drain")


def test_command_refuses_other_states() -> None:
    with pytest.raises(ValueError, match="state must be one of"):
        router_command({"backend": "b", "server": "s"}, "up")


def test_stat_reads_sessions_and_status_of_the_given_servers_in_order() -> None:
    wanted = [{"backend": "be_d3-nano", "server": "h2-d3-nano"}, {"backend": "be_d3-lite", "server": "h1-d3-lite"},
              {"backend": "be_d3-lite", "server": "gone"}]  # fmt: skip
    assert router_stat(STAT, wanted) == [
        {"backend": "be_d3-nano", "server": "h2-d3-nano", "scur": 0, "status": "DOWN 1/2"},
        {"backend": "be_d3-lite", "server": "h1-d3-lite", "scur": 2, "status": "DRAIN"},
        {"backend": "be_d3-lite", "server": "gone", "scur": 0, "status": "MISSING"},
    ]


def test_stat_refuses_text_that_is_not_show_stat() -> None:
    with pytest.raises(ValueError, match="not the output of `show stat`"):
        router_stat("Unknown command. Please enter one of the following commands only :\n", [])


def test_captured_show_stat_of_debians_haproxy_parses() -> None:
    captured = ROOT / "tests/contracts/haproxy/show-stat.csv"
    lines = [line for line in captured.read_text().splitlines() if line.strip() and not line.startswith("#!")]
    text = "\n".join(lines) + "\n"
    header = lines[0][2:].split(",")
    assert header[:5] == ["pxname", "svname", "qcur", "qmax", "scur"] and header[17] == "status"
    servers = [{"backend": line.split(",")[0], "server": line.split(",")[1]} for line in lines[1:]
               if line.split(",")[1] not in ("FRONTEND", "BACKEND")]  # fmt: skip
    assert servers, "the capture lists no server"
    rows = router_stat(text, servers)
    assert all(r["status"] != "MISSING" for r in rows)
    assert {r["status"].split()[0] for r in rows} <= {"UP", "DOWN", "DRAIN", "MAINT", "NOLB", "no"}


def test_status_counts_each_models_servers_by_what_the_router_does_with_them() -> None:
    stat = STAT.rstrip() + "\n" + row("be_d3-nano", "h3-d3-nano", 0, "UP 1/2") + "\n" + row("be_d3-nano", "h4-d3-nano", 0, "MAINT") + "\n"
    assert router_status(stat, "r1") == [
        "r1: d3-lite: 1 up, 1 draining, 0 down, 0 in maintenance; draining: h1-d3-lite",
        "r1: d3-nano: 0 up, 0 draining, 2 down, 1 in maintenance; down: h2-d3-nano, h3-d3-nano; maint: h4-d3-nano",
    ]
    with pytest.raises(ValueError, match="not the output"):
        router_status("", "r1")


def test_exports() -> None:
    assert FilterModule().filters() == {"d3_router_command": router_command, "d3_router_stat": router_stat,
                                        "d3_router_status": router_status,
                                        "d3_router_api_problems": router_api_problems}  # fmt: skip


def test_command_names_the_bad_field_and_the_states_it_accepts() -> None:
    with pytest.raises(ValueError, match=r"\Abackend name 'be_x; shutdown sessions' is not an HAProxy name"):
        router_command({"backend": "be_x; shutdown sessions", "server": "s"}, "drain")
    with pytest.raises(ValueError, match=r"\Aserver name 's x' is not an HAProxy name"):
        router_command({"backend": "be_x", "server": "s x"}, "drain")
    with pytest.raises(ValueError, match=r"\Astate must be one of ready, drain, maint, not 'up'\Z"):
        router_command({"backend": "b", "server": "s"}, "up")


def test_stat_and_status_read_the_first_row_after_the_header() -> None:
    stat = "# " + FIELDS + "\n" + row("be_d3-lite", "h1-d3-lite", 4, "DRAIN") + "\n"
    assert router_stat(stat, [{"backend": "be_d3-lite", "server": "h1-d3-lite"}]) == [
        {"backend": "be_d3-lite", "server": "h1-d3-lite", "scur": 4, "status": "DRAIN"}
    ]
    assert router_status(stat, "r1") == ["r1: d3-lite: 0 up, 1 draining, 0 down, 0 in maintenance; draining: h1-d3-lite"]


def test_stat_reads_an_empty_scur_as_no_session_and_a_missing_status_as_empty() -> None:
    values = row("be_d3-lite", "h1-d3-lite", 0, "UP").split(",")
    values[4] = ""  # scur left empty
    stat = "# " + FIELDS + "\n" + ",".join(values) + "\n"
    assert router_stat(stat, [{"backend": "be_d3-lite", "server": "h1-d3-lite"}])[0]["scur"] == 0
    short = "# pxname,svname,scur\nbe_d3-lite,h1-d3-lite,2\n"
    assert router_stat(short, [{"backend": "be_d3-lite", "server": "h1-d3-lite"}]) == [
        {"backend": "be_d3-lite", "server": "h1-d3-lite", "scur": 2, "status": ""}
    ]


def test_the_refusal_shows_the_first_200_characters_of_the_text() -> None:
    text = "x" * 300
    for parse in (lambda: router_stat(text, []), lambda: router_status(text)):
        with pytest.raises(ValueError) as refused:
            parse()
        assert str(refused.value) == "not the output of `show stat`: " + repr("x" * 200)


def test_status_without_a_router_name_has_no_prefix() -> None:
    expected = ["d3-lite: 1 up, 1 draining, 0 down, 0 in maintenance; draining: h1-d3-lite",
                "d3-nano: 0 up, 0 draining, 1 down, 0 in maintenance; down: h2-d3-nano"]  # fmt: skip
    assert router_status(STAT) == expected
    assert router_status(STAT, "") == expected


def test_status_kinds_of_haproxy_states() -> None:
    stat = "\n".join([
        "# " + FIELDS,
        row("be_x", "FRONTEND", 1, "OPEN"),  # a `listen` proxy has a FRONTEND row under the same name: not a server
        row("be_x", "nolb", 0, "NOLB"),
        row("be_x", "tracked", 0, "MAINT (via be_y/s1)"),
        row("be_x", "nostatus", 0, ""),
        row("be_x", "", 0, "DOWN"),
    ]) + "\n"  # fmt: skip
    assert router_status(stat) == ["x: 0 up, 1 draining, 2 down, 1 in maintenance; draining: nolb; down: nostatus, ; maint: tracked"]
