"""Versions are resolved for the nodes' OS release: only what NVIDIA publishes there is chosen."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.data.load import compatibility
from infra.data.packages import ReleaseOffer, package_facts, release_offer, upstream_version
from infra.errors import SpecError
from infra.platform.resolve import image_parameter, load_platform
from infra.platform.versions import resolve_versions
from infra.spec.models import Software

WHILE_570_WAS_SUPPORTED = dt.date(2026, 1, 15)  # R570 ended in February 2026 (compatibility.yaml)


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
        Software(driver_branch=570),
        ["hopper"],
        compatibility(),
        "p",
        offer=offer(nccl_builds=frozenset({("2.27.3", "12.9")})),
        today=WHILE_570_WAS_SUPPORTED,
    )
    assert not problems and software is not None
    assert (software.driver_branch, software.cuda, software.nccl_cuda_build) == (570, "12.8", "12.9")


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
        offer=offer(open_drivers=frozenset({"570.195.03"})),
        today=WHILE_570_WAS_SUPPORTED,
    )
    assert problems == [
        (
            "p.software.driver_version",
            "driver 570.172.08 (every package of its open-module install set) is not published for "
            "Debian 12 (bookworm) in NVIDIA's repository "
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


def test_a_driver_is_offered_only_where_every_package_the_role_installs_has_it() -> None:
    """A version some package of the component has is not enough: the role installs the whole set
    (packages.yaml driver_packages), and apt fails on the first name the repository lacks."""
    facts = package_facts()
    release = facts.release("ubuntu2204")
    for version in release_offer(facts, "ubuntu2204").drivers(open_modules=True):
        branch = int(version.split(".")[0])
        for name in release.driver_packages.names(branch, open_modules=True):
            assert version in {
                upstream_version(v) for v in facts.offered("ubuntu2204", "cuda").get(name, set())
            }
    with_one_missing = facts.model_copy(
        update={"packages": [p for p in facts.packages if p.name != "nvidia-utils-570"]}
    )
    assert not {
        v
        for v in release_offer(with_one_missing, "ubuntu2204").drivers(open_modules=True)
        if v.startswith("570.")
    }


def test_the_default_branch_is_supported_today_and_an_ended_one_is_refused() -> None:
    data = compatibility()
    today = dt.date.today()
    default = data.driver(data.default_driver_branch)
    assert default is not None and default.supported_on(today), (
        f"default_driver_branch {data.default_driver_branch} ended before {default and default.end_of_life}"
    )
    software, problems = resolve_versions(Software(), ["hopper"], data, "p", offer=offer())
    assert not problems and software is not None and software.driver_branch == data.default_driver_branch
    _, problems = resolve_versions(
        Software(driver_branch=570), ["hopper"], data, "p", offer=offer(), today=today
    )
    assert [path for path, _ in problems] == ["p.software.driver_branch"]
    assert "570 is past its end of life" in problems[0][1] and "580 (until 2028-07-01)" in problems[0][1]


def test_a_branch_raised_for_the_gpus_is_never_an_ended_one() -> None:
    """Blackwell needs 570+; on a day after R570's end the raise lands on a supported branch."""
    data = compatibility()
    software, problems = resolve_versions(
        Software(), ["blackwell"], data, "p", offer=offer(), today=dt.date(2026, 12, 2)
    )
    assert not problems and software is not None
    assert data.driver(software.driver_branch).supported_on(dt.date(2026, 12, 2))  # type: ignore[union-attr]


def test_the_aws_image_is_the_plain_image_of_the_nodes_release(
    shipped_platforms: dict[str, Any],
) -> None:
    """The default was the Deep Learning Base AMI (its own driver, EFA, DCGM): the roles would skip the EFA
    installer and fight its driver. It follows software.os_release, and a stack's own parameter wins."""
    spec = shipped_platforms["aws-prod"].spec
    assert spec.software.os_release is None
    assert (
        image_parameter(spec)
        == "/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id"
    )
    noble = spec.model_copy(
        update={"software": spec.software.model_copy(update={"os_release": "ubuntu2404"})}
    )
    assert "/ubuntu/server/24.04/" in image_parameter(noble)
    own = spec.model_copy(update={"aws": spec.aws.model_copy(update={"image_ssm_parameter": "/golden-ami"})})
    assert image_parameter(own) == "/golden-ami"
    assert all(
        "deeplearning" not in (package_facts().release(r).aws_image_ssm_parameter or "")
        for r in ("debian12", "debian13", "ubuntu2204", "ubuntu2404")
    )
