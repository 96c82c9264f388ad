# d3-fleet: every target installs what it needs into .venv/ first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
# Python's bytecode cache on for everything make starts, kept under build/pycache (the tree stays clean): with
# PYTHONDONTWRITEBYTECODE set (as on this project's CI machines) and pip's --no-compile below, every ansible-playbook,
# every Ansible worker and every pytest would compile what it imports from source again (ansible-playbook on a
# one-task play: 1.70 -> 0.89 s; the playbook tier's test_plan_playbook + test_site_tags: 44 -> 36 s, 2026-12-03).
# As wherever Python caches bytecode, a .py rewritten within the same second at the same size keeps its old bytecode
# (checked by mtime in whole seconds and size); tools/mutation.py writes none (PYTHONDONTWRITEBYTECODE=1 in its stage).
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX ?= $(CURDIR)/build/pycache

.PHONY: help venv check lint unit lab-tests test plan lab lab-images lab-down demo molecule mutation clean

help:
	@echo "make demo      bring up the lab (2 hosts + a router) and run site.yml against it (ends with a decision through the router)"
	@echo "make test      lint + unit + lab (3 hosts) + ee + lab-tests + molecule (the whole suite)"
	@echo "make check     the quick tier, under a minute: ruff, yamllint, the tests that start neither Ansible nor podman"
	@echo "make lint      ansible-lint (production), yamllint, ruff"
	@echo "make unit      pytest without the lab: the quick tier + the playbook tier (plan.yml, role checks on localhost)"
	@echo "make plan INVENTORY=inventories/example   print the placement plan"
	@echo "make lab [LAB_HOSTS=N] / make lab-down   start / remove the simulated L4 lab"
	@echo "make lab-images / lab-tests / molecule   the lab's images / pytest -m lab / molecule test --all"
	@echo "make mutation  mutmut on the collection's filters and modules: score per file, survivors (tools/mutation.py --only FILES)"
	@echo "make bench INVENTORY=... [LIMIT=host] [BENCH_OUT=bench]   decision suite + load: tables, BENCH_OUT/report.json, plots"
	@echo "make bench-compare OLD=a/report.json NEW=b/report.json   one table and plot of the differences, flagged beyond their intervals"

# ansible-core and what it imports, at requirements.txt's pins: enough for the lab's image builds (`make lab-images`:
# builtin modules only), which make demo runs beside the rest of the pip install (the order-only prerequisite below,
# for a new venv: one pip at a time in it; the second only adds packages, it keeps these at their pins).
# --no-compile: pip would byte-compile every file it installs (the `ansible` package alone holds tens of thousands);
# Python compiles what is imported, once, on first use, into PYTHONPYCACHEPREFIX (above). Half of pip's CPU time on
# 2 cores (59 -> 30 s, 2026-12-03).
PIP_INSTALL = $(BIN)/pip install -q --disable-pip-version-check --no-compile
VENV_CORE := ansible-core Jinja2 PyYAML
$(VENV)/.installed-core: requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) $$(grep -E -i '^($(subst $(eval) ,|,$(VENV_CORE)))==' requirements.txt)
	touch $@

$(VENV)/.installed: requirements.txt | $(if $(wildcard $(VENV)/.installed),,$(VENV)/.installed-core)
	$(PIP_INSTALL) -r requirements.txt
	touch $@

venv: $(VENV)/.installed

# promtool and amtool, Prometheus' and Alertmanager's checkers (tests/test_metrics_promtool.py): the machine's own in
# /usr/bin, else the binary unpacked from Debian's package into .venv/bin (nothing installed, no service started).
.PHONY: promtool
promtool: $(BIN)/promtool $(BIN)/amtool
$(BIN)/promtool $(BIN)/amtool: | $(VENV)/.installed
	if [ -x /usr/bin/$(@F) ]; then ln -sf /usr/bin/$(@F) $@; else \
	  tmp=$$(mktemp -d) && chmod 0755 $$tmp && \
	  (cd $$tmp && apt-get download -qq $(if $(filter amtool,$(@F)),prometheus-alertmanager,prometheus)) && \
	  dpkg-deb --fsys-tarfile $$tmp/*.deb | tar -xO ./usr/bin/$(@F) > $@.tmp && \
	  chmod 0755 $@.tmp && mv $@.tmp $@ && rm -rf $$tmp; fi

# The test tiers (enforced by tests/tiers.py): `-m "not lab and not playbook"` start neither Ansible nor podman;
# `playbook` tests run ansible-playbook / ansible-doc on localhost; `lab` tests (everything under tests/lab/) drive the lab.
# Each pytest run writes its JUnit XML to build/ (tools/ci_report.py reads it: the slowest tests of the run).
BUILD := build
PYTEST_JUNIT = --junitxml=$(BUILD)/junit-$@.xml -o junit_family=xunit1

check: venv promtool
	ruff check .
	yamllint -s .
	pytest -m "not lab and not playbook" -q -p no:cacheprovider $(PYTEST_JUNIT)

lint: venv
	yamllint -s .
	ruff check .
	ansible-lint

# Tests that need nothing but the venv: the quick tier and the playbook tier.
unit: venv promtool
	pytest -m "not lab" $(PYTEST_JUNIT)

# Tests that drive the lab (simulator, stand-ins, unit files, site.yml, rollouts); `make lab` first.
lab-tests: venv
	pytest -m lab --durations=25 $(PYTEST_JUNIT)

# make test runs the lab tests in two parts at once. The standalone files touch no lab host and no state of the
# converged fleet: each starts its own containers (nvlabtest-*, unitcheck), its own simulator or its own copy of the
# stand-in apt repository on its own port, and reads the lab's registry and HF mirror only. They wait more than they
# compute (alone: 9 min 25 s of wall time for about 3 min of CPU), so they and molecule run beside the fleet's tests.
LAB_STANDALONE := $(addprefix tests/lab/,test_hf_mirror.py test_nvidia_lab.py test_simulator.py \
	test_simulator_capacity.py test_unit_files_lab.py)
.PHONY: lab-tests-fleet lab-tests-standalone
lab-tests-fleet: venv
	pytest -m lab --durations=25 $(addprefix --ignore=,$(LAB_STANDALONE)) $(PYTEST_JUNIT)
lab-tests-standalone: venv
	pytest -m lab --durations=10 $(LAB_STANDALONE) $(PYTEST_JUNIT)

INVENTORY ?= inventories/example
plan: venv
	ansible-playbook playbooks/plan.yml -i $(INVENTORY)

# The lab: stand-ins for GPUs, NVIDIA's repository, the vLLM image and Hugging Face (see lab/README.md).
# LAB_HOSTS=N: N lab hosts (unset: the lab_hosts role default, 3). LAB_SKIP_IMAGES=1: leave out the image tasks
# (make demo, right after its own make lab-images).
lab: venv
	ansible-playbook lab/lab.yml $(if $(LAB_HOSTS),-e lab_hosts_count=$(LAB_HOSTS))$(if $(LAB_SKIP_IMAGES), --skip-tags images)

# the images only (host images, simulator, stand-in debs, wheels): ansible-core is enough, so it starts beside pip
lab-images: $(VENV)/.installed-core
	ansible-playbook lab/lab.yml --tags images

lab-down: venv
	ansible-playbook lab/lab-down.yml

# lab-down, and the lab's images, build cache and state too: as on a machine that never ran the lab (the packages
# lab_base installed stay). tools/demo_timing.sh starts the cold demo from there.
.PHONY: lab-purge
lab-purge: venv
	ansible-playbook lab/lab-down.yml -e lab_down_purge=true

# The demo's lab: a Debian 13 host (Quadlet: the 27B on two GPUs, d3-mini, d3-edge), a Debian 12 host (classic units:
# d3-flash, d3-nano, d3-lite) and the two routers (keepalived: 10.79.0.10); `make lab` alone (and make test) starts three hosts.
# Both runs print the fleet-shaped output (one line per host and step, the tables, each error once: docs/output.md;
# ANSIBLE_STDOUT_CALLBACK=ansible.builtin.default make demo for Ansible's own); the demo ends with what to do next.
DEMO_HOSTS ?= 2
demo: export ANSIBLE_STDOUT_CALLBACK ?= d3fleet.fleet.fleet
# Without a venv, the lab's images build beside the pip install (make -j2: they need ansible-core only), then the rest
# of the lab without its image tasks (LAB_SKIP_IMAGES); with a venv, all of the lab. Then the converge.
# tools/demo_timing.sh times it by part (docs/testing.md).
demo:
	$(if $(wildcard $(VENV)/.installed),,$(MAKE) -j2 venv lab-images && \
	  )$(MAKE) lab LAB_HOSTS=$(DEMO_HOSTS)$(if $(wildcard $(VENV)/.installed),, LAB_SKIP_IMAGES=1)
	ansible-playbook site.yml -i inventories/lab -l 'l4-nodes:d3-routers'
	@printf '\nA decision through the routers'"'"' virtual address (keepalived, 10.79.0.10:8000):\n'
	@curl -sS --max-time 30 --retry 10 --retry-all-errors --retry-delay 1 http://10.79.0.10:8000/v1/systemone \
	  -H 'Content-Type: application/json' -d @examples/decision-request.json; echo
	@printf '\nNext (examples/demo-next-steps.sh; `. .venv/bin/activate` first):\n'; cat examples/demo-next-steps.sh

molecule: lab
	$(MAKE) molecule-run

# molecule alone, on a lab that is up (make test: right after the lab tests)
.PHONY: molecule-run
molecule-run: venv
	molecule test --all

# Benchmark a fleet with a decision suite (playbooks/bench.yml): tables, $(BENCH_OUT)/report.json and the plots beside it.
.PHONY: bench
BENCH_OUT ?= bench
bench: venv
	ansible-playbook playbooks/bench.yml -i $(INVENTORY) $(if $(LIMIT),-l $(LIMIT)) -e d3_bench_output=$(BENCH_OUT)/report.json

# Two bench reports (e.g. yesterday's nightly, today's) into one table and a plot of the differences (docs/bench.md).
.PHONY: bench-compare
bench-compare: venv
	$(BIN)/python tools/bench_compare.py $(OLD) $(NEW) --plot $(dir $(NEW))bench-compare.png

# The whole suite. The rollout tests need 3 lab hosts.
TEST_LAB_HOSTS ?= 3
# The lab comes up (cold: debootstrap, image builds: mostly network and disk) while the unit tests run; the output of
# each part is printed whole when it ends (--output-sync).
# Each part's wall time goes to build/timing.tsv (`.ci/run` prints it with the slowest tests: tools/ci_report.py).
# Two phases of two parts each: the unit tests beside the lab build; then the fleet's lab tests (the longest part)
# beside lint, the standalone lab tests and molecule (each waits more than it computes; molecule uses its own
# d3-mol-* hosts and ports).
test: venv
	rm -f $(TIMING) $(BUILD)/junit-*.xml
	$(MAKE) -j2 --output-sync=target test-unit test-lab-up
	$(MAKE) -j2 --output-sync=target test-lab-fleet test-beside

.PHONY: test-unit test-lab-up test-lab-fleet test-beside
test-unit: venv
	$(call timed,unit,$(MAKE) -j1 unit)

test-lab-fleet: venv
	$(call timed,lab-fleet,$(MAKE) -j1 lab-tests-fleet)

# every part runs even when one before it failed; the first failure is the status. lint and molecule (every process
# they start, molecule's hosts included) run at nice 10 ($(LOW)): the fleet's tests, the longest part, get most of the
# CPU when both want it; the standalone lab tests keep the normal priority (some time real requests).
test-beside: venv
	rc=0; \
	( $(call timed,lint,$(LOW) $(MAKE) -j1 lint) ) || rc=$$?; \
	( $(call timed,lab-alone,$(MAKE) -j1 lab-tests-standalone) ) || { r=$$?; [ $$rc -ne 0 ] || rc=$$r; }; \
	( $(call timed,molecule,$(LOW) $(MAKE) -j1 molecule-run) ) || { r=$$?; [ $$rc -ne 0 ] || rc=$$r; }; \
	exit $$rc

# the lab build's 15 slowest tasks printed at its end (profile_tasks): where the lab part of the run goes; then the
# execution environment image that tests/lab/test_ee.py runs site.yml in (both beside the unit tier: the lab build and
# ee together take about as long as it does); the callback list in a variable: a comma inside $(call ...) would split
# the argument
LAB_CALLBACKS := ansible.posix.profile_tasks,d3fleet.fleet.preload
LOW := nice -n 10
test-lab-up: venv
	$(call timed,lab,ANSIBLE_CALLBACKS_ENABLED=$(LAB_CALLBACKS) PROFILE_TASKS_TASK_OUTPUT_LIMIT=15 \
	  $(MAKE) -j1 lab LAB_HOSTS=$(TEST_LAB_HOSTS))
	$(call timed,ee,$(MAKE) -j1 ee)

# $(call timed,NAME,COMMAND): run COMMAND; append "NAME<TAB>seconds<TAB>exit status" to $(TIMING); keep its status.
TIMING := $(BUILD)/timing.tsv
timed = mkdir -p $(BUILD); start=$$(date +%s); $(2); rc=$$?; \
	printf '%s\t%s\t%s\n' '$(1)' "$$(( $$(date +%s) - start ))" "$$rc" >> $(TIMING); exit $$rc

# Mutation testing (not part of make test): stages the sources in .venv/mutation/, see tools/mutation.py.
$(VENV)/.mutation-installed: $(VENV)/.installed requirements-mutation.txt
	$(PIP_INSTALL) -r requirements-mutation.txt
	touch $@

mutation: $(VENV)/.mutation-installed
	$(BIN)/python tools/mutation.py

clean:
	rm -rf $(VENV) $(BUILD) .pytest_cache .ruff_cache

# The execution environment for AWX / AAP / ansible-navigator (execution-environment.yml; docs/awx.md).
# Stages the collections the roles use (containers.podman from the pinned ansible package, d3fleet.fleet from this
# tree) into ee/collections/, then ansible-builder create + podman build. EE_BASE_IMAGE: here the lab's Debian
# trixie image (a STAND-IN for docker.io/library/debian:trixie-slim, which is not reachable here). PIP_CERT (set on
# a machine behind a TLS-intercepting proxy, as here) is mounted into the build only, never copied into the image.
.PHONY: ee
EE_IMAGE ?= localhost/d3-fleet-ee:latest
EE_BASE_IMAGE ?= localhost/d3-lab-host-trixie:latest
EE_BUILD_CA ?= $(PIP_CERT)
$(VENV)/.ee-installed: $(VENV)/.installed requirements-ee.txt
	$(PIP_INSTALL) -r requirements-ee.txt
	touch $@

ee: $(VENV)/.ee-installed
	rm -rf ee/collections ee/context
	mkdir -p ee/collections/containers
	cp -a "$$($(BIN)/python -c 'import ansible_collections.containers.podman as m; print(list(m.__path__)[0])')" ee/collections/containers/podman
	# d3fleet.fleet as users get it: the tarball `ansible-galaxy collection build` packs (docs/install.md)
	$(BIN)/ansible-galaxy collection build --force --output-path ee/collections collections/ansible_collections/d3fleet/fleet
	mv ee/collections/d3fleet-fleet-*.tar.gz ee/collections/d3fleet-fleet.tar.gz
	find ee/collections -name __pycache__ -prune -exec rm -rf {} +
	$(BIN)/ansible-builder create -f execution-environment.yml -c ee/context --output-filename Containerfile
	# behind a TLS-intercepting proxy: every stage's RUN gets PIP_CERT as a build ARG (an ARG is not kept in the image)
	$(if $(EE_BUILD_CA),sed -i '/^FROM /a ARG PIP_CERT' ee/context/Containerfile)
	podman build --pull=never -f ee/context/Containerfile -t $(EE_IMAGE) \
	  --build-arg EE_BASE_IMAGE=$(EE_BASE_IMAGE) \
	  $(if $(EE_BUILD_CA),-v $(abspath $(EE_BUILD_CA)):/run/build-ca.crt:ro --build-arg PIP_CERT=/run/build-ca.crt) \
	  ee/context
	podman image inspect $(EE_IMAGE) --format '$(EE_IMAGE) {{.Id}} {{.Size}} bytes'
	# ansible-navigator refuses podman without a /dev/mqueue directory (absent on this VM)
	mkdir -p /dev/mqueue
