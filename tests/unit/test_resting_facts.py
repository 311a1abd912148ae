"""What a shipped stack's nodes install, against what was seen in NVIDIA's real index (`verified`): the plan
lists the unverified facts, and a shipped default may rest on one only where the entry says why."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from infra.data.packages import Package, package_facts
from infra.plan.report import build_report
from infra.platform.package_set import installed_set, resting_facts, unaccepted


@pytest.mark.parametrize("stack", ["local", "aws-prod", "aws-k8s", "onprem", "onprem-k8s"])
def test_a_shipped_stack_rests_only_on_listed_facts_and_says_why_where_unverified(
    stack: str, shipped_platforms: dict[str, Any]
) -> None:
    software = shipped_platforms[stack].software
    facts = resting_facts(package_facts(), str(software.os_release), software)
    assert {f.package for f in facts} >= {"libnccl2", "datacenter-gpu-manager-4-core"}
    assert not [f for f in facts if not f.listed], "the roles would install a version the facts do not list"
    assert not unaccepted(facts), (
        "unverified, and packages.yaml does not say why a shipped stack may rest on it"
    )


def test_the_plan_lists_the_unverified_facts(shipped_platforms: dict[str, Any]) -> None:
    platform = shipped_platforms["aws-prod"]
    report = build_report(platform).to_dict()
    listed = {(f["package"], f["version"]) for f in report["unverified_facts"]}
    expected = {
        (f.package, f.version)
        for f in resting_facts(package_facts(), str(platform.software.os_release), platform.software)
        if not f.verified
    }
    assert listed == expected and listed
    json.dumps(report)


def test_the_dcgm_flavour_in_the_set_is_the_drivers(shipped_platforms: dict[str, Any]) -> None:
    software = shipped_platforms["aws-prod"].software
    names = [name for name, _ in installed_set(package_facts(), str(software.os_release), software)]
    assert f"datacenter-gpu-manager-4-cuda{software.driver_cuda_major}" in names


def test_accepted_belongs_to_unverified_facts_only() -> None:
    entry = yaml.safe_load(
        "{name: x, repository: cuda, component: nccl, releases: [debian12], versions: ['1-1'],"
        " verified: true, source: 'seen in the index', as_of: 2026-12-02, accepted: 'no need'}"
    )
    with pytest.raises(ValueError, match="accepted"):
        Package.model_validate(entry)
