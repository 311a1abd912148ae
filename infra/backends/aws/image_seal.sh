#!/bin/bash
# gpu-platform node image seal: run on a copy of a node that the boot script (bootstrap.py) configured,
# before it becomes an image. What the roles installed stays (the boot script's venv with Ansible,
# the packages, the apt index); what belongs to one instance or one boot goes, so that an instance
# launched from the image runs its user data again, takes its own name and fetches its own key, and
# its Ansible run only configures.
#
# Goes: the instance's name and address (hostname, /etc/hosts), cloud-init's per-instance state (else
# the user data would not run again), the fetched bundle, group vars and MUNGE key, Slurm's and
# munge's state, logs, temporary files, the machine id and SSH host keys (as ParallelCluster's
# ami_cleanup.sh, aws-parallelcluster-cookbook, cookbooks/aws-parallelcluster-platform/files).
# Disabled until the boot's Ansible run enables them again: the services that would act under the
# old name or without a key before the node has joined (slurmd registering, spot-watch draining).
set -euo pipefail
work=${GPUPLAT_WORK:-/opt/gpuplat}

systemctl disable slurmd.service munge.service gpuplat-spot-watch.service 2>/dev/null || true

rm -rf "$work/bundle" "$work/bundle.zip" "$work/all.json" "$work/inventory.yml" "$work/join.py"
rm -f /etc/gpuplat/munge.key /etc/munge/munge.key
rm -rf /var/lib/cloud/instance /var/lib/cloud/instances /var/lib/cloud/data
rm -rf /var/spool/slurmd/*
rm -f /etc/ssh/ssh_host_*
rm -rf /tmp/* /var/tmp/* /var/log/journal/*
find /var/log -type f -delete

echo localhost >/etc/hostname
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >/etc/hosts
# The local backend's images have no boot script and so no work directory.
mkdir -p "$work"
: >/etc/machine-id
echo "gpuplat image sealed $(date --iso-8601=seconds)" >"$work/sealed"
