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


def run_playbook(playbook: str, inventory: Path, log_dir: Path, extra_vars: dict[str, str] | None = None,
                 timeout: float = 3600) -> PlaybookRun:  # fmt: skip
    env = podman_env()
    env["ANSIBLE_CONFIG"] = str(PROJECT_ROOT / "ansible.cfg")
    env.setdefault("ANSIBLE_FORCE_COLOR", "0")
    command = [ansible_playbook_binary(), "-i", str(inventory), str(PROJECT_ROOT / "playbooks" / playbook)]
    for key, value in (extra_vars or {}).items():
        command += ["-e", f"{key}={value}"]
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{Path(playbook).stem}.log"
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False,
                            cwd=PROJECT_ROOT)  # fmt: skip
    log.write_text(result.stdout + result.stderr, encoding="utf-8")
    changed, failed = parse_recap(result.stdout)
    if result.returncode != 0 or failed:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise GpuPlatError(
            f"{playbook} failed on {', '.join(failed) or 'the run'} (exit {result.returncode}); "
            f"full log: {log}\n{tail}"
        )
    return PlaybookRun(playbook, changed, failed, log)


def state_dir(stack: str) -> Path:
    base = Path(os.environ.get("GPUPLAT_STATE_DIR", PROJECT_ROOT / ".gpuplat"))
    return base / stack
