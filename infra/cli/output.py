"""All terminal output of the CLI: tables and progress on stdout, errors on stderr, NO_COLOR respected."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

_NO_COLOR = bool(os.environ.get("NO_COLOR"))


_PIPE_WIDTH = 160


class ReaderTolerantStdout:
    """stdout that outlives its reader: once the reader has gone (`gpuplat plan | head -3`), writes are
    dropped and the command runs on to its own verdict and exit code, instead of failing with EPIPE."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._drop_the_rest()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop_the_rest()

    def _drop_the_rest(self) -> None:
        self.reader_gone = True
        try:
            descriptor = self._stream.fileno()
        except (OSError, ValueError):  # io.UnsupportedOperation: a stream with no descriptor behind it
            return
        # The interpreter flushes the real stream at exit: point its descriptor at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, descriptor)
        os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def stdout() -> Console:
    width = None if sys.stdout.isatty() else _PIPE_WIDTH
    return Console(no_color=_NO_COLOR, highlight=False, soft_wrap=True, width=width)


def stderr() -> Console:
    width = None if sys.stderr.isatty() else _PIPE_WIDTH
    return Console(stderr=True, no_color=_NO_COLOR, highlight=False, soft_wrap=True, width=width)


def chosen_format(requested: str | None, json_flag: bool, allowed: tuple[str, ...]) -> str:
    """--format (text when not given), with --json as its shorthand for json; --json beside another
    --format, or a format not in `allowed`, is bad input (exit 2)."""
    from infra.errors import SpecError

    if json_flag and requested not in (None, "json"):
        raise SpecError(f"--json and --format {requested} ask for two formats: give one of them")
    chosen = "json" if json_flag else requested or "text"
    if chosen not in allowed:
        raise SpecError(f"--format {chosen!r}: give one of {', '.join(allowed)}")
    return chosen


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
