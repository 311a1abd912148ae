"""`gpuplat up | down | status`: bring a platform up, take the local one down, show what runs."""

from __future__ import annotations

import sys
from dataclasses import asdict, replace
from typing import Annotated

import typer

from infra.backends.local.cluster import LocalCluster
from infra.backends.local.host_caches import purge as purge_host_caches
from infra.backends.local.scale import forget_sizes, scale_pool, with_running_sizes
from infra.backends.local.status import PlatformStatus, collect_status
from infra.cli import output
from infra.cli.progress import ProgressPrinter
from infra.cli.stack_options import JsonFlag, StackFile, StackName, platform_from_options
from infra.errors import ExitCode, GpuPlatError, SpecError
from infra.lifecycle import cloud_stack
from infra.lifecycle.bringup import CloudApproval, PhaseTiming
from infra.lifecycle.bringup import up as bring_up
from infra.lifecycle.fleet import destroy_with_fleet, has_slurm_fleet
from infra.lifecycle.fleet_holds import fleet_holds
from infra.nodes.playbook_run import inventory_dir


def render_status(status: PlatformStatus) -> None:
    console = output.stdout()
    console.print(output.table(
        f"Nodes of {status.stack}",
        ["node", "pool", "role", "state", "address", "GPUs"],
        [[s.node.name, s.node.pool, s.node.role, s.state, s.address, s.node.gpus] for s in status.nodes],
    ))  # fmt: skip
    if status.partitions:
        console.print(output.table(
            "Slurm partitions", ["partition", "avail", "nodes", "GRES", "node state"],
            [[p.name, p.state, p.nodes, p.gres, p.node_states] for p in status.partitions],
        ))  # fmt: skip
    if status.services:
        console.print(output.table(
            "Services", ["node", "service", "state"], [[s.node, s.service, s.state] for s in status.services]
        ))  # fmt: skip
    for name, url in status.endpoints.items():
        console.print(f"{name}: {url}")
    for note in status.notes:
        console.print(f"note: {note}")


YesFlag = Annotated[bool, typer.Option("--yes", "-y", help="cloud stacks: go on without asking for approval")]
PurgeFlag = Annotated[
    bool,
    typer.Option(
        "--purge",
        help="local stacks: also remove what `down` keeps for the next `up` (the nodes' wheels and the "
        "Python environments archived from them)",
    ),
]


def _ask() -> cloud_stack.Ask | None:
    """A yes/no question on the terminal; None when stdin is not one (CI, a pipe): --yes is then needed."""
    if not sys.stdin.isatty():
        return None
    return lambda question: typer.confirm(question, default=False, err=True)


def _pulumi_line(line: str) -> None:
    output.stderr().out(f"  pulumi: {line.rstrip()}", highlight=False)


def up(
    stack: StackName = None,
    stack_file: StackFile = None,
    reconfigure: Annotated[
        bool, typer.Option(help="run the playbooks even when nothing changed since the last converge")
    ] = False,
    yes: YesFlag = False,
) -> None:
    """Bring the platform up: machines, inventory, playbooks/site.yml, validation, status. A cloud stack
    is previewed against what is deployed first, and applied after approval (or --yes)."""
    platform = platform_from_options(stack, stack_file)
    err = output.stderr()

    progress = ProgressPrinter(err)

    def started(name: str, hint: str) -> None:
        err.print(f"▶ {name} ..." + (f" ({hint})" if hint else ""))

    def done(phase: PhaseTiming) -> None:
        progress.close()
        err.print(f"✓ {phase.name} ({phase.seconds:.1f} s): {phase.summary}")

    try:
        approval = CloudApproval(on_line=_pulumi_line, yes=yes, ask=_ask())
        result = bring_up(platform, started, done, approval, reconfigure, progress)
    finally:
        progress.close()
    total = sum(p.seconds for p in result.phases)
    err.print(f"{platform.name} is up in {total:.1f} s ({result.changes} change(s)).")
    if result.status is not None:
        render_status(result.status)


def down(
    stack: StackName = None, stack_file: StackFile = None, yes: YesFlag = False, purge: PurgeFlag = False
) -> None:
    """Take the platform down: the local platform's containers, network and volume, or every resource of
    a cloud stack (`pulumi destroy`, after approval or --yes); on an aws Slurm stack the instances Slurm
    launched are terminated first, until none is left."""
    platform = platform_from_options(stack, stack_file)
    err = output.stderr()
    if purge and platform.spec.backend != "local":
        raise SpecError(
            f"gpuplat down --purge: stack {platform.name} has backend {platform.spec.backend}; --purge "
            "removes what a local stack keeps on this host between `down` and `up`, and only local stacks "
            "keep any. "
            "Run `gpuplat down` without it."
        )
    if platform.spec.backend == "local":
        cluster = LocalCluster(with_running_sizes(platform))
        removed = cluster.destroy()
        forget_sizes(cluster.platform)
        if purge:
            removed += purge_host_caches(platform.name)
        err.print(f"removed {len(removed)}: {', '.join(removed) if removed else 'nothing was there'}")
        return
    deployed = cloud_stack.open_stack(platform, "`gpuplat down`", create=False)
    what = "the instances Slurm launched, then " if has_slurm_fleet(platform) else ""
    cloud_stack.approve(f"{what}pulumi destroy: every resource of stack {platform.name}", yes=yes, ask=_ask())
    result = destroy_with_fleet(platform, lambda: cloud_stack.destroy(deployed, _pulumi_line), _fleet_line)
    err.print(f"{platform.name}: {result}", markup=False)


def _fleet_line(line: str) -> None:
    output.stderr().out(f"  fleet: {line}", highlight=False)


def status(stack: StackName = None, stack_file: StackFile = None, json_output: JsonFlag = False) -> None:
    """Show what runs: the local platform's nodes, Slurm partitions, services and endpoints, or a cloud
    stack's last update and outputs (from the Pulumi backend)."""
    platform = platform_from_options(stack, stack_file)
    state: PlatformStatus | cloud_stack.CloudStatus
    if platform.spec.backend == "local":
        state = collect_status(LocalCluster(with_running_sizes(platform)))
    else:
        state = cloud_stack.status(cloud_stack.open_stack(platform, "`gpuplat status`", create=False))
        if has_slurm_fleet(platform):
            state = replace(state, holds=fleet_holds(platform))
    if json_output:
        output.print_json(asdict(state))
    elif isinstance(state, PlatformStatus):
        render_status(state)
    else:
        render_cloud_status(state)


def render_cloud_status(state: cloud_stack.CloudStatus) -> None:
    console = output.stdout()
    console.print(
        f"Stack {state.stack}: last update {state.last_update or 'never'} "
        f"({state.last_result or 'no result'}); resources changed then: {state.resource_changes or 'none'}",
        markup=False,
    )
    console.print(output.table("Outputs", ["output", "value"], [[k, v] for k, v in state.outputs.items()]))
    if state.holds is None:
        return
    if state.holds.note:
        output.stderr().print(state.holds.note, markup=False)
    if state.holds.pools:
        console.print(output.table(
            "Training pools (capacity cool-down, protected mode)", ["pool", "hold", "boot failures in a row"],
            [[h.pool, h.hold or "-", f"{h.boot_failures} of {h.protected_failure_count}"]
             for h in state.holds.pools],
        ))  # fmt: skip


def list_stacks(json_output: JsonFlag = False) -> None:
    """List the deployed cloud stacks of this project (the Pulumi backend's view)."""
    rows = cloud_stack.deployed_stacks()
    if json_output:
        output.print_json(rows)
        return
    output.stdout().print(output.table(
        "Deployed stacks", ["stack", "last update", "resources", "updating"],
        [[r["stack"], r["last_update"] or "-", r["resources"] if r["resources"] is not None else "-",
          "yes" if r["update_in_progress"] else "no"] for r in rows],
    ))  # fmt: skip


def _local_cluster(stack: str | None, stack_file: StackFile) -> LocalCluster:
    platform = platform_from_options(stack, stack_file)
    if platform.spec.backend != "local":
        raise GpuPlatError(
            f"stack {platform.name} has backend {platform.spec.backend}: its elastic pools scale by "
            "themselves between min and max (Slurm power saving launches and terminates the instances); to "
            f"change the bounds edit the stack file and run `gpuplat up --stack {platform.name}`.",
            exit_code=ExitCode.BAD_INPUT,
        )
    return LocalCluster(with_running_sizes(platform))


def scale(
    pool: Annotated[str, typer.Option(help="the elastic pool (min < max in the stack file)")],
    nodes: Annotated[int, typer.Option(help="how many nodes the pool runs, between its min and max")],
    stack: StackName = None,
    stack_file: StackFile = None,
) -> None:
    """Add or remove nodes of an elastic pool of the running local platform (a cloud node's join path)."""
    cluster = _local_cluster(stack, stack_file)
    platform = cluster.platform
    output.stderr().print(scale_pool(platform, pool, nodes, inventory_dir(platform.name)))
