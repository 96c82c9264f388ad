"""Every command the front door shows works as written on a fresh checkout: README.md's ```sh blocks, the example
inventory's comments and the next steps `make demo` ends with (tests/doccommands.py reads them, so these tests follow
the docs). The example's commands run here (playbook tier: they contact no host); the lab's in
tests/lab/test_readme_commands_lab.py."""

from __future__ import annotations

import json
import re

import doccommands
import pytest
from doccommands import NEXT_STEPS, NOT_RUN, README, ROOT, shown, tier


def test_every_shown_command_has_a_tier() -> None:
    """A command added to the docs is run by one of the tiers, or listed in NOT_RUN with its reason."""
    unknown = [(where, c) for where, c in shown() if tier(c) == "unknown"]
    assert not unknown, f"shown commands no test runs (give them a tier in tests/doccommands.py): {unknown}"
    assert {c for _, c in shown()} >= {"make plan", "ansible-playbook playbooks/plan.yml -i inventories/example"}


def test_the_parser_reads_commands_comments_and_continuations() -> None:
    text = "x\n```sh\n# a comment\nmake plan   # plans\nansible-playbook a.yml \\\n  -e 'x=#1'\n\n```\n```yaml\nno: 1\n```\n"
    assert doccommands.readme_commands(text) == ["make plan", "ansible-playbook a.yml -e 'x=#1'"]
    yml = "---\n# Copy it, then\n#   ansible-playbook playbooks/plan.yml -i inv   # preview\n# make sure\nall: {}\n"
    assert doccommands.comment_commands(yml) == ["ansible-playbook playbooks/plan.yml -i inv"]
    assert doccommands._strip_comment("echo '#1' \"a # b\" x#y # z") == "echo '#1' \"a # b\" x#y"


@pytest.mark.parametrize(("command", "expected"), [
    (". .venv/bin/activate", "setup"), ("export ANSIBLE_STDOUT_CALLBACK=x.y.z", "setup"), ("make demo", "skip"),
    ("make plan", "playbook"), ("ansible-playbook playbooks/plan.yml -i inventories/example -l l4-b", "playbook"),
    ("ansible-playbook playbooks/status.yml -i inventories/lab", "lab"),
    ("curl -sS http://127.0.0.1:19104/v1/systemone -d @f", "lab"), ("curl -sS https://example.org/", "unknown"),
    ("make plan INVENTORY=inventories/lab", "unknown"), ("rm -rf /", "unknown"),
])  # fmt: skip
def test_tiers(command: str, expected: str) -> None:
    assert tier(command) == expected


def test_the_demo_ends_with_its_next_steps_and_the_readme_shows_them() -> None:
    """`make demo` prints examples/demo-next-steps.sh at its end; the README's tour shows the same commands."""
    steps = [c for w, c in shown() if w == str(NEXT_STEPS.relative_to(ROOT))]
    assert [tier(c) for c in steps] == ["lab"] * 4
    readme = [c for w, c in shown() if w == "README.md"]
    assert [c for c in steps if c not in readme] == []
    assert {"nightly-next", "nightly"} == {c.rsplit(":", 1)[1] for c in steps if "rollout.yml" in c}
    demo = re.search(r"^demo:[^\n]*\n(?:\t.*\n)+", (ROOT / "Makefile").read_text(), flags=re.M)
    assert demo and "cat examples/demo-next-steps.sh" in demo.group(0).splitlines()[-1]
    assert "demo: export ANSIBLE_STDOUT_CALLBACK ?= d3fleet.fleet.fleet" in (ROOT / "Makefile").read_text()


def test_the_request_file_is_the_contract_request() -> None:
    """examples/decision-request.json (the README's curl body) is tests/contracts/'s POST /v1/systemone request."""
    contract = json.loads(doccommands.CONTRACT_REQUEST.read_text())
    contract.pop("_source")
    assert json.loads(doccommands.REQUEST.read_text()) == contract
    assert all(f"-d @{doccommands.REQUEST.relative_to(ROOT)}" in c for _, c in shown() if c.startswith("curl "))


def test_not_run_commands_are_shown() -> None:
    """NOT_RUN lists only commands the docs show (a stale entry would hide nothing but mislead)."""
    assert set(NOT_RUN) - {c for _, c in shown()} <= {"make check", "make lab-down"}
    assert "make demo" in README.read_text()


@pytest.mark.playbook
@pytest.mark.parametrize("command", sorted({c for _, c in shown() if tier(c) == "playbook"}))
def test_example_command_works_as_written(command: str) -> None:
    """Each example-inventory command exits 0 on a fresh checkout (no vault, no host contacted)."""
    proc = doccommands.run(command, timeout=300)
    assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    assert "l4-a" in proc.stdout and "l4-b" in proc.stdout


# --- the facts the docs name, against the code (issue 35.8) ----------------------------------------------------------


def test_every_variable_the_docs_name_is_in_the_code() -> None:
    """A `d3_*`, `nvidia_toolkit_*` or `podman_*` name in README.md or docs/ (code spans) is a word of the code (a role
    default, an argument spec, a fact a task sets, a plugin's file), or kept on purpose (HISTORICAL): a renamed
    variable left in a doc fails here."""
    known = doccommands.code_words() | {p.stem for p in (ROOT / "collections").rglob("*.py")}
    named = doccommands.named_variables()
    assert len(named) > 100, sorted(named)  # the parser finds them
    stale = {name: sorted(set(docs)) for name, docs in named.items() if name not in known and name not in doccommands.HISTORICAL}
    assert not stale, f"variables the docs name and the code does not have: {stale}"
    assert not [h for h in doccommands.HISTORICAL if h in known], "a historical name is back in the code: drop it"


def test_every_group_the_docs_name_is_one_the_playbooks_use() -> None:
    named = doccommands.named_groups()
    assert {"l4-nodes", "d3-routers", "d3-monitors", "all"} <= set(named), sorted(named)
    unknown = {g: sorted(set(d)) for g, d in named.items() if g not in doccommands.playbook_groups()}
    assert not unknown, f"groups the docs name that no playbook or role uses: {unknown}"


def test_every_default_the_docs_state_is_the_codes() -> None:
    """`| \\`variable\\` | \\`default\\` |` rows and `\\`variable\\` (N)` in README.md and docs/: the role's default (its
    defaults/main.yml, else the planner's Options for the d3 role's `d3_*` settings)."""
    from dataclasses import MISSING, fields

    import yaml
    from d3_planner import Options

    spec = yaml.safe_load((ROOT / "roles/d3/meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    planner = {f"d3_{f.name}": f.default for f in fields(Options) if f.default is not MISSING and f"d3_{f.name}" in spec}
    defaults = planner | doccommands.role_defaults()
    stated = [(doc, name, value) for doc, name, value in doccommands.documented_defaults() if name in defaults]
    assert len(stated) >= 15, stated
    wrong = [(doc, name, value, defaults[name]) for doc, name, value in stated if yaml.safe_load(value) != defaults[name]]
    assert not wrong, f"(doc, variable, the doc's default, the code's): {wrong}"


def test_every_router_url_in_the_docs_uses_a_router_port() -> None:
    """http://router:PORT in the docs: the fleet endpoint (d3_router_port) or the metrics port, the role's defaults
    (a model's own port is a d3_router_ports choice, never a computed one: an example would name it)."""
    defaults = doccommands.role_defaults()
    urls = doccommands.named_router_urls()
    assert urls, "no router URL found"
    wrong = [u for u in urls if u[2] not in (defaults["d3_router_port"], defaults["d3_router_metrics_port"])]
    assert not wrong, wrong


def test_the_fact_parsers_find_what_they_should() -> None:
    """The parsers on a text of each kind (so the tests above cannot pass by finding nothing)."""
    assert doccommands.VARIABLE.findall("set `d3_router_ports: {x: 1}`, d3_gpu_* and d3_rollout.py") == ["d3_router_ports"]
    assert doccommands.GROUP_VARS.findall("in group_vars/all (or group_vars/d3-routers), `group_vars/l4-nodes/main.yml`") == [
        "all", "d3-routers", "l4-nodes"]  # fmt: skip
    assert [a or b for a, b in doccommands.GROUP.findall("group `d3-monitors` and the `l4-nodes` group")] == ["d3-monitors", "l4-nodes"]
    assert doccommands.DEFAULT_ROW.findall("| `d3_router_port` | `8000` | the endpoint |\n| x | `1` |") == [("d3_router_port", "8000")]
    assert doccommands.DEFAULT_INLINE.findall("on `d3_router_metrics_port` (8405), its own") == [("d3_router_metrics_port", "8405")]


def test_the_supported_host_releases_are_docs_versions_md_row() -> None:
    """docs/versions.md states the supported host releases once; d3_preflight's default and its argument spec (what
    preflight refuses by) are that row, and the README and the lab say nothing else."""
    import yaml

    row = re.search(r"^\| host OS \| ([^|]+) \|", (ROOT / "docs/versions.md").read_text(), flags=re.M)
    assert row, "docs/versions.md has no host OS row"
    stated: dict[str, list[str]] = {}
    for release in row.group(1).split(","):
        name, version = release.split()
        stated.setdefault(name, []).append(version)
    role = ROOT / "roles/d3_preflight"
    assert yaml.safe_load((role / "defaults/main.yml").read_text())["d3_preflight_supported_os"] == stated
    spec = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert spec["d3_preflight_supported_os"]["default"] == stated
    assert stated == {"Debian": ["12", "13"], "Ubuntu": ["24"]}  # the row's parser read it


def test_the_readme_keeps_dated_headline_figures_and_no_commit_hashes() -> None:
    """Timings and the commits they were measured at live in docs/testing.md; the README keeps headline figures, each
    paragraph that gives one dated."""
    text = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", README.read_text(), flags=re.M | re.S)
    hashes = re.findall(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/.-])", text)
    assert not hashes, f"commit hashes in README.md (they go to docs/testing.md): {hashes}"
    undated = [p for p in text.split("\n\n") if re.search(r"\b\d+(\.\d+)? ?(min|s)\b", p) and not re.search(r"\b20\d\d-\d\d-\d\d\b", p)]
    assert not undated, f"figures without a date: {undated}"
