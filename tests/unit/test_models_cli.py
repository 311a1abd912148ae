"""`gpuplat models`: what it refuses before it calls the registry, and how it says the registry is away.
The registry's own answers are tests/serving's (a real MLflow server in the serving scenario)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_hostile_input import refused, run_cli


def _with_registry(platform: dict[str, Any]) -> None:
    platform["serving"]["registry"] = {"port": 5000}


@pytest.fixture
def registry_stack(write_stack: Callable[..., Path]) -> Path:
    return write_stack("local", _with_registry)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_stack_without_a_registry_says_how_to_add_one() -> None:
    refused(run_cli("models", "list", "--stack", "onprem"), "runs no model registry", "serving.registry")


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["Embedder", "/shared/models/e/1"], "model name 'Embedder'"),
        (["embedder", "/home/me/model"], "a path under the shared filesystem (/shared/...)"),
        (["embedder", "/shared/../etc/passwd"], "a path under the shared filesystem"),
        (["embedder", "models/e/1"], "an object-store URI (s3://bucket/prefix)"),
        (["embedder", "/shared/models/e/1", "--metric", "accuracy"], "write NAME=NUMBER"),
        (["embedder", "/shared/models/e/1", "--metric", "accuracy=high"], "write NAME=NUMBER"),
        (["embedder", "/shared/models/e/1", "--alias", "latest"], "MLflow's own references"),
        (["embedder", "/shared/models/e/1", "--alias", "v2"], "MLflow's own references"),
    ],
)
def test_bad_input_is_refused_before_the_registry_is_called(
    registry_stack: Path, arguments: list[str], expected: str
) -> None:
    # A registry address nothing listens on: a refusal that reached it would say so instead.
    url = f"http://127.0.0.1:{_closed_port()}"
    run = run_cli(
        "models", "register", "--stack-file", str(registry_stack), "--registry-url", url, *arguments
    )
    refused(run, expected)


def test_a_registry_that_does_not_answer_is_exit_4_naming_its_address(registry_stack: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    run = run_cli("models", "list", "--stack-file", str(registry_stack), "--registry-url", url)
    assert run.code == 4 and run.clean, (run.code, run.err)
    assert f"the model registry at {url} did not answer" in run.err


def test_a_cloud_stack_needs_the_registry_address(write_stack: Callable[..., Path]) -> None:
    stack = write_stack("aws-prod", _with_registry)
    refused(run_cli("models", "list", "--stack-file", str(stack)), "--registry-url", "GPUPLAT_REGISTRY_URL")


def test_a_kubernetes_stack_refuses_the_registry(write_stack: Callable[..., Path]) -> None:
    stack = write_stack("aws-k8s", _with_registry)
    refused(run_cli("check", "--stack-file", str(stack)), "serving.registry", "does not deploy it yet")
