"""Commands that write a directory of files (--output DIR): all or nothing, never over an existing
directory's files without --force."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from infra.errors import GpuPlatError, SpecError

Force = Annotated[bool, typer.Option("--force", help="replace the directory if it exists")]


def write_tree(directory: Path, files: dict[str, str], replace: bool, what: str) -> None:
    """Write every file into a new directory beside `directory`, then move it into place: an error
    leaves the old directory as it was and nothing half-written."""
    if directory.exists() and not directory.is_dir():
        raise SpecError(f"--output {directory}: exists and is not a directory")
    if directory.exists() and any(directory.iterdir()) and not replace:
        raise SpecError(
            f"--output {directory}: the directory exists and is not empty; give --force to replace it, or "
            "another directory"
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        for name, text in files.items():
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise GpuPlatError(f"--output {directory}: cannot write {what} ({exc.strerror})") from exc
