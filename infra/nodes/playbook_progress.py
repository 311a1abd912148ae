"""Where a running playbook is, read from ansible-playbook's own output (the default callback's
`PLAY [...]`, `TASK [role : name]` and per-host result lines), for a progress line while it runs."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

_HEADER = re.compile(r"^(PLAY|TASK|RUNNING HANDLER) \[(?P<name>.*)\] \*+$")
_RESULT = re.compile(r"^(?P<status>ok|changed|skipping|fatal|failed|unreachable): \[(?P<host>[^\]]+)\]")


@dataclass
class PlaybookProgress:
    playbook: str
    started: float = field(default_factory=time.monotonic)
    play: str = ""
    task: str = ""
    plays_started: int = 0
    tasks_done: dict[str, int] = field(default_factory=dict)
    changed: int = 0
    failed_hosts: set[str] = field(default_factory=set)

    def feed(self, line: str) -> bool:
        """Take one output line; True when the play or task changed (worth showing)."""
        line = line.rstrip()
        header = _HEADER.match(line)
        if header:
            if line.startswith("PLAY"):
                self.play, self.task = header["name"], ""
                self.plays_started += 1
            else:
                self.task = header["name"]
            return True
        result = _RESULT.match(line)
        if result:
            host = result["host"].split(" -> ")[0]
            self.tasks_done[host] = self.tasks_done.get(host, 0) + 1
            if result["status"] == "changed":
                self.changed += 1
            if result["status"] in ("fatal", "failed", "unreachable"):
                self.failed_hosts.add(host)
        return False

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def role(self) -> str:
        return self.task.split(" : ", 1)[0] if " : " in self.task else ""

    def summary(self, width: int = 160) -> str:
        minutes, seconds = divmod(int(self.elapsed_s), 60)
        hosts = ", ".join(f"{host} {count}" for host, count in sorted(self.tasks_done.items()))
        where = f"play {self.plays_started} {self.play!r}"
        if self.task:
            where += f", {self.role or 'task'}: {self.task.split(' : ', 1)[-1]}"
        line = f"{self.playbook} {minutes:02d}:{seconds:02d} {where}; tasks done per host: {hosts or '-'}"
        if self.failed_hosts:
            line += f"; FAILED on {', '.join(sorted(self.failed_hosts))}"
        return line if len(line) <= width else line[: width - 1] + "…"
