"""The upstream data stored for the tests: every file listed in its folder's SOURCES.md with the sha256
of the stored bytes, and nothing stored that is not listed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.upstream import UPSTREAM

NOT_DATA = {"SOURCES.md", "README.md"}


def listed_checksums(sources: Path) -> dict[str, str]:
    """file -> sha256, from the table rows of SOURCES.md (first cell the file, last the checksum)."""
    found = {}
    for line in sources.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and len(cells[-1]) == 64 and cells[0] not in ("file", ""):
            found[cells[0]] = cells[-1]
    return found


@pytest.mark.parametrize("folder", sorted(p.name for p in UPSTREAM.iterdir() if p.is_dir()))
def test_every_stored_file_is_listed_with_its_checksum(folder: str) -> None:
    directory = UPSTREAM / folder
    listed = listed_checksums(directory / "SOURCES.md")
    stored = {p.name for p in directory.iterdir() if p.is_file() and p.name not in NOT_DATA}
    assert stored == set(listed), f"{directory}: stored but not listed {stored - set(listed)}, " + (
        f"listed but not stored {set(listed) - stored}"
    )
    for name, checksum in listed.items():
        assert hashlib.sha256((directory / name).read_bytes()).hexdigest() == checksum, f"{folder}/{name}"
