"""The shell blocks of the README and the manual that a user types against the local platform.

A block is marked by the line `<!-- gpuplat:run local -->` right before its fence (a plain or `bash`
fence: commands only, no prompts or output). The integration tier runs every marked block verbatim on
its cluster, in the order of the pages (`PAGES`) and of the blocks in each, from the repository's root
with the venv's commands on PATH, as a user who followed the README's `make up` would have them
(tests/integration/test_local_platform.py, test_the_documented_commands_run_as_written). Identical
blocks (the README repeats a guide's first command) run once.

`<!-- gpuplat:run local NAME -->` hands the block to the integration test that asks for it by NAME
(`named_block`), which runs it where its state is right and checks what it did (`validate`: the report
the command writes); the runner of unnamed blocks leaves it alone.

A marked ```console block is a transcript: each line that starts with `$ ` is a command (a command that
ends with `\\` goes on over the next line), every other line is what the command before it printed. The
commands are run, the output is the page's record of a real run (tests/docs_session.py runs a page's
console blocks in one shell, as one terminal, so variables carry from one block to the next).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = "<!-- gpuplat:run local -->"
MARK_LINE = re.compile(r"^<!-- gpuplat:run local(?: (?P<name>[a-z][a-z0-9-]*))? -->$")
OPENING_FENCE = re.compile(r"^(```|~~~)\s*(bash|sh|shell|console)?\s*$")
PROMPT = "$ "
FENCE_LINE = re.compile(r"^\s*(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"`[^`]*`")
NEAR_MARK = re.compile(r"<!--\s*gpuplat:run", re.IGNORECASE)


class MarkError(ValueError):
    """A mark that names no block the runner can run."""


@dataclass(frozen=True)
class Step:
    command: str
    shown: str  # the output the page shows for it


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the mark, 1-based
    text: str
    name: str | None = None
    # A console block's commands (continuation lines joined into their command), each with the output
    # the page shows under it; a plain block is one command without shown output.
    steps: tuple[Step, ...] = ()

    @property
    def commands(self) -> list[str]:
        return [step.command for step in self.steps] if self.steps else [self.text]

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The marked blocks of a page; marks shown inside another fence (an example of marking) are text."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    inside: str | None = None  # the fence of the unmarked block being read past
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if inside is not None:
            closes = re.fullmatch(rf"{inside[0]}{{{len(inside)},}}", line.strip())
            inside = None if closes else inside
            continue
        if fence_line := FENCE_LINE.match(line):
            inside = fence_line.group(1)
            continue
        mark = MARK_LINE.match(line.strip())
        where = f"{page}:{index}"
        if mark is None:
            if NEAR_MARK.search(INLINE_CODE.sub("", line)):  # a mark shown as `code` in prose is text
                named = "<!-- gpuplat:run local NAME -->"
                raise MarkError(f"{where}: a mark is a line of its own, `{MARK}` or `{named}`")
            continue
        fence = OPENING_FENCE.match(lines[index]) if index < len(lines) else None
        if fence is None:
            raise MarkError(
                f"{where}: the mark must be followed by a ```, ```bash or ```console fence on the next line"
            )
        closing = next((end for end in range(index + 1, len(lines)) if FENCE_LINE.match(lines[end])), None)
        if closing is None:
            raise MarkError(f"{where}: the marked block has no closing {fence.group(1)}")
        if lines[closing].strip() != fence.group(1):
            found_fence, opening = lines[closing].strip(), fence.group(1)
            raise MarkError(f"{where}: the marked block holds `{found_fence}` before its closing {opening}")
        body = lines[index + 1 : closing]
        text = "\n".join(body).strip()
        if not text:
            raise MarkError(f"{where}: the marked block is empty")
        if fence.group(2) == "console":
            steps = transcript(body, where)
            text = "".join(f"{step.command}\n" for step in steps)
            found.append(Block(page, index, text, mark.group("name"), steps))
            for step in steps:
                refuse_hidden_failures([step.command], where)
                if "<<" in _tokens(step.command):  # its body would be the lines the page shows as output
                    raise MarkError(
                        f"{where}: `{step.command}` reads a here-document, which a transcript "
                        "cannot hold (the lines under a command are its output): use a plain block"
                    )
        else:
            if prompted := next((line for line in body if line.startswith(PROMPT)), None):
                raise MarkError(
                    f"{where}: `{prompted}` in a ```{fence.group(2) or ''} block, which is run as a script: "
                    "a transcript with `$ ` prompts is a ```console block"
                )
            found.append(Block(page, index, text + "\n", mark.group("name")))
            refuse_hidden_failures(logical_lines(body), where, script=True)
        index = closing + 1
    return found


def transcript(body: list[str], where: str) -> tuple[Step, ...]:
    """A console block's commands (`$ ` lines, `\\` continuations joined) and the lines shown under each."""
    steps: list[tuple[list[str], list[str]]] = []
    continued = False
    for line in body:
        if continued:
            steps[-1][0].append(line)
        elif line.startswith(PROMPT):
            steps.append(([line.removeprefix(PROMPT)], []))
        elif not steps:
            if line.strip():
                first = f"{where}: a marked console block starts with a command (`$ ...`), not `{line}`"
                raise MarkError(first)
            continue
        else:
            steps[-1][1].append(line)
        continued = line.endswith("\\") and (continued or line.startswith(PROMPT))
    if continued:
        raise MarkError(f"{where}: the console block's last command ends with a `\\` and nothing follows")
    return tuple(Step("\n".join(command), "\n".join(shown)) for command, shown in steps)


# Commands whose failure the runners would not see: `|| true` and its kin always succeed, and `set +e` /
# `set +o pipefail` turn the runners' own checks off for what follows.
_HIDES_FAILURE = (("||", "true"), ("||", ":"), ("set", "+e"), ("set", "+o", "pipefail"))


def logical_lines(body: list[str]) -> list[str]:
    """A script's lines, each with the lines its trailing `\\` continues it over."""
    lines: list[str] = []
    continued = False
    for line in body:
        if continued:
            lines[-1] += "\n" + line
        else:
            lines.append(line)
        continued = line.endswith("\\")
    return [line for line in lines if line.strip()]


def _tokens(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        return list(lexer)
    except ValueError:  # quoting shlex cannot follow: bash itself judges the command
        return []


def refuse_hidden_failures(commands: list[str], where: str, script: bool = False) -> None:
    """A marked block's commands must fail where they fail. Besides `_HIDES_FAILURE`: in a script (a plain
    block, run whole by `bash -e`), an `&&` or `||` list before the last line, whose failing left side
    bash -e does not stop at (the script goes on and may end well); a console block's commands are
    judged one by one, by their status (tests/docs_session.py)."""
    for number, command in enumerate(commands, start=1):
        tokens = _tokens(command)
        for hiding in _HIDES_FAILURE:
            if any(tuple(tokens[i : i + len(hiding)]) == hiding for i in range(len(tokens))):
                pattern = " ".join(hiding)
                raise MarkError(
                    f"{where}: `{command}` hides a failure (`{pattern}`): a marked block's "
                    "commands fail where they fail"
                )
        if script and number < len(commands) and {"&&", "||"} & set(tokens):
            raise MarkError(
                f"{where}: `{command}` is an && or || list before the block's last line: bash -e goes on "
                "when its left side fails; put its commands on lines of their own, or end the block with it"
            )


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


def named_block(name: str, pages: list[Path] | None = None) -> Block:
    """The one block handed to the test that asks for `name` (blocks of that name must be identical)."""
    named = [block for block in marked_blocks(pages) if block.name == name]
    if len(named) != 1:
        places = ", ".join(block.where for block in named) or "none"
        raise MarkError(f"one block is marked for '{name}', distinct blocks found: {places}")
    return named[0]


SUBMITTED = re.compile(r"^Submitted batch job (\d+)$", re.MULTILINE)


def submitted_jobs(output: str) -> list[int]:
    """The Slurm jobs a block's output says it submitted (sbatch's own line)."""
    return [int(job) for job in SUBMITTED.findall(output)]
