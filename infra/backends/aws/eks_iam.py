"""The IAM roles of an EKS cluster: the control plane's, the nodes' (one per pool role) and the cluster
autoscaler's, each with what the EKS user guide and the autoscaler's own documentation list, no more."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_aws as aws

from infra.backends.aws.iam import (
    NodeIdentityArgs,
    bucket_policy_document,
    inline_policy,
    node_role,
    service_trust_policy,
)

# EKS user guide, "Amazon EKS cluster IAM role" (security/iam-reference/cluster-iam-role.adoc).
CLUSTER_POLICIES = ("arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",)
# EKS user guide, "Amazon EKS node IAM role" (security/iam-reference/create-node-role.adoc): kubelet and
# the Pod Identity agent, image pulls from ECR, the VPC CNI's ENI management (allowed on the node role;
# the guide prefers a role of its own), and SSM for access like the Slurm nodes.
NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryPullOnly",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
)
# EKS Pod Identity assumes a role with both (EKS user guide, manage-access/aws-access/service-accounts.adoc).
POD_IDENTITY_SERVICE = "pods.eks.amazonaws.com"
POD_IDENTITY_ACTIONS = ("sts:AssumeRole", "sts:TagSession")

# kubernetes/autoscaler, cluster-autoscaler-1.34.0, cluster-autoscaler/cloudprovider/aws/README.md,
# "Full Cluster Autoscaler Features Policy": read on everything, scale only what the second block allows.
_AUTOSCALER_READ = [
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLaunchConfigurations",
    "autoscaling:DescribeScalingActivities",
    "ec2:DescribeImages",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions",
    "ec2:GetInstanceTypesFromInstanceRequirements",
    "eks:DescribeNodegroup",
]
_AUTOSCALER_SCALE = ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"]


def autoscaler_discovery_tag(cluster_name: str) -> str:
    """The tag key the autoscaler discovers a cluster's Auto Scaling groups by (README, "Auto-Discovery
    Setup"); EKS puts it on every managed node group's group (EKS user guide, managed-node-groups.adoc)."""
    return f"k8s.io/cluster-autoscaler/{cluster_name}"


def autoscaler_statements(cluster_name: str) -> list[dict[str, Any]]:
    """Scale and terminate only in Auto Scaling groups carrying the cluster's discovery tag (any value:
    the autoscaler itself only asks that the key exist)."""
    return [
        {"Sid": "DiscoverNodeGroups", "Effect": "Allow", "Action": _AUTOSCALER_READ, "Resource": "*"},
        {"Sid": "ScaleOwnNodeGroups", "Effect": "Allow", "Action": _AUTOSCALER_SCALE, "Resource": "*",
         "Condition": {"Null": {f"aws:ResourceTag/{autoscaler_discovery_tag(cluster_name)}": "false"}}},
    ]  # fmt: skip


def cluster_role(
    name: str, tags: dict[str, str], opts: pulumi.ResourceOptions
) -> tuple[aws.iam.Role, list[pulumi.Resource]]:
    """The control plane's role and its policy attachments (the cluster waits for them, or EKS cannot
    clean up what it created when the cluster is deleted: pulumi-aws eks.Cluster, `role_arn`)."""
    role = aws.iam.Role(
        f"{name}-cluster-role",
        assume_role_policy=service_trust_policy("eks.amazonaws.com"),
        tags=tags,
        opts=opts,
    )
    attachments: list[pulumi.Resource] = [
        aws.iam.RolePolicyAttachment(
            f"{name}-cluster-managed-{index}", role=role.name, policy_arn=policy, opts=opts
        )
        for index, policy in enumerate(CLUSTER_POLICIES)
    ]
    return role, attachments


def node_roles(
    name: str,
    roles: list[str],
    bucket_arns: dict[str, pulumi.Output[str]],
    tags: dict[str, str],
    opts: pulumi.ResourceOptions,
) -> dict[str, aws.iam.Role]:
    """One node role per pool role, with that role's buckets (as the Slurm nodes have them)."""
    return {
        role: node_role(f"{name}-{role}-node", NodeIdentityArgs(role, bucket_arns, tags), NODE_POLICIES, opts)
        for role in sorted(set(roles))
    }


def autoscaler_role(
    name: str, cluster_name: pulumi.Input[str], tags: dict[str, str], opts: pulumi.ResourceOptions
) -> aws.iam.Role:
    role = aws.iam.Role(
        f"{name}-autoscaler-role",
        assume_role_policy=service_trust_policy(POD_IDENTITY_SERVICE, POD_IDENTITY_ACTIONS),
        tags=tags,
        opts=opts,
    )
    inline_policy(f"{name}-autoscaler-scaling", role, cluster_name, autoscaler_statements, opts)
    return role


def model_server_role(
    name: str, bucket_arns: dict[str, pulumi.Output[str]], tags: dict[str, str], opts: pulumi.ResourceOptions
) -> aws.iam.Role:
    """The model server's own identity (EKS Pod Identity): what an inference node reads, the models
    bucket, and nothing else; pods no longer reach the node's role (instance metadata hop limit 1)."""
    role = aws.iam.Role(
        f"{name}-model-server-role",
        assume_role_policy=service_trust_policy(POD_IDENTITY_SERVICE, POD_IDENTITY_ACTIONS),
        tags=tags,
        opts=opts,
    )
    purposes = sorted(bucket_arns)
    document = pulumi.Output.all(*[bucket_arns[p] for p in purposes]).apply(
        lambda arns: bucket_policy_document("infer", dict(zip(purposes, arns, strict=True)))
    )
    aws.iam.RolePolicy(f"{name}-model-server-buckets", role=role.id, policy=document, opts=opts)
    return role
