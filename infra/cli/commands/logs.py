"""`gpuplat logs NODE`: a node's systemd journal (a unit's, since a time), read on the node the way
`gpuplat ssh` reaches it, to stdout (redirect it to keep it)."""

from __future__ import annotations

import re
from typing import Annotated

import typer

from infra.cli.commands.ssh import PrintFlag, run_on_node
from infra.cli.stack_options import StackFile, StackName, platform_from_options
from infra.errors import SpecError
from infra.nodes.reach import node_command

# A systemd unit name (systemd.unit(5): letters, digits and :-_.\@); --since, a span back from now.
_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]+")
_SINCE = re.compile(r"\d+(s|min|h|d)")


def journal_command(unit: str | None, since: str, lines: int | None) -> list[str]:
    if unit is not None and not _UNIT.fullmatch(unit):
        raise SpecError(f"--unit {unit!r}: a systemd unit name (e.g. slurmd, slurmctld, gpuplat-gateway)")
    if not _SINCE.fullmatch(since):
        raise SpecError(f"--since {since!r}: give a time back from now: 30s, 15min, 2h or 1d")
    # systemd.time(7): a time relative to now is prefixed with "-"; one token, so no option parser
    # takes it for a flag.
    command = ["journalctl", "--no-pager", "--output", "short-iso", f"--since=-{since}"]
    if unit is not None:
        command += ["--unit", unit]
    if lines is not None:
        command += ["--lines", str(lines)]
    return command


def logs(
    node: Annotated[str, typer.Argument(metavar="NODE", help="the node's name, e.g. head-0 or train-1")],
    unit: Annotated[
        str | None, typer.Option(metavar="UNIT", help="one systemd unit, e.g. slurmd (default: all)")
    ] = None,
    since: Annotated[str, typer.Option(metavar="AGE", help="how far back: 30s, 15min, 2h, 1d")] = "1h",
    lines: Annotated[int | None, typer.Option(min=1, metavar="N", help="at most the last N lines")] = None,
    stack: StackName = None,
    stack_file: StackFile = None,
    print_only: PrintFlag = False,
) -> None:
    """Print NODE's journal (one unit's with --unit) since --since ago: read on the node through SSM on
    AWS, podman exec on the local platform, ssh on an on-prem host."""
    journal = journal_command(unit, since, lines)
    run_on_node(node_command(platform_from_options(stack, stack_file), node, journal), print_only)
