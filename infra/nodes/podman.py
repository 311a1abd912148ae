"""Run podman with the project's settings (runc, explicit ulimits: scripts/containers.conf)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from typing import Any

from infra.errors import EnvironmentProblem, GpuPlatError
from infra.spec.load import PROJECT_ROOT

CONTAINERS_CONF = PROJECT_ROOT / "scripts" / "containers.conf"


def podman_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    return env


def podman(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    if shutil.which("podman") is None:
        raise EnvironmentProblem(
            "podman is not installed: run `make up` (it runs scripts/setup-host.sh) or install podman, "
            "runc and debootstrap from your distribution."
        )
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, env=podman_env(), timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise GpuPlatError(
            f"podman {' '.join(args[:3])} failed ({result.returncode}): {result.stderr.strip()}"
        )
    return result


def exists(kind: str, name: str) -> bool:
    return podman(kind, "exists", name, check=False).returncode == 0


def inspect(kind: str, name: str) -> dict[str, Any] | None:
    result = podman(kind, "inspect", name, check=False)
    if result.returncode != 0:
        return None
    data = json.loads(result.stdout)
    return data[0] if isinstance(data, list) and data else None


def wait_systemd(container: str, timeout_s: float, stop: threading.Event | None = None) -> None:
    """Until the container's systemd has booted (running, or degraded: a unit failed, the rest is up).
    A container that exits, or a boot that outlasts the timeout, fails with what podman knows of it; so
    does `stop` once set (the caller gave up: another node failed, or it was interrupted)."""
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        if stop is not None and stop.is_set():
            raise GpuPlatError(f"{container}: gave up waiting for its boot (another node failed, or a stop)")
        probe = podman("exec", container, "systemctl", "is-system-running", check=False)
        state = probe.stdout.strip()
        if state in ("running", "degraded"):
            return
        if not state and not _running(container):
            evidence = _boot_evidence(container, probe.stderr)
            raise GpuPlatError(f"{container} stopped while booting: {evidence}")
        if stop is None:
            time.sleep(0.5)
        else:
            stop.wait(0.5)
    raise GpuPlatError(
        f"{container} did not boot in {timeout_s:.0f} s (systemd state {state!r}): "
        f"{_boot_evidence(container, probe.stderr)}"
    )


def _running(container: str) -> bool:
    info = inspect("container", container) or {}
    return bool(info.get("State", {}).get("Running"))


def _boot_evidence(container: str, exec_error: str) -> str:
    """The container's state, podman's last exec error and the end of its console log."""
    info = inspect("container", container) or {}
    status = info.get("State", {})
    logs = podman("logs", "--tail", "15", container, check=False)
    console = (logs.stdout + logs.stderr).strip() or "(no console output)"
    return (
        f"status {status.get('Status', 'absent')!r}, exit code {status.get('ExitCode', '-')}, "
        f"exec: {exec_error.strip() or '-'}; last console lines:\n{console}"
    )
