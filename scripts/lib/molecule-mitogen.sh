# Shared by the scripts that run Molecule scenarios (test-roles.sh, test-scheduler.sh, test-serving.sh):
# Mitogen for Ansible where infra/nodes/mitogen.py allows it (root, ansible_mitogen installed,
# GPUPLAT_MITOGEN not 0), as the local platform uses it: the gpuplat_mitogen_linear strategy (Mitogen's
# mitogen_linear without its CPU pinning), and the GPUPLAT_MOLECULE_* variables that
# .config/molecule/config.yml's connection_options give every instance (the setns connection and an
# interpreter started with the container's environment). Where it is off nothing is set and the
# instances are reached through playbooks/connection_plugins/gpuplat_podman.py.
# Source it after setting VENV.
# shellcheck shell=bash

# Settings a shell kept from an earlier source go first, so that GPUPLAT_MITOGEN=0 turns them off.
while read -r name; do unset "$name"; done < <(compgen -e | grep '^GPUPLAT_MOLECULE_' || true)
if [[ ${ANSIBLE_STRATEGY:-} == *mitogen_linear ]]; then unset ANSIBLE_STRATEGY ANSIBLE_STRATEGY_PLUGINS; fi
# From the checkout this file is in, whatever the directory the script was started in.
mitogen_settings=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && "$VENV/bin/python" -m infra.nodes.mitogen 2>/dev/null) ||
  mitogen_settings=""
eval "$mitogen_settings"
if [[ -n $mitogen_settings ]]; then
  echo "Molecule: Mitogen for Ansible (setns, $ANSIBLE_STRATEGY; GPUPLAT_MITOGEN=0 turns it off)"
fi
unset mitogen_settings
