"""The inventory carries resolved values from the spec; groups follow pools and roles."""

from __future__ import annotations

import pytest

from infra.backends.local.scale import with_running_sizes
from infra.errors import GpuPlatError
from infra.nodes.inventory import (
    aws_ec2_config,
    inventory_documents,
    platform_vars,
    stack_inventory_documents,
    static_inventory,
)
from infra.platform.resolve import ResolvedPlatform
from infra.platform.serving_layout import startup_budget_s


def test_local_inventory_groups_and_vars(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    local = shipped_platforms["local"]
    assert set(static_inventory(local)["all"]["children"]["pool_train"]["hosts"]) == {
        "train-0",
        "train-1",
        "train-2",
    }
    inventory = static_inventory(with_running_sizes(local, {"train": 2}))["all"]
    children = inventory["children"]
    assert set(children["pool_train"]["hosts"]) == {"train-0", "train-1"}
    train_vars = children["pool_train"]["vars"]
    assert train_vars["gpuplat_gpu_count"] == 8 and train_vars["gpuplat_gpu_simulated"] is True
    assert children["pool_head"]["vars"]["gpuplat_gpu_simulated"] is False
    assert children["pool_train"]["hosts"]["train-0"]["ansible_connection"] == "gpuplat_podman"
    assert children["slurm_compute"]["children"] == {"pool_train": {}}
    assert children["inference_server"]["children"] == {"pool_infer": {}}
    assert inventory["vars"]["fabric_manager_version"] == inventory["vars"]["gpu_driver_version"]


def test_dcgm_flavour_and_version_come_from_the_plan(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    """The dcgm role used to take its flavour from the toolkit (12.8 -> cuda12) under an R580 driver
    that reports CUDA 13, and DCGM 4.2.3, which has no cuda13 flavour."""
    for name, platform in shipped_platforms.items():
        values = platform_vars(platform)
        assert values["dcgm_cuda_major"] == platform.software.driver_cuda_major, name
        assert values["dcgm_version"] == platform.software.dcgm_version, name
        if platform.software.driver_branch >= 580:
            assert values["dcgm_cuda_major"] == 13 and values["dcgm_version"] != "4.2.3", name


def test_inference_pools_are_not_partitions(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    for platform in shipped_platforms.values():
        if platform.spec.scheduler.kind != "slurm":
            continue
        partitions = platform_vars(platform)["slurm_partitions"]
        assert {p["pool"] for p in partitions} == {p.name for p in platform.pools_with_role("train")}


def test_kueue_stacks_get_no_slurm_and_mount_the_shared_fs_before_the_kubelet(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    platform = shipped_platforms["onprem-k8s"]
    values = platform_vars(platform)
    assert not [name for name in values if name.startswith("slurm_")]
    assert values["shared_fs_required_by"] == ["kubelet.service"]
    groups = inventory_documents(platform)["hosts.yml"]["all"]["children"]
    assert not {"slurm_controller", "slurm_compute", "inference_server", "monitoring"} & set(groups)
    assert set(groups["kubernetes_gpu_nodes"]["children"]) == {"pool_train", "pool_infer"}


def test_spot_partition_requeues(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    partitions = inventory_documents(shipped_platforms["aws-prod"])["group_vars/all.yml"]["slurm_partitions"]
    spot = next(p for p in partitions if p["pool"] == "train-spot")
    normal = next(p for p in partitions if p["pool"] == "train")
    assert spot["preempt_mode"] == "REQUEUE" and spot["priority_tier"] < normal["priority_tier"]


def test_onprem_hosts_by_address(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    hosts = static_inventory(shipped_platforms["onprem"])["all"]["children"]["pool_train"]["hosts"]
    assert hosts["gpu-01"]["ansible_host"] == "10.40.1.11"


def test_aws_inventory_finds_nodes_by_tags(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    config = aws_ec2_config(shipped_platforms["aws-prod"])
    assert config["plugin"] == "amazon.aws.aws_ec2"
    assert config["filters"]["tag:gpuplat:stack"] == "aws-prod"
    assert "pool_head" in config["groups"]["slurm_controller"]


def test_play_recap_counts_changes_and_failures() -> None:
    from infra.nodes.playbook_run import parse_recap

    recap = """PLAY RECAP *********
head-0     : ok=40   changed=3    unreachable=0    failed=0    skipped=9    rescued=0    ignored=0
train-0    : ok=12   changed=0    unreachable=1    failed=0    skipped=0    rescued=0    ignored=0
train-1    : ok=12   changed=2    unreachable=0    failed=1    skipped=0    rescued=0    ignored=0
"""
    assert parse_recap(recap) == (5, ["train-0", "train-1"])


def test_stack_outputs_fill_what_the_offline_inventory_cannot_know(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """Without `group_vars` (an older program) the mount source and addresses come from the other outputs."""
    platform = shipped_platforms["aws-prod"]
    offline = inventory_documents(platform)["group_vars/all.yml"]
    assert offline["shared_fs_source"] == "" and "gpuplat_controller_addresses" not in offline
    outputs = {
        "fsx_dns_name": "fs-1.fsx.us-east-1.amazonaws.com",
        "fsx_mount_name": "m1",
        "controller_addresses": {"head-0": "10.64.0.10", "head-1": "10.64.1.11"},
    }
    documents = stack_inventory_documents(platform, outputs)
    all_vars = documents["group_vars/all.yml"]
    assert all_vars["shared_fs_source"] == "fs-1.fsx.us-east-1.amazonaws.com@tcp:/m1"
    assert all_vars["gpuplat_controller_addresses"] == {"head-0": "10.64.0.10", "head-1": "10.64.1.11"}
    assert documents["aws_ec2.yml"] == aws_ec2_config(platform)  # no inventory_config output: offline plugin


def test_stack_outputs_lacking_the_mount_and_controllers_are_an_error(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    with pytest.raises(GpuPlatError) as raised:
        stack_inventory_documents(shipped_platforms["aws-prod"], {"backend": "aws"})
    message = raised.value.message
    assert "controller_addresses" in message and "fsx_dns_name and fsx_mount_name" in message
    assert "Outputs present: backend" in message


def test_other_backends_keep_the_offline_inventory(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    onprem = shipped_platforms["onprem"]
    assert stack_inventory_documents(onprem, {"backend": "onprem"}) == inventory_documents(onprem)


@pytest.mark.parametrize("stack", ["aws-prod", "local"])
def test_ansible_waits_for_a_replica_as_long_as_it_may_take_to_load(
    stack: str, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    """The role's own default (600 s) is shorter than the start budget of a large model (at least
    1200 s): the play would fail a replica that is still loading."""
    platform = shipped_platforms[stack]
    assert platform.spec.serving is not None and platform.serving_layout is not None
    budget = startup_budget_s(
        platform.spec.serving, platform.serving_layout, platform.pool(platform.spec.serving.pool).node_type
    )
    assert platform_vars(platform)["inference_server_health_timeout_s"] == budget >= 1200
