"""The canary's gate and guard (infra/serving/canary.py)."""

from __future__ import annotations

import pytest

from infra.serving.canary import VersionStats, gate, judge
from infra.serving.registry.mlflow import ModelVersion
from infra.spec.models import Canary


def _version(number: int, **tags: str) -> ModelVersion:
    return ModelVersion(name="embedder", version=number, source="/shared/models/x", status="READY", tags=tags)


def test_the_gate_asks_for_the_metric_its_minimum_and_no_worse_than_stable() -> None:
    rules = Canary(gate_metric="accuracy", gate_min=0.8)
    assert gate(_version(2, accuracy="0.91"), _version(1, accuracy="0.90"), rules) is None
    assert "carries no 'accuracy'" in str(gate(_version(2), None, rules))
    assert "asks at least 0.8" in str(gate(_version(2, accuracy="0.7"), None, rules))
    assert "worse than the stable embedder@1's 0.95" in str(
        gate(_version(2, accuracy="0.9"), _version(1, accuracy="0.95"), rules)
    )
    loss = Canary(gate_metric="loss", higher_is_better=False)
    assert gate(_version(2, loss="1.9"), _version(1, loss="2.0"), loss) is None
    assert gate(_version(2, loss="2.1"), _version(1, loss="2.0"), loss) is not None
    assert gate(_version(2), None, Canary()) is None


def test_gate_min_without_its_metric_is_refused() -> None:
    with pytest.raises(ValueError, match="gate_min needs gate_metric"):
        Canary(gate_min=0.5)


def test_the_guard_waits_for_requests_then_rolls_back_on_errors_or_latency() -> None:
    rules = Canary(min_requests=20, max_error_rate_increase=0.05, max_p95_ratio=1.5)
    stable = VersionStats(requests=400, errors=4, p95_s=0.100)
    assert judge(stable, VersionStats(10, 10, 0.1), rules).action == "wait"
    assert judge(stable, VersionStats(100, 3, 0.12), rules).action == "hold"
    errors = judge(stable, VersionStats(100, 20, 0.1), rules)
    assert errors.action == "rollback" and "error rate 20.0%" in errors.reason
    slow = judge(stable, VersionStats(100, 0, 0.2), rules)
    assert slow.action == "rollback" and "2.00 x" in slow.reason
