"""The gate a version passes before it may take any requests as a canary (the running canary's analysis:
infra/serving/analysis.py). The share itself is set at the gateway
(roles/inference_gateway/files/gpuplat_gateway_canary.py: a per-request draw in a version map).
"""

from __future__ import annotations

import math

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
            f"{candidate.reference} carries no '{metric}' (serving.canary.gate_metric): tag the "
            f"version with its evaluation (`gpuplat models register ... --metric {metric}=VALUE`)"
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
    """The version's value of the metric; None where it has none, or one that is not a number (nan, inf:
    a tag anyone with the registry's API can set, which would pass every gate and block every later one)."""
    try:
        value = float(version.tags[metric])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) else None
