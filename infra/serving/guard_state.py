"""Files the detached guard keeps on its gateway node, each written whole or not at all.

A file is written to a temporary beside it, flushed to the disk (fsync), renamed over the old one, and its
folder flushed so the rename itself is on the disk: rename(2) replaces an existing name atomically, no
process ever finding it missing (Linux man-pages, rename(2), DESCRIPTION: http://man.he.net/man2/renameat2;
the temporary is in the same folder, so on the same filesystem, as rename needs), so a reader
finds the old file or the new one, and a guard killed between any two of these steps (or its node losing
power after the rename) finds on its restart a whole file, never a half-written one. A temporary a killed
writer left behind is never read, and the next write replaces it.
Standard library only: the guard's node has Python and nothing of the CLI's dependencies.
"""

from __future__ import annotations

import json
import os
from typing import Any


def write_whole(path: str, data: dict[str, Any]) -> None:
    """`data` as JSON at `path` (folders made as needed, root's alone: 0700/0600)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, mode=0o700, exist_ok=True)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    encoded = json.dumps(data, sort_keys=True).encode()
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        while written < len(encoded):
            written += os.write(descriptor, encoded[written:])
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def read_whole(path: str) -> dict[str, Any] | None:
    """The file's JSON object (None: no such file)."""
    try:
        with open(path, encoding="utf-8") as opened:
            found = json.load(opened)
    except FileNotFoundError:
        return None
    if not isinstance(found, dict):
        raise ValueError(f"{path} holds no JSON object")
    return found
