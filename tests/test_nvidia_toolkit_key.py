"""Unit tests for nvidia_toolkit_key_problems (nvidia_toolkit.py): the NVIDIA repository key check of
roles/nvidia_toolkit/tasks/key.yml, read from real `gpg --show-keys --with-colons` output (tests/fixtures/gpg/,
README there). tests/test_key_and_token_checks.py runs key.yml itself against localhost; the lab runs it on every
converge (tests/lab/test_supply_chain.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from nvidia_toolkit import FilterModule, gpg_primary_keys, key_problems

FIXTURES = Path(__file__).parent / "fixtures/gpg"
ONE = (FIXTURES / "one.colons").read_text()
BOTH = (FIXTURES / "both.colons").read_text()
NOT_A_KEY = (FIXTURES / "not-a-key.stderr").read_text()
FPR_ONE = "61CC15072841DBCEFF7937772F4B626E7B9E8D2F"
FPR_ONE_SUB = "7FB4060D00C93AA7C839E26F03AA8EDB0FF38F4F"
FPR_TWO = "E603E04559041FB138EC72AE8ED3CC68D69594EF"
URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
HEAD = f"h1: the NVIDIA repository key from {URL} (nvidia_toolkit_key_url) does not match nvidia_toolkit_key_fingerprint: "
TAIL = (". Nothing was written. Check where the URL really leads; change nvidia_toolkit_key_fingerprint only after "
        "checking the new key with its publisher.")  # fmt: skip


def gpg(stdout: str = "", rc: int = 0, stderr: str = "") -> dict[str, Any]:
    return {"rc": rc, "stdout": stdout, "stderr": stderr, "stdout_lines": stdout.splitlines(), "changed": False}


@pytest.mark.parametrize(
    ("case", "colons", "count", "fingerprints"),
    [
        ("one key with a subkey (fixture)", ONE, 1, [FPR_ONE]),
        ("two keys in one file (fixture)", BOTH, 2, [FPR_ONE, FPR_TWO]),
        ("nothing", "", 0, []),
        ("a lower-case fingerprint is upper-cased", f"pub:-:255:22:K::\nfpr:::::::::{FPR_ONE.lower()}:\n", 1, [FPR_ONE]),
        ("a subkey's fpr alone is not a primary key's", f"sub:-:255:18:K::\nfpr:::::::::{FPR_ONE_SUB}:\n", 0, []),
        ("an fpr after another record is not the pub's", f"pub:-:255:22:K::\ngrp:::::::::AB:\nfpr:::::::::{FPR_ONE}:\n", 1, []),
        ("only the first fpr after a pub", f"pub:-:255:22:K::\nfpr:::::::::{FPR_ONE}:\nfpr:::::::::{FPR_TWO}:\n", 1, [FPR_ONE]),
        ("a pub without its fpr", "pub:-:255:22:K::\nuid:-::::::::u:\n", 1, []),
        ("sec is not pub", f"sec:-:255:22:K::\nfpr:::::::::{FPR_ONE}:\n", 0, []),
        ("the type is the whole first field", f"pubx:-:255:22:K::\nfpr:::::::::{FPR_ONE}:\n", 0, []),
    ],
)
def test_gpg_primary_keys(case: str, colons: str, count: int, fingerprints: list[str]) -> None:
    assert gpg_primary_keys(colons) == {"count": count, "fingerprints": fingerprints}, case


@pytest.mark.parametrize(
    ("case", "result", "fingerprint", "why"),
    [
        ("the pinned key", gpg(ONE), FPR_ONE, None),
        ("pinned in lower case with spaces", gpg(ONE), " ".join(FPR_ONE.lower()[i : i + 4] for i in range(0, 40, 4)), None),
        ("another key", gpg(ONE), FPR_TWO, f"it has fingerprint {FPR_ONE}, the inventory pins {FPR_TWO}"),
        ("the subkey fingerprint is not the key", gpg(ONE), FPR_ONE_SUB, f"it has fingerprint {FPR_ONE}, the inventory pins {FPR_ONE_SUB}"),
        ("two keys, the pinned one among them", gpg(BOTH), FPR_ONE, f"it holds 2 keys ({FPR_ONE}, {FPR_TWO}), want exactly one"),
        ("no key at all", gpg("tru::1:1796142144:0:3:1:5\n"), FPR_ONE, "it holds 0 keys (), want exactly one"),
        ("a pub without its fpr", gpg("pub:-:255:22:K::\n"), FPR_ONE, f"it has fingerprint (none), the inventory pins {FPR_ONE}"),
        ("gpg refused the data", gpg(rc=2, stderr=NOT_A_KEY), FPR_ONE,
         "gpg could not read it (rc 2: gpg: keybox '/tmp/tmp.HOME/pubring.kbx' created\ngpg: no valid OpenPGP data found.)"),
        ("no gpg on the controller", gpg(rc=3, stderr="gpg is not installed on the Ansible controller (apt-get install gpg)\n"), FPR_ONE,
         "gpg could not read it (rc 3: gpg is not installed on the Ansible controller (apt-get install gpg))"),
        ("gpg failed without a word", gpg(rc=2), FPR_ONE, "gpg could not read it (rc 2: )"),
        ("a failing gpg's output is not trusted", gpg(ONE, rc=2, stderr=" partial "), FPR_ONE, "gpg could not read it (rc 2: partial)"),
    ],
)  # fmt: skip
def test_key_problems_exact_messages(case: str, result: dict[str, Any], fingerprint: str, why: str | None) -> None:
    expected = [] if why is None else [HEAD + why + TAIL]
    assert key_problems(result, fingerprint, "h1", URL) == expected, case


def test_key_problems_names_the_installed_key_when_the_url_did_not_answer() -> None:
    [message] = key_problems(gpg(BOTH), FPR_ONE, "gpu-7", "/etc/apt/keyrings/nvidia-container-toolkit.asc")
    assert message.startswith("gpu-7: the NVIDIA repository key from /etc/apt/keyrings/nvidia-container-toolkit.asc (nvidia")


@pytest.mark.skipif(shutil.which("gpg") is None, reason="needs gpg")
def test_a_fresh_key_from_this_machines_gpg_reads_like_the_fixture(tmp_path: Path) -> None:
    """The fixture is one gpg's output: a key generated now, listed by the command key.yml runs, reads the same way."""
    home, show = tmp_path / "gen", tmp_path / "show"
    home.mkdir(mode=0o700)
    show.mkdir(mode=0o700)
    base = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    subprocess.run(
        [*base, "--quick-gen-key", "fresh <fresh@d3-fleet.invalid>", "ed25519", "sign", "never"], check=True, capture_output=True
    )
    listing = subprocess.run([*base, "--with-colons", "--list-keys"], check=True, capture_output=True, text=True).stdout
    fpr = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    subprocess.run([*base, "--quick-add-key", fpr, "cv25519", "encr", "never"], check=True, capture_output=True)
    armored = subprocess.run([*base, "--armor", "--export", fpr], check=True, capture_output=True, text=True).stdout
    proc = subprocess.run(["gpg", "--homedir", str(show), "--batch", "--no-autostart", "--show-keys", "--with-colons"],
                          input=armored, capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [line.split(":")[0] for line in proc.stdout.splitlines()] == [line.split(":")[0] for line in ONE.splitlines()]
    assert key_problems(gpg(proc.stdout), fpr.lower(), "h1", URL) == []
    assert gpg_primary_keys(proc.stdout + proc.stdout)["count"] == 2


def test_the_filter_is_registered() -> None:
    assert FilterModule().filters() == {"nvidia_toolkit_key_problems": key_problems}
