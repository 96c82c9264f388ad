"""site.yml from the execution environment (execution-environment.yml, `make ee`), run by ansible-navigator the way
AWX / AAP run a job template: the project checked out and mounted, the EE image runs it, the credentials injected
per job (extra vars in a mounted file; the machine credential's key held by an ssh-agent), never baked into the
image. The lab is the STAND-IN fleet (lab/README.md); a missing EE image or lab part fails, it does not skip.

Cost: one site.yml run inside the EE, on a host of each Debian release (the fewest instances) of the converged lab:
it must change nothing (the converge is the session's, tests/lab/conftest.py), log in to the registry with the
injected credential and out again. The image is built by `make ee` beforehand (not here)."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import labkit
import pytest
from labkit import LabHost

pytestmark = pytest.mark.lab

EE_IMAGE = os.environ.get("D3_EE_IMAGE", "localhost/d3-fleet-ee:latest")
CREDENTIALS_IN_EE = "/d3-credentials"  # where the job's credential files appear inside the EE
# colours, and the event data ansible-runner's display hides in stdout (ESC[K base64 ESC[<n>D ESC[K)
ANSI = re.compile(r"\x1b\[K[A-Za-z0-9+/=]*\x1b\[\d+D|\x1b\[[0-9;]*[A-Za-z]")


@pytest.fixture(scope="module")
def ee_user() -> tuple[int, int]:
    """The EE image's user (ansible-builder's USER), who must read the injected credentials."""
    assert labkit.image_exists(EE_IMAGE), f"no execution environment image {EE_IMAGE}: run `make ee` first"
    assert Path("/dev/mqueue").is_dir(), "ansible-navigator needs /dev/mqueue to run podman: `make ee` creates it"
    user = labkit.podman("image", "inspect", EE_IMAGE, "--format", "{{.Config.User}}", timeout=60).stdout.strip()
    assert user.isdigit(), f"{EE_IMAGE} runs as {user!r}, not a numeric uid"
    return int(user), 0


@pytest.fixture(scope="module")
def job_dir(ee_user: tuple[int, int]) -> Iterator[Path]:
    """A private directory per job, readable by the EE's user only (AWX's private data dir)."""
    path = Path(tempfile.mkdtemp(prefix="d3-ee-job-"))
    os.chown(path, *ee_user)
    path.chmod(0o700)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture(scope="module")
def registry_password() -> str:
    return "ee-" + secrets.token_hex(12)


@pytest.fixture(scope="module")
def extravars(job_dir: Path, ee_user: tuple[int, int], registry_password: str) -> str:
    """The job's credential extra vars (AWX's custom credential type injector writes them the same way). The lab
    registry takes any login, so the whole login path runs: podman login with the password on stdin, no_log."""
    path = job_dir / "extravars.json"
    path.write_text(
        json.dumps(
            {
                "d3_image_registry_username": "d3-ee-job",
                "d3_image_registry_password": registry_password,
                "d3_image_registry_login_registry": "lab-registry:5000",
            }
        )
    )
    os.chown(path, *ee_user)
    path.chmod(0o600)
    return f"@{CREDENTIALS_IN_EE}/extravars.json"


@pytest.fixture(scope="module")
def machine_credential(job_dir: Path, ee_user: tuple[int, int], lab_hosts: list[LabHost]) -> Iterator[str]:
    """An ssh-agent holding the lab's key, as ansible-runner loads an AWX machine credential (ssh-add of the key,
    which is never a file in the EE); ansible-navigator mounts SSH_AUTH_SOCK into the EE. The agent runs as the EE's
    user: ssh-agent answers only its own uid (and root)."""
    sock = job_dir / "agent.sock"
    uid, gid = ee_user
    agent = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "ssh-agent", "-D", "-a", str(sock)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        labkit.wait_until("the ssh-agent socket", sock.exists, timeout=10)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", lab_hosts[0].key], env=env, check=True, timeout=30, capture_output=True)
        yield str(sock)
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def navigator_site(job_dir: Path, extravars: str, agent_sock: str, log: str, limit: str) -> subprocess.CompletedProcess[str]:
    argv = [
        # the collection's playbook by its name: the copy `make ee` installed from the built tarball runs (site.yml
        # of this checkout would find the checkout's collections/ first, next to it)
        labkit.venv_tool("ansible-navigator"), "run", "d3fleet.fleet.site",
        "-i", str(labkit.LAB_INVENTORY), "-l", limit,
        "--ee", "true", "--eei", EE_IMAGE, "--pull-policy", "never", "--ce", "podman",
        "-m", "stdout", "--pae", "false", "--lf", str(job_dir / log),
        # the lab hosts' sshd listen on this machine's loopback (127.0.0.1:22NN)
        "--co=--network=host",
        "--eev", f"{job_dir}:{CREDENTIALS_IN_EE}",
        "--senv", "ANSIBLE_NOCOLOR=1",
        "-e", extravars,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["SSH_AUTH_SOCK"] = agent_sock
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=labkit.ROOT, env=env, timeout=1500, check=False)
    proc.stdout = ANSI.sub("", proc.stdout)
    (job_dir / log).with_suffix(".out").write_text(proc.stdout)
    return proc


def fatal_lines(stdout: str) -> str:
    """The failed tasks of a run with their messages (for an assertion's text)."""
    lines = stdout.splitlines()
    picked = [i for i, line in enumerate(lines) if line.startswith(("fatal:", "failed:"))]
    return "\n".join("\n".join(lines[max(0, i - 2) : i + 8]) for i in picked)[-6000:] or stdout[-3000:]


@pytest.fixture(scope="module")
def ee_hosts(converge_run: labkit.Run, host_names: list[str]) -> list[str]:
    """A host of each Debian release of the converged fleet (the session's converge)."""
    return sorted(labkit.host_per_suite(host_names).values())


@pytest.fixture(scope="module")
def ee_run(job_dir: Path, extravars: str, machine_credential: str, ee_hosts: list[str]) -> subprocess.CompletedProcess[str]:
    run = navigator_site(job_dir, extravars, machine_credential, "site.log", ",".join(ee_hosts))
    assert run.returncode == 0, fatal_lines(run.stdout) + run.stderr[-2000:]
    return run


def test_site_runs_in_the_ee_and_changes_nothing_on_the_converged_hosts(ee_run, ee_hosts: list[str]) -> None:
    for host in ee_hosts:
        counts = labkit.recap(ee_run.stdout, host)
        assert counts["failed"] == 0 and counts["unreachable"] == 0, (host, counts)
        assert counts["ok"] > 0, (host, counts)
    changed = {host: labkit.recap_changed(ee_run.stdout, host) for host in ee_hosts}
    assert changed == dict.fromkeys(ee_hosts, 0), changed


def task_block(stdout: str, task: str) -> str:
    """The output of the first task whose name starts with `task`, up to the next task."""
    m = re.search(rf"^TASK \[{re.escape(task)}[^\n]*\n(.*?)(?=^TASK \[|^PLAY RECAP)", stdout, re.M | re.S)
    assert m, f"no task {task!r} in the run"
    return m.group(1)


def test_the_injected_registry_credential_was_used_never_printed_and_logged_out(
    ee_run, registry_password: str, ee_hosts: list[str]
) -> None:
    # the login ran on every host (its result hidden by no_log), the refusal of a failed login passed, and the role
    # logged out again after the pull: the host's credentials file holds no login afterwards
    login = task_block(ee_run.stdout, "d3fleet.fleet.d3_image : Log in to the image registry")
    refusal = task_block(ee_run.stdout, "d3fleet.fleet.d3_image : Refuse a failed registry login")
    logout = task_block(ee_run.stdout, "d3fleet.fleet.d3_image : Log out of the image registry")
    for host in ee_hosts:
        assert re.search(rf"^ok: \[{host}\]", login, re.M), (host, login)
        assert re.search(rf"^ok: \[{host}\]", refusal, re.M), (host, refusal)
        assert re.search(rf"^ok: \[{host}\]", logout, re.M), (host, logout)
        auth = labkit.on_host(host, "cat /run/containers/0/auth.json 2>/dev/null || echo '{}'")
        assert "lab-registry:5000" not in auth, (host, auth)
    assert registry_password not in ee_run.stdout + ee_run.stderr


def _grep_image(mounts: list[str], needles: list[str]) -> subprocess.CompletedProcess[str]:
    """grep the EE's whole filesystem for any of the needles (fixed strings)."""
    args = ["run", "--rm", "--network=none", "--user=0", *mounts, "--entrypoint", "grep", EE_IMAGE, "-rlsF"]
    for needle in needles:
        args += ["-e", needle]
    return labkit.podman(*args, "/", "--exclude-dir=proc", "--exclude-dir=sys", "--exclude-dir=dev", timeout=300)


def test_the_image_holds_no_credential(ee_user, lab_hosts: list[LabHost]) -> None:
    key = Path(lab_hosts[0].key)
    # the private key's body (not its armour lines) and the public key: neither may be in a file of the image
    body = [line for line in key.read_text().splitlines() if line and not line.startswith("-----")]
    needles = [body[1], Path(f"{key}.pub").read_text().split()[1]]
    found = _grep_image([], needles)
    assert found.returncode == 1 and not found.stdout, f"{EE_IMAGE} holds the lab's SSH key in: {found.stdout}"
    # the same search finds the key where it is (a file mounted into the container): the search itself works
    control = _grep_image([f"-v={key}:/tmp/planted-key:ro"], needles)
    assert control.stdout.split() == ["/tmp/planted-key"], control.stdout + control.stderr
    env = labkit.podman("image", "inspect", EE_IMAGE, "--format", "{{json .Config.Env}}", timeout=60).stdout
    assert not re.search(r"(?i)(password|passwd|token|secret|api_key|private_key)", env), env
