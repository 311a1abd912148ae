"""The stack selection every command shares: --stack NAME or --stack-file PATH."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infra.errors import SpecError
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import stack_file

StackName = Annotated[
    str | None, typer.Option("--stack", "-s", metavar="NAME", help="stack name: stacks/Pulumi.NAME.yaml")
]
StackFile = Annotated[
    Path | None, typer.Option("--stack-file", metavar="PATH", help="path of a stack file to read instead")
]
JsonFlag = Annotated[bool, typer.Option("--json", help="print JSON instead of tables")]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="a value over the stack file's, e.g. budget.max_gpus=64 or pools[infer].max=12 (repeatable)",
    ),
]


def stack_path(stack: str | None, stack_file_path: Path | None) -> Path:
    if stack and stack_file_path:
        raise SpecError("give --stack or --stack-file, not both")
    if stack_file_path:
        return stack_file_path
    if stack:
        return stack_file(stack)
    raise SpecError("name a stack: --stack NAME (see `gpuplat stacks`) or --stack-file PATH")


def platform_from_options(
    stack: str | None, stack_file_path: Path | None, overrides: list[str] | None = None
) -> ResolvedPlatform:
    return load_platform(stack_path(stack, stack_file_path), overrides or ())


def read_log(path: Path) -> str:
    """A job's or a tool's log as text (undecodable bytes replaced); unreadable: bad input, exit 2."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the log ({exc.strerror})") from exc
