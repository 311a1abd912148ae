"""Where a stack's model registry answers: given by the user, or found on the local platform."""

from __future__ import annotations

from infra.errors import SpecError
from infra.nodes.inventory import registry_artifacts_dir
from infra.platform.resolve import ResolvedPlatform
from infra.serving.registry.mlflow import MlflowRegistry


def registry_url(platform: ResolvedPlatform, given: str | None) -> str:
    serving = platform.spec.serving
    if serving is None or serving.registry is None:
        raise SpecError(
            f"stack '{platform.name}' runs no model registry: add serving.registry (e.g. `registry: {{}}` "
            "under serving) to its stack file and run `gpuplat up`"
        )
    if given:
        return given
    if platform.spec.backend == "local":
        from infra.backends.local.cluster import LocalCluster

        url = LocalCluster(platform).registry_url()
        if url:
            return url
    raise SpecError(
        f"stack '{platform.name}' is on {platform.spec.backend}: give the registry's address with "
        f"--registry-url (http://<the gateway node>:{serving.registry.port}) or GPUPLAT_REGISTRY_URL"
    )


def open_registry(platform: ResolvedPlatform, given: str | None) -> MlflowRegistry:
    """The stack's registry, knowing where its artifacts lie on the shared filesystem."""
    return MlflowRegistry(registry_url(platform, given), artifacts_dir=registry_artifacts_dir(platform))
