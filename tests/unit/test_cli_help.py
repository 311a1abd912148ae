"""Every command's help in plain placeholders: no typer type tags (`<str>`, `<list[str]>`, `<int range>`)
and no braces or double brackets around arguments (`{LOG}`, `[[NAME]]`) in any usage line or row."""

from __future__ import annotations

import re

import typer

from infra.cli.app import app
from tests.unit.test_cli import gpuplat

# typer's tags (core.py display_type): <str>, <int range>, <list[str]>, <a|b> choices; not prose like
# `.gpuplat/<stack>/inventory`.
_TAG = re.compile(
    r"<(?:str|int|float|path|bool|datetime|list\[[a-z|]+\]|(?:int|float) range|[a-z0-9-]+(?:\|[a-z0-9-]+)+)>"
    r"|\{[A-Z][A-Z_@|-]*\}|\[\["
)


def _commands(command: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, sub in getattr(command, "commands", {}).items():
        found += _commands(sub, (*path, name))
    return found


def test_no_command_shows_a_type_tag_or_braces() -> None:
    paths = _commands(typer.main.get_command(app))
    assert len(paths) > 20
    for path in paths:
        result = gpuplat(*path, "--help")
        assert result.returncode == 0, (path, result.stderr)
        tags = _TAG.findall(result.stdout)
        assert not tags, (path, tags)
    usage = gpuplat("nccl-report", "--help").stdout.splitlines()[0]
    assert usage == "Usage: gpuplat nccl-report [OPTIONS] LOG"
    stack = gpuplat("plan", "--help").stdout
    assert "-s, --stack NAME" in stack and "--stack-file PATH" in stack and "--set KEY=VALUE" in stack
