"""The canary's weights, gate and guard (infra/canary.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.canary import MAX_WEIGHT, VersionStats, gate, judge, split
from infra.registry.mlflow import ModelVersion
from infra.spec.models import Canary


def _servers(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


@given(
    percent=st.integers(min_value=0, max_value=100),
    stable=st.integers(min_value=1, max_value=8),
    canary=st.integers(min_value=1, max_value=8),
)
def test_weights_give_the_canary_its_share_within_what_integers_allow(
    percent: int, stable: int, canary: int
) -> None:
    result = split(percent, _servers("s", stable), _servers("c", canary))
    assert all(0 <= w <= MAX_WEIGHT for w in result.weights.values())
    total = sum(result.weights.values())
    canary_share = 100 * sum(w for name, w in result.weights.items() if name.startswith("c")) / total
    assert canary_share == pytest.approx(result.canary_percent)
    extreme = sorted({result.weights["s0"], result.weights["c0"]}) == [1, MAX_WEIGHT]
    assert abs(result.canary_percent - percent) <= 1.0 or extreme, result


def test_a_share_integers_cannot_give_is_the_nearest_and_says_so() -> None:
    """One stable server and 64 canary servers: 1 % would need a stable weight of 6,336."""
    result = split(1, ["s"], _servers("c", 64))
    assert result.weights["s"] == MAX_WEIGHT and result.weights["c0"] == 1
    assert result.canary_percent == pytest.approx(100 * 64 / (64 + 256))


def test_exact_shares_are_exact() -> None:
    assert split(20, ["a", "b"], ["c"]).weights == {"a": 2, "b": 2, "c": 1}
    assert split(20, ["a"], ["c"]).canary_percent == 20
    assert split(0, ["a"], ["c"]).weights == {"a": 1, "c": 0}
    assert split(100, ["a"], ["c"]).weights == {"a": 0, "c": 1}


def test_a_split_needs_both_versions_and_a_percentage() -> None:
    with pytest.raises(ValueError, match="0 to 100"):
        split(120, ["a"], ["b"])
    with pytest.raises(ValueError, match="both versions"):
        split(20, [], ["b"])


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
