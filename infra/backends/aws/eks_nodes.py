"""A pool as an EKS managed node group on its own launch template (infra/backends/aws/node_pool.py).

- AMI type and capacity type use the EKS API's enums (botocore 1.44.8, data/eks/2017-11-01
  service-2.json: AMITypes, CapacityTypes, TaintEffect): the EKS-optimized Amazon Linux 2023 AMI with
  NVIDIA's driver for GPU pools, the standard one otherwise; SPOT for spot pools, CAPACITY_BLOCK for a
  Capacity Block (the template targets it; EKS user guide, ml/capacity-blocks-mng.adoc), ON_DEMAND
  otherwise (an On-Demand Capacity Reservation is targeted by the template).
- EFA pools attach one EFA interface on every network card and launch into the pool's cluster placement
  group, as eksctl's `efaEnabled` node groups do (https://eksctl.io/usage/efa/).
- The cluster autoscaler owns the desired size: the node group starts at its minimum and `pulumi up`
  never resets it. Scaling from zero: the autoscaler reads a managed node group's labels and taints from
  EKS DescribeNodegroup, its CPUs, memory and GPUs from the instance type, and other resources from the
  node group's `k8s.io/cluster-autoscaler/node-template/resources/<name>` tags (kubernetes/autoscaler,
  cluster-autoscaler-1.34.0, cloudprovider/aws/aws_manager.go, buildNodeFromTemplate): EFA interfaces are
  such a resource.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from infra.backends.aws.node_pool import eks_pool_template
from infra.data.models import NodeType
from infra.k8s.objects import EFA_RESOURCE
from infra.spec.models import NodePool, Placement

GPU_AMI_TYPE = "AL2023_x86_64_NVIDIA"
STANDARD_AMI_TYPE = "AL2023_x86_64_STANDARD"
TAINT_EFFECTS = {
    "NoSchedule": "NO_SCHEDULE",
    "NoExecute": "NO_EXECUTE",
    "PreferNoSchedule": "PREFER_NO_SCHEDULE",
}
NODE_TEMPLATE_RESOURCE_TAG = "k8s.io/cluster-autoscaler/node-template/resources/"
DESIRED_SIZE = "scalingConfig.desiredSize"


def ami_type(node_type: NodeType) -> str:
    return GPU_AMI_TYPE if node_type.gpu_count else STANDARD_AMI_TYPE


def capacity_type(pool: NodePool) -> str:
    if pool.capacity == "spot":
        return "SPOT"
    if pool.reservation is not None and pool.reservation.kind == "capacity-block":
        return "CAPACITY_BLOCK"
    return "ON_DEMAND"


def eks_taints(pool: NodePool) -> list[aws.eks.NodeGroupTaintArgsDict]:
    taints = []
    for taint in pool.taints:
        entry: aws.eks.NodeGroupTaintArgsDict = {"key": taint.key, "effect": TAINT_EFFECTS[taint.effect]}
        if taint.value:
            entry["value"] = taint.value
        taints.append(entry)
    return taints


def scale_from_zero_tags(node_type: NodeType, efa: bool) -> dict[str, str]:
    return {NODE_TEMPLATE_RESOURCE_TAG + EFA_RESOURCE: str(node_type.network.nics)} if efa else {}


@dataclass(frozen=True)
class EksNodePoolArgs:
    pool: NodePool
    node_type: NodeType
    cluster_name: pulumi.Input[str]
    node_role_arn: pulumi.Input[str]
    subnet_ids: list[pulumi.Input[str]]
    security_group_ids: list[pulumi.Input[str]]
    root_volume_gib: int
    efa: bool
    placement: Placement
    labels: dict[str, str]
    tags: dict[str, str]
    after: list[pulumi.Resource] = field(default_factory=list)
    """What must run before nodes join: the add-ons that give them a network."""


class EksNodePool(pulumi.ComponentResource):
    def __init__(self, name: str, args: EksNodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-platform:aws:EksNodePool", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        pool = args.pool
        self.placement_group = (
            aws.ec2.PlacementGroup(f"{name}-placement", strategy=args.placement, tags=args.tags, opts=child)
            if pool.role == "train" and args.placement != "none"
            else None
        )
        self.launch_template = aws.ec2.LaunchTemplate(
            f"{name}-lt",
            **eks_pool_template(
                pool,
                args.node_type,
                args.security_group_ids,
                self.placement_group.name if self.placement_group is not None else None,
                args.root_volume_gib,
                args.efa,
                args.tags,
            ),
            opts=child,
        )
        scaling: aws.eks.NodeGroupScalingConfigArgsDict = {
            "min_size": pool.min_nodes,
            "max_size": pool.max_nodes,
            "desired_size": pool.min_nodes,
        }
        template: aws.eks.NodeGroupLaunchTemplateArgsDict = {
            "id": self.launch_template.id,
            "version": self.launch_template.latest_version.apply(str),
        }
        self.node_group = aws.eks.NodeGroup(
            f"{name}-ng",
            cluster_name=args.cluster_name,
            node_role_arn=args.node_role_arn,
            subnet_ids=args.subnet_ids,
            scaling_config=scaling,
            capacity_type=capacity_type(pool),
            ami_type=ami_type(args.node_type),
            launch_template=template,
            labels=args.labels,
            taints=eks_taints(pool),
            tags={**args.tags, **scale_from_zero_tags(args.node_type, args.efa)},
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=[DESIRED_SIZE], depends_on=args.after),
        )
        self.register_outputs(
            {
                "node_group_name": self.node_group.node_group_name,
                "launch_template_id": self.launch_template.id,
                "placement_group": self.placement_group.name if self.placement_group is not None else None,
            }
        )
