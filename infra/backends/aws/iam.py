"""One IAM role and instance profile per pool role, least privilege: its buckets, SSM, CloudWatch agent."""

from __future__ import annotations

import json
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


class NodeIdentity(pulumi.ComponentResource):
    def __init__(self, name: str, args: NodeIdentityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-platform:aws:NodeIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        assume = json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Principal": {"Service": "ec2.amazonaws.com"},
                        "Action": "sts:AssumeRole",
                    }
                ],
            }
        )
        self.role = aws.iam.Role(f"{name}-role", assume_role_policy=assume, tags=args.tags, opts=child)
        for index, policy in enumerate(MANAGED_POLICIES):
            aws.iam.RolePolicyAttachment(
                f"{name}-managed-{index}", role=self.role.name, policy_arn=policy, opts=child
            )
        if any(BUCKET_ACCESS[args.role].values()) and args.bucket_arns:
            purposes = sorted(args.bucket_arns)
            document = pulumi.Output.all(*[args.bucket_arns[p] for p in purposes]).apply(
                lambda arns: bucket_policy_document(args.role, dict(zip(purposes, arns, strict=True)))
            )
            aws.iam.RolePolicy(f"{name}-buckets", role=self.role.id, policy=document, opts=child)
        if args.platform_policy is not None:
            aws.iam.RolePolicy(f"{name}-platform", role=self.role.id, policy=args.platform_policy, opts=child)
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
