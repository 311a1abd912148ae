"""GDRCopy where GPUDirect RDMA is used (issue 50): the training GPU nodes of an efa, infiniband or roce
fabric build the release infra/data/packages.yaml pins (roles/rdma/tasks/gdrcopy.yml), the plan says so,
and a release that does not support the driver's CUDA major or the pools' GPUs is refused. Pools without
an RDMA fabric, and nodes without a GPU, get nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli.app import app
from infra.data.packages import package_facts
from infra.nodes.inventory import platform_vars, pool_vars
from infra.platform.gdrcopy import resolve_gdrcopy
from infra.platform.resolve import load_platform

ROOT = Path(__file__).resolve().parents[2]
FACTS = package_facts().gdrcopy


def test_the_rdma_stacks_build_the_pinned_release_and_the_others_nothing() -> None:
    for stack in ("aws-prod", "onprem"):
        platform = load_platform(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
        assert platform.software.gdrcopy is not None, stack
        values = platform_vars(platform)
        pinned = (values["rdma_gdrcopy_version"], values["rdma_gdrcopy_commit"])
        assert pinned == (FACTS.version, FACTS.commit)
        node_pools = {p.name: pool_vars(platform, p)["gpuplat_gdrcopy"] for p in platform.pools}
        expected = {p.name: bool(p.node_type.gpu) and p.role == "train" for p in platform.pools}
        assert node_pools == expected and not any(p.simulated for p in platform.pools)
        assert any(node_pools.values()) and not all(node_pools.values()), (stack, node_pools)
    onprem = load_platform(ROOT / "stacks" / "Pulumi.onprem.yaml")
    train = replace(next(p for p in onprem.pools if p.name == "train"), simulated=True)
    assert pool_vars(onprem, train)["gpuplat_gdrcopy"] is False  # simulated GPUs: nothing to build on
    local = load_platform(ROOT / "stacks" / "Pulumi.local.yaml")
    assert local.software.gdrcopy is None
    assert "rdma_gdrcopy_version" not in platform_vars(local)
    assert not any(pool_vars(local, p)["gpuplat_gdrcopy"] for p in local.pools)


def test_the_plan_names_gdrcopy_on_an_rdma_stack_only() -> None:
    shown = CliRunner().invoke(app, ["plan", "--stack", "onprem"])
    assert shown.exit_code == 0, shown.output
    said = " ".join(shown.output.split())
    assert f"GDRCopy {FACTS.version} on the training GPU nodes of the RDMA fabric" in said
    local = CliRunner().invoke(app, ["plan", "--stack", "local"])
    assert local.exit_code == 0 and "GDRCopy" not in local.output


def test_a_release_without_the_drivers_cuda_major_is_refused() -> None:
    older = FACTS.model_copy(update={"cuda_majors": [11, 12]})
    build, problems = resolve_gdrcopy(older, "infiniband", 13, ["hopper"], "p.fabric.kind")
    assert build is None
    [(path, message)] = problems
    assert path == "p.fabric.kind" and "supports CUDA 11, 12, and the driver reports CUDA 13" in message


def test_a_release_without_the_pools_architecture_is_refused() -> None:
    older = FACTS.model_copy(update={"architectures": ["ampere", "ada", "hopper"]})
    build, problems = resolve_gdrcopy(older, "efa", 13, ["hopper", "blackwell"], "p")
    assert build is None and len(problems) == 1 and "does not support blackwell GPUs" in problems[0][1]


def test_no_rdma_fabric_or_no_gpu_needs_no_gdrcopy() -> None:
    assert resolve_gdrcopy(FACTS, "none", 13, ["hopper"], "p") == (None, [])
    assert resolve_gdrcopy(FACTS, "efa", 13, [], "p") == (None, [])


def test_the_pinned_release_supports_what_the_data_pins() -> None:
    """CHANGELOG.md [2.5.1]: "Support CUDA 13.0", "Support Blackwell" (NVIDIA/gdrcopy); the newest driver
    branch in the data reports CUDA 13, and B200 pools are Blackwell."""
    assert 13 in FACTS.cuda_majors and "blackwell" in FACTS.architectures
    assert tuple(int(p) for p in FACTS.version.split(".")) >= (2, 5, 1)


def test_the_role_installs_gdrcopy_only_on_real_gpus_of_an_rdma_node() -> None:
    tasks = yaml.safe_load((ROOT / "roles" / "rdma" / "tasks" / "main.yml").read_text())
    install = next(
        t for t in tasks if t.get("ansible.builtin.include_tasks", {}).get("file") == "gdrcopy.yml"
    )
    assert install["when"] == [
        "gpuplat_gdrcopy | default(false) | bool",
        "not (gpuplat_gpu_simulated | default(false) | bool)",
    ]
    defaults = yaml.safe_load((ROOT / "roles" / "rdma" / "defaults" / "main.yml").read_text())
    assert defaults["rdma_gdrcopy_repo_url"] == FACTS.repository
    assert defaults["rdma_gdrcopy_version"] == ""  # the inventory sets it; the role alone installs nothing


def test_gdrdrv_is_started_only_on_a_loaded_driver_and_enabled_for_boot_always() -> None:
    """An image build runs on a machine without a GPU (infra/backends/aws/node_image.py): gdrdrv's init
    script needs the nvidia module gdrdrv was built for, so the role enables it for the next boot and starts
    it only where that driver is the one loaded (/sys/module/nvidia/version), then checks it is there."""
    tasks = yaml.safe_load((ROOT / "roles" / "rdma" / "tasks" / "gdrcopy.yml").read_text())
    enable = next(t for t in tasks if t["name"] == "Enable gdrdrv at boot")
    assert enable["ansible.builtin.systemd_service"] == {"name": "gdrdrv", "enabled": True}
    assert "when" not in enable
    [load] = [t for t in tasks if "block" in t and "gdrdrv" in t["name"]]
    assert load["when"] == "__rdma_nvidia_loaded_version == gpu_driver_version"
    started = [t for t in load["block"] if "state" in t.get("ansible.builtin.systemd_service", {})]
    assert len(started) == 1
    assert any("ansible.builtin.assert" in t for t in load["block"])


@pytest.mark.parametrize("fabric", ["efa", "infiniband", "roce"])
def test_every_rdma_fabric_builds_gdrcopy(fabric: str) -> None:
    build, problems = resolve_gdrcopy(FACTS, fabric, 13, ["hopper"], "p")
    assert problems == [] and build is not None and build.commit == FACTS.commit


def test_only_the_training_pools_gpus_must_be_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    """aws-prod's inference pool (ada) gets no GDRCopy, so a release without ada must not refuse the stack."""
    facts = package_facts()
    hopper_only = facts.model_copy(update={"gdrcopy": FACTS.model_copy(update={"architectures": ["hopper"]})})
    monkeypatch.setattr("infra.platform.resolve.package_facts", lambda: hopper_only)
    platform = load_platform(ROOT / "stacks" / "Pulumi.aws-prod.yaml")
    assert {
        p.node_type.gpu.architecture for p in platform.pools if p.role == "infer" and p.node_type.gpu
    } == {"ada"}
    assert platform.software.gdrcopy is not None
