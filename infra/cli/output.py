"""All terminal output of the CLI: tables and progress on stdout, errors on stderr, NO_COLOR respected."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

_NO_COLOR = bool(os.environ.get("NO_COLOR"))


_PIPE_WIDTH = 160


def stdout() -> Console:
    width = None if sys.stdout.isatty() else _PIPE_WIDTH
    return Console(no_color=_NO_COLOR, highlight=False, soft_wrap=True, width=width)


def stderr() -> Console:
    width = None if sys.stderr.isatty() else _PIPE_WIDTH
    return Console(stderr=True, no_color=_NO_COLOR, highlight=False, soft_wrap=True, width=width)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def error(message: str) -> None:
    stderr().print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False)


def table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    result = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        result.add_column(column)
    for row in rows:
        result.add_row(*[str(cell) for cell in row])
    return result


def usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"
