"""The commands' state files (<state_dir>, /var/lib/gpuplat): JSON objects, replaced atomically."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from .logs import LOG

T = TypeVar("T")


def read_state(path: Path) -> dict[str, Any]:
    """The JSON object in the file; empty when it is missing or unreadable (logged)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        LOG.warning("cannot read the state file %s (%s); starting afresh", path, err)
        return {}
    return data if isinstance(data, dict) else {}


def write_state(path: Path, data: dict[str, Any]) -> bool:
    """Replace the file atomically; False (logged) when it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(path.name + ".new")
        scratch.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        scratch.replace(path)
    except OSError as err:
        LOG.error("cannot write the state file %s: %s", path, err)
        return False
    return True


def number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside the file (`<file>.lock`): resume, resume-fail and reconcile all change
    the pools' state, several resumes at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_name(path.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update_state(path: Path, change: Callable[[dict[str, Any]], T]) -> tuple[T, bool]:
    """Read, change (in place) and write the file under its lock; the change's result, and whether the
    file was written (False, logged, when the lock or the file could not be had: the change still
    applies to what was read)."""
    try:
        with locked(path):
            data = read_state(path)
            result = change(data)
            return result, write_state(path, data)
    except OSError as err:
        LOG.error("cannot lock the state file %s: %s", path, err)
        data = read_state(path)
        return change(data), False
