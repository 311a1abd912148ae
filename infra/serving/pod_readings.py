"""A Kueue stack's canary counters, read as the guard on the nodes reads them (infra/serving/release.py
`readings`), from the pods (infra/serving/pod_counters.py): each gateway pod's HAProxy exporter (its
requests and failed answers per backend, metrics_text.exporter_figures) and each model-server pod's own
/metrics (the latency histograms), all through the API server's pods/proxy subresource
(ClusterApi.pod_text), at one instant.

Each gateway pod is one gateway (its name the key: counts.SinceStart sums the gateways' increases, a pod
that restarted counting from zero, a pod first seen counting from then); each model-server pod one series.
A pod that does not answer is left out of this look (its counters count at its next); no gateway pod
answering fails the look.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from infra.k8s.objects import LABEL_COMPONENT
from infra.k8s.serving import (
    CANARY_BACKEND,
    GATEWAY,
    GATEWAY_BACKEND,
    GATEWAY_METRICS_PORT,
    LABEL_MODEL_VERSION,
    LWS_WORKER_INDEX_LABEL,
    MODEL_SERVER,
    MODEL_SERVER_PORT,
)
from infra.k8s.serving_apply import ClusterApi, ObjectRef
from infra.k8s.serving_versions import ServingRelease
from infra.serving.counts import Reading
from infra.serving.pod_counters import METRICS_PATH, PodCounters, PodNames, backend_of, pod_name

UNREACHED = (
    ". The API server could not dial the pods: the proxy connects from the API server's own address, which "
    "the serving namespace's NetworkPolicies (the metrics port admits only the monitoring namespace) do not "
    "admit where the network plugin enforces them: admit the control plane's addresses (an ipBlock) to "
    f"ports {GATEWAY_METRICS_PORT} and {MODEL_SERVER_PORT}, or guard the canary from inside the cluster"
)
NAMES = PodNames(
    LABEL_COMPONENT,
    GATEWAY,
    MODEL_SERVER,
    GATEWAY_METRICS_PORT,
    MODEL_SERVER_PORT,
    LABEL_MODEL_VERSION,
    LWS_WORKER_INDEX_LABEL,
    GATEWAY_BACKEND,
    CANARY_BACKEND,
)
"""the serving objects' names, as the pods are read (infra/serving/pod_counters.py)"""


def pod_backend(pod: Mapping[str, Any], release: ServingRelease) -> str | None:
    """The gateway backend whose requests a model-server pod answers (pod_counters.backend_of)."""
    return backend_of(pod, NAMES, release.stable.slug, release.canary.slug if release.canary else None)


def _through_proxy(api: ClusterApi, namespace: str) -> PodCounters:
    """A look at the pods (pod_counters.PodCounters), each pod read through the API server's proxy."""
    return PodCounters(
        NAMES,
        pods=lambda component: api.list(
            ObjectRef("v1", "Pod", "", namespace), f"{LABEL_COMPONENT}={component}"
        ),
        read=lambda pod, port: api.pod_text(namespace, pod_name(pod), port, METRICS_PATH),
        unreached=lambda failures: (
            UNREACHED if any("error trying to reach service" in failure for failure in failures) else ""
        ),
    )


def pod_readings(
    api: ClusterApi,
    namespace: str,
    release: ServingRelease,
    latency: str,
    itl: tuple[str, ...],
    say: Callable[[str], None],
) -> tuple[Reading, Reading]:
    """The stable's and the canary's counters now (pod_counters.PodCounters.readings)."""
    looked = _through_proxy(api, namespace)
    canary = release.canary.slug if release.canary else None
    return looked.readings(namespace, release.stable.slug, canary, release.canary_percent, latency, itl, say)


def pod_servers_up(api: ClusterApi, namespace: str, say: Callable[[str], None]) -> tuple[int, int]:
    """The canary's servers and the stable's up, as the gateway pods' exporters count them
    (pod_counters.PodCounters.servers_up)."""
    return _through_proxy(api, namespace).servers_up(namespace, say)
