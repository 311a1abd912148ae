"""Who can read the MUNGE key, on each role's effective policy: its inline policies and the AWS managed
policies attached to it (their documents as moto ships them, moto/iam/aws_managed_policies.py), judged by
test_aws_iam.py's model of IAM's evaluation (an explicit Deny wins).

AmazonSSMManagedInstanceCore allows ssm:GetParameter(s) on "*" and the key is a SecureString under the
account's aws/ssm key: before, every role could read it, the inference nodes' (a model server a job's
user may reach) and the image builds' included.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from infra.backends.aws.bootstrap import munge_parameter
from infra.backends.aws.iam import munge_key_denied_statements
from infra.nodes.munge import munge_roles
from infra.plan.record import Recording
from infra.platform.resolve import ResolvedPlatform
from tests.pulumi.test_aws_iam import (
    ACCOUNT,
    REGION,
    allowed,
    aws_prod,
    effective_statements,
    managed_statements,
)

__all__ = ["aws_prod"]  # the fixture: aws-prod's program recorded under the mocks

KEY = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{munge_parameter('aws-prod')}"
PARAMETER_READS = ("ssm:GetParameter", "ssm:GetParameters", "ssm:GetParameterHistory")


def reads(key: str) -> list[tuple[str, str]]:
    """Every way to read the key: by name, and by path from each of its parents."""
    prefix, _, name = key.partition(":parameter/")
    parents = ["/".join(name.split("/")[:n]) for n in range(len(name.split("/")))]
    return [(action, key) for action in PARAMETER_READS] + [
        ("ssm:GetParametersByPath", f"{prefix}:parameter/{parent}") for parent in parents
    ]


def recorded_key(recording: Recording) -> str:
    """The key's ARN as the mocks answer it (arn:aws:mock:::parameter/<resource name>)."""
    statements = json.loads(recording.named("aws-prod-train-platform").inputs["policy"])["Statement"]
    [key] = next(s["Resource"] for s in statements if s["Sid"] == "ReadMungeKey")
    return str(key)


def reads_key(statements: list[Mapping[str, Any]], key: str) -> bool:
    return any(allowed(statements, action, resource, {}) for action, resource in reads(key))


def test_only_the_roles_of_nodes_that_run_munge_can_read_the_key(
    aws_prod: tuple[ResolvedPlatform, Recording],
) -> None:
    platform, recording = aws_prod
    identities = {f"aws-prod-{role}": role for role in ("train", "infer", "service")}
    identities["aws-prod-image-build"] = "image-build"
    roles = {r.name for r in recording.of_type("aws:iam/role:Role")}
    assert {f"{identity}-role" for identity in identities} <= roles
    key = recorded_key(recording)
    readers = {
        role
        for identity, role in identities.items()
        if reads_key(effective_statements(recording, identity), key)
    }
    assert readers == munge_roles(platform) == {"train", "service"}


def test_the_deny_holds_against_any_allow_on_the_real_arn() -> None:
    """The SSM core policy every role carries allows the read by itself (what the Deny is for); the Deny,
    built from the key's real ARN, covers the key and every path above it, whatever is allowed."""
    core = managed_statements("arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore")
    assert reads_key(core, KEY)
    anything: Mapping[str, Any] = {"Effect": "Allow", "Action": "ssm:*", "Resource": "*"}
    assert not reads_key([anything, *munge_key_denied_statements(KEY)], KEY)
    assert allowed([anything, *munge_key_denied_statements(KEY)], "ssm:GetParameter", KEY + "-other", {})


def test_every_role_with_a_managed_policy_is_judged(aws_prod: tuple[ResolvedPlatform, Recording]) -> None:
    """A new role carrying the SSM core policy (an EKS node group, another build) must be judged above."""
    _, recording = aws_prod
    attached = {
        a.name.rsplit("-managed-", 1)[0]
        for a in recording.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if "AmazonSSMManagedInstanceCore" in a.inputs["policyArn"]
    }
    assert attached == {"aws-prod-train", "aws-prod-infer", "aws-prod-service", "aws-prod-image-build"}
