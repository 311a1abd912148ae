#!/bin/bash
# gpu-platform node image seal: run on a copy of a node that the boot script (bootstrap.py) configured,
# before it becomes an image. What the roles installed stays (the boot script's venv with Ansible,
# the packages, the apt index); what belongs to one instance or one boot goes, so that an instance
# launched from the image runs its user data again, takes its own name and fetches its own key, and
# its Ansible run only configures.
#
# Goes: the instance's name and address (hostname, /etc/hosts), cloud-init's per-instance state
# (`cloud-init clean --logs`, else the user data would not run again), the fetched bundle, group vars
# and MUNGE key, Slurm's and munge's state, logs, temporary files, the machine ids (/etc and dbus),
# the random seed, DHCP leases, SSH host keys and every authorized_keys (as ParallelCluster's
# ami_cleanup.sh, aws-parallelcluster-cookbook, cookbooks/aws-parallelcluster-platform/files, and
# Image Builder's own post-build cleanup script, "Required post-build cleanup" in
# https://docs.aws.amazon.com/imagebuilder/latest/userguide/security-best-practices.html).
# Disabled until the boot's Ansible run enables them again: the services that would act under the
# old name or without a key before the node has joined (slurmd registering, spot-watch draining).
#
# Stays: Image Builder's working directory, /tmp/imagebuilder_service (same page): the running build
# (its TOE files) is still in it, and its `perform_cleanup` marker is what makes Image Builder run
# its own cleanup after this component; removed, that cleanup is skipped without a word.
set -euo pipefail
work=${GPUPLAT_WORK:-/opt/gpuplat}
# SlurmdSpoolDir: roles/slurm_common/templates/slurm.conf.j2, slurm_compute_spool_dir (a unit test
# holds the three equal).
slurmd_spool=${GPUPLAT_SLURMD_SPOOL:-/var/lib/slurm/slurmd}
image_builder_work=/tmp/imagebuilder_service

systemctl disable slurmd.service munge.service gpuplat-spot-watch.service 2>/dev/null || true

rm -rf "$work/bundle" "$work/bundle.zip" "$work/all.json" "$work/inventory.yml" "$work/join.py"
rm -f /etc/gpuplat/munge.key /etc/munge/munge.key
if command -v cloud-init >/dev/null; then
  cloud-init clean --logs
fi
# Also where cloud-init is absent (the local backend's images) or left them.
rm -rf /var/lib/cloud/instance /var/lib/cloud/instances /var/lib/cloud/data
if [[ -d $slurmd_spool ]]; then
  find "$slurmd_spool" -mindepth 1 -delete
fi
rm -f /etc/ssh/ssh_host_* /root/.ssh/authorized_keys /home/*/.ssh/authorized_keys
rm -f /var/lib/systemd/random-seed /var/lib/dhcp/*.leases /var/lib/dhclient/*.lease* \
  /var/lib/NetworkManager/*.lease
find /tmp -mindepth 1 -maxdepth 1 ! -path "$image_builder_work" -exec rm -rf {} +
rm -rf /var/tmp/* /var/log/journal/*
find /var/log -type f -delete

echo localhost >/etc/hostname
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >/etc/hosts
# The local backend's images have no boot script and so no work directory.
mkdir -p "$work"
# Empty: systemd makes a new id at the next boot. dbus's copy is either a link to it or its own file,
# which would otherwise give every node of the image one id.
: >/etc/machine-id
if [[ -f /var/lib/dbus/machine-id && ! -L /var/lib/dbus/machine-id ]]; then
  rm -f /var/lib/dbus/machine-id
  ln -s /etc/machine-id /var/lib/dbus/machine-id
fi
echo "gpuplat image sealed $(date --iso-8601=seconds)" >"$work/sealed"
