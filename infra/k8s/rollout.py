"""When a workload's rollout is over, as the release's steps wait for it: the CLI's
(infra/k8s/serving_apply.py) and the guard Job's (infra/serving/guard_job.py). The standard library only
(the Job's zip application carries it); the API it reads is any object with get and list of objects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from infra.k8s.api_refs import ClusterError, ObjectRef


class ReadApi(Protocol):
    def get(self, ref: ObjectRef) -> dict[str, Any] | None: ...
    def list(self, ref: ObjectRef, label_selector: str) -> list[dict[str, Any]]: ...


def rollout_done(workload: Mapping[str, Any], replicas: int) -> str | None:
    """None once `replicas` of the workload run its latest spec and are available (ready for a
    LeaderWorkerSet's groups) and no older one is left; else what is still awaited. A Deployment as
    `kubectl rollout status` judges it (kubernetes/kubectl pkg/polymorphichelpers/rollout_status.go,
    DeploymentStatusViewer.Status), a progress deadline exceeded included (a ClusterError at once, not a
    wait to the end); a LeaderWorkerSet by its status fields (lws v0.10.0 CRD: observedGeneration,
    replicas, updatedReplicas, readyReplicas, each counting groups)."""
    meta, status = workload.get("metadata") or {}, workload.get("status") or {}
    if int(meta.get("generation") or 0) > int(status.get("observedGeneration") or 0):
        return "its latest spec is not observed yet"
    for condition in status.get("conditions") or []:
        # The Deployment controller's reason when spec.progressDeadlineSeconds passed without progress
        # (kubernetes/kubernetes pkg/controller/deployment/util/deployment_util.go, TimedOutReason).
        if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            raise ClusterError(
                f"{workload.get('kind')} {meta.get('namespace', '')}/{meta.get('name', '')} exceeded its "
                f"progress deadline: {condition.get('message', '')}. The release stopped there (its record "
                "says which step ran last); look at its pods, then run the same command again or `gpuplat "
                "serve rollback`"
            )
    updated = int(status.get("updatedReplicas") or 0)
    total = int(status.get("replicas") or 0)
    ready_key = "readyReplicas" if workload.get("kind") == "LeaderWorkerSet" else "availableReplicas"
    ready = int(status.get(ready_key) or 0)
    if updated < replicas:
        return f"{updated} of {replicas} replicas updated"
    if total > updated:
        return f"{total - updated} old replicas pending termination"
    if ready < replicas:
        state = "ready" if ready_key == "readyReplicas" else "available"
        return f"{ready} of {replicas} updated replicas {state}"
    return None


def gateways_wait(api: ReadApi, namespace: str, name: str) -> str | None:
    """None once every pod of the gateways' Deployment `name` runs its latest configuration and no older
    one still answers; else what is still awaited."""
    live = api.get(ObjectRef("apps/v1", "Deployment", name, namespace))
    if live is None:
        return "not created yet"
    awaited = rollout_done(live, int((live.get("spec") or {}).get("replicas") or 1))
    if awaited is not None:
        return awaited
    # A Deployment's status.replicas counts no terminating pod ("Total number of non-terminating pods",
    # DeploymentStatus in the 1.34 OpenAPI; its terminatingReplicas is alpha there, behind
    # DeploymentReplicaSetTerminatingReplicas), yet a gateway pod draws for its old share until it ends.
    labels = ((live.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    pods = api.list(ObjectRef("v1", "Pod", "", namespace), selector)
    ending = [p["metadata"]["name"] for p in pods if (p.get("metadata") or {}).get("deletionTimestamp")]
    return f"{len(ending)} terminating gateway pods still answer ({', '.join(ending)})" if ending else None
