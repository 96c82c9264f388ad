"""Supply chain on a lab host (the lab is the STAND-IN fleet; a missing lab part fails, it does not skip): the
lab apt server serves NVIDIA's stand-in key and repository over https with a certificate of the lab CA that lab
hosts trust; a key whose fingerprint is not nvidia_toolkit_key_fingerprint and a key URL that is not https are
refused by site.yml, naming the host and the variable, before anything on the host changes."""

from __future__ import annotations

import labkit
import pytest

pytestmark = pytest.mark.lab

HOST = "d3-lab-host2"  # Debian 12
# What the toolkit role would change first: apt's sources and keys, the installed packages, the CDI specs.
SNAPSHOT = r"""
set -eu
find /etc/apt /etc/cdi /var/run/cdi -type f -print0 2>/dev/null | sort -z | xargs -0r sha256sum
dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\n' | sort | sha256sum
"""
WRONG = "0123456789ABCDEF0123456789ABCDEF01234567"


@pytest.fixture(scope="module")
def host(lab_hosts: list[labkit.LabHost]) -> str:
    assert HOST in {h.name for h in lab_hosts}, f"{HOST} is missing: run `make lab`"
    return HOST


def test_lab_hosts_fetch_the_key_over_https_with_the_lab_ca(host: str) -> None:
    inventory = labkit.lab_inventory()
    gvars = inventory["all"].get("vars", {})
    assert gvars.get("ansible_host_key_checking") is False  # lab-only; ansible.cfg keeps checking on
    # certificate checked against the system trust store (the lab CA installed at provisioning), no -k
    key = labkit.on_host(host, "curl -fsS https://lab-apt:8443/gpgkey")
    assert "BEGIN PGP PUBLIC KEY BLOCK" in key
    assert labkit.on_host(host, "curl -fsS https://lab-apt:8443/stable/deb/amd64/InRelease").startswith("-----BEGIN PGP SIGNED")


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (
            {"nvidia_toolkit_key_fingerprint": WRONG},
            ["nvidia_toolkit_key_fingerprint", f"the inventory pins {WRONG}", "it has fingerprint"],
        ),
        # (a key URL that is not https is refused in the read-only head: docs/refusals.md row key-url-http)
    ],
    ids=["wrong-fingerprint"],
)
def test_a_key_that_is_not_pinned_or_not_https_is_refused_before_any_change(host: str, extra: dict[str, str], needles: list[str]) -> None:
    before = labkit.on_host(host, SNAPSHOT)
    run = labkit.run_playbook("site.yml", limit=host, extravars=extra)
    assert run.rc != 0
    text = " ".join(run.failure_text(host).split())
    assert f"{host}:" in text, text
    for needle in needles:
        assert needle in text, (needle, text)
    assert run.changed_tasks(host) == [], run.changed_tasks(host)
    assert labkit.on_host(host, SNAPSHOT) == before


def test_the_lab_pypi_serves_exactly_the_files_the_hash_pinned_requirements_allow() -> None:
    """d3_weights installs with pip --require-hashes from roles/d3_weights/files/hub-requirements.txt; the lab PyPI
    (lab_pypi, the stand-in for PyPI) must serve the very files PyPI serves, so every served wheel's sha256 is pinned."""
    import hashlib
    import re
    import urllib.request

    pinned = (labkit.ROOT / "roles/d3_weights/files/hub-requirements.txt").read_text()
    index = urllib.request.urlopen("http://127.0.0.1:8081/pypi/simple/", timeout=10).read().decode()
    projects = re.findall(r'href="([^"]+)/"', index)
    assert projects, "the lab PyPI index lists no project: run `make lab`"
    served = 0
    for project in projects:
        page = urllib.request.urlopen(f"http://127.0.0.1:8081/pypi/simple/{project}/", timeout=10).read().decode()
        for href, digest in re.findall(r'href="([^"#]+\.whl)#sha256=([0-9a-f]{64})"', page):
            url = urllib.request.urljoin(f"http://127.0.0.1:8081/pypi/simple/{project}/", href)
            data = urllib.request.urlopen(url, timeout=30).read()
            assert hashlib.sha256(data).hexdigest() == digest, url
            assert f"--hash=sha256:{digest}" in pinned, f"{href} is served by the lab PyPI but not pinned"
            served += 1
    assert served >= len([line for line in pinned.splitlines() if line and not line.startswith("#")])
