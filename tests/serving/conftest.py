"""The serving scenario's registry authenticates: tests/serving ask it as its operator, whose password the
role keeps on the scenario's service node (roles/model_registry, root's alone), handed to gpuplat through
MLflow's own variables as an operator elsewhere would."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from infra.nodes.podman import podman
from infra.nodes.role_templates import role_defaults
from infra.serving.registry.locate import PASSWORD_VARIABLE, USERNAME_VARIABLE, operator_secret_path
from infra.serving.registry.mlflow import Credential

REGISTRY_NODE = "gpuplat-molecule-head-0"


@pytest.fixture(scope="session")
def operator() -> Credential:
    kept = podman("exec", REGISTRY_NODE, "cat", operator_secret_path()).stdout.strip()
    return Credential(str(role_defaults("model_registry")["model_registry_admin_user"]), kept)


# Session-wide: module fixtures (a test module's registered model) run before any function's fixture, and
# they ask the registry too.
@pytest.fixture(autouse=True, scope="session")
def as_operator(request: pytest.FixtureRequest) -> Iterator[None]:
    """gpuplat's commands in these tests ask as the operator (a registry named by --registry-url gets no
    password read from a node: infra/serving/registry/locate.py)."""
    if not os.environ.get("GPUPLAT_SERVING_SCENARIO"):
        yield
        return
    operator: Credential = request.getfixturevalue("operator")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(USERNAME_VARIABLE, operator.username)
        patch.setenv(PASSWORD_VARIABLE, operator.password)
        yield
