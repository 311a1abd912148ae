"""The parts of the security rules that read IAM and tags (infra/policy/rules/security.py), on hand-made
values: which ARN patterns match EC2 instances and SSM parameters, which tag-key conditions keep a
CreateTags off the stack tag, which pool role holds a role policy, and a blank tag given by tagsAll. Each
test failed on a mutant of the rules the policy-rules session let through (`make mutation`,
docs/developing.md#mutation-score)."""

from __future__ import annotations

from typing import Any

import pytest

from infra.policy.rules import PolicyContext
from infra.policy.rules.resource_types import BUCKET_PAB, BUCKETS, IAM_ROLE, IAM_ROLE_POLICY, SSM_PARAMETER
from infra.policy.rules.security import (
    _instance_arn,
    _names_parameter,
    _policy_role,
    _retags_stack,
    check_required_tags,
    check_s3_public_access,
)
from infra.policy.settings import PolicyConfig
from infra.policy.view import TAG_ROLE, UNKNOWN, ResourceIndex, ResourceView


@pytest.mark.parametrize(
    ("pattern", "matches"),
    [
        ("*", True),
        ("arn:aws:ec2:*:*:instance/*", True),
        ("arn:aws:ec2:us-east-1:*:instance/*", True),
        ("arn:aws:s3:*:*:instance/*", False),
        # Six parts split from the left: the resource part keeps the colon and names no instance.
        ("arn:aws:ec2:*:*:*:instance/*", False),
    ],
)
def test_an_arn_pattern_matches_instances_by_its_service_and_resource(pattern: str, matches: bool) -> None:
    assert _instance_arn(pattern) is matches


def test_a_parameter_pattern_is_matched_on_what_follows_its_first_parameter_part() -> None:
    parameter = ResourceView(SSM_PARAMETER, "munge", {"name": "/gpuplat/munge"}, urn="urn:munge")
    assert _names_parameter("arn:aws:ssm:*:*:parameter/gpuplat/*", parameter)
    assert not _names_parameter("arn:aws:ssm:*:*:parameter/*:parameter/other", parameter)
    assert not _names_parameter("arn:aws:ssm:*:*:parameter/other:parameter/gpuplat/*", parameter)


@pytest.mark.parametrize("operator", ["ForAllValues:StringEquals", "ForAllValues:StringLike"])
def test_tag_keys_listed_without_the_stack_tag_keep_createtags_off_it(operator: str) -> None:
    assert not _retags_stack({"aws:tagkeys": [(operator, ["team", "owner*"])]})
    assert _retags_stack({"aws:tagkeys": [(operator, ["gpuplat:*"])]})


def role_policy_of(*roles: ResourceView) -> str | None:
    policy = ResourceView(IAM_ROLE_POLICY, "policy", {"role": "node-role"}, urn="urn:policy")
    return _policy_role(ResourceIndex([*roles, policy]), policy)


@pytest.mark.parametrize("pool_role", ["train", "infer", "service"])
def test_a_role_policys_pool_role_is_read_from_its_iam_roles_name(pool_role: str) -> None:
    role = ResourceView(IAM_ROLE, f"stack-{pool_role}-role", {}, urn="urn:role", ids=frozenset({"node-role"}))
    assert role_policy_of(role) == pool_role


def test_a_role_policys_pool_role_comes_from_an_iam_role_only() -> None:
    """Under the mocks another resource may share the role's id: its tag says nothing."""
    namesake = ResourceView(
        SSM_PARAMETER, "other", {"tags": {TAG_ROLE: "infer"}}, urn="urn:other", ids=frozenset({"node-role"})
    )
    role = ResourceView(IAM_ROLE, "stack-train-role", {}, urn="urn:role", ids=frozenset({"node-role"}))
    assert role_policy_of(namesake, role) == "train"


def test_a_blank_required_tag_given_by_tags_all_is_missing() -> None:
    config = PolicyConfig.model_validate({"requiredTags": ["owner"]})
    resource = ResourceView(SSM_PARAMETER, "p", {"tagsAll": {"owner": ""}}, urn="urn:p")
    assert list(check_required_tags(resource, PolicyContext(None, config))) == [
        "missing tag owner: cost reports and owners are found through them"
    ]


def public_access(*pab: dict[str, Any]) -> list[str]:
    bucket = ResourceView(BUCKETS[0], "data", {}, urn="urn:data", ids=frozenset({"data"}))
    blocks = [
        ResourceView(BUCKET_PAB, f"pab-{i}", {"bucket": "data", **p}, urn=f"urn:pab-{i}")
        for i, p in enumerate(pab)
    ]
    return [f.message for f in check_s3_public_access(ResourceIndex([bucket, *blocks]), PolicyContext(None))]


def test_a_bucket_is_told_which_public_access_flags_are_off_or_that_it_has_no_block() -> None:
    """Flags a preview does not know yet are not called off."""
    assert public_access() == [
        "bucket 'data' has no public access block: one wrong ACL or policy publishes training data"
    ]
    known = {"blockPublicPolicy": True, "restrictPublicBuckets": UNKNOWN}
    assert public_access(known) == [
        "bucket 'data' has blockPublicAcls, ignorePublicAcls off: one wrong ACL or policy publishes training "
        "data"
    ]
