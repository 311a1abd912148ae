"""The canary's gate and guard (infra/serving/canary.py)."""

from __future__ import annotations

import pytest

from infra.serving.canary import Verdict, VersionStats, gate, judge
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


def test_the_gate_lets_a_candidate_equal_to_its_bar_through() -> None:
    """A candidate exactly at gate_min, or exactly as good as the stable version, passes: the bar is "at
    least" (higher is better) or "at most" (lower is better), never strictly better."""
    rules = Canary(gate_metric="accuracy", gate_min=0.8)
    assert gate(_version(2, accuracy="0.8"), _version(1, accuracy="0.8"), rules) is None
    assert gate(_version(2, accuracy="0.9"), None, rules) is None  # no stable version yet: nothing to beat
    assert gate(_version(2, accuracy="0.9"), _version(1), rules) is None  # a stable version without it
    loss = Canary(gate_metric="loss", gate_min=2.0, higher_is_better=False)
    assert gate(_version(2, loss="2.0"), _version(1, loss="2.0"), loss) is None
    assert (
        gate(_version(2, loss="2.5"), None, loss)
        == "embedder@2 has loss 2.5; serving.canary.gate_min asks at most 2"
    )
    assert gate(_version(2, loss="not-a-number"), None, loss) == (
        "embedder@2 carries no 'loss' (serving.canary.gate_metric): tag the version with its evaluation "
        "(`gpuplat models register ... --metric loss=VALUE`)"
    )


def test_the_guard_judges_at_its_boundaries() -> None:
    """min_requests answered is enough to judge; an error-rate increase or a p95 ratio exactly at its limit
    holds; one above it rolls back. The increase is over the stable version's own rate."""
    rules = Canary(min_requests=20, max_error_rate_increase=0.05, max_p95_ratio=1.5)
    stable = VersionStats(requests=400, errors=8, p95_s=0.25)
    waiting = judge(stable, VersionStats(19, 0, 0.25), rules)
    assert waiting == Verdict("wait", "the canary answered 19 of the 20 requests judged on")
    assert judge(stable, VersionStats(20, 0, 0.25), rules).action == "hold"
    at_limit = judge(stable, VersionStats(100, 7, 0.375), rules)  # 7 % against 2 % (exactly 0.05); 1.5 x
    assert at_limit == Verdict("hold", "canary error rate 7.0%, stable 2.0%; p95 375 ms vs 250 ms")
    above = judge(stable, VersionStats(100, 8, 0.25), rules)
    assert above == Verdict(
        "rollback",
        "canary error rate 8.0% (8/100) is 6.0% above the stable version's 2.0%; "
        "serving.canary.max_error_rate_increase allows 5.0%",
    )
    slow = judge(stable, VersionStats(100, 0, 0.4), rules)
    assert slow == Verdict(
        "rollback",
        "canary p95 400 ms is 1.60 x the stable version's 250 ms; serving.canary.max_p95_ratio allows 1.5",
    )


def test_the_guard_without_latency_figures_judges_errors_alone() -> None:
    rules = Canary(min_requests=20, max_error_rate_increase=0.05, max_p95_ratio=1.5)
    no_canary_p95 = judge(VersionStats(400, 4, 0.25), VersionStats(100, 1, None), rules)
    assert no_canary_p95 == Verdict("hold", "canary error rate 1.0%, stable 1.0%")
    no_stable_p95 = judge(VersionStats(400, 4, None), VersionStats(100, 1, 0.4), rules)
    assert no_stable_p95 == Verdict("hold", "canary error rate 1.0%, stable 1.0%")
