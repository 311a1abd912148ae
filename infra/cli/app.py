"""The `gpuplat` command: a thin Typer app; the work lives in library modules."""

from __future__ import annotations

import sys

import typer

from infra.cli import output
from infra.cli.commands.check import check
from infra.cli.commands.inventory import inventory
from infra.cli.commands.lifecycle import down, scale, status, up
from infra.cli.commands.manifests import manifests
from infra.cli.commands.plan import plan
from infra.cli.commands.size import size
from infra.cli.commands.stacks import stacks
from infra.errors import GpuPlatError
from infra.plan.record import release_event_loops

app = typer.Typer(
    name="gpuplat",
    help="Plan, check, size and bring up a GPU AI platform (training and inference) as code.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(stacks)
app.command()(plan)
app.command()(check)
app.command()(size)
app.command()(inventory)
app.command()(up)
app.command()(down)
app.command()(status)
app.command()(scale)
app.command()(manifests)


def main() -> None:
    """Run the app; usage errors exit 2 (click), domain errors print one paragraph and their exit code."""
    try:
        app()
    except GpuPlatError as exc:
        output.error(exc.message)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        output.error("interrupted")
        sys.exit(130)
    finally:
        release_event_loops()
