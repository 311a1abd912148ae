"""Where a stack's model registry answers, and the operator's credential gpuplat asks it with: given by the
user, or found on the local platform."""

from __future__ import annotations

import os

from infra.errors import SpecError
from infra.nodes.addresses import registry_address
from infra.nodes.inventory import registry_artifacts_dir
from infra.nodes.role_templates import role_defaults
from infra.platform.resolve import ResolvedPlatform
from infra.serving.registry.mlflow import Credential, MlflowRegistry

# MLflow's own variables for its client's basic-auth user (mlflow 3.17.2, mlflow/utils/credentials.py:48-49).
USERNAME_VARIABLE = "MLFLOW_TRACKING_USERNAME"
PASSWORD_VARIABLE = "MLFLOW_TRACKING_PASSWORD"


def registry_url(platform: ResolvedPlatform, given: str | None) -> str:
    serving = platform.spec.serving
    if serving is None or serving.registry is None:
        raise SpecError(
            f"stack '{platform.name}' runs no model registry: add serving.registry (e.g. `registry: {{}}` "
            "under serving) to its stack file and run `gpuplat up`"
        )
    if given:
        return given
    # Where the role binds it on the gateway pool's first node: its fixed address on the local platform,
    # its listed address on an on-premises stack (not known before the instance exists on aws).
    url = registry_address(platform)
    if url:
        return url
    raise SpecError(
        f"stack '{platform.name}' is on {platform.spec.backend}: give the registry's address with "
        f"--registry-url (http://<the gateway node>:{serving.registry.port}) or GPUPLAT_REGISTRY_URL"
    )


def operator_secret_path() -> str:
    """Where roles/model_registry keeps the operator's password on the registry's node (root's alone)."""
    defaults = role_defaults("model_registry")
    return f"{defaults['model_registry_config_dir']}/secrets/{defaults['model_registry_admin_user']}"


def operator_credential(platform: ResolvedPlatform, given: str | None) -> Credential | None:
    """The registry's operator: MLflow's variables where set; else, for the local platform's own registry,
    the password read as root on the registry's node (never a file on the host, never a command line; not
    sent to a registry named by --registry-url). None: ask anonymously, which the registry refuses (401)
    with a message that says what to set."""
    username = os.environ.get(USERNAME_VARIABLE)
    password = os.environ.get(PASSWORD_VARIABLE)
    if username and password:
        return Credential(username, password)
    if platform.spec.backend != "local" or given:
        return None
    from infra.backends.local.cluster import LocalCluster

    node = platform.gateway_pool.node_names()[0]
    kept = LocalCluster(platform).exec_unchecked(node, "cat", operator_secret_path()).strip()
    admin = str(role_defaults("model_registry")["model_registry_admin_user"])
    return Credential(admin, kept) if kept else None


def open_registry(platform: ResolvedPlatform, given: str | None) -> MlflowRegistry:
    """The stack's registry as its operator, knowing where its artifacts lie on the shared filesystem."""
    url = registry_url(platform, given)
    return MlflowRegistry(
        url, artifacts_dir=registry_artifacts_dir(platform), credential=operator_credential(platform, given)
    )
