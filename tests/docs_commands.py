"""The shell blocks of the README and the manual that a user types against the local platform.

A block is marked by the line `<!-- gpuplat:run local -->` right before its fence (a plain or `bash`
fence: commands only, no prompts or output). The integration tier runs every marked block verbatim on
its cluster, in the order of the pages (`PAGES`) and of the blocks in each, from the repository's root
with the venv's commands on PATH, as a user who followed the README's `make up` would have them
(tests/integration/test_local_platform.py, test_the_documented_commands_run_as_written). Identical
blocks (the README repeats a guide's first command) run once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = "<!-- gpuplat:run local -->"
OPENING_FENCE = re.compile(r"^(```|~~~)\s*(bash|sh|shell)?\s*$")


class MarkError(ValueError):
    """A mark that names no block the runner can run."""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the mark, 1-based
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    for index, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        where = f"{page}:{index + 1}"
        fence = OPENING_FENCE.match(lines[index + 1]) if index + 1 < len(lines) else None
        if fence is None:
            raise MarkError(f"{where}: the mark must be followed by a ``` or ```bash fence on the next line")
        closing = next(
            (end for end in range(index + 2, len(lines)) if lines[end].strip() == fence.group(1)), None
        )
        if closing is None:
            raise MarkError(f"{where}: the marked block has no closing {fence.group(1)}")
        text = "\n".join(lines[index + 2 : closing]).strip()
        if not text:
            raise MarkError(f"{where}: the marked block is empty")
        found.append(Block(page, index + 1, text + "\n"))
    return found


def marked_blocks(pages: list[Path] | None = None) -> list[Block]:
    """Every marked block, in page order, each distinct text once (at its first place)."""
    seen: set[str] = set()
    distinct = []
    for page in pages or PAGES:
        for block in blocks_of(page):
            if block.text not in seen:
                seen.add(block.text)
                distinct.append(block)
    return distinct


SUBMITTED = re.compile(r"^Submitted batch job (\d+)$", re.MULTILINE)


def submitted_jobs(output: str) -> list[int]:
    """The Slurm jobs a block's output says it submitted (sbatch's own line)."""
    return [int(job) for job in SUBMITTED.findall(output)]
