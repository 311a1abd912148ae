"""Progress of a running playbook on stderr: a live status line on a terminal, a plain line every
PLAIN_INTERVAL_S (and at each new play) when stderr is a pipe or a CI log. The full output stays in
the playbook's log file."""

from __future__ import annotations

import time

from rich.console import Console
from rich.status import Status

from infra.nodes.playbook_progress import PlaybookProgress

PLAIN_INTERVAL_S = 30.0


class ProgressPrinter:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Status | None = None
        self.last_plain = time.monotonic()
        self.last_play = 0

    def __call__(self, progress: PlaybookProgress) -> None:
        line = progress.summary(width=max(40, self.console.width - 4))
        if self.console.is_terminal:
            if self.live is None:
                self.live = self.console.status(line)
                self.live.start()
            else:
                self.live.update(line)
            return
        now = time.monotonic()
        if progress.plays_started != self.last_play or now - self.last_plain >= PLAIN_INTERVAL_S:
            self.console.print(f"  {line}", markup=False, highlight=False)
            self.last_plain, self.last_play = now, progress.plays_started

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
