"""What names an object of the Kubernetes API and what its refusals are, for every client of it: the
CLI's (infra/k8s/serving_apply.py ClusterApi, through the official client) and the guard Job's
(infra/serving/kube_http.py, the standard library only: this module imports nothing else, so that the
guard's zip application carries it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.errors import GpuPlatError

# apiVersion, kind -> (plural, namespaced): the kinds serving_objects gives, the release record and the lock.
_RESOURCES: dict[str, tuple[str, bool]] = {
    "Namespace": ("namespaces", False),
    "PersistentVolume": ("persistentvolumes", False),
    "PersistentVolumeClaim": ("persistentvolumeclaims", True),
    "ServiceAccount": ("serviceaccounts", True),
    "Deployment": ("deployments", True),
    "LeaderWorkerSet": ("leaderworkersets", True),
    "Service": ("services", True),
    "PodDisruptionBudget": ("poddisruptionbudgets", True),
    "ScaledObject": ("scaledobjects", True),
    "ConfigMap": ("configmaps", True),
    "NetworkPolicy": ("networkpolicies", True),
    "Lease": ("leases", True),
    "Pod": ("pods", True),
    "Job": ("jobs", True),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
}


class ClusterError(GpuPlatError):
    """One paragraph for the user: the API could not be reached, refused, or a wait ran out."""


class NotFound(ClusterError):
    pass


class Conflict(ClusterError):
    pass


class Unavailable(ClusterError):
    """A call the API did not carry out, or may not have: a 429 or a 5xx (`status`), or no answer
    (`status` None: a reset connection, a timeout, a refused connection). `retry_after`: the answer's
    Retry-After in seconds, where it gave one."""

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after

    @property
    def may_have_happened(self) -> bool:
        """A 429 was refused before any handler ran; a 5xx or a lost answer may have come after the write."""
        return self.status != 429


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str
    namespace: str | None = None

    @classmethod
    def of(cls, manifest: Mapping[str, Any]) -> ObjectRef:
        meta = manifest["metadata"]
        return cls(manifest["apiVersion"], manifest["kind"], meta["name"], meta.get("namespace"))

    @property
    def resource(self) -> str:
        group = self.api_version.rpartition("/")[0]
        plural = _RESOURCES[self.kind][0]
        return f"{plural}.{group}" if group else plural

    def path(self, *, collection: bool = False) -> str:
        group, _, version = self.api_version.rpartition("/")
        plural, namespaced = _RESOURCES[self.kind]
        base = f"/apis/{group}/{version}" if group else f"/api/{version}"
        scope = f"/namespaces/{self.namespace}" if namespaced else ""
        return f"{base}{scope}/{plural}" + ("" if collection else f"/{self.name}")

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace + '/' if self.namespace else ''}{self.name}"


def refusal(
    status: int,
    said: str,
    verb: str,
    ref: ObjectRef,
    server: str,
    forbidden: str,
    retry_after: float | None = None,
) -> ClusterError:
    """The error for an API server's refusal with HTTP `status` (`said`: its Status message); `forbidden`:
    the paragraph for a 401 or 403, which names whose identity lacks the verb; a 429 or a 5xx is
    Unavailable (infra/k8s/api_retry.py tries it again), with the answer's Retry-After."""
    if status == 404:
        return NotFound(f"{ref} not found at {server}: {said}")
    if status == 409:
        return Conflict(f"{ref}: {said}")
    if status in (401, 403):
        return ClusterError(forbidden)
    answered = f"the Kubernetes API at {server} answered HTTP {status} to {verb} {ref}: {said}"
    if status == 429 or status >= 500:
        return Unavailable(answered, status, retry_after)
    return ClusterError(answered)
