"""infra.scheduling.slurm: the Slurm node lines of elastic training pools and the controllers."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from infra.data.load import catalog
from infra.data.packages import package_facts
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.scheduling import slurm


def test_aws_training_pools_are_described_from_the_catalog(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    nodes = {n.pool: n for n in slurm.cloud_nodes(shipped_platforms["aws-prod"])}
    assert sorted(nodes) == ["train", "train-spot"]  # training pools only, never inference
    train, spot = nodes["train"], nodes["train-spot"]
    assert train.names == ["train-0", "train-1", "train-2", "train-3"]
    assert (train.static, train.cloud) == (train.names, [])  # count 4: all static
    assert spot.names == [f"train-spot-{i}" for i in range(4)]
    assert (spot.static, spot.cloud) == ([], spot.names)  # min 0, max 4: all on demand
    p5 = catalog().get("p5.48xlarge")
    assert p5 is not None
    for n in (train, spot):
        assert (n.cpus, n.gpu_type, n.gpu_count, n.gres) == (p5.vcpus, "h100", 8, "gpu:h100:8")
        assert n.feature == f"pool_{n.pool},gpu_{n.gpu_type}"
        assert n.real_memory_mb == slurm.cloud_real_memory_mb(p5.memory_gib)


def test_min_nodes_are_static_and_the_rest_cloud(write_stack: Callable[..., Path]) -> None:
    def mutate(platform: dict[str, Any]) -> None:
        spot = next(p for p in platform["pools"] if p["name"] == "train-spot")
        spot.update(min=1, max=3)

    nodes = {n.pool: n for n in slurm.cloud_nodes(load_platform(write_stack("aws-prod", mutate)))}
    assert nodes["train-spot"].static == ["train-spot-0"]
    assert nodes["train-spot"].cloud == ["train-spot-1", "train-spot-2"]


def test_real_memory_stays_below_what_the_os_reports() -> None:
    # A p5.48xlarge (2048 GiB) reports MemTotal 2063844 MiB: the kernel's page array alone is
    # 1/64 of RAM. The margin keeps RealMemory below that, and not absurdly low.
    assert slurm.cloud_real_memory_mb(2048) < 2063844
    assert slurm.cloud_real_memory_mb(2048) > 2048 * 1024 * 0.95
    for gib in (16, 32, 64, 2048):
        total = gib * 1024
        assert slurm.cloud_real_memory_mb(gib) < total - total // 64 - 256


def test_power_saving_on_aws_and_for_elastic_local_pools(
    shipped_platforms: dict[str, ResolvedPlatform], write_stack: Callable[..., Path]
) -> None:
    aws = slurm.slurm_vars(shipped_platforms["aws-prod"])
    assert aws["slurm_power_saving"] is True and len(aws["slurm_cloud_nodes"]) == 2
    local = slurm.slurm_vars(shipped_platforms["local"])  # train: min 2, max 3
    assert local["slurm_power_saving"] is True
    (train,) = local["slurm_cloud_nodes"]
    assert train["names"] == ["train-0", "train-1", "train-2"] and train["static"] == ["train-0", "train-1"]
    # Local nodes are containers of this machine: its CPUs and memory, not the catalog's.
    cpus, memory_mb = slurm.host_hardware()
    assert train["cpus"] == cpus and train["real_memory_mb"] < memory_mb
    assert local["slurm_suspend_time"] == slurm.LOCAL_NEVER_SUSPEND_S

    def fixed(platform: dict[str, Any]) -> None:
        train = next(p for p in platform["pools"] if p["name"] == "train")
        train.pop("min"), train.pop("max")
        train["count"] = 2

    fixed_local = load_platform(write_stack("local", fixed))
    assert slurm.power_saving(fixed_local) is False and slurm.cloud_nodes(fixed_local) == []


def test_suspend_time_comes_from_the_spec(write_stack: Callable[..., Path]) -> None:
    path = write_stack("aws-prod", lambda p: p["scheduler"].__setitem__("scale_down_idle_s", 1200))
    assert slurm.slurm_vars(load_platform(path))["slurm_suspend_time"] == 1200


def test_controllers_primary_first_backup_only_with_high_availability(
    write_stack: Callable[..., Path], shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    aws = slurm.slurm_vars(shipped_platforms["aws-prod"])
    assert (aws["slurm_controllers"], aws["slurm_high_availability"]) == (["head-0", "head-1"], True)

    def one_controller(platform: dict[str, Any]) -> None:
        platform["scheduler"].pop("high_availability", None)
        next(p for p in platform["pools"] if p["name"] == "head")["count"] = 1

    single = load_platform(write_stack("aws-prod", one_controller))
    assert slurm.controllers(single) == ["head-0"]
    assert slurm.slurm_vars(single)["slurm_high_availability"] is False
    assert slurm.controllers(shipped_platforms["local"]) == ["head-0"]


def test_mpi_default_is_pmi2_where_the_release_slurm_has_no_pmix_plugin(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """Ubuntu 22.04 (the aws default) ships Slurm 21.08 without mpi/pmix: MpiDefault=pmix would fail every
    job step there. Debian 12 (local, onprem) ships it."""
    assert slurm.slurm_vars(shipped_platforms["aws-prod"])["slurm_common_mpi_default"] == "pmi2"
    assert slurm.slurm_vars(shipped_platforms["local"])["slurm_common_mpi_default"] == "pmix"
    assert slurm.slurm_vars(shipped_platforms["onprem"])["slurm_common_mpi_default"] == "pmix"


@pytest.mark.parametrize(
    ("release", "mpi"), [("ubuntu2204", "pmi2"), ("ubuntu2404", "pmix"), ("debian12", "pmix")]
)
def test_mpi_default_follows_the_os_release_facts(
    release: str, mpi: str, write_stack: Callable[..., Path]
) -> None:
    path = write_stack("aws-prod", lambda p: p.setdefault("software", {}).__setitem__("os_release", release))
    platform = load_platform(path)
    facts = package_facts().release(release).slurm
    assert facts is not None and facts.mpi_default == mpi
    assert slurm.slurm_vars(platform)["slurm_common_mpi_default"] == mpi


def test_the_inventory_mpi_default_is_what_slurm_conf_says(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """The inventory's value reaches slurm.conf (it overrides the role default, pmix)."""
    pytest.importorskip("ansible.template")
    from tests.roles.test_slurm_templates import render, settings

    mpi = slurm.slurm_vars(shipped_platforms["aws-prod"])["slurm_common_mpi_default"]
    conf = render("slurm.conf.j2", version="21.08.5-2ubuntu1", slurm_common_mpi_default=mpi)
    assert settings(conf)["MpiDefault"] == "pmi2"
    assert "no mpi/pmix plugin" in conf


def test_the_aws_stacks_partitions_accounts_and_qos(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    """One partition per training pool: on demand first (PriorityTier 10, every QoS, never preempted),
    spot after it (PriorityTier 1, the spot QoS only, preempted in the stack's mode); an account per team
    with its GPU cap; the QoS tiers, spot's with the grace period a checkpoint needs."""
    platform = shipped_platforms["aws-prod"]
    train = [f"train-{i}" for i in range(4)]
    assert [asdict(p) for p in slurm.partitions(platform)] == [
        {"name": "train", "pool": "train", "nodes": train, "gpus_per_node": 8, "gpu_type": "h100",
         "priority_tier": 10, "preempt_mode": "OFF", "default": True, "spot": False,
         "allowed_qos": ["normal", "high", "spot"]},
        {"name": "train_spot", "pool": "train-spot", "nodes": [f"train-spot-{i}" for i in range(4)],
         "gpus_per_node": 8, "gpu_type": "h100", "priority_tier": 1, "preempt_mode": "REQUEUE",
         "default": False, "spot": True, "allowed_qos": ["spot"]},
    ]  # fmt: skip
    assert slurm.default_partition(platform) == "train"
    assert slurm.partition_names(platform) == {"train", "train_spot"}
    assert slurm.accounts(platform) == [
        slurm.Account("research", 48, 50, ["alice", "carol"]),
        slurm.Account("product", 24, 30, ["bob"]),
        slurm.Account("eval", 8, 20, ["dave"]),
    ]
    assert slurm.qos(platform) == [
        {"name": "high", "priority": 1000, "preempt": ["spot"], "preempt_mode": "requeue", "grace_time": 0},
        {"name": "normal", "priority": 100, "preempt": ["spot"], "preempt_mode": "requeue", "grace_time": 0},
        {"name": "spot", "priority": 10, "preempt": [], "preempt_mode": "requeue", "grace_time": 120},
    ]


def test_gres_types_and_the_memory_nodes_keep_for_the_os(monkeypatch: pytest.MonkeyPatch) -> None:
    assert slurm.gres_type("H100") == "h100" and slurm.gres_type("RTX-6000") == "rtx_6000"
    assert slurm.gres_type("") == "gpu"  # a node without a GPU model
    # 2048 GiB: 3 % (rounded up) and 512 MiB kept; 16 GiB likewise
    assert slurm.cloud_real_memory_mb(2048) == 2048 * 1024 - 62915 - 512 == 2033725
    assert slurm.cloud_real_memory_mb(16) == 16384 - 492 - 512
    # local nodes: 1 % rounded up, at least 512 MiB
    assert [slurm.local_real_memory_mb(t) for t in (2000, 100000, 100050)] == [1488, 99000, 99049]
    assert all(isinstance(slurm.local_real_memory_mb(t), int) for t in (2000, 100050))
    meminfo = Path("/proc/meminfo").read_text()
    total_kib = int(next(line for line in meminfo.splitlines() if line.startswith("MemTotal:")).split()[1])
    assert slurm.host_hardware() == (os.cpu_count(), total_kib // 1024)
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert slurm.host_hardware()[0] == 1
