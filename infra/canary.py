"""A canary release's arithmetic: the gateway's version map that gives the canary its share of requests,
the gate a version passes before it may take any, and the guard's verdict on a running canary.

The share is drawn per request, not weighted per server. The gateway balances each version's servers by
least connections, and HAProxy's leastconn ignores server weights while the servers are equally loaded:
measured on HAProxy 2.6.12 (Debian 12), 300 sequential requests to a leastconn backend of two servers
weighted 4:1 went 150/150. Instead the frontend draws a number from 0 to 99 per request
(`rand(100)`) and looks up the version's backend in a map (`map_int`), which the runtime API changes
without a reload (`set map <file> <key> <value>`, answered with an empty line); the same HAProxy sent 60
of 300 requests to the canary with 20 of the 100 draws mapped to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.registry.mlflow import ModelVersion
from infra.spec.models import Canary

DRAWS = 100
"""The frontend's draw: rand(100), so a share is a whole percent."""


def version_map(percent: int, stable: str, canary: str) -> dict[int, str]:
    """The backend of each draw for a canary share: draws below `percent` go to the canary."""
    if not 0 <= percent <= 100:
        raise ValueError(f"a canary share is a whole percentage from 0 to 100, not {percent}")
    return {draw: canary if draw < percent else stable for draw in range(DRAWS)}


def map_changes(current: dict[int, str], wanted: dict[int, str]) -> list[tuple[int, str]]:
    """The entries to set (`set map <file> <draw> <backend>`) to turn one version map into another."""
    return [(draw, backend) for draw, backend in sorted(wanted.items()) if current.get(draw) != backend]


def gate(candidate: ModelVersion, stable: ModelVersion | None, rules: Canary) -> str | None:
    """Why `candidate` may not enter a canary (None: it may)."""
    metric = rules.gate_metric
    if metric is None:
        return None
    value = _metric(candidate, metric)
    if value is None:
        return (
            f"{candidate.reference} carries no '{metric}' (serving.canary.gate_metric): tag the version with "
            f"its evaluation (`gpuplat models register ... --metric {metric}=VALUE`)"
        )

    def better(a: float, b: float) -> bool:
        return a >= b if rules.higher_is_better else a <= b

    word = "at least" if rules.higher_is_better else "at most"
    if rules.gate_min is not None and not better(value, rules.gate_min):
        return (
            f"{candidate.reference} has {metric} {value:g}; serving.canary.gate_min asks {word} "
            f"{rules.gate_min:g}"
        )
    baseline = _metric(stable, metric) if stable is not None else None
    if stable is not None and baseline is not None and not better(value, baseline):
        return (
            f"{candidate.reference} has {metric} {value:g}, worse than the stable "
            f"{stable.reference}'s {baseline:g}"
        )
    return None


def _metric(version: ModelVersion, metric: str) -> float | None:
    try:
        return float(version.tags[metric])
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class VersionStats:
    """What the gateway saw of one version over the guard's window."""

    requests: int
    errors: int
    p95_s: float | None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class Verdict:
    action: str
    """'wait' (too few requests yet), 'hold' (healthy) or 'rollback'."""
    reason: str


def judge(stable: VersionStats, canary: VersionStats, rules: Canary) -> Verdict:
    """The guard's call on a running canary, against the stable version over the same window."""
    if canary.requests < rules.min_requests:
        return Verdict(
            "wait", f"the canary answered {canary.requests} of the {rules.min_requests} requests judged on"
        )
    excess = canary.error_rate - stable.error_rate
    if excess > rules.max_error_rate_increase:
        return Verdict(
            "rollback",
            f"canary error rate {canary.error_rate:.1%} ({canary.errors}/{canary.requests}) is "
            f"{excess:.1%} above the stable version's {stable.error_rate:.1%}; "
            f"serving.canary.max_error_rate_increase allows {rules.max_error_rate_increase:.1%}",
        )
    if canary.p95_s is not None and stable.p95_s:
        ratio = canary.p95_s / stable.p95_s
        if ratio > rules.max_p95_ratio:
            return Verdict(
                "rollback",
                f"canary p95 {canary.p95_s * 1000:.0f} ms is {ratio:.2f} x the stable version's "
                f"{stable.p95_s * 1000:.0f} ms; serving.canary.max_p95_ratio allows {rules.max_p95_ratio:g}",
            )
    return Verdict(
        "hold",
        f"canary error rate {canary.error_rate:.1%}, stable {stable.error_rate:.1%}"
        + (
            f"; p95 {canary.p95_s * 1000:.0f} ms vs {stable.p95_s * 1000:.0f} ms"
            if canary.p95_s and stable.p95_s
            else ""
        ),
    )
