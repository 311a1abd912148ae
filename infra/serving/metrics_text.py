"""What the gateways and model servers say, as text: a gateway's `show` (its share, requests, errors and
servers up per backend) and the model servers' /metrics (Prometheus' text format). Standard library only:
the detached guard reads them on a gateway node (infra/serving/guard_service.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from infra.serving.counts import Histogram

# The CPU reference server's gauge naming the registered version it serves (roles/inference_server/files/
# cpu_reference_server.py); vLLM has none.
VERSION_INFO = "gpuplat_inference_model_version_info"
# Run with python3 -c: each port's /metrics after a line "# port N" (none for a port that is down).
# The first argument: the host (127.0.0.1 on the node itself; the node's address from a gateway).
METRICS_READ = """import sys, urllib.request
for port in sys.argv[2:]:
    try:
        text = urllib.request.urlopen(f"http://{sys.argv[1]}:{port}/metrics", timeout=5).read().decode()
    except OSError:
        continue
    print(f"# port {port}")
    print(text)
"""


# Prometheus' text format (prometheus/docs content/docs/instrumenting/exposition_formats.md, "Text format
# details"): `name{label="value",...} value [timestamp]`, each label value quoted, with \\, \" and \n
# escaped in it: a `,` or `}` inside the quotes belongs to the value.
_SAMPLE = re.compile(
    r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(?P<labels>(?:[^"}]|"(?:[^"\\]|\\.)*")*)\})?'
    r"\s+(?P<value>\S+)(?:\s+-?\d+)?$"
)
_LABEL = re.compile(r'\s*(?P<name>[a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*(?:,|$)')
_UNESCAPED = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def sample_labels(labels: str) -> dict[str, str]:
    """A sample's labels (the text between its braces), each value unescaped."""
    return {
        match["name"]: re.sub(r"\\.", lambda escape: _UNESCAPED.get(escape[0], escape[0]), match["value"])
        for match in _LABEL.finditer(labels)
    }


def port_samples(answer: str) -> Iterator[tuple[int, re.Match[str]]]:
    """Each sample of METRICS_READ's answer with the port whose /metrics it came from."""
    port: int | None = None
    for line in answer.splitlines():
        if line.startswith("# port "):
            port = int(line.split()[2])
            continue
        sample = _SAMPLE.match(line.strip())
        if port is not None and sample is not None:
            yield port, sample


def answering_ports(answer: str) -> set[int]:
    return {int(line.split()[2]) for line in answer.splitlines() if line.startswith("# port ")}


def served_versions(answer: str) -> dict[int, str]:
    """The registered version each port's server says it serves (VERSION_INFO at 1; "" for the stack's own
    model), from METRICS_READ's answer."""
    return {
        port: sample_labels(sample["labels"] or "").get("version", "")
        for port, sample in port_samples(answer)
        if sample["name"] == VERSION_INFO and float(sample["value"]) == 1
    }


def parse_metrics(answer: str, histogram: str) -> dict[int, Histogram]:
    """`histogram`'s buckets and _sum per port from METRICS_READ's answer (Prometheus' text format, every
    label set of a port summed at each `le`)."""
    cumulative: dict[int, dict[float, float]] = {}
    sums: dict[int, float] = {}
    for port, sample in port_samples(answer):
        name, number = sample["name"], float(sample["value"])
        if name == f"{histogram}_bucket":
            le = float(sample_labels(sample["labels"] or "").get("le", "+Inf"))
            bucket = cumulative.setdefault(port, {})
            bucket[le] = bucket.get(le, 0.0) + number
        elif name == f"{histogram}_sum":
            sums[port] = sums.get(port, 0.0) + number
    return {p: Histogram.from_cumulative(b, sums.get(p, 0.0)) for p, b in cumulative.items()}


@dataclass(frozen=True)
class GatewayFigures:
    canary_percent: int
    requests: dict[str, int]
    errors: dict[str, int]
    servers_up: dict[str, int]

    @classmethod
    def from_show(cls, answer: dict[str, Any]) -> GatewayFigures:
        backends = answer["backends"]
        return cls(
            canary_percent=int(answer["canary_percent"]),
            requests={name: int(b["requests"]) for name, b in backends.items()},
            errors={name: int(b["errors"]) for name, b in backends.items()},
            servers_up={name: int(b["servers_up"]) for name, b in backends.items()},
        )


# HAProxy's Prometheus exporter, the `show stat` fields the gateway program reads (its ERROR_FIELDS, stot,
# act) by the exporter's names (haproxy addons/promex/README, "Backend metrics", at v3.2.0: the Kubernetes
# gateway image is 3.2; Debian's 2.6 names them alike): requests, failed answers and servers up per backend.
EXPORTER_REQUESTS = "haproxy_backend_sessions_total"
EXPORTER_RESPONSES = "haproxy_backend_http_responses_total"
EXPORTER_FAILED_CODES = ("4xx", "5xx")
EXPORTER_ABORTS = ("haproxy_backend_client_aborts_total", "haproxy_backend_server_aborts_total")
EXPORTER_SERVERS_UP = "haproxy_backend_active_servers"


def exporter_figures(text: str, backends: tuple[str, ...], canary_percent: int) -> GatewayFigures:
    """A gateway's figures from its exporter's /metrics (a Kubernetes gateway pod's port 8404), as the
    gateway program's `show` gives them from `show stat`: requests since it started, failed answers (4xx,
    5xx and aborted, at most one per request), servers up, for each of `backends`. A backend with no
    request count in the answer, or a count that is no count (NaN, negative), is a ValueError."""
    requests = dict.fromkeys(backends, 0)
    failed = dict.fromkeys(backends, 0)
    up = dict.fromkeys(backends, 0)
    counted: set[str] = set()
    for line in text.splitlines():
        sample = _SAMPLE.match(line.strip())
        if sample is None:
            continue
        labels = sample_labels(sample["labels"] or "")
        backend, name = labels.get("proxy", ""), sample["name"]
        if backend not in requests:
            continue
        if name == EXPORTER_REQUESTS:
            into = requests
            counted.add(backend)
        elif name in EXPORTER_ABORTS or (
            name == EXPORTER_RESPONSES and labels.get("code") in EXPORTER_FAILED_CODES
        ):
            into = failed
        elif name == EXPORTER_SERVERS_UP:
            into = up
        else:
            continue  # never read: other samples may be NaN (an average with nothing to average)
        value = float(sample["value"])
        if not value >= 0 or value == float("inf"):
            raise ValueError(f"the gateway's exporter gives {name} of backend {backend} as {sample['value']}")
        into[backend] += int(value)
    missing = [backend for backend in backends if backend not in counted]
    if missing:
        # No count is not a count of 0: a backend the exporter did not list would read as no request.
        raise ValueError(
            f"the gateway's exporter gives no {EXPORTER_REQUESTS} for backend {', '.join(missing)}: its "
            "configuration has no such backend, or the answer was cut short"
        )
    return GatewayFigures(
        canary_percent=canary_percent,
        requests=requests,
        errors={b: min(requests[b], failed[b]) for b in backends},
        servers_up=up,
    )
