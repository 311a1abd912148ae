"""infra.validate.scaling against cases computed by hand.

Common case: 1e9 parameters with 2-byte (bf16) gradients, so S = 2e9 bytes, 0.5 s of compute per step.
Ring all-reduce t = S * 2(n-1)/n / busbw (nccl-tests doc/PERFORMANCE.md):
  8 GPUs at 200 GB/s: 2e9 * 1.75   / 200e9 = 0.0175 s
  32 GPUs at 25 GB/s: 2e9 * 1.9375 / 25e9  = 0.155 s
"""

from __future__ import annotations

from typing import Any

import pytest

from infra.validate.scaling import ScalingPrediction, predict_scaling, predict_step, ring_allreduce_seconds

COMMON: dict[str, Any] = {
    "params": 1e9,
    "bytes_per_grad": 2,
    "compute_seconds": 0.5,
    "base_busbw_gbps": 200.0,
}


def predict(scaled_busbw_gbps: float, overlap: float = 0.0) -> ScalingPrediction:
    return predict_scaling(**COMMON, scaled_busbw_gbps=scaled_busbw_gbps, overlap=overlap)


def test_ring_allreduce_time_follows_the_bus_bandwidth_definition() -> None:
    assert ring_allreduce_seconds(2e9, 8, 200.0) == pytest.approx(0.0175)
    assert ring_allreduce_seconds(2e9, 32, 25.0) == pytest.approx(0.155)
    assert ring_allreduce_seconds(2e9, 1, 25.0) == 0


def test_no_overlap_scales_above_three() -> None:
    # steps: 0.5 + 0.0175 = 0.5175 s and 0.5 + 0.155 = 0.655 s; speedup 4 * 0.5175 / 0.655 = 3.16031
    prediction = predict(25.0)
    assert prediction.gradient_bytes == 2e9
    assert prediction.base.step_seconds == pytest.approx(0.5175)
    assert prediction.scaled.step_seconds == pytest.approx(0.655)
    assert prediction.speedup == pytest.approx(3.160305, rel=1e-6)
    assert prediction.scaled.comm_share == pytest.approx(0.155 / 0.655)  # 23.66 %
    assert prediction.flag == "ok" and prediction.ideal_speedup == 4


def test_slow_fabric_warns_under_three() -> None:
    # 32 GPUs at 10 GB/s: 2e9 * 1.9375 / 10e9 = 0.3875 s; step 0.8875 s; speedup 4 * 0.5175 / 0.8875 = 2.33239
    prediction = predict(10.0)
    assert prediction.speedup == pytest.approx(2.332394, rel=1e-6)
    assert prediction.flag == "warn" and "under 3x" in prediction.message


def test_tcp_class_fabric_points_at_the_fabric_under_two() -> None:
    # 32 GPUs at 2 GB/s: 1.9375 s all-reduce; step 2.4375 s; speedup 4 * 0.5175 / 2.4375 = 0.84923
    prediction = predict(2.0)
    assert prediction.speedup == pytest.approx(0.849231, rel=1e-5)
    assert prediction.scaled.comm_share == pytest.approx(1.9375 / 2.4375)
    assert prediction.flag == "fabric" and "fabric" in prediction.message


def test_half_overlap_hides_half_the_all_reduce() -> None:
    # 8: 0.5 + 0.0175 / 2 = 0.50875; 32 at 10 GB/s: 0.5 + 0.3875 / 2 = 0.69375; speedup 2.93333
    prediction = predict(10.0, overlap=0.5)
    assert prediction.base.step_seconds == pytest.approx(0.50875)
    assert prediction.scaled.exposed_seconds == pytest.approx(0.19375)
    assert prediction.speedup == pytest.approx(2.933333, rel=1e-6)
    assert prediction.flag == "warn"


def test_overlap_cannot_hide_more_than_the_compute() -> None:
    # 0.3875 s all-reduce, 0.1 s compute, full overlap: 0.1 s hidden, 0.2875 exposed, step 0.3875 s
    step = predict_step(2e9, 32, 10.0, compute_seconds=0.1, overlap=1.0)
    assert step.exposed_seconds == pytest.approx(0.2875)
    assert step.step_seconds == pytest.approx(0.3875)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("overlap", 1.5, "overlap must be between 0 and 1"),
        ("compute_seconds", 0.0, "compute_seconds must be positive"),
        ("scaled_busbw_gbps", -1.0, "scaled_busbw_gbps must be positive"),
        ("scaled_gpus", 8, "base_gpus must be at least 1 and below scaled_gpus"),
    ],
)
def test_bad_inputs_name_the_field(field: str, value: float, message: str) -> None:
    arguments: dict[str, Any] = {**COMMON, "scaled_busbw_gbps": 25.0, field: value}
    with pytest.raises(ValueError, match=message):
        predict_scaling(**arguments)
