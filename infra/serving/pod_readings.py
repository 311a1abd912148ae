"""A Kueue stack's canary counters, read as the guard on the nodes reads them (infra/serving/release.py
`readings`), from the pods: each gateway pod's HAProxy exporter (its requests and failed answers per
backend, metrics_text.exporter_figures) and each model-server pod's own /metrics (the latency histograms),
all through the API server's pods/proxy subresource (ClusterApi.pod_text), at one instant.

Each gateway pod is one gateway (its name the key: counts.SinceStart sums the gateways' increases, a pod
that restarted counting from zero, a pod first seen counting from then); each model-server pod one series.
A pod that does not answer is left out of this look (its counters count at its next); no gateway pod
answering fails the look.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from infra.errors import GpuPlatError
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
from infra.k8s.serving_apply import ClusterApi, ClusterError, ObjectRef
from infra.k8s.serving_versions import ServingRelease
from infra.serving.counts import Counts, Histogram, Reading
from infra.serving.metrics_text import exporter_figures, parse_metrics

UNREACHED = (
    ". The API server could not dial the pods: the proxy connects from the API server's own address, which "
    "the serving namespace's NetworkPolicies (the metrics port admits only the monitoring namespace) do not "
    "admit where the network plugin enforces them: admit the control plane's addresses (an ipBlock) to "
    f"ports {GATEWAY_METRICS_PORT} and {MODEL_SERVER_PORT}, or guard the canary from inside the cluster"
)
METRICS_PATH = "metrics"
"""the exporter's and the model servers' path (the pods' prometheus.io/path annotation)"""


def _running(api: ClusterApi, namespace: str, component: str) -> Iterator[dict[str, Any]]:
    """The component's pods that have a server to ask: running, with an address (a terminating gateway pod
    still answers for the requests it drew)."""
    for pod in api.list(ObjectRef("v1", "Pod", "", namespace), f"{LABEL_COMPONENT}={component}"):
        status = pod.get("status") or {}
        if status.get("phase") == "Running" and status.get("podIP"):
            yield pod


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def pod_backend(pod: Mapping[str, Any], release: ServingRelease) -> str | None:
    """The gateway backend whose requests a model-server pod answers: the stable version's, the canary's;
    None for one no gateway sends to (a retiring version, a multi-node group's worker)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get(LWS_WORKER_INDEX_LABEL, "0") != "0":
        return None
    slug = labels.get(LABEL_MODEL_VERSION)
    if release.canary is not None and slug == release.canary.slug:
        return CANARY_BACKEND
    if slug == release.stable.slug:
        return GATEWAY_BACKEND
    return None


def pod_readings(
    api: ClusterApi,
    namespace: str,
    release: ServingRelease,
    latency: str,
    itl: tuple[str, ...],
    say: Callable[[str], None],
) -> tuple[Reading, Reading]:
    """The stable's and the canary's counters now: every gateway pod's requests and failed answers, and
    each model-server pod's `latency` histogram and first `itl` histogram it has."""
    gateways: dict[str, dict[str, Counts]] = {GATEWAY_BACKEND: {}, CANARY_BACKEND: {}}
    failures: list[str] = []
    for pod in _running(api, namespace, GATEWAY):
        try:
            text = api.pod_text(namespace, _name(pod), GATEWAY_METRICS_PORT, METRICS_PATH)
            figures = exporter_figures(text, (GATEWAY_BACKEND, CANARY_BACKEND), release.canary_percent)
        except (ClusterError, ValueError) as error:
            failures.append(f"{_name(pod)}: {error}")
            continue
        for backend, counts in gateways.items():
            counts[_name(pod)] = Counts(figures.requests[backend], figures.errors[backend])
    if not gateways[GATEWAY_BACKEND]:
        unreached = any("error trying to reach service" in failure for failure in failures)
        raise GpuPlatError(
            f"no gateway pod in namespace {namespace} answered on its metrics port {GATEWAY_METRICS_PORT}"
            + (": " + "; ".join(failures) if failures else " (none is running)")
            + (UNREACHED if unreached else "")
        )
    for failure in failures:
        say(f"left out of this look: gateway pod {failure}")
    histograms: dict[str, dict[str, Histogram]] = {GATEWAY_BACKEND: {}, CANARY_BACKEND: {}}
    gaps: dict[str, dict[str, Histogram]] = {GATEWAY_BACKEND: {}, CANARY_BACKEND: {}}
    for pod in _running(api, namespace, MODEL_SERVER):
        served_by = pod_backend(pod, release)
        if served_by is None:
            continue
        try:
            text = api.pod_text(namespace, _name(pod), MODEL_SERVER_PORT, METRICS_PATH)
        except ClusterError as error:
            say(f"left out of this look: model-server pod {error}")
            continue
        # parse_metrics reads the answer of METRICS_READ, one port's text after "# port N".
        answer = f"# port {MODEL_SERVER_PORT}\n{text}"
        found = parse_metrics(answer, latency).get(MODEL_SERVER_PORT)
        if found is not None:
            histograms[served_by][_name(pod)] = found
        for name in itl:
            gap = parse_metrics(answer, name).get(MODEL_SERVER_PORT)
            if gap is not None:
                gaps[served_by][_name(pod)] = gap
                break
    stable, canary = (
        Reading.of_gateways(gateways[backend], histograms[backend] or None, gaps[backend] or None)
        for backend in (GATEWAY_BACKEND, CANARY_BACKEND)
    )
    return stable, canary
