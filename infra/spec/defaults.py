"""Values a stack may leave out, decided from the rest of the stack."""

from __future__ import annotations

from infra.spec.models import PlatformSpec


def os_release(spec: PlatformSpec) -> str:
    """The GPU nodes' OS release: the stack's, else the default AMI's on aws (Ubuntu 22.04), else Debian 12
    (the local cluster's image and the release the Molecule scenarios install on)."""
    if spec.software.os_release:
        return spec.software.os_release
    return "ubuntu2204" if spec.backend == "aws" else "debian12"
