# d3-fleet: every target installs what it needs into .venv/ first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: help venv lint unit lab-tests test plan lab lab-images lab-down demo molecule mutation clean

help:
	@echo "make demo      bring up the lab and run site.yml against it"
	@echo "make test      lint + unit + lab (3 hosts) + lab-tests + molecule (the whole suite)"
	@echo "make lint      ansible-lint (production), yamllint, ruff"
	@echo "make unit      pytest without the lab (planner, parsers, plan.yml, role specs)"
	@echo "make plan INVENTORY=inventories/example   print the placement plan"
	@echo "make lab [LAB_HOSTS=N] / make lab-down   start / remove the simulated L4 lab"
	@echo "make lab-images / lab-tests / molecule   the lab's images / pytest -m lab / molecule test --all"
	@echo "make mutation  mutmut on plugins/filter + the collection's modules: score per file, survivors (~4 min)"

$(VENV)/.installed: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt
	touch $@

venv: $(VENV)/.installed

lint: venv
	yamllint -s .
	ruff check .
	ansible-lint

# Tests that need nothing but the venv (planner, parsers, plan.yml, role specs).
unit: venv
	pytest -m "not lab"

# Tests that drive the lab (simulator, stand-ins, unit files, site.yml, rollouts); `make lab` first.
lab-tests: venv
	pytest -m lab

INVENTORY ?= inventories/example
plan: venv
	ansible-playbook playbooks/plan.yml -i $(INVENTORY)

# The lab: stand-ins for GPUs, NVIDIA's repository, the vLLM image and Hugging Face (see lab/README.md).
# LAB_HOSTS=N: N lab hosts (unset: the lab_hosts role default, 3).
lab: venv
	ansible-playbook playbooks/lab.yml $(if $(LAB_HOSTS),-e lab_hosts_count=$(LAB_HOSTS))

lab-images: venv
	ansible-playbook playbooks/lab.yml --tags images

lab-down: venv
	ansible-playbook playbooks/lab-down.yml

demo: lab
	ansible-playbook site.yml -i inventories/lab -l l4-nodes

molecule: lab
	molecule test --all

# The whole suite. The rollout tests need 3 lab hosts.
TEST_LAB_HOSTS ?= 3
test: lint unit
	$(MAKE) lab LAB_HOSTS=$(TEST_LAB_HOSTS)
	$(MAKE) lab-tests
	$(MAKE) molecule LAB_HOSTS=$(TEST_LAB_HOSTS)

# Mutation testing (not part of make test): stages the sources in .venv/mutation/, see tools/mutation.py.
$(VENV)/.mutation-installed: $(VENV)/.installed requirements-mutation.txt
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-mutation.txt
	touch $@

mutation: $(VENV)/.mutation-installed
	$(BIN)/python tools/mutation.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
