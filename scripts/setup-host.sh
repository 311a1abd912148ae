#!/usr/bin/env bash
# Install what the role tests need on a Debian 12 host (run as root; idempotent).
#   podman + runc    containers for Molecule (runc: crun fails on cgroup v1 hybrid hosts)
#   debootstrap      builds the local base image (no registry is reachable)
#   apt-utils, dpkg-dev, gnupg   build and sign the offline fixture apt repository
#   sudo             visudo checks the sudoers drop-in of roles/slurm_compute's dataset cache
#   postgresql-15    the model registry's database on production stacks, run under the registry's server
#                    in tests/roles/test_registry_auth.py (Debian's package, as roles/model_registry installs)
#   haproxy          the inference gateway reloaded and restarted under load in tests/roles/test_gateway_reload.py
#                    (Debian's package, as roles/inference_gateway installs; the test runs processes of its own)
# The project's containers.conf (scripts/containers.conf) is used through
# CONTAINERS_CONF by scripts/test-roles.sh; nothing under /etc is edited.
set -euo pipefail

PACKAGES=(podman runc debootstrap apt-utils dpkg-dev gnupg uidmap slirp4netns fuse-overlayfs
          conmon catatonit iproute2 python3 ca-certificates sudo postgresql-15 haproxy)

if [[ ${EUID} -ne 0 ]]; then
  echo "setup-host.sh: run as root (it installs packages with apt-get)" >&2
  exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup-host.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Some hosts list third-party sources that are unreachable here; apt still
  # refreshes the Debian lists, so a failed fetch elsewhere is not fatal.
  apt-get update -q || echo "setup-host.sh: apt-get update reported errors (unreachable third-party sources?); continuing" >&2
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup-host.sh: all host packages present"
fi

podman --version
runc --version | head -n1
