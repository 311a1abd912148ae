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
        self.profile = aws.iam.InstanceProfile(
            f"{name}-profile", role=self.role.name, tags=args.tags, opts=child
        )
        self.register_outputs({"role_arn": self.role.arn, "instance_profile_arn": self.profile.arn})
