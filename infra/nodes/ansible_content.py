"""The project's Ansible content: ansible.cfg and the files of playbooks/ and roles/ that a node's
bootstrap bundle ships and a converge's outcome depends on. Caches that running the content leaves
behind (Python's __pycache__ next to a plugin) are not content: they must not make a bundle or a
converge look new."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

CONTENT_DIRECTORIES = ("playbooks", "roles")
# Where Ansible finds the roles and the connection plugins (relative to this file).
CONTENT_FILES = ("ansible.cfg",)
_NOT_CONTENT = frozenset({"__pycache__", ".pytest_cache"})


def _not_content(part: str) -> bool:
    """Caches and hidden files that tools leave (mypy's, ruff's, an editor's swap file): none is tracked
    under playbooks/ or roles/, and each would change the bundle digest, so every training node in
    service would be drained for a new definition (gpuplat_ec2_nodes/outdated.py)."""
    return part in _NOT_CONTENT or part.startswith(".")


def content_files(root: Path) -> list[Path]:
    files = [root / name for name in CONTENT_FILES if (root / name).is_file()]
    return sorted(
        files
        + [
            path
            for directory in CONTENT_DIRECTORIES
            for path in (root / directory).rglob("*")
            if path.is_file() and not any(_not_content(part) for part in path.relative_to(root).parts)
        ]
    )


def digest_content(digest: Any, root: Path, extra: Iterable[Path] = ()) -> None:
    """Feed `digest` (a hashlib object) every content file under `root`, and `extra`, by path and bytes."""
    for path in [*content_files(root), *extra]:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
