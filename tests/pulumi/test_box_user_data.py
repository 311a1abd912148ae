"""The box's user data (tests/box/cloud.node_boot_script) is the program's, for the box's own stack and for
two bundle digests. The box declares its instances and launch templates from node_boot_script, and its
role change (box scenario r) stops and starts a controller whose node_boot_script changed with the
bundle: that decision models the program's only while the two agree, which nothing in the box can see
(the box does not run the Pulumi program)."""

from __future__ import annotations

import base64

import pytest

import infra.backends.aws as aws_backend
from infra.plan.record import record
from infra.platform.resolve import load_platform
from infra.spec.load import PROJECT_ROOT
from tests.box.cloud import node_boot_script

INSTANCE = "aws:ec2/instance:Instance"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
BUCKET = "aws:s3/bucket:Bucket"
STACK_FILE = PROJECT_ROOT / "tests" / "box" / "stack.yaml"
DIGESTS = ["bootstrap/0000000000000000/bundle.zip", "bootstrap/1111111111111111/bundle.zip"]


@pytest.mark.parametrize("key", DIGESTS)
def test_the_box_boots_its_nodes_from_the_programs_user_data(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    platform = load_platform(STACK_FILE)
    monkeypatch.setattr(aws_backend, "bundle_key", lambda _root: key)
    recording = record(platform)
    [bootstrap] = [r for r in recording.of_type(BUCKET) if r.name == f"{platform.name}-objects-bootstrap"]
    bucket = f"{bootstrap.inputs.get('bucketPrefix', bootstrap.name)}mock"  # infra/plan/record.py's mock name
    controllers = {r.inputs["tags"]["gpuplat:node"]: r.inputs for r in recording.of_type(INSTANCE)}
    assert set(controllers) == set(platform.controller_pool.node_names())
    for node, inputs in controllers.items():
        declared = base64.b64decode(inputs["userDataBase64"]).decode()
        assert declared == node_boot_script(platform, bucket, key, platform.controller_pool.name, node), node
    templates = {r.name: r.inputs for r in recording.of_type(TEMPLATE)}
    pools = [p.name for p in platform.pools_with_role("train")]
    assert sorted(templates) == sorted(f"{platform.name}-{pool}-lt" for pool in pools)
    for pool in pools:
        declared = base64.b64decode(templates[f"{platform.name}-{pool}-lt"]["userData"]).decode()
        assert declared == node_boot_script(platform, bucket, key, pool), pool
