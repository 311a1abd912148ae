"""Nodes that run an older definition of their pool, drained out after their jobs (reconcile's part).

`pulumi up` of a role change (a new bundle digest) or of the stack's values (a driver, Slurm's
settings: the digest of the values the group vars carry, bootstrap.py settings_digest) gives each
training pool's launch template a new version whose user data names the new bundle and digest
(infra/backends/aws/bootstrap.py); the resume program
launches `$Latest`, so a node launched after it boots the new bundle. A node already in service keeps
the bundle it booted: it is never configured again under a running job (`gpuplat up`'s configure phase
leaves Slurm's instances out, infra/nodes/inventory.py aws_ec2_config). Its name is set
POWER_DOWN_ASAP: no new job starts there, the running ones finish on the old bundle, then slurmctld
powers it down (SuspendProgram terminates the instance) and the next job for the name launches the new
definition. This is ParallelCluster 3.11's QueueUpdateStrategy DRAIN for dynamic nodes
(aws-parallelcluster-cookbook v3.11.0, cookbooks/aws-parallelcluster-slurm/recipes/update/
update_head_node.rb:31-33 SLURM_POWER_SAVING_MAPPING DRAIN -> POWER_DOWN_ASAP, :73-80 update_nodes),
not TERMINATE (POWER_DOWN_FORCE: running jobs killed) nor COMPUTE_FLEET_STOP (the update refused while
compute nodes run: aws-parallelcluster v3.11.0, cli/src/pcluster/config/update_policy.py:343
condition_checker_queue_update_strategy).

Which definition an instance runs: EC2 tags an instance launched from a template with the template's
id and version (aws:ec2launchtemplate:id, aws:ec2launchtemplate:version). A version whose user data
is the latest's is no change to what the node runs (a new pool image sealed from a node of the same
bundle, infra/backends/aws/image_seal.sh): its nodes stay.
"""

from __future__ import annotations

from typing import Any

from .ec2 import TAG_NODE, TAG_POOL, Ec2Nodes, ErrorTypes, tag_value
from .logs import LOG
from .replacement import in_service
from .settings import Settings
from .slurm import NodeInfo, Slurm

TAG_TEMPLATE_ID = "aws:ec2launchtemplate:id"
TAG_TEMPLATE_VERSION = "aws:ec2launchtemplate:version"
REASON_OUTDATED = "gpuplat update: the pool's definition changed"


def outdated_instances(
    settings: Settings, ec2: Ec2Nodes, instances: list[dict[str, Any]]
) -> dict[str, str] | None:
    """Instance id -> why, for the instances of a configured pool launched from a version of the pool's
    template whose user data is not the latest version's; None when EC2 cannot say."""
    versions: dict[str, set[str]] = {}
    for instance in instances:
        pool = settings.pools.get(str(tag_value(instance, TAG_POOL)))
        version = tag_value(instance, TAG_TEMPLATE_VERSION)
        if pool is not None and version and tag_value(instance, TAG_TEMPLATE_ID) == pool.launch_template_id:
            versions.setdefault(pool.launch_template_id, set()).add(version)
    user_data: dict[str, tuple[str, dict[str, str]]] = {}
    try:
        for template_id, seen in sorted(versions.items()):
            user_data[template_id] = ec2.template_user_data(template_id, sorted(seen))
    except ErrorTypes as err:
        LOG.error("reconcile: cannot read the pools' launch template versions: %s", err)
        return None
    outdated: dict[str, str] = {}
    for instance in instances:
        template_id = str(tag_value(instance, TAG_TEMPLATE_ID))
        version = str(tag_value(instance, TAG_TEMPLATE_VERSION))
        if template_id not in user_data:
            continue
        latest, by_version = user_data[template_id]
        if version in by_version and by_version[version] != by_version[latest]:
            outdated[instance["InstanceId"]] = f"launch template {template_id} version {version} -> {latest}"
    return outdated


def drain_outdated(
    slurm: Slurm, nodes: dict[str, NodeInfo], instances: list[dict[str, Any]], outdated: dict[str, str]
) -> bool:
    """POWER_DOWN_ASAP for the in-service nodes whose instance is outdated (not already draining)."""
    results = []
    for instance in instances:
        why = outdated.get(instance["InstanceId"])
        name = str(tag_value(instance, TAG_NODE))
        node = nodes.get(name)
        if why is None or node is None or not in_service(node) or node.flags & {"DRAIN", "POWER_DOWN"}:
            continue
        LOG.warning(
            "reconcile: %s (%s) runs an older definition of its pool (%s): power down once its jobs end",
            name, instance["InstanceId"], why,
        )  # fmt: skip
        results.append(slurm.update([name], "state=power_down_asap", f"reason={REASON_OUTDATED}: {why}"))
    return all(results)
