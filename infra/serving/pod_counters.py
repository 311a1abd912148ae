"""A Kueue stack's canary counters from its pods, whoever reads them: each gateway pod's HAProxy exporter
(its requests and failed answers per backend, metrics_text.exporter_figures) and each model-server pod's own
/metrics (the latency histograms), at one instant. The CLI reads the pods through the API server's proxy
(infra/serving/pod_readings.py), the guard Job at their addresses (infra/serving/guard_job.py); what the
pods are called and on which ports they answer comes from the caller (infra/k8s/serving.py's names, which
the Job gets written into its plan). The standard library only: the Job's zip application carries it.

Each gateway pod is one gateway (its name the key: counts.SinceStart sums the gateways' increases, a pod
that restarted counting from zero, a pod first seen counting from then); each model-server pod one series.
A pod that does not answer is left out of this look (its counters count at its next); no gateway pod
answering fails the look.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from infra.errors import GpuPlatError
from infra.serving.counts import Counts, Histogram, Reading
from infra.serving.metrics_text import GatewayFigures, exporter_figures, parse_metrics

METRICS_PATH = "metrics"
"""the exporter's and the model servers' path (the pods' prometheus.io/path annotation)"""

Pod = Mapping[str, Any]


@dataclass(frozen=True)
class PodNames:
    """What the serving objects call their pods and where they answer (infra/k8s/serving.py)."""

    component_label: str
    gateway: str
    model_server: str
    gateway_port: int
    server_port: int
    version_label: str
    worker_label: str
    stable_backend: str
    canary_backend: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def running(pods: Iterable[Pod]) -> Iterator[Pod]:
    """The pods that have a server to ask: running, with an address (a terminating gateway pod still
    answers for the requests it drew)."""
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") == "Running" and status.get("podIP"):
            yield pod


def pod_name(pod: Pod) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def backend_of(pod: Pod, names: PodNames, stable_slug: str, canary_slug: str | None) -> str | None:
    """The gateway backend whose requests a model-server pod answers: the stable version's, the canary's;
    None for one no gateway sends to (a retiring version, a multi-node group's worker)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get(names.worker_label, "0") != "0":
        return None
    slug = labels.get(names.version_label)
    if canary_slug is not None and slug == canary_slug:
        return names.canary_backend
    if slug == stable_slug:
        return names.stable_backend
    return None


@dataclass(frozen=True)
class PodCounters:
    """One look at the pods: `pods(component)` lists a component's pods, `read(pod, port)` is what the pod's
    server answers at METRICS_PATH (raising GpuPlatError or OSError where it does not), `unreached(failures)`
    what to add to the paragraph when no gateway pod answered."""

    names: PodNames
    pods: Callable[[str], Iterable[Pod]]
    read: Callable[[Pod, int], str]
    unreached: Callable[[list[str]], str] = lambda _: ""

    def gateways(
        self, namespace: str, canary_percent: int, say: Callable[[str], None]
    ) -> dict[str, GatewayFigures]:
        """Each running gateway pod's exporter figures (metrics_text.exporter_figures), by the pod's name; a
        pod that does not answer is said and left out, none answering is a GpuPlatError."""
        names = self.names
        backends = (names.stable_backend, names.canary_backend)
        figures: dict[str, GatewayFigures] = {}
        failures: list[str] = []
        for pod in running(self.pods(names.gateway)):
            try:
                text = self.read(pod, names.gateway_port)
                figures[pod_name(pod)] = exporter_figures(text, backends, canary_percent)
            except (GpuPlatError, OSError, ValueError) as error:
                failures.append(f"{pod_name(pod)}: {error}")
        if not figures:
            raise GpuPlatError(
                f"no gateway pod in namespace {namespace} answered on its metrics port {names.gateway_port}"
                + (": " + "; ".join(failures) if failures else " (none is running)")
                + self.unreached(failures)
            )
        for failure in failures:
            say(f"left out of this look: gateway pod {failure}")
        return figures

    def servers_up(self, namespace: str, say: Callable[[str], None]) -> tuple[int, int]:
        """The canary's servers and the stable's up (HAProxy's active servers of each backend), as every
        gateway pod that answers counts them: the least any counts, as the nodes' gateways are read
        (infra/serving/release.py Release.figures)."""
        each = self.gateways(namespace, 0, say).values()
        names = self.names
        return (
            min(f.servers_up[names.canary_backend] for f in each),
            min(f.servers_up[names.stable_backend] for f in each),
        )

    def readings(
        self,
        namespace: str,
        stable_slug: str,
        canary_slug: str | None,
        canary_percent: int,
        latency: str,
        itl: tuple[str, ...],
        say: Callable[[str], None],
    ) -> tuple[Reading, Reading]:
        """The stable's and the canary's counters now: every gateway pod's requests and failed answers, and
        each model-server pod's `latency` histogram and first `itl` histogram it has."""
        names = self.names
        backends = (names.stable_backend, names.canary_backend)
        each = self.gateways(namespace, canary_percent, say)
        gateways = {
            backend: {
                pod: Counts(figures.requests[backend], figures.errors[backend])
                for pod, figures in each.items()
            }
            for backend in backends
        }
        histograms: dict[str, dict[str, Histogram]] = {backend: {} for backend in backends}
        gaps: dict[str, dict[str, Histogram]] = {backend: {} for backend in backends}
        for pod in running(self.pods(names.model_server)):
            served_by = backend_of(pod, names, stable_slug, canary_slug)
            if served_by is None:
                continue
            try:
                text = self.read(pod, names.server_port)
            except (GpuPlatError, OSError) as error:
                say(f"left out of this look: model-server pod {pod_name(pod)}: {error}")
                continue
            # parse_metrics reads the answer of METRICS_READ, one port's text after "# port N".
            answer = f"# port {names.server_port}\n{text}"
            found = parse_metrics(answer, latency).get(names.server_port)
            if found is not None:
                histograms[served_by][pod_name(pod)] = found
            for name in itl:
                gap = parse_metrics(answer, name).get(names.server_port)
                if gap is not None:
                    gaps[served_by][pod_name(pod)] = gap
                    break
        stable, canary = (
            Reading.of_gateways(gateways[backend], histograms[backend] or None, gaps[backend] or None)
            for backend in backends
        )
        return stable, canary
