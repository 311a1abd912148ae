"""Run the project's playbooks with its ansible.cfg and podman settings; read the play recap."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.errors import EnvironmentProblem, GpuPlatError
from infra.nodes.mitogen import container_speedup, failure_hint
from infra.nodes.playbook_progress import PlaybookProgress
from infra.nodes.podman import podman_env
from infra.spec.load import PROJECT_ROOT

_RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)"
)


@dataclass(frozen=True)
class PlaybookRun:
    playbook: str
    changed: int
    failed_hosts: list[str]
    log: Path


def ansible_playbook_binary() -> str:
    beside_python = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside_python) if beside_python.exists() else shutil.which("ansible-playbook")
    if not found:
        raise EnvironmentProblem(
            "ansible-playbook is not installed: run `make venv` (installs the ansible extra)."
        )
    return found


def parse_recap(output: str) -> tuple[int, list[str]]:
    changed, failed = 0, []
    for line in output.splitlines():
        match = _RECAP.match(line.strip())
        if match:
            changed += int(match["changed"])
            if int(match["failed"]) or int(match["unreachable"]):
                failed.append(match["host"])
    return changed, failed


def playbook_log(log_dir: Path, playbook: str) -> Path:
    return log_dir / f"{Path(playbook).stem}.log"


ProgressCallback = Callable[[PlaybookProgress], None]
# At most one progress report per this many seconds, besides one per play or task start.
PROGRESS_INTERVAL_S = 1.0


def _stream(
    command: list[str],
    env: dict[str, str],
    log: Path,
    timeout: float,
    progress: PlaybookProgress,
    on_progress: ProgressCallback | None,
) -> int:
    """Run the playbook with its output going to `log` line by line (so `tail -f` shows it) and into
    `progress`; kill it after `timeout` seconds."""
    with log.open("w", encoding="utf-8") as sink:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=PROJECT_ROOT,
            text=True,
            errors="replace",
        )
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            process.kill()

        watchdog = threading.Timer(timeout, kill)
        watchdog.start()
        last_report = 0.0
        try:
            assert process.stdout is not None
            for line in process.stdout:
                sink.write(line)
                sink.flush()
                turned = progress.feed(line)
                now = time.monotonic()
                if on_progress is not None and (turned or now - last_report >= PROGRESS_INTERVAL_S):
                    on_progress(progress)
                    last_report = now
            returncode = process.wait()
        finally:
            watchdog.cancel()
            if process.poll() is None:
                process.kill()
                process.wait()
    if killed.is_set():
        raise GpuPlatError(f"{progress.playbook} did not finish in {timeout:.0f} s; log: {log}")
    return returncode


def run_playbook(
    playbook: str,
    inventory: Path,
    log_dir: Path,
    timeout: float = 3600,
    limit: list[str] | None = None,
    extra_vars: dict[str, str] | None = None,
    on_progress: ProgressCallback | None = None,
    tags: list[str] | None = None,
    log_name: str | None = None,
    containers: bool = False,
) -> PlaybookRun:
    """`containers`: every host is a local podman container and the playbook never delegates to
    localhost, so Mitogen may run it (infra/nodes/mitogen.py)."""
    env = podman_env()
    env["ANSIBLE_CONFIG"] = str(PROJECT_ROOT / "ansible.cfg")
    env.setdefault("ANSIBLE_FORCE_COLOR", "0")
    command = [ansible_playbook_binary(), "-i", str(inventory), str(PROJECT_ROOT / "playbooks" / playbook)]
    speedup = container_speedup(env) if containers else None
    if speedup is not None:
        env |= speedup.env
        command += ["-e", json.dumps(speedup.extra_vars)]
    if limit:
        command += ["--limit", ",".join(limit)]
    if tags:
        command += ["--tags", ",".join(tags)]
    for key, value in (extra_vars or {}).items():
        command += ["-e", f"{key}={value}"]
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / log_name if log_name else playbook_log(log_dir, playbook)
    progress = PlaybookProgress(playbook)
    returncode = _stream(command, env, log, timeout, progress, on_progress)
    text = log.read_text(encoding="utf-8", errors="replace")
    changed, failed = parse_recap(text)
    if returncode != 0 or failed:
        tail = "\n".join(text.strip().splitlines()[-15:])
        hint = failure_hint(text) if speedup is not None else None
        raise GpuPlatError(
            f"{playbook} failed on {', '.join(failed) or 'the run'} (exit {returncode}); "
            f"full log: {log}\n{tail}" + (f"\n{hint}" if hint else "")
        )
    return PlaybookRun(playbook, changed, failed, log)


def state_dir(stack: str) -> Path:
    base = Path(os.environ.get("GPUPLAT_STATE_DIR", PROJECT_ROOT / ".gpuplat"))
    return base / stack


def inventory_dir(stack: str) -> Path:
    """Where the inventory of a stack's nodes is written for its playbook runs."""
    return state_dir(stack) / "inventory"
