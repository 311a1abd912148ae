"""`gpuplat logs NODE`: a node's journal read on the node as `gpuplat ssh` reaches it; run here against a
stand-in podman on PATH that records what it was asked (the container's journal itself is the
integration tier's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.cli.commands.logs import journal_command
from infra.errors import SpecError
from tests.unit.test_cli import gpuplat


def test_the_journal_command() -> None:
    journal = ["journalctl", "--no-pager", "--output", "short-iso"]
    assert journal_command("slurmd", "2h", 50) == [
        *journal,
        "--since=-2h",
        "--unit",
        "slurmd",
        "--lines",
        "50",
    ]
    assert journal_command(None, "15min", None)[-1] == "--since=-15min"
    for unit, since in (("slurmd; rm -rf /", "1h"), ("slurmd", "yesterday"), ("slurmd", "-1h")):
        with pytest.raises(SpecError):
            journal_command(unit, since, None)


def test_logs_runs_on_the_node(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    podman = tmp_path / "podman"
    podman.write_text(
        f'#!/bin/sh\necho "$@" > {calls}\necho "2026-12-06T07:00:00+0000 head-0 slurmctld[1]: ready"\n'
    )
    podman.chmod(0o755)
    environment = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-c", "from infra.cli.app import main; main()", "logs", "--stack", "local", "head-0",
         "--unit", "slurmctld"],
        capture_output=True, text=True, env=environment, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "slurmctld[1]: ready" in done.stdout
    journal = ["journalctl", "--no-pager", "--output", "short-iso", "--since=-1h", "--unit", "slurmctld"]
    assert calls.read_text().split() == ["exec", "-i", "gpuplat-local-head-0", *journal]


def test_logs_of_an_unknown_node_or_a_bad_unit_exit_2() -> None:
    unknown = gpuplat("logs", "--stack", "local", "nope")
    assert unknown.returncode == 2 and "has no node 'nope'" in unknown.stderr
    bad = gpuplat("logs", "--stack", "local", "head-0", "--unit", "a b")
    assert bad.returncode == 2 and "a systemd unit name" in bad.stderr
