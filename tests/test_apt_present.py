"""The action d3fleet.fleet.apt_present's read and decision (d3_host.dpkg_status_command, d3_host.apt_missing) against
real dpkg-query output (tests/contracts/dpkg/dpkg-query-status.yml): apt runs only for a package that is not installed."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from d3_host import apt_missing, dpkg_status_command

CONTRACT = yaml.safe_load((Path(__file__).parent / "contracts" / "dpkg" / "dpkg-query-status.yml").read_text())


@pytest.mark.parametrize("capture", CONTRACT["captures"], ids=lambda c: f"{c['dpkg']}-{'-'.join(c['asked'])}")
def test_missing_is_what_dpkg_does_not_show_installed(capture: dict[str, Any]) -> None:
    assert apt_missing(capture["stdout"], capture["asked"]) == capture["not_installed"]


def test_only_the_installed_status_word_counts_and_the_order_is_the_one_asked() -> None:
    words = CONTRACT["status_words"]
    assert words[-1] == "installed"
    asked = [f"p{i}" for i in range(len(words))]
    # dpkg prints its lines sorted by name, not in the order asked
    out = "".join(f"p{i} {word}\n" for i, word in reversed(list(enumerate(words))))
    assert apt_missing(out, asked) == asked[:-1]
    assert apt_missing(out, list(reversed(asked))) == list(reversed(asked[:-1]))
    # a line for another package, a name that only starts like an asked one, an empty read
    assert apt_missing("bash installed\nhaproxy-x installed\n", ["haproxy", "bash"]) == ["haproxy"]
    assert apt_missing("", ["a1", "b2"]) == ["a1", "b2"]
    # a multiarch package with one instance installed, trailing spaces as a terminal would leave them
    assert apt_missing("lib1 config-files\nlib1 installed  \n", ["lib1"]) == []


def test_the_command_is_dpkg_query_with_the_contract_s_format() -> None:
    command = dpkg_status_command(["podman", "skopeo", "g++", "libc6.1-dev"])
    argv = shlex.split(command)
    assert argv == ["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\\n", "--", "podman", "skopeo", "g++", "libc6.1-dev"]


@pytest.mark.parametrize("bad", ["", "a", "Podman", "-rf", "bash;rm", "bash rm", "bash:amd64", "bash=5.2", "$(id)", "b\nc", 7, None])
def test_a_name_that_is_not_a_package_name_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(ValueError) as refused:
        dpkg_status_command(["bash", bad])
    assert str(refused.value) == (
        f"apt_present: name {bad!r}: not a Debian package name (Debian Policy 5.6.1: lower case letters, digits, '+', '-'"
        " and '.', starting with a letter or digit; no version or architecture)"
    )


@pytest.mark.parametrize("bad", [[], "podman", None, ("podman",)])
def test_name_must_be_a_non_empty_list(bad: Any) -> None:
    with pytest.raises(ValueError, match=re.escape("apt_present: name must be a non-empty list of Debian package names")):
        dpkg_status_command(bad)


def test_the_command_runs_on_this_debian_machine() -> None:
    """The read on this machine's own dpkg (CI's kind: Debian 12): bash is installed, a made-up name is not."""
    done = subprocess.run(dpkg_status_command(["bash", "no-such-package-d3fleet"]), shell=True, capture_output=True, text=True, check=False)
    assert done.returncode == 1, done
    assert done.stdout == "bash installed\n"
    assert apt_missing(done.stdout, ["bash", "no-such-package-d3fleet"]) == ["no-such-package-d3fleet"]
