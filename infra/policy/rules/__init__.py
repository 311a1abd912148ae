"""The platform's rules: plain functions over neutral resource views and the resolved platform.

Each rule has a kebab-case id, a description, an enforcement level (mandatory unless marked advisory)
and remediation text. Resource rules judge one resource at a time; stack rules see every resource of
the stack and, through the context, the resolved platform: the facts that are not resource properties
(a pool's interruptible flag, the budget, the catalog's NIC count, Slurm partitions, checkpoint storage,
the onprem and local backends that declare no cloud resources).

The same functions serve the CrossGuard pack (`infra/policy/pack.py`) and `gpuplat check`
(`infra/policy/check.py`). Nothing here imports Pulumi.

Layout: `base` (context, findings, rule and verdict records, value helpers), `resource_types` (the
Pulumi type tokens), `nodes` (node groups: Auto Scaling groups and Slurm-managed training launch
templates, with their pool, role and size), one module per area (`spot`, `isolation`, `fabric`,
`security`, `placement`, `budget`), and `registry` (RULES and `evaluate`). This module re-exports the public
names, so `from infra.policy.rules import ...` sees one namespace.
"""

from infra.policy.rules.base import (
    Finding,
    PolicyContext,
    ResourceCheck,
    ResourceRule,
    Rule,
    Severity,
    StackCheck,
    StackRule,
    Verdict,
)
from infra.policy.rules.budget import check_budget_cost, check_budget_gpus
from infra.policy.rules.fabric import check_cluster_placement, check_efa_security_group, check_multi_node_rdma
from infra.policy.rules.isolation import check_inference_taint, check_partitions, check_shared_resources
from infra.policy.rules.nodes import NodeGroup, node_groups
from infra.policy.rules.placement import check_filesystem_zone
from infra.policy.rules.registry import RULES, RULES_BY_ID, applies_to, evaluate, not_applicable, rule
from infra.policy.rules.resource_types import (
    ASG,
    BUCKET_PAB,
    BUCKET_SSE,
    BUCKETS,
    EGRESS_RULE,
    INGRESS_RULE,
    INSTANCE,
    LAUNCH_TEMPLATE,
    LUSTRE,
    OPEN_IPV4,
    OPEN_IPV6,
    PLACEMENT_GROUP,
    SECURITY_GROUP,
    SG_RULE,
    SUBNET,
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
    SPOT_BACKENDS,
    check_inference_base_capacity,
    check_interruptible_on_spot,
    check_spot_training_recovery,
    check_spot_training_share,
)

__all__ = [
    "ASG",
    "BUCKETS",
    "BUCKET_PAB",
    "BUCKET_SSE",
    "EGRESS_RULE",
    "INGRESS_RULE",
    "INSTANCE",
    "LAUNCH_TEMPLATE",
    "LUSTRE",
    "OPEN_IPV4",
    "OPEN_IPV6",
    "PLACEMENT_GROUP",
    "RULES",
    "RULES_BY_ID",
    "SECURITY_GROUP",
    "SG_RULE",
    "SPOT_BACKENDS",
    "SUBNET",
    "TAGGABLE",
    "VOLUME",
    "Finding",
    "NodeGroup",
    "PolicyContext",
    "ResourceCheck",
    "ResourceRule",
    "Rule",
    "Severity",
    "StackCheck",
    "StackRule",
    "Verdict",
    "applies_to",
    "check_budget_cost",
    "check_budget_gpus",
    "check_cluster_placement",
    "check_ebs_encrypted",
    "check_ec2_launch_scoped",
    "check_efa_security_group",
    "check_filesystem_zone",
    "check_fsx_encrypted",
    "check_imdsv2",
    "check_inference_base_capacity",
    "check_inference_taint",
    "check_interruptible_on_spot",
    "check_multi_node_rdma",
    "check_munge_key_readers",
    "check_open_ingress",
    "check_partitions",
    "check_required_tags",
    "check_s3_encrypted",
    "check_s3_public_access",
    "check_shared_resources",
    "check_spot_training_recovery",
    "check_spot_training_share",
    "evaluate",
    "node_groups",
    "not_applicable",
    "rule",
]
