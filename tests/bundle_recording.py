"""The Pulumi program recorded under its mocks with a given bootstrap bundle key: what a role change (a
new bundle digest) changes in what the program declares. tests/pulumi compares the inputs; the box
(tests/box/box.py) asks which controllers `pulumi up` would stop and start for its role change."""

from __future__ import annotations

from typing import Any
from unittest import mock

import infra.backends.aws as aws_backend
from infra.plan.record import Recording, record
from infra.platform.resolve import ResolvedPlatform

INSTANCE = "aws:ec2/instance:Instance"


def recorded_with_bundle(platform: ResolvedPlatform, key: str) -> Recording:
    with mock.patch.object(aws_backend, "bundle_key", lambda _root: key):
        return record(platform)


def controller_inputs(recording: Recording) -> dict[str, dict[str, Any]]:
    """The controllers' EC2 instances (the only aws_instance resources of a Slurm stack): name -> inputs.
    Pulumi diffs inputs: an instance whose inputs are equal is planned no update."""
    return {r.name: r.inputs for r in recording.of_type(INSTANCE)}
