"""The `gpuplat` command: a thin Typer app; the work lives in library modules."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from importlib.metadata import version as package_version
from typing import Annotated, Any

import typer

from infra.cli import output
from infra.cli.commands.check import check
from infra.cli.commands.inventory import inventory
from infra.cli.commands.job_profile import job_profile_command
from infra.cli.commands.lifecycle import down, list_stacks, scale, status, up
from infra.cli.commands.logs import logs
from infra.cli.commands.manifests import manifests
from infra.cli.commands.models import models
from infra.cli.commands.nccl_report import nccl_report
from infra.cli.commands.plan import plan
from infra.cli.commands.serve import serve
from infra.cli.commands.size import size
from infra.cli.commands.ssh import ssh
from infra.cli.commands.stacks import stacks
from infra.cli.commands.validate import validate
from infra.cli.crash import crash_summary, write_crash_log
from infra.cli.help_text import plain_placeholders
from infra.errors import ExitCode, GpuPlatError
from infra.plan.event_loops import release_event_loops


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"gpuplat {package_version('gpu-platform')}")
        raise typer.Exit()


# click's own help layout: typer's rich panels print `<bool>` after every flag and `{log}` for arguments.
app = typer.Typer(
    name="gpuplat",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="print the version and exit"),
    ] = False,
) -> None:
    """Plan, check, size and bring up a GPU AI platform (training and inference) as code.

    Before deploying: `check` and `plan` (offline). After: `validate` proves a running cluster."""


app.command()(stacks)
app.command()(plan)
app.command()(check)
app.command()(size)
app.command()(inventory)
app.command()(up)
app.command()(down)
app.command()(status)
app.command("list")(list_stacks)
app.command()(scale)
app.command()(manifests)
app.command()(nccl_report)
app.command()(validate)
app.command("job-profile")(job_profile_command)
app.command()(ssh)
app.command()(logs)
app.add_typer(models)
app.add_typer(serve)


_INTERRUPTED = 130  # the shell's code for a command stopped by Ctrl-C (128 + SIGINT)

# click's usage error base class, from the click typer runs on (typer 0.29 vendors its own copy of click,
# so `click.ClickException` would not match).
_USAGE_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def usage_message(exc: Exception) -> str:
    """click's message of a usage error, with the command whose --help says more."""
    usage_error: Any = exc
    message = str(usage_error.format_message())
    context = getattr(usage_error, "ctx", None)
    if context is not None and getattr(context, "command_path", None):
        message += f" (see `{context.command_path} --help`)"
    return message


@functools.cache
def cli_command() -> Any:
    """The click command of `app` with plain placeholders, built once per process: typer reads every
    command's signature and annotations to build it (about 0.1 CPU-s), which a process calling `main`
    again (the tests, in process) would otherwise pay on every call. click keeps a call's state in the
    context it makes per call, none in the command."""
    command = typer.main.get_command(app)
    plain_placeholders(command)
    return command


def main(args: Sequence[str] | None = None) -> None:
    """Run the app and turn every way it can end into one of the documented exit codes (0 ok, 1 policy
    violation, 2 bad input, 3 missing tool or host setting, 4 failure, 5 an analysis without a verdict to
    act on: a canary's guard inconclusive, cut short or unable to look) and at most one paragraph on
    stderr; never a traceback."""
    argv = list(sys.argv[1:] if args is None else args)
    if not isinstance(sys.stdout, output.ReaderTolerantStdout):
        sys.stdout = output.ReaderTolerantStdout(sys.stdout)
    try:
        code = cli_command().main(args=argv, prog_name="gpuplat", standalone_mode=False)
    except GpuPlatError as exc:
        output.error(exc.message)
        sys.exit(int(exc.exit_code))
    except _USAGE_ERROR as exc:  # unknown flag, bad option value, missing option: in the tool's one style
        if type(exc).__name__ == "NoArgsIsHelpError":  # `gpuplat` alone, or a group alone: its help
            sys.stderr.write(str(getattr(exc, "format_message", lambda: "")()) + "\n")
        else:
            output.error(usage_message(exc))
        sys.exit(int(ExitCode.BAD_INPUT))
    except (KeyboardInterrupt, typer.Abort):
        output.error("interrupted")
        sys.exit(_INTERRUPTED)
    except SystemExit as exc:
        # Inside the app only click calls sys.exit, with 1 when its own output failed (stdout itself
        # tolerates a reader that left); 1 means a policy violation here, so that is a failure.
        sys.exit(int(ExitCode.FAILED) if exc.code == 1 else exc.code)
    except Exception as exc:
        output.error(crash_summary(exc, write_crash_log(exc, argv)))
        sys.exit(int(ExitCode.FAILED))
    finally:
        release_event_loops()
    sys.exit(code if isinstance(code, int) else int(ExitCode.OK))  # typer.Exit(n) returns n here
