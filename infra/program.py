"""The Pulumi program: read the platform once, resolve it, let its backend declare the resources."""

from __future__ import annotations

import os
from pathlib import Path

import pulumi

from infra.backends.base import Backend
from infra.platform.resolve import ResolvedPlatform, resolve
from infra.spec.load import parse_spec, stack_file


def backend_for(name: str) -> Backend:
    if name == "aws":
        from infra.backends.aws import AwsBackend

        return AwsBackend()
    from infra.backends.hosts import HostBackend

    return HostBackend(name)


def build(platform: ResolvedPlatform) -> None:
    for key, value in backend_for(platform.spec.backend).declare(platform).items():
        pulumi.export(key, value)


def platform_from_config() -> ResolvedPlatform:
    raw = pulumi.Config("gpu-platform").require_object("platform")
    # `gpuplat up --stack-file` names the file it gave Pulumi (infra/lifecycle/cloud_stack.py).
    source = Path(os.environ.get("GPUPLAT_STACK_FILE") or stack_file(pulumi.get_stack()))
    return resolve(parse_spec(raw, source), Path(source))
