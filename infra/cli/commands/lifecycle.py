"""`gpuplat up | down | status`: bring a platform up, take the local one down, show what runs."""

from __future__ import annotations

from typing import Annotated

import typer

from infra.bringup import PhaseTiming, inventory_dir
from infra.bringup import up as bring_up
from infra.cli import output
from infra.cli.progress import ProgressPrinter
from infra.cli.stack_options import JsonFlag, StackFile, StackName, platform_from_options
from infra.errors import ExitCode, GpuPlatError
from infra.local.cluster import LocalCluster
from infra.local.scale import forget_sizes, scale_pool, with_running_sizes
from infra.local.status import PlatformStatus, collect_status


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


def up(
    stack: StackName = None,
    stack_file: StackFile = None,
    reconfigure: Annotated[
        bool, typer.Option(help="run the playbooks even when nothing changed since the last converge")
    ] = False,
) -> None:
    """Bring the platform up: machines, inventory, playbooks/site.yml, validation, status."""
    platform = platform_from_options(stack, stack_file)
    err = output.stderr()

    progress = ProgressPrinter(err)

    def started(name: str, hint: str) -> None:
        err.print(f"▶ {name} ..." + (f" ({hint})" if hint else ""))

    def done(phase: PhaseTiming) -> None:
        progress.close()
        err.print(f"✓ {phase.name} ({phase.seconds:.1f} s): {phase.summary}")

    try:
        result = bring_up(platform, started, done, reconfigure, progress)
    finally:
        progress.close()
    total = sum(p.seconds for p in result.phases)
    err.print(f"{platform.name} is up in {total:.1f} s ({result.changes} change(s)).")
    if result.status is not None:
        render_status(result.status)


def _local_cluster(stack: str | None, stack_file: StackFile) -> LocalCluster:
    platform = platform_from_options(stack, stack_file)
    if platform.spec.backend != "local":
        raise GpuPlatError(
            f"stack {platform.name} has backend {platform.spec.backend}: `pulumi destroy -s {platform.name}` "
            "removes cloud resources, and `pulumi stack output` shows them; this command is for local "
            "stacks.",
            exit_code=ExitCode.BAD_INPUT,
        )
    return LocalCluster(with_running_sizes(platform))


def down(stack: StackName = None, stack_file: StackFile = None) -> None:
    """Remove the local platform's containers, network and volume."""
    cluster = _local_cluster(stack, stack_file)
    removed = cluster.destroy()
    forget_sizes(cluster.platform)
    output.stderr().print(f"removed {len(removed)}: {', '.join(removed) if removed else 'nothing was there'}")


def status(stack: StackName = None, stack_file: StackFile = None, json_output: JsonFlag = False) -> None:
    """Show nodes, Slurm partitions and GPUs, services and endpoints of the local platform."""
    state = collect_status(_local_cluster(stack, stack_file))
    if json_output:
        from dataclasses import asdict

        output.print_json(asdict(state))
        return
    render_status(state)


def scale(
    pool: Annotated[str, typer.Option(help="the elastic pool (min < max in the stack file)")],
    nodes: Annotated[int, typer.Option(help="how many nodes the pool runs, between its min and max")],
    stack: StackName = None,
    stack_file: StackFile = None,
) -> None:
    """Add or remove nodes of an elastic pool of the running local platform (a cloud node's join path)."""
    cluster = _local_cluster(stack, stack_file)
    platform = cluster.platform
    output.stderr().print(scale_pool(platform, pool, nodes, inventory_dir(platform)))
