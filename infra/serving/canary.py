"""A canary release's judgement: the gate a version passes before it may take any requests, and the
guard's verdict on a running canary. The share itself is set at the gateway
(roles/inference_gateway/files/gpuplat_gateway_canary.py: a per-request draw in a version map).
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.serving.registry.mlflow import ModelVersion
from infra.spec.models import Canary


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
