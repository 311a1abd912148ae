"""A page's marked console blocks run as a user runs them: in one terminal, one command after another.

One bash (`-e -o pipefail`, as the runner of plain blocks) reads the commands of each block in turn, so
what one block sets (a job's ID in a variable, a process sent to the background with `&`) is there for
the next. Each command's own output is kept; the first command that fails ends the shell, and with it
the session: what ran after it in the page never runs. Every command reads /dev/null as its input (the
shell reads the commands from its own), and closing the session kills what its commands left running.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.docs_commands import Block

# The line the shell prints after each command that returned to it, with its status: its own line, which
# no command prints.
_DONE = "\x1egpuplat-session-command-done"
_DONE_LINE = re.compile(re.escape(_DONE) + r" (\d+)")
_SHELL_ENDED = 255  # the status of a command that ended the shell with 0 (it did not return to it)


@dataclass(frozen=True)
class Ran:
    command: str
    output: str
    status: int | None  # None: the session's time ran out while it ran


@dataclass
class BlockRun:
    block: Block
    ran: list[Ran] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return len(self.ran) == len(self.block.commands) and all(r.status == 0 for r in self.ran)

    def output(self, command: int) -> str:
        """What the block's command at index `command` printed."""
        return self.ran[command].output

    def report(self, tail: int | None = 3000) -> str:
        """The block's place, and each command with (the last `tail` characters of) its output, up to
        the one that failed. Whole, it is the block as the page would show this run."""
        lines = [f"{self.block.where}: {'ran' if self.ok else 'failed'}"]
        for ran in self.ran:
            status = "timed out" if ran.status is None else f"exit {ran.status}"
            output = ran.output if tail is None else ran.output[-tail:]
            lines += [f"$ {ran.command}", output.rstrip("\n"), f"({status})"]
        return "\n".join(lines)


class Session:
    """One shell for a page's blocks (use as a context manager: leaving it kills what is left running)."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self._shell = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-e", "-o", "pipefail"],
            cwd=cwd, env=env, text=True, bufsize=1, start_new_session=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.ended = False

    def _read(self) -> None:
        assert self._shell.stdout is not None
        for line in self._shell.stdout:
            self._lines.put(line)

    def run(self, block: Block, timeout: float = 900) -> BlockRun:
        """The block's commands in turn, until one fails or `timeout` seconds have passed."""
        done = BlockRun(block)
        deadline = time.monotonic() + timeout
        for command in block.commands:
            if self.ended:
                break
            ran = self._command(command, deadline)
            done.ran.append(ran)
            if ran.status != 0:
                break
        return done

    def _command(self, command: str, deadline: float) -> Ran:
        assert self._shell.stdin is not None
        # A group, not a subshell: what it sets stays; `\n}` so that a command ending with `&` is one.
        # Its status printed after it: -e ends the shell at most failures, but not where bash ignores -e
        # for the command that failed (`a && b` whose `a` fails, `! b`), which a terminal's user still sees.
        self._shell.stdin.write(f"{{ {command}\n}} </dev/null\nprintf '\\n{_DONE} %d\\n' $?\n")
        self._shell.stdin.flush()
        output: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=0.2)
            except queue.Empty:
                if self._shell.poll() is not None:  # ended by the command's failure (-e), or its `exit`
                    self.ended = True
                    time.sleep(0.2)  # what the reader still has of its last words
                    output += self._drained()
                    # A shell gone before the command's end is a failure even at status 0 (`exit 0`):
                    # the page's terminal would be closed, and nothing after it runs.
                    return Ran(command, "".join(output), self._shell.returncode or _SHELL_ENDED)
                if time.monotonic() > deadline:
                    self.close()
                    return Ran(command, "".join(output + self._drained()), None)
                continue
            if done := _DONE_LINE.fullmatch(line.rstrip("\n")):
                status = int(done.group(1))
                if status != 0:
                    self.close()  # the session stops at the failed command, as under -e
                return Ran(command, "".join(output).removesuffix("\n"), status)
            output.append(line)

    def _drained(self) -> list[str]:
        lines = []
        while not self._lines.empty():
            lines.append(self._lines.get_nowait())
        return lines

    def close(self) -> None:
        self.ended = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._shell.pid, signal.SIGKILL)  # the shell and what it sent to the background
        self._shell.wait(timeout=30)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
