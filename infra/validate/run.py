"""`gpuplat validate`: run playbooks/validate.yml on a running Slurm platform and judge what it measured.

The play checks every training node's health (draining the ones that fail), then per training pool
reads the parallel filesystem from all ready nodes at once, writes a checkpoint from each, and runs
all_reduce_perf within one node and across two. Its results, raw logs included, land in
.gpuplat/<stack>/validate/raw; the judged report beside them as report.json.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from infra.backends.local.cluster import LocalCluster
from infra.backends.local.scale import with_running_sizes
from infra.errors import EnvironmentProblem, SpecError
from infra.nodes.playbook_run import ansible_playbook_binary, inventory_dir, run_playbook, state_dir
from infra.platform.resolve import ResolvedPlatform
from infra.spec.load import stacks_dir
from infra.validate.cluster_results import CheckpointBudget, ClusterValidation, ScalingInputs, judge_cluster

PLAYBOOK = "validate.yml"
# DCGM's level 3 and 4 diagnostics alone run for tens of minutes; nccl-tests builds on first use.
PLAYBOOK_TIMEOUT_S = 4 * 3600
MIB_PER_GIB = 1024


@dataclass(frozen=True)
class ValidateOptions:
    inventory: Path | None = None
    dcgm_level: int = 2
    checkpoint_gib: float | None = None  # None: the role's default (16 GiB; 64 MiB on the local cluster)
    budget: CheckpointBudget = field(default_factory=CheckpointBudget)
    scaling: ScalingInputs | None = None


def validation_dir(platform: ResolvedPlatform) -> Path:
    return state_dir(platform.name) / "validate"


def stack_option(platform: ResolvedPlatform) -> str:
    """How the user names this stack on the command line, for messages that say what to run."""
    if platform.source.resolve() == (stacks_dir() / f"Pulumi.{platform.name}.yaml").resolve():
        return f"--stack {platform.name}"
    return f"--stack-file {platform.source}"


def check_validatable(platform: ResolvedPlatform) -> None:
    if platform.spec.scheduler.kind != "slurm":
        raise SpecError(
            f"stack {platform.name} schedules with {platform.spec.scheduler.kind} (scheduler.kind): `gpuplat "
            "validate` drives Slurm. On Kubernetes, run all_reduce_perf with NCCL_DEBUG=INFO as a JobSet and "
            "judge its log with `gpuplat nccl-report LOG --node-type TYPE`."
        )
    if not platform.pools_with_role("train"):
        raise SpecError(
            f"stack {platform.name} has no training pool (pools[].role: train): nothing to validate"
        )


def check_local_cluster_running(platform: ResolvedPlatform) -> None:
    cluster = LocalCluster(with_running_sizes(platform))
    down = [f"{state.node.name} ({state.state})" for state in cluster.states() if state.state != "running"]
    if down:
        raise EnvironmentProblem(
            f"the local cluster of stack {platform.name} is not running: {', '.join(down)}. Bring it up with "
            f"`gpuplat up {stack_option(platform)}` (a few minutes), then run `gpuplat validate` again."
        )


def check_inventory(platform: ResolvedPlatform, inventory: Path) -> None:
    if not inventory.exists():
        where = (
            f"`gpuplat up {stack_option(platform)}` writes it"
            if platform.spec.backend == "local"
            else "write it with `pulumi stack output inventory_config` (docs/aws.md) or "
            f"`gpuplat inventory {stack_option(platform)} --output DIR`, and give --inventory"
        )
        raise EnvironmentProblem(f"no inventory for stack {platform.name} at {inventory}: {where}.")


def extra_vars(options: ValidateOptions, results: Path) -> dict[str, str]:
    values = {"gpu_validation_report_dir": str(results), "gpu_validation_dcgm_level": str(options.dcgm_level)}
    if options.checkpoint_gib is not None:
        values["gpu_validation_checkpoint_mib"] = str(max(1, round(options.checkpoint_gib * MIB_PER_GIB)))
    return values


def validate(platform: ResolvedPlatform, options: ValidateOptions) -> ClusterValidation:
    """Run the play, judge its results, save report.json; raise GpuPlatError when it cannot run."""
    check_validatable(platform)
    inventory = options.inventory or inventory_dir(platform.name)
    ansible_playbook_binary()
    if platform.spec.backend == "local":
        check_local_cluster_running(platform)
    check_inventory(platform, inventory)
    directory = validation_dir(platform)
    results = directory / "raw"
    shutil.rmtree(results, ignore_errors=True)
    results.mkdir(parents=True)
    run_playbook(
        PLAYBOOK, inventory, directory, timeout=PLAYBOOK_TIMEOUT_S, extra_vars=extra_vars(options, results)
    )
    report = judge_cluster(platform, results, options.budget, options.scaling)
    (directory / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
    return report
