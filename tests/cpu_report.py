"""A pytest plugin (tests/conftest.py loads it; idle unless asked: `pytest --cpu-report=FILE`): the CPU
seconds each test cost, its process's own and those of the processes it ran and waited for (getrusage
SELF and CHILDREN around the test's setup, call and teardown), and what each process spent before its
first test (interpreter start, imports, collection). On a shared machine wall times say little; CPU
seconds do not depend on what else runs. With xdist every worker appends its lines to FILE (JSON lines);
the run ends with the tests and files that cost most and the totals.

A fixture set up for several tests is charged to the first of them; a process a test leaves running
(a server it does not wait for) is not charged at all."""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TOP = 15


@dataclass(frozen=True)
class CpuSample:
    own: float
    children: float
    wall: float

    @classmethod
    def now(cls) -> CpuSample:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls(own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime, time.monotonic())

    def since(self, before: CpuSample) -> CpuSample:
        return CpuSample(self.own - before.own, self.children - before.children, self.wall - before.wall)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report",
        metavar="FILE",
        help="append each test's CPU seconds (own and its waited-for child processes) to FILE, as JSON lines",
    )


def report_path(config: pytest.Config) -> Path | None:
    value = config.getoption("--cpu-report")
    return Path(value) if value else None


def append(path: Path, record: dict[str, object]) -> None:
    # One write of one short line per call, with O_APPEND: lines of workers do not interleave.
    with path.open("a", encoding="utf-8") as stream:
        stream.write(json.dumps(record) + "\n")


def worker_id(config: pytest.Config) -> str:
    """xdist's name of this worker (gw0, ...); "main" for the controller or a run without xdist. Read from
    the config, not the environment: a pytest run inside a worker's test (pytester) is no worker."""
    workerinput: dict[str, str] | None = getattr(config, "workerinput", None)
    return workerinput["workerid"] if workerinput else "main"


def pytest_collection_finish(session: pytest.Session) -> None:
    path = report_path(session.config)
    if path is None:
        return
    startup = CpuSample.now()
    append(
        path,
        {
            "kind": "startup",
            "worker": worker_id(session.config),
            "own": startup.own,
            "children": startup.children,
        },
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = report_path(item.config)
    before = CpuSample.now()
    yield
    if path is None:
        return
    spent = CpuSample.now().since(before)
    append(
        path,
        {
            "kind": "test",
            "worker": worker_id(item.config),
            "test": item.nodeid,
            "own": spent.own,
            "children": spent.children,
            "wall": spent.wall,
        },
    )


@dataclass(frozen=True)
class Summary:
    tests: list[dict[str, float | str]]
    startups: list[dict[str, float | str]]

    @classmethod
    def read(cls, path: Path) -> Summary:
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
        return cls(
            [r for r in records if r["kind"] == "test"], [r for r in records if r["kind"] == "startup"]
        )

    @staticmethod
    def cpu(record: dict[str, float | str]) -> float:
        return float(record["own"]) + float(record["children"])

    def lines(self, top: int = TOP) -> list[str]:
        tests_cpu = sum(map(self.cpu, self.tests))
        startup_cpu = sum(map(self.cpu, self.startups))
        by_file: dict[str, float] = {}
        for record in self.tests:
            file = str(record["test"]).split("::")[0]
            by_file[file] = by_file.get(file, 0.0) + self.cpu(record)
        out = [
            f"CPU seconds: tests {tests_cpu:.1f} ({len(self.tests)} tests), before the first test "
            f"{startup_cpu:.1f} ({len(self.startups)} processes: start, imports, collection)",
            f"tests by CPU seconds (own + child processes), top {top}:",
        ]
        for record in sorted(self.tests, key=self.cpu, reverse=True)[:top]:
            out.append(
                f"  {self.cpu(record):6.1f}  ({float(record['own']):.1f} + {float(record['children']):.1f})"
                f"  wall {float(record['wall']):6.1f}  {record['test']}"
            )
        out.append(f"files by CPU seconds, top {top}:")
        for file, spent in sorted(by_file.items(), key=lambda item: item[1], reverse=True)[:top]:
            out.append(f"  {spent:6.1f}  {file}")
        return out


def pytest_configure(config: pytest.Config) -> None:
    path = report_path(config)
    # The controller (or a run without xdist) starts the file afresh; workers only append.
    if path is not None and worker_id(config) == "main":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("", encoding="utf-8")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    path = report_path(config)
    if path is None or worker_id(config) != "main" or not path.exists():
        return
    terminalreporter.section("CPU seconds per test")
    for line in Summary.read(path).lines():
        terminalreporter.write_line(line)
