#!/bin/bash
# gpu-platform node image test: Image Builder's test stage runs it on an instance booted from the new image
# (the build's instance type: no GPU). What a GPU-less boot can prove: the driver's module was built by
# DKMS for the kernel the image boots, that kernel is held with the driver, nvidia_uvm is loaded at boot,
# and the seal ran (no MUNGE key, no instance identity). The GPU checks (XIDs, fabric, DCGM) run on the
# pool's nodes: Slurm's health program drains a node that fails them before jobs land on it.
set -euo pipefail
kernel=$(uname -r)
fail() {
  echo "gpuplat image test: $*" >&2
  exit 1
}
modinfo -k "$kernel" nvidia >/dev/null 2>&1 || fail "no nvidia kernel module built for the booted kernel $kernel"
grep -qx nvidia_uvm /etc/modules-load.d/gpuplat-nvidia.conf || fail "nvidia_uvm is not loaded at boot"
apt-mark showhold | grep -qx "linux-image-$kernel" || fail "the booted kernel $kernel is not held with the driver"
command -v nvidia-smi >/dev/null || fail "nvidia-smi is missing"
[[ -f ${GPUPLAT_WORK:-/opt/gpuplat}/sealed ]] || fail "the image was not sealed (image_seal.sh)"
[[ ! -e /etc/munge/munge.key ]] || fail "the image carries a MUNGE key"
echo "gpuplat image test: passed on kernel $kernel"
