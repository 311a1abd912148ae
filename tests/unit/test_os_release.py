"""Versions are resolved for the nodes' OS release: only what NVIDIA publishes there is chosen."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.data.load import compatibility
from infra.data.packages import ReleaseOffer, package_facts, release_offer
from infra.errors import SpecError
from infra.resolve import load_platform
from infra.spec.models import Software
from infra.versions import resolve_versions


def offer(**changes: Any) -> ReleaseOffer:
    base = release_offer(package_facts(), "debian12")
    return ReleaseOffer(**{**base.__dict__, **changes})


def test_nccl_build_is_one_the_release_publishes() -> None:
    software, problems = resolve_versions(Software(), ["hopper"], compatibility(), "p", offer=offer())
    assert not problems and software is not None
    assert (software.nccl, software.nccl_cuda_build) in release_offer(package_facts(), "debian12").nccl_builds


def test_nccl_runs_a_newer_minor_build_through_minor_version_compatibility() -> None:
    """Driver 570 tops out at CUDA 12.8; NCCL built with 12.9 runs on it (same major, driver >= 525)."""
    software, problems = resolve_versions(
        Software(), ["hopper"], compatibility(), "p", offer=offer(nccl_builds=frozenset({("2.27.3", "12.9")}))
    )
    assert not problems and software is not None
    assert (software.driver_branch, software.nccl_cuda_build) == (570, "12.9")


def test_no_published_nccl_build_is_rejected_with_what_exists() -> None:
    _, problems = resolve_versions(
        Software(), ["hopper"], compatibility(), "p", offer=offer(nccl_builds=frozenset({("2.27.3", "13.0")}))
    )
    assert problems and problems[0][0] == "p.software.nccl"
    assert "2.27.3+cuda13.0" in problems[0][1]


def test_unpublished_driver_is_rejected_at_the_field() -> None:
    _, problems = resolve_versions(
        Software(driver_version="570.172.08"),
        ["hopper"],
        compatibility(),
        "p",
        offer=offer(drivers=frozenset({"570.195.03"})),
    )
    assert problems == [
        (
            "p.software.driver_version",
            "driver 570.172.08 is not published for Debian 12 (bookworm) in NVIDIA's repository "
            "(infra/data/packages.yaml lists: 570.195.03); pick a published version or set "
            "software.os_release to a release that has it",
        )
    ]


def test_debian13_stack_is_refused_until_nvidia_publishes_the_driver(
    write_stack: Callable[..., Path],
) -> None:
    def on_debian13(platform: dict[str, Any]) -> None:
        platform.setdefault("software", {})["os_release"] = "debian13"

    with pytest.raises(SpecError) as error:
        load_platform(write_stack("onprem", on_debian13))
    message = str(error.value)
    assert "software.driver_branch" in message and "Debian 13 (trixie)" in message


@pytest.mark.parametrize(("stack", "release"), [("local", "debian12"), ("aws-prod", "ubuntu2204")])
def test_default_release_follows_the_backend(
    stack: str, release: str, shipped_platforms: dict[str, Any]
) -> None:
    assert shipped_platforms[stack].software.os_release == release
