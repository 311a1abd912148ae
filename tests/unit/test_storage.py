from __future__ import annotations

import pytest

from infra.platform.storage import PERSISTENT_2_MBPS_PER_TIB, aggregate_gbps, fsx_lustre_layout


def test_cheapest_throughput_tier_that_meets_demand() -> None:
    layout = fsx_lustre_layout(capacity_tib=48, demand_gbps=10)
    assert layout.per_unit_mbps == 250 and layout.meets_demand


def test_capacity_grows_past_the_top_tier() -> None:
    layout = fsx_lustre_layout(capacity_tib=1.2, demand_gbps=100)
    assert layout.per_unit_mbps == PERSISTENT_2_MBPS_PER_TIB[-1]
    assert layout.meets_demand and layout.capacity_gib % 2400 == 0


@pytest.mark.parametrize(("tib", "gib"), [(0.5, 1200), (1.2, 1200), (1.3, 2400), (48, 48000)])
def test_capacity_steps(tib: float, gib: int) -> None:
    assert fsx_lustre_layout(tib, 0.1).capacity_gib == gib


def test_aggregate_throughput() -> None:
    assert aggregate_gbps(2400, 1000) == pytest.approx(2400 / 1024)
