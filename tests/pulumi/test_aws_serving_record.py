"""Who can read and write an AWS stack's serving version record (infra/serving/version_record.py), on each
node role's effective policy: its inline policies and the AWS managed policies attached to it (their
documents as moto ships them), judged by test_aws_iam.py's model of IAM's evaluation (an explicit Deny wins).

The record decides what every inference instance started later serves: the inference nodes read it at boot;
no node role may write it (a compromised model server would choose its peers' model), and the other node
roles have no reason to read it. The operator's credentials write it (outside the stack's roles).
"""

from __future__ import annotations

from infra.backends.aws.bootstrap import serving_version_parameter
from infra.backends.aws.iam import serving_version_statements
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
from tests.pulumi.test_aws_munge_key import recorded_key

__all__ = ["aws_prod"]  # the fixture: aws-prod's program recorded under the mocks

RECORD = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{serving_version_parameter('aws-prod')}"
READS = ("ssm:GetParameter", "ssm:GetParameters", "ssm:GetParameterHistory")
WRITES = ("ssm:PutParameter", "ssm:DeleteParameter", "ssm:LabelParameterVersion", "ssm:AddTagsToResource")
ROLES = ("train", "infer", "service")


def test_only_the_inference_role_reads_the_record_and_no_node_role_writes_it(
    aws_prod: tuple[ResolvedPlatform, Recording],
) -> None:
    _, recording = aws_prod
    statements = {role: effective_statements(recording, f"aws-prod-{role}") for role in ROLES}
    readers = {role for role in ROLES if all(allowed(statements[role], a, RECORD, {}) for a in READS)}
    assert readers == {"infer"}
    for role in ROLES:
        assert not any(allowed(statements[role], a, RECORD, {}) for a in READS) or role == "infer", role
        assert not any(allowed(statements[role], a, RECORD, {}) for a in WRITES), role
    # The image build's role (the SSM core policy too) reads none of it; its ARN as the mocks name the
    # stack's parameters (test_aws_munge_key.recorded_key).
    prefix = recorded_key(recording).rsplit(":parameter/", 1)[0]
    mocked = f"{prefix}:parameter{serving_version_parameter('aws-prod')}"
    build = effective_statements(recording, "aws-prod-image-build")
    assert not any(allowed(build, a, mocked, {}) for a in READS + WRITES)
    # Another stack's record is none of this stack's business either way.
    other = RECORD.replace("/aws-prod/", "/other/")
    assert not allowed(statements["infer"], "ssm:PutParameter", other, {})


def test_the_denies_hold_against_any_allow() -> None:
    """The SSM core policy every node role carries allows the read by itself (what the Deny is for) and no
    write; the Deny of writes holds even against a role given ssm:* later."""
    core = managed_statements("arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore")
    assert allowed(core, "ssm:GetParameter", RECORD, {})
    assert not any(allowed(core, action, RECORD, {}) for action in WRITES)
    anything = {"Effect": "Allow", "Action": "ssm:*", "Resource": "*"}
    for reader in (True, False):
        policy = [anything, *serving_version_statements(RECORD, reader)]
        assert not any(allowed(policy, action, RECORD, {}) for action in WRITES)
        assert allowed(policy, "ssm:GetParameter", RECORD, {}) is reader
