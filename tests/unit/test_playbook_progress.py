"""Progress of a running playbook: read from ansible-playbook's output while it streams to the log."""

from __future__ import annotations

import io
import stat
from pathlib import Path

import pytest
from rich.console import Console

from infra.cli.progress import ProgressPrinter
from infra.errors import GpuPlatError
from infra.nodes import playbook_run
from infra.nodes.playbook_progress import PlaybookProgress

OUTPUT = """\
PLAY [Platform facts and host metrics on every node] ***************************

TASK [Gathering Facts] *********************************************************
ok: [head-0]
ok: [train-0]

TASK [node_identity : Create the facts directory] ******************************
changed: [head-0]
ok: [train-0]

TASK [node_exporter : Install the node exporter] *******************************
included: /work/main/roles/node_exporter/tasks/install-Debian.yml for head-0, train-0
skipping: [head-0]
changed: [train-0] => (item=x)

PLAY [GPU node software] *******************************************************

TASK [gpu_driver : Install the driver] *****************************************
fatal: [train-0]: FAILED! => {"msg": "no package"}

PLAY RECAP *********************************************************************
head-0                     : ok=3    changed=1    unreachable=0    failed=0    skipped=1
train-0                    : ok=3    changed=2    unreachable=0    failed=1    skipped=0
"""


def test_progress_follows_plays_tasks_and_hosts() -> None:
    progress = PlaybookProgress("site.yml")
    turns = [line for line in OUTPUT.splitlines() if progress.feed(line)]
    assert progress.plays_started == 2  # PLAY RECAP is no play
    assert progress.tasks_done == {"head-0": 3, "train-0": 4}
    assert progress.changed == 2
    assert progress.failed_hosts == {"train-0"}
    assert len(turns) == 6
    progress.play, progress.task = "GPU node software", "gpu_driver : Install the driver"
    line = progress.summary()
    assert "'GPU node software'" in line and "gpu_driver: Install the driver" in line
    assert "head-0 3, train-0 4" in line and "FAILED on train-0" in line


def _fake_playbook(tmp_path: Path, body: str) -> str:
    script = tmp_path / "ansible-playbook"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_run_playbook_streams_to_the_log_and_reports_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recap = "head-0 : ok=2 changed=1 unreachable=0 failed=0 skipped=0"
    body = (
        "echo 'PLAY [One] ***'\necho 'TASK [r : a] ***'\necho 'changed: [head-0]'\n"
        "echo 'PLAY [Two] ***'\necho 'TASK [r : b] ***'\necho 'ok: [head-0]'\n"
        f"echo 'PLAY RECAP ***'\necho '{recap}'\n"
    )
    monkeypatch.setattr(playbook_run, "ansible_playbook_binary", lambda: _fake_playbook(tmp_path, body))
    seen: list[tuple[str, int]] = []
    run = playbook_run.run_playbook(
        "site.yml", tmp_path, tmp_path / "logs", on_progress=lambda p: seen.append((p.play, p.plays_started))
    )
    assert run.changed == 1
    assert ("One", 1) in seen and ("Two", 2) in seen
    assert "TASK [r : b]" in run.log.read_text()


def test_a_playbook_that_outlives_its_timeout_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        playbook_run,
        "ansible_playbook_binary",
        lambda: _fake_playbook(tmp_path, "echo 'PLAY [x] ***'\nexec sleep 30\n"),
    )
    with pytest.raises(GpuPlatError, match="did not finish in 1 s"):
        playbook_run.run_playbook("site.yml", tmp_path, tmp_path / "logs", timeout=1)


def test_plain_output_prints_a_line_per_play_not_per_task() -> None:
    sink = io.StringIO()
    printer = ProgressPrinter(Console(file=sink, force_terminal=False, width=200))
    progress = PlaybookProgress("site.yml")
    for line in OUTPUT.splitlines():
        if progress.feed(line):
            printer(progress)
    printed = sink.getvalue().splitlines()
    assert len(printed) == 2
    assert all(line.startswith("  site.yml 00:0") for line in printed)
