"""The model registry of the serving scenario (molecule/serving: roles/model_registry on its service node,
MLflow published on the host's 127.0.0.1:15000), through the platform's client and `gpuplat models`.

scripts/test-serving.sh runs these between the scenario's verify and its destroy (GPUPLAT_SERVING_SCENARIO
set); elsewhere they skip, saying so.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.serving.registry.mlflow import Credential, MlflowRegistry, RegistryError
from tests.unit.test_hostile_input import run_cli

REGISTRY = "http://127.0.0.1:15000"

pytestmark = pytest.mark.skipif(
    not os.environ.get("GPUPLAT_SERVING_SCENARIO"),
    reason="needs the converged serving scenario: scripts/test-serving.sh runs these",
)


@pytest.fixture
def stack(write_stack: Callable[..., Path]) -> Path:
    def with_registry(platform: dict[str, Any]) -> None:
        platform["serving"]["registry"] = {}

    return write_stack("local", with_registry)


@pytest.fixture
def model() -> str:
    """A name of this run's own: the scenario's registry keeps what earlier tests registered."""
    return f"embedder-{uuid.uuid4().hex[:8]}"


def models(stack: Path, *arguments: str) -> Any:
    run = run_cli("models", *arguments, "--stack-file", str(stack), "--registry-url", REGISTRY, "--json")
    assert run.code == 0, (run.code, run.err)
    return json.loads(run.out)


def test_versions_register_with_metrics_and_aliases_and_list_back(
    stack: Path, model: str, operator: Credential
) -> None:
    first = models(stack, "register", model, "/shared/models/embedder/1", "--metric", "accuracy=0.90")
    assert first["version"] == 1 and first["location"] == "/shared/models/embedder/1"
    assert first["source"] == "shared:///shared/models/embedder/1"
    second = models(
        stack,
        "register",
        model,
        "s3://models/embedder/2",
        "--metric",
        "accuracy=0.92",
        "--alias",
        "challenger",
    )
    assert second["version"] == 2 and second["aliases"] == ["challenger"]
    assert second["tags"] == {"accuracy": "0.92"}

    listed = models(stack, "list", model)
    assert [(v["version"], v["location"], v["aliases"]) for v in listed] == [
        (1, "/shared/models/embedder/1", []),
        (2, "s3://models/embedder/2", ["challenger"]),
    ]
    registry = MlflowRegistry(REGISTRY, credential=operator)
    registry.set_alias(model, "champion", 1)
    assert registry.resolve(f"{model}@champion").version == 1
    assert registry.resolve(model).version == 2  # a bare name: the newest
    assert registry.resolve(f"{model}@1").tags == {"accuracy": "0.9"}


def test_the_registry_says_what_it_does_not_hold(model: str, operator: Credential) -> None:
    registry = MlflowRegistry(REGISTRY, credential=operator)
    with pytest.raises(RegistryError, match="has no version"):
        registry.resolve(model)
    registry.ensure_model(model)
    registry.ensure_model(model)  # a second time: already there, no error
    with pytest.raises(RegistryError, match="alias nope not found"):
        registry.resolve(f"{model}@nope")
    with pytest.raises(RegistryError, match="RESOURCE_DOES_NOT_EXIST"):
        registry.resolve(f"{model}@7")
