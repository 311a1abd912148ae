"""A pytest plugin (tests/conftest.py loads it): under CI=true, a skip whose reason is not on
tests/skip_allowlist.yaml fails the run, with the test and its reason named. Skips at collection
(`pytest.importorskip` at module level) count as much as skips of a single test; expected failures
(`xfail`) are not skips."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ALLOWLIST = Path(__file__).with_name("skip_allowlist.yaml")


@dataclass(frozen=True)
class Skip:
    test: str
    reason: str


def allowed_reasons(path: Path = ALLOWLIST) -> list[re.Pattern[str]]:
    entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    return [re.compile(entry["reason"]) for entry in entries]


def skip_of(report: pytest.TestReport | pytest.CollectReport) -> Skip:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return Skip(report.nodeid or str(report.fspath), reason.removeprefix("Skipped: "))


def unallowed_skips(config: pytest.Config) -> list[Skip]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return []
    patterns = allowed_reasons()
    skips = [
        skip_of(report) for report in reporter.stats.get("skipped", []) if not hasattr(report, "wasxfail")
    ]
    return [skip for skip in skips if not any(p.search(skip.reason) for p in patterns)]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI") != "true":
        return
    found = unallowed_skips(session.config)
    session.config.stash[UNALLOWED] = found
    if found and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    found = config.stash.get(UNALLOWED, [])
    if not found:
        return
    terminalreporter.section("skips CI does not allow", sep="=", red=True, bold=True)
    for skip in found:
        terminalreporter.line(f"{skip.test}: {skip.reason}")
    terminalreporter.line(
        f"CI=true: {len(found)} skip(s) whose reason is not on tests/{ALLOWLIST.name}; "
        "make what the test needs available (make test installs it) or fix the test"
    )


UNALLOWED = pytest.StashKey[list[Skip]]()
