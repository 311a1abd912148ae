"""Every step that writes slurmdbd's accounting data converges whatever the daemons did in between.

slurmctld registers its cluster in slurmdbd by itself when it connects; a `sacctmgr add` of something
that appeared since the read exits 1 ("Nothing new added.", SchedMD/slurm
src/sacctmgr/cluster_functions.c at slurm-22-05-8-1 and slurm-24-11-5-1). A converge that fails on that
exit lost a race, not a setting: adds must not fail by themselves, and the state read after them decides.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"


def sacctmgr_adds() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(ROLES.glob("*/tasks/*.yml")):
        for task in yaml.safe_load(path.read_text()) or []:
            command = task.get("ansible.builtin.command")
            argv = command.get("argv", []) if isinstance(command, dict) else str(command or "").split()
            if argv[:1] == ["sacctmgr"] and "add" in argv[1:3]:
                yield f"{path.relative_to(ROLES)}: {task['name']}", task


ADDS = list(sacctmgr_adds())


def test_the_roles_add_accounting_data() -> None:
    assert len(ADDS) >= 4  # cluster, QoS, accounts, users


@pytest.mark.parametrize(("where", "task"), ADDS, ids=[where for where, _ in ADDS])
def test_an_add_that_lost_a_race_does_not_fail_the_converge(where: str, task: dict[str, Any]) -> None:
    register = task.get("register")
    assert register, f"{where}: register the result, so the add is changed only when it added"
    assert task.get("failed_when") is False, f"{where}: sacctmgr exits 1 when the daemon added it first"
    assert str(task.get("changed_when")) == f"{register}.rc == 0", f"{where}: changed only when rc is 0"


@pytest.mark.parametrize(("where", "task"), ADDS, ids=[where for where, _ in ADDS])
def test_the_state_is_read_and_asserted_after_each_add(where: str, task: dict[str, Any]) -> None:
    path = ROLES / where.split(":")[0]
    tasks = yaml.safe_load(path.read_text())
    index = next(i for i, t in enumerate(tasks) if t.get("name") == task["name"])
    later = tasks[index + 1 :]
    reads = [
        i for i, t in enumerate(later) if "sacctmgr -nP show" in str(t.get("ansible.builtin.command", ""))
    ]
    asserts = [i for i, t in enumerate(later) if "ansible.builtin.assert" in t]
    assert reads and asserts and min(reads) < min(asserts), (
        f"{where}: read the accounting state again after the add and assert what the inventory asks for"
    )
