"""The fabric manager role starts only units the packages ship.

NVLink 5 systems (HGX B200) need NVIDIA's NVLink subnet manager, but the nvlsm package ships no systemd
unit: the fabric manager's own start script (nvidia-fabricmanager-start.sh, run by the package's
nvidia-fabricmanager.service) starts it (NVIDIA/gpu-driver-container ubuntu22.04/nvidia-driver). A
task that starts `nvlsm` fails on exactly the machines that need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

TASKS = Path(__file__).resolve().parents[2] / "roles" / "fabric_manager" / "tasks"
SHIPPED_UNITS = {"nvidia-fabricmanager"}  # by the nvidia-fabricmanager package


def tasks(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for task in node if isinstance(node, list) else []:
        found.append(task)
        found.extend(tasks(task.get("block", [])))
    return found


def test_only_the_fabric_manager_unit_is_started() -> None:
    started = {
        task["ansible.builtin.systemd_service"]["name"]
        for path in TASKS.glob("*.yml")
        for task in tasks(yaml.safe_load(path.read_text()))
        if "ansible.builtin.systemd_service" in task
    }
    assert started <= SHIPPED_UNITS, f"units no package ships: {sorted(started - SHIPPED_UNITS)}"
