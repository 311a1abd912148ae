"""The box tier: one cloud in a box for the whole module (the scenarios share the converged controller)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.nodes.podman import podman
from infra.platform.resolve import load_platform

STACK_FILE = Path(__file__).with_name("stack.yaml")
WORKDIR = Path(os.environ.get("GPUPLAT_BOX_DIR", "/tmp/gpuplat-box"))


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the box adds the instance metadata address to its bridge and runs rootful podman: run as root"
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/setup-host.sh)"
    if podman("image", "exists", "localhost/gpuplat-base:bookworm", check=False).returncode != 0:
        return "the base image is missing (scripts/build-base-image.sh)"
    return None


@pytest.fixture(scope="module")
def box() -> Iterator[object]:
    from tests.box.box import CloudBox

    reason = _unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"box tier cannot run: {reason}")
        pytest.skip(reason)
    cloud = CloudBox(load_platform(STACK_FILE), WORKDIR)
    cloud.start()
    try:
        yield cloud
    finally:
        if os.environ.get("GPUPLAT_BOX_KEEP") != "1":  # keep it to look inside after a failure
            cloud.stop()
