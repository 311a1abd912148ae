"""One IAM role and instance profile per pool role, least privilege: its buckets, SSM, CloudWatch agent."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

MANAGED_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
    "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy",
)
_READ = ["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"]
_WRITE = ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]

# Which buckets (by purpose) each pool role reads and writes.
BUCKET_ACCESS: dict[str, dict[str, list[str]]] = {
    "train": {"read": ["datasets", "checkpoints", "models"], "write": ["checkpoints", "models"]},
    "infer": {"read": ["models"], "write": []},
    "service": {"read": [], "write": []},
}


@dataclass(frozen=True)
class NodeIdentityArgs:
    role: str
    bucket_arns: dict[str, pulumi.Output[str]] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    # What the role's nodes need beyond their buckets (bootstrap, cluster management): a policy document.
    platform_policy: pulumi.Input[str] | None = None


def bucket_policy_document(role: str, arns: dict[str, str]) -> str:
    access = BUCKET_ACCESS[role]
    statements: list[dict[str, Any]] = []
    for verb, actions in (("read", _READ), ("write", _WRITE)):
        targets = [arns[p] for p in access[verb] if p in arns]
        if targets:
            statements.append(
                {
                    "Sid": f"{verb.capitalize()}Buckets",
                    "Effect": "Allow",
                    "Action": actions,
                    "Resource": sorted(targets + [f"{a}/*" for a in targets]),
                }
            )
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, sort_keys=True)


def service_trust_policy(service: str, actions: Sequence[str] = ("sts:AssumeRole",)) -> str:
    """A role's trust policy: `service` (ec2.amazonaws.com, eks.amazonaws.com, ...) may assume it."""
    action: str | list[str] = actions[0] if len(actions) == 1 else list(actions)
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": action}],
        }
    )


def node_role(
    name: str, args: NodeIdentityArgs, managed_policies: Sequence[str], opts: pulumi.ResourceOptions
) -> aws.iam.Role:
    """The IAM role of a pool role's nodes: the managed policies, its buckets, its platform policy."""
    role = aws.iam.Role(
        f"{name}-role",
        assume_role_policy=service_trust_policy("ec2.amazonaws.com"),
        tags=args.tags,
        opts=opts,
    )
    for index, policy in enumerate(managed_policies):
        aws.iam.RolePolicyAttachment(f"{name}-managed-{index}", role=role.name, policy_arn=policy, opts=opts)
    if any(BUCKET_ACCESS[args.role].values()) and args.bucket_arns:
        purposes = sorted(args.bucket_arns)
        document = pulumi.Output.all(*[args.bucket_arns[p] for p in purposes]).apply(
            lambda arns: bucket_policy_document(args.role, dict(zip(purposes, arns, strict=True)))
        )
        aws.iam.RolePolicy(f"{name}-buckets", role=role.id, policy=document, opts=opts)
    if args.platform_policy is not None:
        aws.iam.RolePolicy(f"{name}-platform", role=role.id, policy=args.platform_policy, opts=opts)
    return role


class NodeIdentity(pulumi.ComponentResource):
    def __init__(self, name: str, args: NodeIdentityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-platform:aws:NodeIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role = node_role(name, args, MANAGED_POLICIES, child)
        self.profile = aws.iam.InstanceProfile(
            f"{name}-profile", role=self.role.name, tags=args.tags, opts=child
        )
        self.register_outputs({"role_arn": self.role.arn, "instance_profile_arn": self.profile.arn})


def bootstrap_statements(platform_bucket_arn: str, munge_parameter_arn: str) -> list[dict[str, Any]]:
    """Every node: read the bundle and group vars, and the MUNGE key."""
    return [
        {"Sid": "ReadBootstrapBundle", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": [f"{platform_bucket_arn}/bootstrap/*"]},
        {"Sid": "ReadMungeKey", "Effect": "Allow", "Action": ["ssm:GetParameter"],
         "Resource": [munge_parameter_arn]},
    ]  # fmt: skip


def cluster_manager_statements(stack: str, train_role_arns: list[str]) -> list[dict[str, Any]]:
    """The controllers: launch and terminate training nodes (Slurm power saving) and find inference
    nodes (gateway and Prometheus discovery). Termination only of this stack's instances."""
    return [
        {"Sid": "DiscoverInstances", "Effect": "Allow", "Action": ["ec2:DescribeInstances"], "Resource": "*"},
        {"Sid": "LaunchTrainingNodes", "Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateTags"],
         "Resource": "*"},
        {"Sid": "TerminateOwnNodes", "Effect": "Allow", "Action": ["ec2:TerminateInstances"], "Resource": "*",
         "Condition": {"StringEquals": {"ec2:ResourceTag/gpuplat:stack": stack}}},
        {"Sid": "PassTrainingRole", "Effect": "Allow", "Action": ["iam:PassRole"],
         "Resource": sorted(train_role_arns),
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
    ]  # fmt: skip


def policy_document(statements: list[dict[str, Any]]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, sort_keys=True)
