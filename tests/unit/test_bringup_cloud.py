"""`gpuplat up` on an aws stack: after `pulumi up` the inventory carries the stack's outputs (the FSx
mount source, every controller's address, the SSM transfer bucket), not the offline view's blanks.

The Pulumi CLI is not installed here: a stand-in for the Automation API's stack answers `up()` with the
outputs the aws program exports (infra/backends/aws/__init__.py), as OutputValue objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from infra import bringup
from infra.ansible import PlaybookRun
from infra.inventory import aws_ec2_config, platform_vars
from infra.resolve import ResolvedPlatform

FSX_DNS = "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com"
FSX_MOUNT = "abcdefgh"
ADDRESSES = {"head-0": "10.64.0.10", "head-1": "10.64.1.11"}
SSM_BUCKET = "aws-prod-ssm-transfer-1a2b3c"


def program_outputs(platform: ResolvedPlatform) -> dict[str, Any]:
    """What `pulumi up` of the aws program exports that the inventory needs."""
    return {
        "backend": "aws",
        "fsx_dns_name": FSX_DNS,
        "fsx_mount_name": FSX_MOUNT,
        "controller_addresses": ADDRESSES,
        "inventory_config": aws_ec2_config(platform, SSM_BUCKET),
        "group_vars": {
            **platform_vars(platform),
            "gpuplat_region": "us-east-1",
            "gpuplat_controller_addresses": ADDRESSES,
            "shared_fs_source": f"{FSX_DNS}@tcp:/{FSX_MOUNT}",
            "slurm_elastic_stack": platform.name,
            "slurm_elastic_region": "us-east-1",
            "slurm_elastic_pools": {"train-spot": {"launch_template_id": "lt-0abc", "subnet_id": None}},
        },
    }


@dataclass
class StandIn:
    platforms: dict[str, ResolvedPlatform] = field(default_factory=dict)
    playbooks: list[str] = field(default_factory=list)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> StandIn:
    """The Automation API, the playbooks and the validation replaced (the state directory in tmp_path)."""
    from pulumi import automation

    state = StandIn()

    class Stack:
        def __init__(self, platform: ResolvedPlatform) -> None:
            self.platform = platform

        def up(self, on_output: Any = None) -> Any:
            outputs = program_outputs(self.platform)
            return SimpleNamespace(
                outputs={key: automation.OutputValue(value, False) for key, value in outputs.items()}
            )

    def create_or_select_stack(stack_name: str, work_dir: str) -> Stack:
        return Stack(state.platforms[stack_name])

    def run_playbook(playbook: str, inventory: Path, log_dir: Path, **_: Any) -> PlaybookRun:
        state.playbooks.append(playbook)
        return PlaybookRun(playbook, 0, [], log_dir / "site.log")

    def validate(platform: ResolvedPlatform, options: Any) -> Any:
        return SimpleNamespace(passed=True, failing_nodes={}, results_dir=tmp_path / "raw")

    monkeypatch.setattr(bringup.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(automation, "create_or_select_stack", create_or_select_stack)
    monkeypatch.setattr(bringup, "run_playbook", run_playbook)
    monkeypatch.setattr(bringup, "state_dir", lambda stack: tmp_path / stack)
    monkeypatch.setattr("infra.validate.run.validate", validate)
    return state


def test_up_writes_the_inventory_with_the_stack_outputs(
    stand_in: StandIn, shipped_platforms: dict[str, ResolvedPlatform], tmp_path: Path
) -> None:
    platform = shipped_platforms["aws-prod"]
    stand_in.platforms[platform.name] = platform
    result = bringup.up(platform, lambda name, hint: None, lambda timing: None)

    assert [p.name for p in result.phases] == ["pulumi up", "inventory", "configure", "validate"]
    assert stand_in.playbooks == ["site.yml"]
    inventory = tmp_path / platform.name / "inventory"
    all_vars = yaml.safe_load((inventory / "group_vars" / "all.yml").read_text())
    assert all_vars["shared_fs_source"] == f"{FSX_DNS}@tcp:/{FSX_MOUNT}"
    assert all_vars["gpuplat_controller_addresses"] == ADDRESSES
    assert all_vars["slurm_elastic_pools"]["train-spot"]["launch_template_id"] == "lt-0abc"
    assert all_vars["slurm_controllers"] == ["head-0", "head-1"]  # the offline values stay
    plugin = yaml.safe_load((inventory / "aws_ec2.yml").read_text())
    assert plugin["compose"]["ansible_aws_ssm_bucket_name"] == repr(SSM_BUCKET)


def test_automation_api_outputs_become_plain_values() -> None:
    from pulumi import automation

    outputs = {"a": automation.OutputValue({"x": 1}, False), "b": automation.OutputValue("s", True)}
    assert bringup.stack_outputs(outputs) == {"a": {"x": 1}, "b": "s"}
