"""How a node joins by itself: the bundle the stack publishes and the boot script that applies it.

`pulumi up` uploads the project's `playbooks/` and `roles/` as one zip under a key named by their
digest (`bootstrap/<digest>/bundle.zip`: a changed role is a new bundle, and only nodes launched after
the change take it) and the stack's resolved group vars, outputs included, as
`bootstrap/group_vars/all.json`. Every launch template's user data is the boot script below. On boot a
node:

1. finds its name: fixed for controllers, else its `gpuplat:node` tag, which Slurm's resume program
   sets right after RunInstances (read from instance metadata; waits up to `NAME_WAIT_S`); instances of
   Auto Scaling groups (inference, other service pools) are named after their instance id;
2. sets the hostname to that name, so the host and its Slurm node agree by construction;
3. fetches the bundle and group vars, and the MUNGE key from SSM Parameter Store (SecureString);
4. installs Ansible into a venv and runs `site.yml` against itself only, with an inventory of one host
   in its pool's groups; slurmd starts configless from the controllers, so no other node changes.

Everything is logged to /var/log/gpuplat-bootstrap.log. A failed bootstrap leaves the node without
slurmd: Slurm's ResumeTimeout then runs the resume-fail program, which terminates it.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infra.ansible_content import content_files
from infra.inventory import pool_group, pool_vars, role_group_members
from infra.resolve import ResolvedPlatform, ResolvedPool

GROUP_VARS_KEY = "bootstrap/group_vars/all.json"
NAME_WAIT_S = 600
# Ansible on the node: the release the project is tested with (pyproject's `ansible` extra).
NODE_ANSIBLE = "ansible==12.3.0"


def munge_parameter(stack: str) -> str:
    return f"/gpuplat/{stack}/munge-key"


def bundle_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in content_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


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
    bundle_key: str
    inventory: dict[str, Any]
    node_name: str = ""  # empty: from the gpuplat:node tag, else the instance id

    def render(self) -> str:
        inventory = yaml.safe_dump(self.inventory, sort_keys=False)
        settings = {
            "STACK": self.stack,
            "REGION": self.region,
            "BUCKET": self.bucket,
            "BUNDLE_KEY": self.bundle_key,
            "GROUP_VARS_KEY": GROUP_VARS_KEY,
            "MUNGE_PARAMETER": munge_parameter(self.stack),
            "NODE_NAME": self.node_name,
            "NAME_WAIT_S": str(NAME_WAIT_S),
            "NODE_ANSIBLE": NODE_ANSIBLE,
        }
        assignments = "\n".join(f"{key}={shlex.quote(value)}" for key, value in settings.items())
        return _SCRIPT.replace("@SETTINGS@", assignments).replace("@INVENTORY@", inventory)


_SCRIPT = """#!/bin/bash
# gpu-platform node bootstrap: name, bundle, MUNGE key, Ansible against this node only.
set -euo pipefail
exec >>/var/log/gpuplat-bootstrap.log 2>&1
echo "gpuplat bootstrap start $(date --iso-8601=seconds)"
@SETTINGS@
IMDS=http://169.254.169.254/latest
imds() {
  local token
  token=$(curl -sf -X PUT "$IMDS/api/token" -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')
  curl -sf -H "X-aws-ec2-metadata-token: $token" "$IMDS/meta-data/$1"
}
INSTANCE_ID=$(imds instance-id)
if [ -z "$NODE_NAME" ] && imds tags/instance >/dev/null; then
  deadline=$((SECONDS + NAME_WAIT_S))
  until NODE_NAME=$(imds tags/instance/gpuplat:node); do
    if imds tags/instance | grep -qx 'aws:autoscaling:groupName'; then NODE_NAME=$INSTANCE_ID; break; fi
    [ "$SECONDS" -lt "$deadline" ] || { echo "no gpuplat:node tag after ${NAME_WAIT_S}s"; exit 1; }
    sleep 5
  done
fi
NODE_NAME=${NODE_NAME:-$INSTANCE_ID}
hostnamectl set-hostname "$NODE_NAME"
grep -q " $NODE_NAME\\$" /etc/hosts || echo "$(imds local-ipv4) $NODE_NAME" >>/etc/hosts

work=/opt/gpuplat
install -d -m 0700 "$work" /etc/gpuplat
cd "$work"
aws --region "$REGION" s3 cp "s3://$BUCKET/$BUNDLE_KEY" bundle.zip
aws --region "$REGION" s3 cp "s3://$BUCKET/$GROUP_VARS_KEY" all.json
rm -rf bundle && python3 -m zipfile -e bundle.zip bundle
umask 0277
aws --region "$REGION" ssm get-parameter --with-decryption --name "$MUNGE_PARAMETER" \\
  --query Parameter.Value --output text | base64 -d >/etc/gpuplat/munge.key
umask 0022
cat >inventory.yml <<'INVENTORY'
@INVENTORY@INVENTORY
sed -i "s/^\\( *\\)NODE:/\\1$NODE_NAME:/" inventory.yml
[ -x venv/bin/ansible-playbook ] || { python3 -m venv venv && venv/bin/pip install -q "$NODE_ANSIBLE"; }
venv/bin/ansible-playbook -i inventory.yml -e @all.json -e munge_key_file=/etc/gpuplat/munge.key \\
  --limit "$NODE_NAME" bundle/playbooks/site.yml
echo "gpuplat bootstrap done $(date --iso-8601=seconds)"
"""
