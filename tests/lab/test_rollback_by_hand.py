"""docs/runbook.md "Rolling back by hand, without Ansible", followed as written (issue 35.6): its shell blocks run
command by command (`set -eux`, each block on the machine its first comment names), on one instance of one lab host
behind the lab router: d3-lite on d3-lab-host3 (Quadlet), the model's other two servers keep serving.

There and back on the session's converge: the instance goes to the image of another tag of the lab registry
(`nightly-next`, a STAND-IN for the previous deployment: the session's converge has none; pulled here when the host
does not have it, as a real host keeps its previous image), then back to the one it ran, by the same blocks. The
unit file ends byte-identical, the router server UP, the deployment record untouched."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import labkit
import pytest
from labkit import ROOT, on_host
from routerkit import ROUTER, SOCKET, routed, server_states

HOST, INSTANCE, MODEL = "d3-lab-host3", "d3-lite", "d3-lite"
SECTION = "## Rolling back by hand, without Ansible"


def runbook_blocks() -> list[tuple[str, list[str]]]:
    """(where, lines) of each ```sh block of the section: where is `router` or `host`, from its first comment."""
    text = (ROOT / "docs/runbook.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, flags=re.M | re.S)
    out = []
    for block in blocks:
        lines = block.strip("\n").splitlines()
        where = "router" if lines[0].startswith("# on each router") else "host" if lines[0].startswith("# on the host") else ""
        assert where, f"a block of {SECTION!r} names neither the router nor the host: {lines[0]!r}"
        out.append((where, lines))
    return out


def as_run(lines: list[str], values: dict[str, str]) -> str:
    """The block as a script: the assignments of the names in ``values`` take the test's value (an example in the
    doc), every other line as written."""
    script = ["set -eux"]
    for line in lines:
        name = line.split("=", 1)[0]
        script.append(f"{name}='{values[name]}'" if re.fullmatch(r"[A-Z]+=.*", line) and name in values else line)
    return "\n".join(script)


def run_blocks(values: dict[str, str], blocks: list[tuple[str, list[str]]]) -> list[str]:
    """Each block on its machine, as in one shell session per machine: a block sees the names earlier blocks on the
    same machine set (the give-back on the router uses the drain's SOCK, BACKEND and SERVER)."""
    outputs, session = [], {"router": [], "host": []}
    for where, lines in blocks:
        machine = ROUTER if where == "router" else HOST
        outputs.append(on_host(machine, as_run(session[where] + lines, values)))
        session[where] += [line for line in lines if re.fullmatch(r"[A-Z]+=.*", line)]
    return outputs


def back_up(backend: str, name: str) -> None:
    """Given back: UP once the router's health checks see it again."""
    labkit.wait_until(f"{backend}/{name} UP", lambda: server_states(backend)[name].startswith("UP"), timeout=60, poll=0.5)


def test_the_runbooks_manual_rollback_there_and_back(converge_run: labkit.Run, host_names: list[str]) -> None:
    started = time.monotonic()
    blocks = runbook_blocks()
    assert [w for w, _ in blocks] == ["router", "host", "router"]
    # the doc's example socket is the role's default, the one the lab router uses
    assert f"SOCK={SOCKET}" in blocks[0][1]
    model = routed(converge_run, host_names)[MODEL]
    server = next(s for s in model["servers"] if s["host"] == HOST and s["instance"] == INSTANCE)
    args = labkit.container_args(HOST, INSTANCE)
    address = args[args.index("--host") + 1]
    health = f"http://{'127.0.0.1' if address in ('0.0.0.0', '::') else address}:{args[args.index('--port') + 1]}/health"
    record: dict[str, Any] = json.loads(on_host(HOST, "cat /var/lib/d3/deployed.json"))
    current = record["image_ref"]
    unit = on_host(HOST, f"cat /etc/containers/systemd/{INSTANCE}.container")
    assert current in unit, f"the unit does not name the recorded image {current}"
    other = f"{current.split('@', 1)[0]}@{labkit.registry_digest('nightly-next')}"
    assert other != current
    had_other = on_host(HOST, f"podman image exists '{other}' && echo yes || echo no").strip() == "yes"
    if not had_other:  # setup, not the procedure: a real host keeps its previous image
        on_host(HOST, f"podman pull -q '{other}' >/dev/null")
    values = {"BACKEND": model["backend"], "SERVER": server["name"], "UNIT": INSTANCE, "HEALTH": health}
    try:
        # there: NOW is read from the deployment record by the doc's own line; PREVIOUS is the stand-in
        out = run_blocks({**values, "PREVIOUS": other}, blocks)
        assert f"{model['backend']}/{server['name']} in flight 0 DRAIN" in out[0], out[0]
        assert out[1].strip().splitlines()[-1] == other, out[1]
        assert labkit.running(HOST)[INSTANCE][0] == other
        assert other in on_host(HOST, f"cat /etc/containers/systemd/{INSTANCE}.container")
        back_up(model["backend"], server["name"])
        # back: the same blocks, the names swapped
        out = run_blocks({**values, "NOW": other, "PREVIOUS": current}, blocks)
        assert out[1].strip().splitlines()[-1] == current, out[1]
    finally:
        # whatever happened: the recorded image in the unit, the instance running it, the server back in. The unit file
        # is rewritten only when it still names the other image: sed -i always writes a new file, and a unit file newer
        # than the running instance makes the next site.yml restart it (d3_units_actions: "unit file newer than the
        # running instance"; test_site_runner's second run, which follows, then changed 1 on this host)
        on_host(HOST, f"f=/etc/containers/systemd/{INSTANCE}.container; if grep -qF '{other}' $f; then "
                      f"sed -i 's|{other}|{current}|' $f && systemctl daemon-reload; fi; "
                      f"podman inspect --format '{{{{.ImageName}}}}' {INSTANCE} | grep -qxF '{current}' "
                      f"|| systemctl restart {INSTANCE}.service", check=False)  # fmt: skip
        on_host(ROUTER, f"echo 'set server {model['backend']}/{server['name']} state ready' | socat stdio {SOCKET}", check=False)
        if not had_other:
            on_host(HOST, f"podman rmi '{other}' >/dev/null 2>&1 || true", check=False)
    assert on_host(HOST, f"cat /etc/containers/systemd/{INSTANCE}.container") == unit
    assert labkit.running(HOST)[INSTANCE][0] == current
    assert json.loads(on_host(HOST, "cat /var/lib/d3/deployed.json")) == record
    back_up(model["backend"], server["name"])
    print(f"manual rollback there and back: {time.monotonic() - started:.1f} s")


@pytest.fixture(autouse=True)
def _only_on_a_three_host_lab(host_names: list[str]) -> None:
    assert HOST in host_names, f"the test needs {HOST}: make lab LAB_HOSTS=3"
