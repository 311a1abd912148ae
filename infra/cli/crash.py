"""What the CLI does with an error nobody foresaw: the traceback goes to a log file, the terminal gets one
line naming that file.

The file lies in the user's state directory, $XDG_STATE_HOME/gpuplat/logs (default
~/.local/state/gpuplat/logs, the XDG Base Directory place for logs), else in the system's temporary
directory.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

_MAX_SUMMARY = 200


def crash_log_dirs() -> list[Path]:
    """Where a crash log may go, first choice first."""
    state = os.environ.get("XDG_STATE_HOME")
    dirs = []
    with contextlib.suppress(RuntimeError):  # RuntimeError: no home directory to be found
        dirs.append(Path(state) if state else Path.home() / ".local" / "state")
    return [d / "gpuplat" / "logs" for d in dirs] + [Path(tempfile.gettempdir())]


def write_crash_log(exc: BaseException, args: Sequence[str]) -> Path | None:
    """A new file holding the command line and the full traceback; None when no directory takes it."""
    text = (
        f"gpuplat {' '.join(args)}\n"
        f"{time.strftime('%Y-%m-%d %H:%M:%S %z')}, Python {sys.version.split()[0]}\n\n"
        + "".join(traceback.format_exception(exc))
    )
    for directory in crash_log_dirs():
        try:
            directory.mkdir(parents=True, exist_ok=True)
            handle, name = tempfile.mkstemp(
                prefix=time.strftime("gpuplat-crash-%Y%m%d-%H%M%S-"), suffix=".log", dir=directory
            )
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                stream.write(text)
            return Path(name)
        except OSError:
            continue
    return None


def crash_summary(exc: BaseException, log: Path | None) -> str:
    """One line: what broke and where the traceback is."""
    detail = " ".join(str(exc).split())
    if len(detail) > _MAX_SUMMARY:
        detail = detail[:_MAX_SUMMARY] + "..."
    where = f"the full traceback is in {log}" if log else "no log file could be written"
    return f"unexpected {type(exc).__name__}{f': {detail}' if detail else ''} (a gpuplat bug; {where})"
