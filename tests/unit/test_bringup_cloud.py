"""`gpuplat up`, `down` and `status` on an aws stack: the preview is shown and approved before `pulumi up`
(--yes, or the user's answer; no terminal and no --yes refuses), Pulumi's lines stream, and after `pulumi
up` the inventory carries the stack's outputs (the FSx mount source, every controller's address, the SSM
transfer bucket), not the offline view's blanks.

The Pulumi CLI cannot be installed here: a stand-in for the Automation API's Stack answers `preview()`
with a change summary, `up()` with the outputs the aws program exports (infra/backends/aws/__init__.py)
as OutputValue objects, and records what was called. Without the CLI the commands exit 3 (checked
through the real entry point)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from infra.errors import ExitCode, GpuPlatError, SpecError
from infra.lifecycle import bringup, cloud_stack, fleet
from infra.lifecycle.bringup import CloudApproval
from infra.nodes.inventory import aws_ec2_config, platform_vars
from infra.nodes.playbook_run import PlaybookRun
from infra.platform.resolve import ResolvedPlatform, load_platform
from tests.unit.test_cli import gpuplat

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
    limits: list[list[str] | None] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    change_summary: dict[str, int] = field(default_factory=lambda: {"create": 212, "same": 0})
    config_files: list[str] = field(default_factory=list)
    environments: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> StandIn:
    """The Automation API, the playbooks and the validation replaced (the state directory in tmp_path)."""
    from pulumi import automation

    state = StandIn()

    class Stack:
        def __init__(self, platform: ResolvedPlatform) -> None:
            self.platform = platform
            self.name = platform.name

        def preview(self, diff: bool | None = None, on_output: Any = None, config_file: str = "") -> Any:
            state.calls.append(f"preview diff={diff}")
            state.config_files.append(config_file)
            on_output("+ aws:ec2/vpc:Vpc aws-prod-vpc create")
            return SimpleNamespace(change_summary=dict(state.change_summary))

        def up(self, diff: bool | None = None, on_output: Any = None, config_file: str = "") -> Any:
            state.calls.append("up")
            state.config_files.append(config_file)
            on_output("Resources: + 212 created")
            outputs = program_outputs(self.platform)
            return SimpleNamespace(
                outputs={key: automation.OutputValue(value, False) for key, value in outputs.items()}
            )

    def create_or_select_stack(stack_name: str, work_dir: str, opts: Any) -> Stack:
        state.environments.append(dict(opts.env_vars))
        return Stack(state.platforms[stack_name])

    def run_playbook(playbook: str, inventory: Path, log_dir: Path, **options: Any) -> PlaybookRun:
        # Cloud and existing hosts are not this machine's containers: never Mitogen's setns into them.
        assert not options.get("containers"), playbook
        state.playbooks.append(playbook)
        state.limits.append(options.get("limit"))
        return PlaybookRun(playbook, 0, [], log_dir / "site.log")

    def validate(platform: ResolvedPlatform, options: Any) -> Any:
        return SimpleNamespace(passed=True, failing_nodes={}, results_dir=tmp_path / "raw")

    monkeypatch.setattr(cloud_stack.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(automation, "create_or_select_stack", create_or_select_stack)
    monkeypatch.setattr(bringup, "run_playbook", run_playbook)

    def start_fleet(platform: ResolvedPlatform) -> str:
        state.calls.append("start fleet")
        return "fleet started"

    monkeypatch.setattr(fleet, "start_fleet", start_fleet)
    monkeypatch.setenv("GPUPLAT_STATE_DIR", str(tmp_path))
    monkeypatch.setattr("infra.validate.run.validate", validate)
    return state


def up(platform: ResolvedPlatform, lines: list[str], **approval: Any) -> bringup.UpResult:
    return bringup.up(
        platform,
        lambda name, hint: None,
        lambda timing: None,
        CloudApproval(on_line=lines.append, **approval),
    )


def test_up_writes_the_inventory_with_the_stack_outputs(
    stand_in: StandIn, shipped_platforms: dict[str, ResolvedPlatform], tmp_path: Path
) -> None:
    platform = shipped_platforms["aws-prod"]
    stand_in.platforms[platform.name] = platform
    lines: list[str] = []
    result = up(platform, lines, yes=True)

    assert [p.name for p in result.phases] == ["preview", "pulumi up", "inventory", "configure", "validate"]
    # a `gpuplat down` that did not finish left the fleet stopped: `up` starts it again after pulumi up
    assert stand_in.calls == ["preview diff=True", "up", "start fleet"]
    assert lines == ["+ aws:ec2/vpc:Vpc aws-prod-vpc create", "Resources: + 212 created"]
    assert result.phases[0].summary == "212 to create"
    assert stand_in.playbooks == ["site.yml"]
    # Slurm's training nodes are not configured again under their jobs (outdated.py drains them instead)
    assert stand_in.limits == [["all", "!slurm_compute"]]
    inventory = tmp_path / platform.name / "inventory"
    all_vars = yaml.safe_load((inventory / "group_vars" / "all.yml").read_text())
    assert all_vars["shared_fs_source"] == f"{FSX_DNS}@tcp:/{FSX_MOUNT}"
    assert all_vars["gpuplat_controller_addresses"] == ADDRESSES
    assert all_vars["slurm_elastic_pools"]["train-spot"]["launch_template_id"] == "lt-0abc"
    assert all_vars["slurm_controllers"] == ["head-0", "head-1"]  # the offline values stay
    plugin = yaml.safe_load((inventory / "aws_ec2.yml").read_text())
    assert plugin["compose"]["ansible_aws_ssm_bucket_name"] == repr(SSM_BUCKET)


def test_without_a_terminal_and_without_yes_nothing_is_applied(
    stand_in: StandIn, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    platform = shipped_platforms["aws-prod"]
    stand_in.platforms[platform.name] = platform
    with pytest.raises(SpecError) as refused:
        up(platform, [], yes=False, ask=None)
    assert refused.value.exit_code == ExitCode.BAD_INPUT
    assert "pulumi up on stack aws-prod: 212 to create" in refused.value.message
    assert "give --yes" in refused.value.message
    assert stand_in.calls == ["preview diff=True"] and stand_in.playbooks == []


def test_a_declined_preview_applies_nothing_and_an_accepted_one_applies(
    stand_in: StandIn, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    platform = shipped_platforms["aws-prod"]
    stand_in.platforms[platform.name] = platform
    questions: list[str] = []
    with pytest.raises(GpuPlatError, match="declined: nothing was changed"):
        up(platform, [], ask=lambda question: questions.append(question) is not None)
    assert stand_in.calls == ["preview diff=True"]
    assert questions == ["pulumi up on stack aws-prod: 212 to create. Go on?"]
    up(platform, [], ask=lambda question: True)
    assert stand_in.calls[-3:] == ["preview diff=True", "up", "start fleet"]


def test_a_preview_without_changes_asks_nothing(
    stand_in: StandIn, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    """Nothing to change: `up` runs without approval (it reads the outputs and configures the nodes)."""
    platform = shipped_platforms["aws-prod"]
    stand_in.platforms[platform.name] = platform
    stand_in.change_summary = {"same": 212}
    result = up(platform, [], ask=None)
    # a stack already up still gets its fleet started (a failed `down` changed no Pulumi resource)
    assert stand_in.calls == ["preview diff=True", "up", "start fleet"]
    assert result.phases[0].summary == "no changes; 212 unchanged"


def test_automation_api_outputs_become_plain_values() -> None:
    from pulumi import automation

    outputs = {"a": automation.OutputValue({"x": 1}, False), "b": automation.OutputValue("s", True)}
    assert cloud_stack.plain_outputs(outputs) == {"a": {"x": 1}, "b": "s"}


@pytest.mark.parametrize(
    "command",
    [
        ["up", "--stack", "aws-prod", "--yes"],
        ["status", "--stack", "aws-prod"],
        ["down", "--stack", "aws-prod"],
        ["list"],
        ["plan", "--stack", "aws-prod", "--deployed"],
    ],
)
def test_cloud_commands_without_the_pulumi_cli_exit_3_with_the_install_command(command: list[str]) -> None:
    result = gpuplat(*command)  # PATH=/usr/bin:/bin: no pulumi
    assert result.returncode == 3, result.stderr
    assert "get.pulumi.com" in result.stderr and "Traceback" not in result.stderr


def test_a_stack_file_elsewhere_is_what_pulumi_deploys(
    stand_in: StandIn, write_stack: Callable[..., Path]
) -> None:
    """`up --stack-file /elsewhere/Pulumi.aws-prod.yaml`: every Pulumi operation reads that file (its
    --config-file), and the program is told its path, not stacks/Pulumi.aws-prod.yaml of the same name."""
    path = write_stack("aws-prod", lambda spec: None, name="aws-prod")
    platform = load_platform(path)
    stand_in.platforms[platform.name] = platform
    up(platform, [], yes=True)
    assert stand_in.config_files == [str(path.resolve())] * 2  # preview and up
    assert stand_in.environments == [{"GPUPLAT_STACK_FILE": str(path.resolve())}]
