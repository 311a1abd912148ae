"""A canary release's arithmetic: the gateway weights that give the canary its share of requests, the
gate a version passes before it may take any, and the guard's verdict on a running canary.

Weights: the gateway balances each version's servers by weighted round robin, and HAProxy takes
absolute server weights from 0 to 256 at run time (`set weight <backend>/<server> <weight>`, HAProxy's
management guide, section "set weight"). A version's share is the sum of its servers' weights over the
sum of all; with s stable and c canary servers, weights (100 - p) * c and p * s give the canary p
percent exactly, reduced by their common divisor and scaled down where they exceed 256 (the share is
then the nearest the integers allow, and the plan says which).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.registry.mlflow import ModelVersion
from infra.spec.models import Canary

MAX_WEIGHT = 256


@dataclass(frozen=True)
class Split:
    weights: dict[str, int]
    """Weight per server name."""
    canary_percent: float
    """The canary's share these integer weights give (the one asked, or the nearest possible)."""


def split(percent: float, stable: list[str], canary: list[str]) -> Split:
    """Server weights that send `percent` of the requests to the canary's servers: the pair of per-version
    weights (1 to 256 each) whose share is nearest to it, the smallest such pair."""
    if not 0 <= percent <= 100:
        raise ValueError(f"a canary share is a percentage from 0 to 100, not {percent}")
    if not stable or not canary:
        raise ValueError("a split needs servers of both versions")
    if percent in (0, 100):
        stable_weight, canary_weight = (1, 0) if percent == 0 else (0, 1)
    else:
        stable_weight, canary_weight = min(
            _candidates(percent, len(stable), len(canary)),
            key=lambda pair: (abs(_share(pair[0], pair[1], len(stable), len(canary)) - percent), sum(pair)),
        )
    weights = {server: stable_weight for server in stable} | {server: canary_weight for server in canary}
    return Split(
        weights=weights, canary_percent=_share(stable_weight, canary_weight, len(stable), len(canary))
    )


def _candidates(percent: float, stable: int, canary: int) -> list[tuple[int, int]]:
    """For each canary weight, the stable weight nearest to the share (both within 1..256)."""
    pairs = []
    for canary_weight in range(1, MAX_WEIGHT + 1):
        ideal = canary_weight * canary * (100 - percent) / (percent * stable)
        for stable_weight in {math.floor(ideal), math.ceil(ideal)}:
            if 1 <= stable_weight <= MAX_WEIGHT:
                pairs.append((stable_weight, canary_weight))
    return pairs or [(MAX_WEIGHT, 1) if percent < 50 else (1, MAX_WEIGHT)]


def _share(stable_weight: int, canary_weight: int, stable: int, canary: int) -> float:
    return 100 * canary_weight * canary / (canary_weight * canary + stable_weight * stable)


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
