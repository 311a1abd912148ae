"""The rule registry (RULES, in evaluation order) and `evaluate`, which runs rules over one stack."""

from __future__ import annotations

from collections.abc import Iterable

from infra.policy.rules.alerting import check_alert_receivers
from infra.policy.rules.base import PolicyContext, ResourceRule, StackRule, Verdict
from infra.policy.rules.budget import check_budget_cost, check_budget_gpus
from infra.policy.rules.fabric import check_cluster_placement, check_efa_security_group, check_multi_node_rdma
from infra.policy.rules.isolation import check_inference_taint, check_partitions, check_shared_resources
from infra.policy.rules.kubernetes import (
    check_kubernetes_isolation,
    check_kubernetes_quotas,
    check_spot_flavors,
)
from infra.policy.rules.placement import check_filesystem_zone
from infra.policy.rules.preferences import check_placement_preferences
from infra.policy.rules.resource_types import (
    IAM_POLICY,
    IAM_ROLE,
    IAM_ROLE_POLICY,
    INGRESS_RULE,
    INSTANCE,
    LAUNCH_TEMPLATE,
    LUSTRE,
    SECURITY_GROUP,
    SG_RULE,
    TAGGABLE,
    VOLUME,
)
from infra.policy.rules.security import (
    check_ebs_encrypted,
    check_ec2_launch_scoped,
    check_fsx_encrypted,
    check_imdsv2,
    check_munge_key_readers,
    check_open_ingress,
    check_required_tags,
    check_s3_encrypted,
    check_s3_public_access,
)
from infra.policy.rules.spot import (
    check_inference_base_capacity,
    check_interruptible_on_spot,
    check_spot_training_recovery,
    check_spot_training_share,
)
from infra.policy.view import ResourceIndex, ResourceView

RULES: tuple[ResourceRule | StackRule, ...] = (
    StackRule(
        id="spot-interruptible-pools",
        group="spot",
        description="Interruptible pools run on spot capacity (aws; onprem and local have no spot market).",
        remediation="Set `capacity: spot` on the pool (or `reserved` to use capacity already paid for), or "
        "set `interruptible: false` if its work cannot survive losing a node.",
        needs_platform=True,
        check=check_interruptible_on_spot,
    ),
    StackRule(
        id="spot-inference-base-capacity",
        group="spot",
        description="Inference pools keep on-demand or reserved base capacity of at least their minimum.",
        remediation="Give the inference pool `capacity: on-demand` or `reserved`; the node pool then sets "
        "the Auto Scaling group's onDemandBaseCapacity to the pool minimum and uses spot only above it.",
        check=check_inference_base_capacity,
    ),
    StackRule(
        id="spot-training-recovery",
        group="spot",
        description="A spot training pool has persistent checkpoint storage and a requeue partition.",
        remediation="Put `storage.checkpoint_path` under the parallel filesystem's mount path on a "
        "persistent filesystem (fsx-lustre PERSISTENT_2, lustre, nfs) and keep "
        "`scheduler.spot_preempt_mode: requeue`.",
        needs_platform=True,
        check=check_spot_training_recovery,
    ),
    StackRule(
        id="spot-training-share",
        group="spot",
        description="Non-production aws stacks run at least a configured share of training GPUs on spot.",
        remediation="Move training capacity to a pool with `capacity: spot` and `interruptible: true`, or "
        "lower `minSpotShare` in the policy config for this stack.",
        severity="advisory",
        options=("min_spot_share",),
        needs_platform=True,
        check=check_spot_training_share,
    ),
    StackRule(
        id="isolation-shared-resources",
        group="isolation",
        description="No launch template, Auto Scaling group, placement group, security group or (when "
        "configured) subnet serves both training and inference.",
        remediation="Give training and inference pools their own launch templates, placement groups and "
        "security groups (GpuNetwork.security_groups[role]); with `isolateSubnets`, their own subnets.",
        options=("isolate_subnets",),
        check=check_shared_resources,
    ),
    StackRule(
        id="isolation-partitions",
        group="isolation",
        description="No Slurm partition holds a node that also serves inference.",
        remediation="List each host in exactly one pool; inference hosts never join a training pool.",
        needs_platform=True,
        check=check_partitions,
    ),
    StackRule(
        id="isolation-inference-taint",
        group="isolation",
        description="Inference nodes carry the taint (or configured label) keeping training jobs off them.",
        remediation='Add `taints: [{key: gpuplat/inference, value: "true", effect: NoSchedule}]` to the '
        "inference pool (or set `inferenceLabel` in the policy config to a label the scheduler honours).",
        options=("inference_label",),
        needs_platform=True,
        check=check_inference_taint,
    ),
    StackRule(
        id="k8s-isolation",
        group="isolation",
        description="Kubernetes: team workloads and Kueue flavors never reach inference nodes, model servers "
        "run on the inference pool only, and an admission policy makes the API server refuse the rest.",
        remediation="Keep training pools free of the inference taint and team jobs free of inference "
        "tolerations and selectors; keep the platform's ValidatingAdmissionPolicy and its Deny binding.",
        needs_platform=True,
        check=check_kubernetes_isolation,
    ),
    StackRule(
        id="k8s-spot-flavors",
        group="spot",
        description="Kubernetes: every ClusterQueue tries on-demand flavors before spot ones, and only "
        "interruptible pools are offered as spot flavors.",
        remediation="Order each queue's flavors on-demand first; mark spot pools `interruptible: true` "
        "(their jobs checkpoint and restart).",
        needs_platform=True,
        check=check_spot_flavors,
    ),
    StackRule(
        id="k8s-quotas",
        group="budget",
        description="Kubernetes: per flavor the guaranteed GPUs (nominal quotas) do not exceed the pool's, "
        "each team's reach stays within its gpu_quota, no team quota exceeds the training GPUs, and every "
        "queue and flavor reference resolves.",
        remediation="Lower the team's gpu_quota or add training capacity; let the platform derive "
        "nominal quotas and borrowing limits from the teams (infra/k8s/queues.py).",
        needs_platform=True,
        check=check_kubernetes_quotas,
    ),
    StackRule(
        id="fabric-multi-node-rdma",
        group="fabric",
        description="A training pool of more than one node has RDMA on every NIC the catalog lists.",
        remediation="aws: use an EFA instance type and `fabric.kind: efa` (one EFA interface per network "
        "card); onprem: `fabric.kind: infiniband` or `roce` on RDMA NICs; or keep the pool to one node.",
        check=check_multi_node_rdma,
    ),
    StackRule(
        id="fabric-cluster-placement",
        group="fabric",
        description="A multi-node training pool on aws sits in a cluster placement group.",
        remediation="Set `fabric.placement: cluster`; the node pool creates a cluster placement group and "
        "puts the pool's nodes in it (one zone): the Slurm launch template's placement, or the Auto "
        "Scaling group's.",
        check=check_cluster_placement,
    ),
    StackRule(
        id="fabric-efa-security-group",
        group="fabric",
        description="A security group on EFA interfaces allows all traffic to and from itself.",
        remediation="Add ingress and egress rules with ipProtocol -1 referencing the group itself "
        "(GpuNetwork `train-from-self` / `train-to-self`).",
        check=check_efa_security_group,
    ),
    ResourceRule(
        id="security-imdsv2",
        group="security",
        description="Launch templates and instances require IMDSv2 (metadata httpTokens required).",
        remediation='Set metadata_options.http_tokens = "required".',
        types=(LAUNCH_TEMPLATE, INSTANCE),
        check=check_imdsv2,
    ),
    ResourceRule(
        id="security-ebs-encrypted",
        group="security",
        description="EBS volumes (launch template block devices, instances, volumes) are encrypted.",
        remediation='Set ebs.encrypted = "true" on every block device mapping (encrypted = True on volumes).',
        types=(LAUNCH_TEMPLATE, INSTANCE, VOLUME),
        check=check_ebs_encrypted,
    ),
    ResourceRule(
        id="security-fsx-encrypted",
        group="security",
        description="FSx for Lustre file systems are encrypted at rest (a PERSISTENT deployment type).",
        remediation="Use deployment_type PERSISTENT_2 (optionally with kms_key_id).",
        types=(LUSTRE,),
        check=check_fsx_encrypted,
    ),
    StackRule(
        id="security-s3-encrypted",
        group="security",
        description="Every S3 bucket has a server-side encryption configuration (SSE-KMS or SSE-S3).",
        remediation="Declare a BucketServerSideEncryptionConfiguration with sse_algorithm aws:kms.",
        check=check_s3_encrypted,
    ),
    StackRule(
        id="security-s3-public-access-blocked",
        group="security",
        description="Every S3 bucket has a public access block with all four settings on.",
        remediation="Declare a BucketPublicAccessBlock with block_public_acls, block_public_policy, "
        "ignore_public_acls and restrict_public_buckets all True.",
        check=check_s3_public_access,
    ),
    ResourceRule(
        id="security-no-open-ingress",
        group="security",
        description="No security group accepts ingress from 0.0.0.0/0 or ::/0.",
        remediation="Allow ingress from the VPC CIDR or another security group; reach nodes through SSM.",
        types=(INGRESS_RULE, SG_RULE, SECURITY_GROUP),
        check=check_open_ingress,
    ),
    ResourceRule(
        id="security-required-tags",
        group="security",
        description="Taggable cloud resources carry the required tags (default owner, team, cost-center).",
        remediation="Set the missing keys in the stack's `tags:` (owner, team, cost-center and any others "
        "the organisation requires); every component passes them on. "
        "Change the keys with `requiredTags` in the policy config.",
        options=("required_tags",),
        types=TAGGABLE,
        any_tagged=True,
        check=check_required_tags,
    ),
    StackRule(
        id="security-munge-key-readers",
        group="security",
        description="Only the node roles of pools that run munged (Slurm controllers and training nodes) "
        "may read the MUNGE key.",
        remediation="Grant ssm:GetParameter on the MUNGE key parameter only to the identities of the pools "
        "in the slurm_controller and slurm_compute groups (infra/nodes/munge.py); other nodes fetch no key.",
        needs_platform=True,
        check=check_munge_key_readers,
    ),
    ResourceRule(
        id="security-ec2-launch-scoped",
        group="security",
        description="IAM never grants ec2:RunInstances, ec2:CreateFleet, ec2:CreateTags or "
        "ec2:TerminateInstances on instances without a condition, and CreateTags never lets an existing "
        "instance get the stack tag.",
        remediation="RunInstances on instances with an ec2:LaunchTemplate and aws:RequestTag/gpuplat:stack "
        "condition, CreateFleet with aws:RequestTag/gpuplat:stack; CreateTags with ec2:CreateAction "
        "RunInstances (or CreateFleet), or on instances tagged with the stack and ForAllValues aws:TagKeys "
        "[gpuplat:node, Name]; TerminateInstances with a resource tag condition (infra/backends/aws/iam.py, "
        "cluster_manager_statements).",
        types=(IAM_ROLE_POLICY, IAM_POLICY, IAM_ROLE),
        check=check_ec2_launch_scoped,
    ),
    StackRule(
        id="placement-filesystem-zone",
        group="placement",
        description="Training node groups launch in the zone of the FSx for Lustre file system.",
        remediation="Put the training pools in one zone (`zone:` on the pool, where its reservation is); the "
        "file system follows them (infra/platform/zones.py). Pools that must stay in another zone read "
        "across zones, or get their own stack.",
        severity="advisory",
        check=check_filesystem_zone,
    ),
    StackRule(
        id="placement-names-pools",
        group="scheduling",
        description="Each placement preference (a team's, a job class's) names training pools of the stack, "
        "and on Slurm has GPU types to choose between.",
        remediation="List training pool names only (`gpuplat plan` prints them), or use performance or cost; "
        "on Slurm, a preference needs on-demand training pools of two GPU types or more (else drop it).",
        needs_platform=True,
        check=check_placement_preferences,
    ),
    StackRule(
        id="alerts-reach-someone",
        group="monitoring",
        description="A production Slurm stack sends its alerts somewhere (alerting.webhook_urls).",
        remediation="Add the webhook of your paging or chat service (Alertmanager's webhook format, "
        "directly or through its adapter) to alerting.webhook_urls.",
        severity="advisory",
        needs_platform=True,
        check=check_alert_receivers,
    ),
    StackRule(
        id="budget-gpus",
        group="budget",
        description="The pools' GPUs at full size stay within the stack's budget.max_gpus.",
        remediation="Lower pool counts/max, pick smaller node types, or raise budget.max_gpus deliberately.",
        needs_platform=True,
        check=check_budget_gpus,
    ),
    StackRule(
        id="budget-hourly-cost",
        group="budget",
        description="The pools' hourly cost at full size stays within the stack's budget.max_hourly_usd.",
        remediation="Use spot for interruptible training, lower pool sizes, or raise budget.max_hourly_usd "
        "deliberately.",
        needs_platform=True,
        check=check_budget_cost,
    ),
)

RULES_BY_ID = {rule.id: rule for rule in RULES}


def rule(rule_id: str) -> ResourceRule | StackRule:
    return RULES_BY_ID[rule_id]


def applies_to(rule_: ResourceRule, resource: ResourceView) -> bool:
    return resource.type in rule_.types or (rule_.any_tagged and "tags" in resource.props)


def not_applicable(
    resources: Iterable[ResourceView], rules: Iterable[ResourceRule | StackRule] = RULES
) -> list[str]:
    """The resource rules no resource of the stack is judged by (an AWS rule on an on-prem stack): a report
    shows them as skipped, not passed. A stack rule always judges the stack."""
    views = list(resources)
    return [
        rule_.id
        for rule_ in rules
        if isinstance(rule_, ResourceRule) and not any(applies_to(rule_, view) for view in views)
    ]


def evaluate(
    resources: Iterable[ResourceView],
    ctx: PolicyContext,
    rules: Iterable[ResourceRule | StackRule] = RULES,
) -> list[Verdict]:
    """Run the rules over one stack's resources; enforcement overrides from the config apply."""
    index = resources if isinstance(resources, ResourceIndex) else ResourceIndex(resources)
    verdicts: list[Verdict] = []
    for rule_ in rules:
        level = ctx.config.enforcement.get(rule_.id, rule_.severity)
        if level == "disabled":
            continue
        if isinstance(rule_, ResourceRule):
            for resource in index:
                if applies_to(rule_, resource):
                    verdicts += [
                        Verdict(
                            rule_.id, level, resource.name, message, rule_.remediation, resource.urn or None
                        )
                        for message in rule_.check(resource, ctx)
                    ]
        else:
            if rule_.needs_platform and ctx.platform is None:
                continue
            verdicts += [
                Verdict(rule_.id, level, f.resource, f.message, rule_.remediation, f.urn)
                for f in rule_.check(index, ctx)
            ]
    return verdicts
