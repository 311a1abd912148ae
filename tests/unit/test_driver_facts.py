"""Facts of the driver data with their sources (infra/data/compatibility.yaml), as NVIDIA states them at the
versions the platform pins: what the resolver decides from them is only as right as they are."""

from __future__ import annotations

import datetime as dt

from infra.data.load import catalog, compatibility
from infra.platform.versions import resolve_versions
from infra.spec.models import Software

WHILE_535_WAS_SUPPORTED = dt.date(2026, 1, 15)


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


# The first production driver per GPU model (compatibility.yaml gpu_models): the first release after NVIDIA's
# betas whose supported-GPU table (NVIDIA/open-gpu-kernel-modules README.md, read at every tag) lists the
# model's PCI device ID. The Vulkan developer betas list some GPUs earlier and then drop them.
FIRST_PRODUCTION_DRIVER = {
    "A100": "515.48.07",  # 20B0/20B2 in the first README table (515.48.07; 515.43.04 has none)
    "A10G": "515.48.07",  # 2237, the same
    "H100": "525.85.05",  # 2330 from 525.85.05; earlier only in 525.47.07..525.47.35 (Vulkan betas)
    "H200": "550.90.07",  # 2335 from 550.90.07; earlier only in 550.40.65..550.40.85 (Vulkan betas)
    "B200": "570.133.20",  # NVIDIA's GPU Operator platform support: HGX B200 needs 570.133.20 or later
    "L4": "525.105.17",  # 27B8 from 525.105.17; earlier only in 525.47.22.. (Vulkan betas)
    "L40S": "535.104.05",  # 26B9 from 535.104.05; earlier only in 535.43.09..535.43.28 (Vulkan betas)
}
VULKAN_BETA_SERIES = ("525.47.", "535.43.", "550.40.")


def test_every_gpu_model_of_the_catalog_has_its_first_production_driver() -> None:
    """A GPU model the catalog offers without a first driver would be accepted on any driver."""
    models = {t.gpu.model for t in catalog().node_types if t.gpu is not None}
    recorded = {m.model: m.min_driver_version for m in compatibility().gpu_models}
    assert models <= set(recorded), f"no first production driver for {sorted(models - set(recorded))}"
    assert recorded == FIRST_PRODUCTION_DRIVER
    assert not [v for v in recorded.values() if v.startswith(VULKAN_BETA_SERIES)]


def test_a_driver_older_than_the_gpus_first_production_driver_is_refused() -> None:
    """535.86.10 is a production R535 driver, but not yet one that supports L40S (535.104.05 is)."""
    old = Software(driver_version="535.86.10")
    _, problems = resolve_versions(
        old, ["ada"], compatibility(), "p", today=WHILE_535_WAS_SUPPORTED, gpu_models=["L40S"]
    )
    assert problems == [
        (
            "p.software.driver_version",
            "L40S GPUs need driver 535.104.05 or newer, the first production driver that supports them "
            "(infra/data/compatibility.yaml, gpu_models); driver 535.86.10 (branch 535) does not: set "
            "software.driver_version to 535.104.05 or later, or leave the driver to the plan",
        )
    ]
    first = Software(driver_version="535.104.05")
    software, problems = resolve_versions(
        first, ["ada"], compatibility(), "p", today=WHILE_535_WAS_SUPPORTED, gpu_models=["L40S"]
    )
    assert not problems and software is not None and software.driver_version == "535.104.05"
