"""The example inventory's vault layout (issue 35): the file inventories/example/group_vars/all/main.yml tells the user
to create, made by its own command line, passes yamllint (the repository's .yamllint, strict) and ansible-lint
(production profile), and decrypts to the key plan.yml passes to both groups: the routers are not refused."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from testkit import BIN, ROOT, ansible, ansible_env, ansible_playbook

pytestmark = pytest.mark.playbook  # it starts ansible-vault, ansible-lint and ansible-playbook

EXAMPLE = ROOT / "inventories/example"
KEY = "example-vault-key-1234"


def documented_command() -> str:
    """The one command line the example's comment gives for the vault file."""
    lines = [line[1:].strip() for line in (EXAMPLE / "group_vars/all/main.yml").read_text().splitlines()
             if line.startswith("#") and "ansible-vault encrypt_string" in line]  # fmt: skip
    assert len(lines) == 1, lines
    return lines[0]


def test_the_documented_vault_file_passes_lint_and_reaches_the_routers(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory"
    shutil.copytree(EXAMPLE, inventory)
    password = tmp_path / "vault-password"
    password.write_text("a vault password\n")
    env = ansible_env(ANSIBLE_VAULT_PASSWORD_FILE=str(password))
    made = subprocess.run(["bash", "-c", documented_command()], cwd=inventory, input=KEY, env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    vault = inventory / "group_vars/all/vault.yml"
    assert "$ANSIBLE_VAULT;1.1;AES256" in vault.read_text() and KEY not in vault.read_text()
    yamllint = subprocess.run([str(BIN / "yamllint"), "-s", "-c", str(ROOT / ".yamllint"), str(vault)], capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
    assert yamllint.returncode == 0, yamllint.stdout
    lint = ansible("ansible-lint", "--offline", "--profile", "production", "-c", str(ROOT / ".ansible-lint"), str(vault),
                   ANSIBLE_VAULT_PASSWORD_FILE=str(password))  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # the layout works: the key is in group_vars/all, so a router beside the hosts is not refused
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["d3-routers"] = {"hosts": {"router-1": {"ansible_host": "10.0.0.10"}}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    plan = ansible_playbook("playbooks/plan.yml", "-i", str(inventory), "-e", "d3_allow_unauthenticated=false",
                            ANSIBLE_VAULT_PASSWORD_FILE=str(password))  # fmt: skip
    assert plan.returncode == 0, plan.stdout[-3000:]
    assert KEY not in plan.stdout + plan.stderr
    # and the same key in group_vars/l4-nodes only is refused, naming d3-routers
    (inventory / "group_vars/all/main.yml").rename(inventory / "group_vars/l4-nodes/key.yml")
    vault.rename(inventory / "group_vars/l4-nodes/vault.yml")
    refused = ansible_playbook("playbooks/plan.yml", "-i", str(inventory), ANSIBLE_VAULT_PASSWORD_FILE=str(password))
    assert refused.returncode != 0
    assert "router router-1 cannot authenticate to l4-a, l4-b" in " ".join(refused.stdout.split())
