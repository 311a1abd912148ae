"""How a node joins by itself: the bundle the stack publishes and the boot script that applies it.

`pulumi up` uploads the project's `playbooks/` and `roles/` as one zip under a key named by their
digest (`bootstrap/<digest>/bundle.zip`: a changed role is a new bundle, and only nodes launched after
the change take it; controllers boot from the bundle the group vars name, so their user data does not
change with the roles: BootScript.bundle_key) and the stack's resolved group vars, outputs included, as
`bootstrap/group_vars/all.json`. Every launch template's user data is the boot script below. On boot a
node:

1. creates a venv with the image's own Python (installing python3-venv where the image lacks it) and
   installs Ansible and boto3 into it;
2. runs node_join.py with it: finds its name (fixed for controllers, else its `gpuplat:node` tag, which
   Slurm's resume program sets right after RunInstances, read from instance metadata, waiting up to
   `NAME_WAIT_S`; instances of Auto Scaling groups are named after their instance id), sets the
   hostname to that name, so the host and its Slurm node agree by construction, and fetches the bundle,
   the group vars and the MUNGE key (SSM SecureString), each retried until `FETCH_WAIT_S`: the group
   vars are written only once the filesystem exists, and user data runs once;
3. runs `site.yml` against itself only, with an inventory of one host in its pool's groups; slurmd
   starts configless from the controllers, so no other node changes.

Everything is logged to /var/log/gpuplat-bootstrap.log. A training node (launched by Slurm's resume
program) whose bootstrap fails powers itself off, and its launch template terminates an instance that
shuts itself down (node_pool.slurm_pool_template), as ParallelCluster's compute nodes do (aws-parallelcluster
v3.11.0, cli/src/pcluster/resources/compute_node/user_data.sh:173 error_exit runs `shutdown -h now`;
cli/src/pcluster/templates/queues_stack.py:221 instance_initiated_shutdown_behavior="terminate"). The
controllers' reconciler then sees its node going up without an instance: a boot failure of the pool,
replaced at once, the job requeued (gpuplat_ec2_nodes/replacement.py), rather than a GPU instance
billed until ResumeTimeout. Other nodes stay up after a failed bootstrap, for an operator to look at.
"""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infra.backends.aws.naming import stack_bucket_uri
from infra.backends.aws.node_join import BUNDLE_KEY_VAR
from infra.data.node_ansible_choice import node_ansible
from infra.nodes.ansible_content import content_files
from infra.nodes.inventory import platform_vars, pool_group, pool_vars, role_group_members
from infra.nodes.role_templates import role_defaults
from infra.platform import zones
from infra.platform.resolve import ResolvedPlatform, ResolvedPool

GROUP_VARS_KEY = "bootstrap/group_vars/all.json"
NAME_WAIT_S = 600
# The group vars wait for the filesystem (FSx takes up to ~15 minutes); a node that boots first waits.
FETCH_WAIT_S = 1800
WORK_DIR = "/opt/gpuplat"
# The node fetches the bundle, group vars and key with boto3 (no AWS CLI on Ubuntu or Debian images).
NODE_BOTO3 = "boto3>=1.34,<2"
# EC2 refuses user data over 16 KB before base64 (EC2 User Guide, "Run commands when you launch an EC2
# instance with user data input").
USER_DATA_MAX_BYTES = 16 * 1024
_JOIN_PROGRAM = Path(__file__).with_name("node_join.py")
# Where the model servers' version files live (roles/inference_server; infra/serving/release.py writes them).
SERVING_CONFIG_DIR = str(role_defaults("inference_server")["inference_server_config_dir"])


def munge_parameter(stack: str) -> str:
    return f"/gpuplat/{stack}/munge-key"


def serving_version_parameter(stack: str) -> str:
    """The version record of an AWS stack's model servers (infra/serving/version_record.py): the version
    file a promote wrote to every stable replica, which an inference instance booted later writes for its
    own replicas before they start (node_join.py)."""
    return f"/gpuplat/{stack}/serving/version"


def serving_replicas(platform: ResolvedPlatform, pool: ResolvedPool) -> int:
    """The stable replicas each node of `pool` serves, which its boot gives the stack's recorded version
    (0: the pool serves no model)."""
    serving, layout = platform.spec.serving, platform.serving_layout
    if serving is None or serving.pool != pool.name:
        return 0
    return layout.replicas if layout is not None else 1


def bundle_files(root: Path) -> dict[str, Path]:
    """What the bundle holds: archive name -> file (the Ansible content, no caches)."""
    return {path.relative_to(root).as_posix(): path for path in content_files(root)}


def bundle_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for name, path in bundle_files(root).items():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def bundle_zip(root: Path) -> bytes:
    """The bundle as the node receives it (what Pulumi's archive of `bundle_files` uploads)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, path in bundle_files(root).items():
            archive.write(path, name)
    return buffer.getvalue()


def launched_through_fleet(platform: ResolvedPlatform, pool: ResolvedPool) -> bool:
    """Whether Slurm launches the pool through CreateFleet: more than one instance type or zone."""
    return bool(pool.spec.alternate_instance_types) or len(zones.pool_zones(platform, pool)) > 1


def elastic_pool_settings(
    platform: ResolvedPlatform, template_ids: dict[str, str], subnet_by_zone: Mapping[str, str]
) -> dict[str, Any]:
    """The Slurm resume program's view of the training pools: launch template, static node names and,
    where a pool has several, the instance types (its own first) and subnets it may launch on
    (roles/slurm_elastic/files/gpuplat_ec2_nodes/settings.py, Pool). With several zones the template's
    network interfaces name no subnet (node_pool.slurm_pool_template): the overrides give it."""
    settings: dict[str, Any] = {}
    for name, template_id in sorted(template_ids.items()):
        pool = platform.pool(name)
        pool_zones = zones.pool_zones(platform, pool)
        alternates = pool.spec.alternate_instance_types
        settings[name] = {
            "launch_template_id": template_id,
            "subnet_id": None,
            "static_nodes": pool.node_names()[: pool.spec.min_nodes],
            "instance_types": [pool.node_type.name, *alternates] if alternates else [],
            "subnet_ids": [subnet_by_zone[zone] for zone in pool_zones] if len(pool_zones) > 1 else [],
            "capacity": "spot" if pool.spec.capacity == "spot" else "on-demand",
        }
    return settings


def node_group_vars(
    platform: ResolvedPlatform,
    filesystem_source: str,
    controller_addresses: dict[str, str],
    template_ids: dict[str, str],
    bucket_names: Mapping[str, str],
    bundle: str,
    subnet_by_zone: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The group vars every booting node reads (`GROUP_VARS_KEY`): the platform's resolved values and
    what exists only once the stack's resources do (an `s3://<purpose>/` model names its bucket), and
    the current bundle's key, which controllers boot from."""
    region = str(platform.spec.region)
    values = platform_vars(platform)
    if "inference_model" in values:
        values["inference_model"] = stack_bucket_uri(values["inference_model"], bucket_names)
    return {
        **values,
        "gpuplat_region": region,
        "gpuplat_controller_addresses": controller_addresses,
        "shared_fs_source": filesystem_source,
        "slurm_elastic_stack": platform.name,
        "slurm_elastic_region": region,
        "slurm_elastic_pools": elastic_pool_settings(platform, template_ids, subnet_by_zone or {}),
        BUNDLE_KEY_VAR: bundle,
    }


def settings_digest(platform: ResolvedPlatform) -> str:
    """A digest of the stack's resolved values a node is configured with (platform_vars: what the
    group vars carry besides the stack's outputs)."""
    values = json.dumps(platform_vars(platform), sort_keys=True, default=str)
    return hashlib.sha256(values.encode()).hexdigest()[:16]


def bundle_key(root: Path) -> str:
    return f"bootstrap/{bundle_digest(root)}/bundle.zip"


def node_inventory(platform: ResolvedPlatform, pool: ResolvedPool) -> dict[str, Any]:
    """The one-host inventory of a node of `pool`; the host is `NODE` (the boot script substitutes it)."""
    own = pool_group(pool.name)
    children: dict[str, Any] = {
        own: {"hosts": {"NODE": {"ansible_connection": "local"}}, "vars": pool_vars(platform, pool)}
    }
    for group, pools in role_group_members(platform).items():
        if own in pools:
            children[group] = {"children": {own: {}}}
    return {"all": {"children": children}}


@dataclass(frozen=True)
class BootScript:
    stack: str
    region: str
    bucket: str
    # Empty: the one the group vars name (BUNDLE_KEY_VAR), for controllers, whose user data must not
    # change with the bundle: on an aws_instance a user data change is a stop and start (Terraform AWS
    # provider, resource aws_instance, user_data: "Updates to this field will trigger a stop/start of
    # the EC2 instance by default"); role changes reach running controllers through `gpuplat up`'s
    # Ansible run instead.
    bundle_key: str
    inventory: dict[str, Any]
    os_release: str  # the image's: its Python decides the Ansible release (infra/data/node_ansible_choice.py)
    node_name: str = ""  # empty: from the gpuplat:node tag, else the instance id
    # Only nodes that run munged fetch the key (infra/nodes/munge.py); the others may not read it.
    fetch_munge_key: bool = True
    # A training node powers off when its bootstrap fails (the module docstring).
    power_off_on_failure: bool = False
    # The serving pool's nodes: the stable replicas that take the stack's recorded version at boot.
    serving_replicas: int = 0
    # Training nodes: settings_digest(platform), so that a change of the stack's values (a driver
    # branch, NCCL, Slurm's settings), which reaches a booting node through the group vars and not
    # through the bundle, is a new launch template version whose user data differs, and the controllers
    # drain the nodes of the old one after their jobs (gpuplat_ec2_nodes/outdated.py); `gpuplat up`
    # never configures them under a job. Empty (no line) for the others: controllers' user data must
    # not change (the stop/start above).
    settings_digest: str = ""

    def render(self) -> str:
        inventory = yaml.safe_dump(self.inventory, sort_keys=False)
        # `python3 -m venv` needs ensurepip, which Debian and Ubuntu ship in python3-venv (per release in
        # the facts), not in their cloud or minimal images.
        node = node_ansible(self.os_release)
        settings = {
            "GPUPLAT_STACK": self.stack,
            "GPUPLAT_REGION": self.region,
            "GPUPLAT_BUCKET": self.bucket,
            "GPUPLAT_BUNDLE_KEY": self.bundle_key,
            "GPUPLAT_GROUP_VARS_KEY": GROUP_VARS_KEY,
            "GPUPLAT_MUNGE_PARAMETER": munge_parameter(self.stack) if self.fetch_munge_key else "",
            "GPUPLAT_NODE_NAME": self.node_name,
            "GPUPLAT_NAME_WAIT_S": str(NAME_WAIT_S),
            "GPUPLAT_FETCH_WAIT_S": str(FETCH_WAIT_S),
            "GPUPLAT_WORK": WORK_DIR,
            "GPUPLAT_POWER_OFF_ON_FAILURE": "1" if self.power_off_on_failure else "",
            "GPUPLAT_SERVING_PARAMETER": (
                serving_version_parameter(self.stack) if self.serving_replicas else ""
            ),
            "GPUPLAT_SERVING_REPLICAS": str(self.serving_replicas),
            "GPUPLAT_SERVING_DIR": SERVING_CONFIG_DIR,
            **({"GPUPLAT_SETTINGS_DIGEST": self.settings_digest} if self.settings_digest else {}),
            "BOOT_PACKAGES": node.venv_package,
            "NODE_PIP_REQUIREMENTS": f"{node.requirement} {NODE_BOTO3}",
        }
        assignments = "\n".join(f"{key}={shlex.quote(value)}" for key, value in settings.items())
        script = (
            _SCRIPT.replace("@SETTINGS@", assignments)
            .replace("@POWER_OFF@", POWER_OFF_STEP)
            .replace("@VENV@", VENV_STEP)
            .replace("@INVENTORY@", inventory)
            .replace("@JOIN@", _JOIN_PROGRAM.read_text())
        )
        if len(script.encode()) > USER_DATA_MAX_BYTES:
            raise ValueError(f"boot script of {len(script.encode())} bytes exceeds EC2's user data limit")
        return script


# Both the boot script and the image build (node_image.py): a venv of the image's Python with Ansible.
VENV_STEP = """retry() {
  local n
  for n in 1 2 3 4 5; do "$@" && return 0; echo "attempt $n of: $* failed"; sleep $((n * 10)); done
  return 1
}
install -d -m 0700 "$GPUPLAT_WORK" /etc/gpuplat
cd "$GPUPLAT_WORK"
if [ ! -x venv/bin/ansible-playbook ]; then
  rm -rf venv
  if ! python3 -m venv venv; then
    export DEBIAN_FRONTEND=noninteractive
    retry apt-get update -q
    retry apt-get install -q -y --no-install-recommends $BOOT_PACKAGES
    rm -rf venv && python3 -m venv venv
  fi
  # No byte-compiling of all of Ansible and botocore: Python compiles (and caches) what the run imports.
  retry venv/bin/pip install -q --no-compile $NODE_PIP_REQUIREMENTS
fi
"""

# Where GPUPLAT_POWER_OFF_ON_FAILURE is set: the bootstrap's exit with an error powers the instance off.
# `poweroff` (or `shutdown`, not `halt`) is an instance-initiated shutdown, which the launch template's
# InstanceInitiatedShutdownBehavior makes a termination (EC2 User Guide, "Change instance initiated
# shutdown behavior", Using_ChangingInstanceInitiatedShutdownBehavior.html). Not where slurmd runs: the
# script run again on a live node (by hand), or a step after slurm_compute started slurmd, on a node
# that may have joined and taken a job (the image comes with slurmd disabled, image_seal.sh), which
# stays up as before for an operator.
POWER_OFF_STEP = """power_off_on_failure() {
  local status=$?
  if [ "$status" -ne 0 ] && [ -n "${GPUPLAT_POWER_OFF_ON_FAILURE:-}" ]; then
    if systemctl is-active --quiet slurmd.service; then
      echo "gpuplat bootstrap failed (exit $status) $(date --iso-8601=seconds): slurmd runs, staying up"
    else
      echo "gpuplat bootstrap failed (exit $status) $(date --iso-8601=seconds): powering off"
      poweroff
    fi
  fi
}
trap power_off_on_failure EXIT
"""

_SCRIPT = """#!/bin/bash
# gpu-platform node bootstrap: Python and Ansible, the node's name, bundle, group vars and MUNGE key,
# then Ansible against this node only.
set -euo pipefail
exec >>/var/log/gpuplat-bootstrap.log 2>&1
echo "gpuplat bootstrap start $(date --iso-8601=seconds)"
@SETTINGS@
@POWER_OFF@export GPUPLAT_STACK GPUPLAT_REGION GPUPLAT_BUCKET GPUPLAT_BUNDLE_KEY GPUPLAT_GROUP_VARS_KEY \\
  GPUPLAT_MUNGE_PARAMETER GPUPLAT_NODE_NAME GPUPLAT_NAME_WAIT_S GPUPLAT_FETCH_WAIT_S GPUPLAT_WORK
@VENV@cat >join.py <<'JOIN'
@JOIN@JOIN
NODE_NAME=$(venv/bin/python3 join.py)
echo "node name: $NODE_NAME"
cat >inventory.yml <<'INVENTORY'
@INVENTORY@INVENTORY
sed -i "s/^\\( *\\)NODE:/\\1$NODE_NAME:/" inventory.yml
rm -rf bundle && venv/bin/python3 -m zipfile -e bundle.zip bundle
cd bundle
ANSIBLE_CONFIG=ansible.cfg ../venv/bin/ansible-playbook -i ../inventory.yml -e @../all.json \\
  ${GPUPLAT_MUNGE_PARAMETER:+-e munge_key_file=/etc/gpuplat/munge.key} --limit "$NODE_NAME" playbooks/site.yml
echo "gpuplat bootstrap done $(date --iso-8601=seconds)"
"""
