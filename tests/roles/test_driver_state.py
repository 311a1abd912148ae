"""nvidia_common's driver state: services that talk to the driver start only on the pinned, loaded one.

The fabric manager and DCGM refuse to work against another driver version; right after an install or
upgrade the module on disk is new and the running one old (or none) until a reboot. The decision is
rendered here from the role's own task file against real /proc/driver/nvidia/version texts.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "roles" / "nvidia_common" / "tasks" / "driver_state.yml"

OPEN_570 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.195.03  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Thu Sep 18 20:08:05 UTC 2025\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
PROPRIETARY_570 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Tue Jul  8 18:17:49 UTC 2025\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)


def regex_search(value: str, pattern: str, *groups: str) -> Any:
    """Ansible's regex_search: the match, or with '\\N' arguments the list of those groups."""
    match = re.search(pattern, value)
    if match is None:
        return None
    if not groups:
        return match.group(0)
    return [match.group(int(g.lstrip("\\"))) for g in groups]


def decide(proc_text: str | None, pinned: str) -> dict[str, Any]:
    env = jinja2.Environment()
    env.filters["b64decode"] = lambda value: base64.b64decode(value).decode()
    env.filters["regex_search"] = regex_search
    tasks = yaml.safe_load(TASKS.read_text())
    decision = next(t for t in tasks if "ansible.builtin.set_fact" in t)
    slurp: dict[str, Any] = (
        {} if proc_text is None else {"content": base64.b64encode(proc_text.encode()).decode()}
    )
    variables: dict[str, Any] = {"__nvidia_common_loaded_module": slurp, "gpu_driver_version": pinned}
    variables["__nvidia_common_loaded_version"] = (
        env.from_string(decision["vars"]["__nvidia_common_loaded_version"]).render(**variables).strip()
    )
    facts = decision["ansible.builtin.set_fact"]
    return {key: env.from_string(str(value)).render(**variables).strip() for key, value in facts.items()}


@pytest.mark.parametrize("text", [OPEN_570, PROPRIETARY_570])
def test_reads_the_loaded_version_of_either_flavour(text: str) -> None:
    expected = "570.195.03" if "Open" in text else "570.172.08"
    state = decide(text, expected)
    assert state["nvidia_common_driver_loaded_version"] == expected
    assert state["nvidia_common_driver_ready"] == "True"
    assert state["nvidia_common_driver_not_ready_reason"] == ""


def test_reboot_pending_after_an_upgrade_holds_the_services() -> None:
    state = decide(PROPRIETARY_570, "570.195.03")
    assert state["nvidia_common_driver_ready"] == "False"
    assert "reboot is pending" in state["nvidia_common_driver_not_ready_reason"]
    assert "570.172.08" in state["nvidia_common_driver_not_ready_reason"]


def test_no_module_loaded_says_so() -> None:
    state = decide(None, "570.195.03")
    assert state["nvidia_common_driver_ready"] == "False"
    assert "no NVIDIA kernel module is loaded" in state["nvidia_common_driver_not_ready_reason"]
