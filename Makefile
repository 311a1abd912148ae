# gpu-platform entry points. `make up` is the main job, `make test` the whole test suite.
SHELL := /bin/bash
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STACK ?= local
export CONTAINERS_CONF := $(CURDIR)/scripts/containers.conf
# Python caches what it compiles: some machines set this, and then every gpuplat, pytest, molecule and
# ansible-playbook process compiles its imports again (the venv is installed without byte-compiling).
unexport PYTHONDONTWRITEBYTECODE
# Python programs the roles install on nodes (stdlib + distro boto3), linted like infra/ (a directory: a package).
NODE_PROGRAMS := roles/slurm_elastic/files/gpuplat_ec2_nodes roles/inference_gateway/files/gpuplat_gateway_targets.py \
	roles/inference_gateway/files/gpuplat_gateway_canary.py \
	roles/inference_server/files/gpuplat_scaling_agent.py roles/inference_server/files/gpuplat_replica_loan.py \
	roles/gpu_validation/files/gpuplat_node_check.py roles/gpu_validation/files/gpuplat_checkpoint_probe.py \
	roles/slurm_compute/files/gpuplat_dataset_cache.py roles/python_requirements/files/requirements_met.py

.PHONY: venv host image images up down status plan test test-fast test-unit test-processes test-roles test-scheduler test-serving test-integration test-box lint mutation clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
# No byte-compiling at install: of the venv's 2.3 GB (torch, the Ansible collections) the suite imports
# a small part, compiled on first import; compiling all of it took half of the install's CPU.
	$(BIN)/pip install -q --no-compile -e '.[dev,ansible]'
	touch $@

venv: $(VENV)/.installed

## image: the local Debian 12 systemd base image (debootstrap + podman import; skipped when present)
image: host
	scripts/build-base-image.sh

## up: the main job: bring the platform of STACK (default local) up and print its status
up: venv image
	$(BIN)/gpuplat up --stack $(STACK)

## down: remove the local platform (containers, network, volume)
down: venv
	$(BIN)/gpuplat down --stack $(STACK)

status: venv
	$(BIN)/gpuplat status --stack $(STACK)

## plan: the offline plan of every shipped stack (no cloud account, no Pulumi CLI)
plan: venv
	@for s in $$($(BIN)/python -c 'from infra.spec.load import stack_names; print(*stack_names())'); do \
		$(BIN)/gpuplat plan --stack $$s || exit $$?; done

## lint: ruff and mypy on the Python code; the CI examples against the GitHub workflow and GitLab CI schemas
## and actionlint; the manual (docs/, mkdocs.yml) built as a site with --strict: a broken link between its
## pages, a missing anchor or a page left out of the nav fails (build/site, removed by make clean)
lint: venv
	$(BIN)/ruff check infra tests benchmarks examples
	$(BIN)/ruff format --check infra tests benchmarks examples
	$(BIN)/mypy infra
	$(BIN)/ruff check $(NODE_PROGRAMS)
	$(BIN)/ruff format --check $(NODE_PROGRAMS)
	$(BIN)/mypy --strict --ignore-missing-imports $(NODE_PROGRAMS)
	$(BIN)/ruff check scripts/mutation
	$(BIN)/ruff format --check scripts/mutation
	$(BIN)/mypy --strict scripts/mutation/run.py
	$(BIN)/check-jsonschema --builtin-schema vendor.github-workflows examples/ci/github/*.yml
	$(BIN)/actionlint examples/ci/github/*.yml
	$(BIN)/check-jsonschema --builtin-schema vendor.gitlab-ci examples/ci/gitlab/.gitlab-ci.yml
# (not --quiet: mkdocs 1.6.1 then counts no warning, and --strict passes whatever it found)
	$(BIN)/mkdocs build --strict --site-dir build/site

## host: podman, runc, debootstrap and friends from the distribution (root; skips what is installed)
host:
	@if command -v podman >/dev/null && command -v debootstrap >/dev/null && command -v apt-ftparchive >/dev/null \
		&& PATH="$$PATH:/usr/sbin" command -v visudo >/dev/null && test -x /usr/lib/postgresql/15/bin/initdb \
		&& test -x /usr/sbin/haproxy; \
		then echo "host packages present"; else scripts/setup-host.sh; fi

## test-unit: fast tests (spec, data, sizing, policy rules, CLI, Pulumi program under mocks, role contracts),
## less those marked `processes` (test-processes runs them)
test-unit: venv
	time $(BIN)/pytest -q -n auto -m "not processes" tests/unit tests/pulumi tests/roles

## test-processes: the tests of tests/unit, tests/pulumi and tests/roles that run a real program for seconds of
## CPU or more: the model registry's MLflow servers (SQLite and PostgreSQL) with the role's task files,
## train.py as a process and under torchrun, the python_requirements role's installing converges, the
## training environment's converges, the plan-comment script over every stack in a checkout
# One worker a CPU here (tests/xdist_workers.py adds one to `-n auto` for the unit tier's waits): these tests
# keep their CPUs busy, and some time a process against a timeout.
test-processes: export PYTEST_XDIST_AUTO_NUM_WORKERS := $(shell nproc)
test-processes: venv
	time $(BIN)/pytest -q -n auto -m processes tests/unit tests/pulumi tests/roles

## test-fast: the inner loop, no containers: lint, then the unit tier less the few that start a container
test-fast: venv
	time $(MAKE) --no-print-directory lint
	time $(BIN)/pytest -q -n auto -m "not containers and not processes" tests/unit tests/pulumi tests/roles

## test-roles: ansible-lint and the Molecule scenarios of the node roles (podman)
test-roles: venv host
	time scripts/test-roles.sh

## test-scheduler: the multi-node Slurm scenario (quotas, preemption, node failure, health check)
test-scheduler: venv host
	time scripts/test-scheduler.sh

## test-serving: the serving scenario (model server, gateway overload, Prometheus, openai client)
test-serving: venv host
	time scripts/test-serving.sh

## test-box: the AWS Slurm stack's node lifecycle in the cloud in a box (moto on loopback, podman
## containers as instances running the real user data; root): boot, join, spot interruption, failed
## launches and boots, strays, suspend, teardown
test-box: venv image
	time $(BIN)/pytest -v -s --durations=0 --durations-min=5 -m box tests/box

## test-integration: the local platform end to end (up, idempotent up, node-loss requeue, down)
test-integration: venv image
	time $(BIN)/pytest -v -s --durations=0 --durations-min=5 -m integration tests/integration

## mutation: the mutation score of the modules that decide (issue 46), per module: mutmut 3 on each module
## with only its own tests, then the hand mutants (scripts/mutation/hand/*.patch: survivors found by hand
## that mutmut cannot make); how it drives mutmut, and what it relied on, in scripts/mutation/run.py.
## Not part of `make test`. Work folders: build/mutation/<module>/ (survivors.txt lists what lived).
## MUTATION_ARGS: session names, --keep (reuse earlier results), --no-hand; MUTATION_JOBS: mutants at once.
mutation: venv
	time $(BIN)/python scripts/mutation/run.py $(MUTATION_ARGS)

## images: the base images of both supported Debian releases
images: image
	scripts/build-base-image.sh trixie

## test: everything CI runs. The venv and the Debian 12 image are made side by side (pip and debootstrap
## both wait on the network much of the time), then four streams run side by side (scripts/test-streams.sh),
## each printed when it ends with when it started and ended: test-box and test-integration (the two
## longest; both wait on Slurm's timers much of the time), test-roles then lint, test-unit and test-processes
## (which fill the CPU those two leave idle late in the run), and test-scheduler then test-serving. (test-serving as a
## fifth stream from the start slowed the integration tier's first `up`, the longest stream's busiest
## part, by four minutes: 27.7 minutes in all against 24.7.)
## The Debian 13 image is built inside the streams that need it (test-scheduler and test-roles, one
## waiting for the other: build-base-image.sh locks), while the others already run.
test:
	@$(PYTHON) benchmarks/cpu_speed.py start
	$(MAKE) --no-print-directory -j2 venv image
	GPUPLAT_ROLES_LINTED=1 scripts/test-streams.sh test-box test-integration 'test-roles lint test-unit test-processes' \
		'test-scheduler test-serving'
	@$(PYTHON) benchmarks/cpu_speed.py end

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build *.egg-info
