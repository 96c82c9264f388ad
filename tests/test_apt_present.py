"""The action d3fleet.fleet.apt_present's read and decision (d3_host.dpkg_status_command, d3_host.apt_missing) against
real output (tests/contracts/dpkg/dpkg-query-status.yml): apt runs only where apt state=present would act."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from d3_host import apt_missing, apt_simulate_command, apt_simulated, dpkg_status_command

CONTRACT = yaml.safe_load((Path(__file__).parent / "contracts" / "dpkg" / "dpkg-query-status.yml").read_text())


@pytest.mark.parametrize("capture", CONTRACT["captures"], ids=lambda c: f"{c['dpkg']}-{'-'.join(c['asked'])}")
def test_apt_acts_on_what_the_real_read_shows_not_installed_or_automatic(capture: dict[str, Any]) -> None:
    assert apt_missing(capture["stdout"], capture["asked"]) == capture["apt_acts_on"]


def test_only_installed_without_the_error_flag_for_this_architecture_and_not_automatic_counts() -> None:
    words = CONTRACT["status_words"]
    assert words[-1] == "installed"
    asked = [f"p{i}" for i in range(len(words))]
    # dpkg prints its lines sorted by name, not in the order asked
    read = "arch amd64\n" + "".join(f"pkg p{i} amd64 ok {word}\n" for i, word in reversed(list(enumerate(words))))
    assert apt_missing(read, asked) == asked[:-1]
    assert apt_missing(read, list(reversed(asked))) == list(reversed(asked[:-1]))
    ok = "arch amd64\npkg a1 amd64 ok installed\npkg b2 all ok installed\n"
    assert apt_missing(ok, ["a1", "b2"]) == []
    # the reinstall-required flag; only a foreign architecture (apt looks the bare name up for the native one)
    assert apt_missing(ok + "pkg c3 amd64 reinstreq installed\npkg d4 i386 ok installed\n", ["c3", "d4", "a1"]) == ["c3", "d4"]
    # one architecture installed of two: the native one counts
    assert apt_missing("arch amd64\npkg e5 i386 config-files\npkg e5 amd64 ok installed\n", ["e5"]) == []
    # marked automatic for the native architecture (an Architecture: all package is recorded under it); another
    # architecture's mark is not this one's
    assert apt_missing(ok + "auto b2 amd64\n", ["a1", "b2"]) == ["b2"]
    assert apt_missing(ok + "auto a1 i386\n", ["a1"]) == []
    # no native architecture read, an empty read, a line for another package or a name that only starts alike
    assert apt_missing("pkg a1 amd64 ok installed\n", ["a1"]) == ["a1"]
    assert apt_missing("", ["a1"]) == ["a1"]
    assert apt_missing("arch amd64\npkg a1x amd64 ok installed\npkg z9 amd64 ok installed\n", ["a1"]) == ["a1"]
    # lines of another shape are not read as one of these
    assert apt_missing("arch amd64 x\npkg a1 amd64 ok installed\n", ["a1"]) == ["a1"]
    assert apt_missing("arch amd64\npkg a1 amd64 ok installed extra\n", ["a1"]) == ["a1"]
    assert apt_missing("arch amd64\npkg a1 amd64 ok installed\nauto a1 amd64 x\nauto a1\n", ["a1"]) == []


def test_the_command_reads_the_architecture_dpkg_and_the_automatic_marks_of_the_names_only() -> None:
    command = dpkg_status_command(["podman", "g++", "libc6.1-dev"])
    assert command is not None
    assert command.startswith("printf 'arch %s\\n' \"$(dpkg --print-architecture)\"; ")
    fmt = "'pkg ${Package} ${Architecture} ${db:Status-Eflag} ${db:Status-Status}\\n'"
    assert f"dpkg-query -W -f={fmt} -- podman g++ libc6.1-dev; rc=$?; " in command
    assert "-v want=' podman g++ libc6.1-dev ' " in command and command.endswith(" /var/lib/apt/extended_states 2>/dev/null; exit $rc")


NOT_PLAIN = ["a", "Podman", "-rf", "bash;rm", "bash rm", "bash:amd64", "bash=5.2", "python3-*", "$(id)", "b\nc", 7, None]


@pytest.mark.parametrize("other", NOT_PLAIN)
def test_a_name_apt_alone_understands_is_not_read(other: Any) -> None:
    """A version, an architecture, a pattern or anything else that is not a plain name reaches apt (as a module
    argument, never a shell), not the read."""
    assert dpkg_status_command(["bash", other]) is None


@pytest.mark.parametrize("bad", [[], "podman", None, ("podman",)])
def test_name_must_be_a_non_empty_list(bad: Any) -> None:
    with pytest.raises(ValueError, match=re.escape("apt_present: name must be a non-empty list of Debian package names")):
        dpkg_status_command(bad)


def test_the_command_runs_on_this_debian_machine() -> None:
    """The read on this machine's own dpkg (CI's kind: Debian 12): dpkg is installed for the native architecture (it may
    be marked automatic), a made-up name is unknown (dpkg-query's rc 1)."""
    native = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    command = dpkg_status_command(["dpkg", "no-such-package-d3fleet"])
    assert command is not None
    done = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
    assert done.returncode == 1, done
    lines = done.stdout.splitlines()
    assert lines[:2] == [f"arch {native}", f"pkg dpkg {native} ok installed"], lines
    assert set(lines[2:]) <= {f"auto dpkg {native}"}, lines
    assert apt_missing(done.stdout, ["dpkg", "no-such-package-d3fleet"])[-1:] == ["no-such-package-d3fleet"]


def test_the_automatic_marks_are_read_for_the_names_asked_only(tmp_path: Path) -> None:
    """The command's awk part on this machine's awk, over an extended_states file of apt's shape: the asked packages
    marked Auto-Installed: 1 as "auto NAME ARCH" (an unmarked or unasked package, a name that only contains an asked
    one, a stanza whose Architecture line comes first, nothing else)."""
    states = tmp_path / "extended_states"
    states.write_text(
        "Package: curl\nArchitecture: amd64\nAuto-Installed: 1\n\n"
        "Package: wget\nArchitecture: amd64\nAuto-Installed: 0\n\n"
        "Package: libcurl\nArchitecture: amd64\nAuto-Installed: 1\n\n"
        "Architecture: i386\nPackage: socat\nAuto-Installed: 1\n\n"
        "Package: haproxy\nArchitecture: amd64\nAuto-Installed: 1\n"
    )
    command = dpkg_status_command(["curl", "wget", "socat", "no-such-package-d3fleet"])
    assert command is not None
    command = command.replace("/var/lib/apt/extended_states", str(states))
    done = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
    assert [line for line in done.stdout.splitlines() if line.startswith("auto")] == ["auto curl amd64", "auto socat i386"], done


SIMULATE = yaml.safe_load((Path(__file__).parent / "contracts" / "dpkg" / "apt-get-simulate.yml").read_text())


@pytest.mark.parametrize("capture", SIMULATE["captures"], ids=lambda c: "-".join(c["asked"]))
def test_check_mode_reads_what_apt_get_would_install_from_its_real_simulation(capture: dict[str, Any]) -> None:
    assert apt_simulated(capture["stdout"]) == capture["simulated"]


def test_the_simulation_reads_fresh_lists_into_a_temporary_directory_and_installs_nothing() -> None:
    command = apt_simulate_command(["haproxy", "socat"])
    opts = '-o "Dir::State::Lists=$d" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache='
    assert command == (
        "set -e; d=$(mktemp -d); trap 'rm -rf \"$d\"' EXIT; mkdir -p \"$d/partial\"; "
        f"apt-get {opts} -qq update >/dev/null; apt-get {opts} -s install -- haproxy socat"
    )
    # only Inst lines, whole words
    assert apt_simulated("Inst a (1 x [amd64])\nConf a (1 x [amd64])\nInstall b\n Inst c\nInst\n") == ["a"]


@pytest.mark.parametrize("bad", [[], "haproxy", ["haproxy", "bash;rm"], ["haproxy=2.6"], [None]])
def test_the_simulation_takes_plain_package_names_only(bad: Any) -> None:
    with pytest.raises(ValueError, match="plain Debian package names only"):
        apt_simulate_command(bad)
