"""A role change (a new bundle digest) on day 2 must not stop and start the controllers: on an
aws_instance a user data change is a stop and start (Terraform AWS provider, resource aws_instance,
user_data: "Updates to this field will trigger a stop/start of the EC2 instance by default"; with
user_data_replace_on_change, a replacement). The controllers' inputs are recorded under Pulumi's mocks
for two bundle digests: Pulumi diffs inputs, so equal inputs plan no update of the controllers, while
the training pools' launch templates take the new bundle (new versions, used by the next launch only).
Running controllers get role changes from `gpuplat up`'s Ansible run (infra/lifecycle/bringup.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import infra.backends.aws as aws_backend
from infra.plan.record import Recording, record
from infra.platform.resolve import ResolvedPlatform

INSTANCE = "aws:ec2/instance:Instance"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
OBJECT = "aws:s3/bucketObjectv2:BucketObjectv2"


def recorded_with_bundle(platform: ResolvedPlatform, key: str, monkeypatch: pytest.MonkeyPatch) -> Recording:
    monkeypatch.setattr(aws_backend, "bundle_key", lambda _root: key)
    return record(platform)


def by_name(recording: Recording, type_token: str) -> dict[str, dict[str, Any]]:
    return {r.name: r.inputs for r in recording.of_type(type_token)}


@pytest.mark.parametrize("stack", ["aws-prod"])
def test_a_new_bundle_digest_changes_no_controller_input(
    shipped_platforms: dict[str, ResolvedPlatform], monkeypatch: pytest.MonkeyPatch, stack: str
) -> None:
    platform = shipped_platforms[stack]
    before = recorded_with_bundle(platform, "bootstrap/0000000000000000/bundle.zip", monkeypatch)
    after = recorded_with_bundle(platform, "bootstrap/1111111111111111/bundle.zip", monkeypatch)
    controllers = by_name(before, INSTANCE)
    assert controllers and controllers == by_name(after, INSTANCE)
    templates_before, templates_after = by_name(before, TEMPLATE), by_name(after, TEMPLATE)
    assert any(templates_before[n]["userData"] != templates_after[n]["userData"] for n in templates_before)
    group_vars = json.loads(after.named(f"{stack}-group-vars").inputs["content"])
    assert group_vars["gpuplat_bundle_key"] == "bootstrap/1111111111111111/bundle.zip"
