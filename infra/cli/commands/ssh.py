"""`gpuplat ssh NODE`: a shell on one node of a stack (SSM on AWS, the container on the local platform,
ssh on listed hosts), or one command there."""

from __future__ import annotations

import os
import shlex
from typing import Annotated

import typer

from infra.cli import output
from infra.cli.stack_options import StackFile, StackName, platform_from_options
from infra.errors import EnvironmentProblem
from infra.nodes.reach import node_command

PrintFlag = Annotated[
    bool, typer.Option("--print", help="print the command that reaches the node instead of running it")
]


def ssh(
    node: Annotated[str, typer.Argument(metavar="NODE", help="the node's name, e.g. head-0 or train-1")],
    command: Annotated[
        list[str] | None, typer.Argument(metavar="COMMAND", help="run this instead of a shell")
    ] = None,
    stack: StackName = None,
    stack_file: StackFile = None,
    print_only: PrintFlag = False,
) -> None:
    """Open a shell on NODE, or run COMMAND there: an SSM session on AWS (the platform opens no SSH
    port), `podman exec` on the local platform, ssh to an on-prem host's address."""
    run_on_node(node_command(platform_from_options(stack, stack_file), node, command or []), print_only)


def run_on_node(argv: list[str], print_only: bool) -> None:
    """Become the command that reaches the node (its exit code is ours), or print it."""
    if print_only:
        output.stdout().out(shlex.join(argv), highlight=False)
        return
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        raise EnvironmentProblem(f"{argv[0]}: cannot run it ({exc.strerror})") from exc
