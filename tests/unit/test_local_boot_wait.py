"""Waiting for a local node's systemd (infra/nodes/podman.py) against real podman: a node whose init
exits fails at once, with its exit code and console, instead of after the whole boot timeout."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator

import pytest

from infra.backends.local.cluster import BASE_IMAGE
from infra.errors import GpuPlatError
from infra.nodes.podman import exists, podman, wait_systemd

pytestmark = [
    pytest.mark.containers,
    pytest.mark.skipif(
        shutil.which("podman") is None or not exists("image", BASE_IMAGE),
        reason=f"needs podman and the base image {BASE_IMAGE} (make image)",
    ),
]


@pytest.fixture
def container() -> Iterator[str]:
    name = f"gpuplat-test-boot-{uuid.uuid4().hex[:8]}"
    yield name
    podman("rm", "--force", "--time", "0", name, check=False)


def test_a_node_whose_init_exits_fails_at_once_with_its_exit_code_and_console(container: str) -> None:
    podman("run", "--detach", "--name", container, BASE_IMAGE, "/bin/sh", "-c", "echo init-gave-up; exit 3")
    started = time.monotonic()
    with pytest.raises(GpuPlatError) as failure:
        wait_systemd(container, timeout_s=90)
    assert time.monotonic() - started < 30
    message = str(failure.value)
    assert "stopped while booting" in message
    assert "exit code 3" in message
    assert "init-gave-up" in message
