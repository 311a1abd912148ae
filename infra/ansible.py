"""Run the project's playbooks with its ansible.cfg and podman settings; read the play recap."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from infra.errors import EnvironmentProblem, GpuPlatError
from infra.local.podman import podman_env
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


def run_playbook(
    playbook: str,
    inventory: Path,
    log_dir: Path,
    timeout: float = 3600,
    limit: list[str] | None = None,
    extra_vars: dict[str, str] | None = None,
) -> PlaybookRun:
    env = podman_env()
    env["ANSIBLE_CONFIG"] = str(PROJECT_ROOT / "ansible.cfg")
    env.setdefault("ANSIBLE_FORCE_COLOR", "0")
    command = [ansible_playbook_binary(), "-i", str(inventory), str(PROJECT_ROOT / "playbooks" / playbook)]
    if limit:
        command += ["--limit", ",".join(limit)]
    for key, value in (extra_vars or {}).items():
        command += ["-e", f"{key}={value}"]
    log_dir.mkdir(parents=True, exist_ok=True)
    log = playbook_log(log_dir, playbook)
    with log.open("w", encoding="utf-8") as sink:  # streamed, so `tail -f` shows progress
        try:
            returncode = subprocess.run(
                command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout,
                check=False,
                cwd=PROJECT_ROOT,
            ).returncode
        except subprocess.TimeoutExpired as exc:
            raise GpuPlatError(f"{playbook} did not finish in {timeout:.0f} s; log: {log}") from exc
    text = log.read_text(encoding="utf-8", errors="replace")
    changed, failed = parse_recap(text)
    if returncode != 0 or failed:
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise GpuPlatError(
            f"{playbook} failed on {', '.join(failed) or 'the run'} (exit {returncode}); "
            f"full log: {log}\n{tail}"
        )
    return PlaybookRun(playbook, changed, failed, log)


def state_dir(stack: str) -> Path:
    base = Path(os.environ.get("GPUPLAT_STATE_DIR", PROJECT_ROOT / ".gpuplat"))
    return base / stack
