#!/usr/bin/env bash
# Test the serving stack offline: lint its roles and playbook (ansible-lint, production
# profile), then run the Molecule scenario molecule/serving: a service node (HAProxy
# gateway + Prometheus) and an infer node (CPU reference model server) converge
# playbooks/serving.yml, pass check mode, and verify (a converge again with no change is the
# integration tier's, over the same roles): health, real embeddings through the gateway with
# the official openai client, the
# overload burst (503 at once past the queue, every accepted request complete), and
# Prometheus targets, recording rules and recorded series; then tests/serving from this host
# against the converged scenario: the model registry through `gpuplat models`, and `gpuplat serve`
# (two registered versions, the canary's measured share, a failing canary rolled back by the guard,
# a canary slower by its architecture (24 encoder layers instead of 6) rolled back by the guard for
# its latency, promote, rollback to the previous version), the gateway role's aws slot configuration
# run as a second gateway on the service node, reloaded and restarted by systemd under load, and the roles
# converged again while a canary borrows a replica (left alone; fewer replicas refused, then retired).
#
#   scripts/test-serving.sh
#
# Needs: scripts/setup-host.sh (as root) and `.venv/bin/pip install -e '.[dev,ansible]'`;
# the base image is built by scripts/build-base-image.sh if missing. The nodes install
# haproxy and prometheus from Debian's archive and the model server from PyPI.
# Prints `N passed, M failed` last and exits non-zero if anything failed.
# Logs: build/test-serving/<step>.log
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SUITE=test-serving
# shellcheck source=scripts/lib/test-steps.sh
source "$ROOT/scripts/lib/test-steps.sh"
require_tools podman debootstrap molecule ansible-lint

ready=1
if ! podman image exists localhost/gpuplat-base:bookworm; then
  run_step base-image scripts/build-base-image.sh || ready=0
fi
if [[ ${GPUPLAT_ROLES_LINTED:-} == 1 ]]; then
  # make test: test-roles lints every role and playbook with the same profile in the same run.
  echo "ansible-lint: left to test-roles (GPUPLAT_ROLES_LINTED=1, make test)"
else
  run_step ansible-lint ansible-lint --profile production \
    roles/inference_server roles/inference_gateway roles/monitoring roles/model_registry playbooks/serving.yml
fi

if ((ready)); then
  # The scenario's sequence without its last destroy: tests/serving then use its registry (and gateway)
  # from this host through the published ports; the scenario is destroyed whatever they found.
  if run_step molecule:serving molecule test -s serving --destroy never; then
    run_step pytest:serving env GPUPLAT_SERVING_SCENARIO=1 pytest -q -s -p no:cacheprovider tests/serving
  else
    skip_step pytest:serving "the serving scenario did not converge and verify"
  fi
  run_step molecule:serving:destroy molecule destroy -s serving
else
  skip_step molecule:serving "no base image"
fi

finish_steps
