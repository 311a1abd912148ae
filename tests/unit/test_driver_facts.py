"""Facts of the driver data with their sources (infra/data/compatibility.yaml), as NVIDIA states them at the
versions the platform pins: what the resolver decides from them is only as right as they are."""

from __future__ import annotations

import datetime as dt

from infra.data.load import compatibility


def test_r580_ends_with_june_2028_as_nvidias_support_page_says() -> None:
    """NVIDIA Data Center Drivers, "Supported Drivers and CUDA Toolkit Versions" Table 2 (615, 620 editions):
    R580, Long Term Support Branch, End of Life June 2028. end_of_life is the first day without support."""
    r580 = compatibility().driver(580)
    assert r580 is not None and r580.lifecycle == "lts"
    assert r580.end_of_life == dt.date(2028, 7, 1)
    assert r580.supported_on(dt.date(2028, 6, 30)) and not r580.supported_on(dt.date(2028, 7, 1))
    assert "supported-drivers-and-cuda-toolkit-versions" in r580.source and '"June 2028"' in r580.source


def test_the_default_branch_is_not_chosen_past_its_end_of_life() -> None:
    """In July 2028 the resolver no longer picks R580 by default (it is refused when set)."""
    data = compatibility()
    branches = {d.branch for d in data.supported_branches(dt.date(2028, 7, 1))}
    assert 580 not in branches
    assert 580 in {d.branch for d in data.supported_branches(dt.date(2028, 6, 30))}
