"""A role's tags select its steps: `--tags preflight,install` installs and configures nothing else.

Node images (infra/backends/local/node_image.py) are built with `site.yml --tags preflight,install`, and an
operator may run `--tags configure`. Ansible gives the tags of an `include_tasks` to the include alone,
not to the tasks it loads (Ansible's "Tags" guide: "tags applied to include_tasks apply only to the
include itself"; `apply: {tags: ...}` passes them on). Without `apply`, a tag-filtered run includes
the file and then skips everything in it. Static: every include reached from a role's main.yml with
tags (its own, a block's, or an enclosing include's) passes them on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
_INCLUDES = ("ansible.builtin.include_tasks", "include_tasks")
_IMPORTS = ("ansible.builtin.import_tasks", "import_tasks")


def included_files(directory: Path, reference: str) -> list[Path]:
    """The task files a reference may name: a Jinja expression (install-{{ os_family }}.yml) names
    every file its fixed parts match."""
    pattern = re.sub(r"\{\{.*?\}\}", "*", reference)
    return sorted(directory.glob(pattern))


def include_problems(
    path: Path, inherited: frozenset[str], seen: set[tuple[Path, frozenset[str]]]
) -> list[str]:
    if (path, inherited) in seen:
        return []
    seen.add((path, inherited))
    return walk(yaml.safe_load(path.read_text()) or [], path, inherited, seen)


def walk(tasks: list[dict[str, Any]], path: Path, inherited: frozenset[str], seen: set[Any]) -> list[str]:
    problems: list[str] = []
    for task in tasks:
        tags = inherited | frozenset(task.get("tags", []) or [])
        for key in ("block", "rescue", "always"):
            problems += walk(task.get(key, []) or [], path, tags, seen)
        include = next((task[k] for k in _INCLUDES if k in task), None)
        imported = next((task[k] for k in _IMPORTS if k in task), None)
        if include is not None:
            reference = include["file"] if isinstance(include, dict) else include
            applied = frozenset(
                ((include.get("apply") or {}) if isinstance(include, dict) else {}).get("tags", [])
            )
            if tags - applied:
                problems.append(
                    f"{path.parent.parent.name}/tasks/{path.name}: include of {reference} has tags "
                    f"{sorted(tags)} but applies {sorted(applied)}"
                )
            for target in included_files(path.parent, reference):
                problems += include_problems(target, applied, seen)
        elif imported is not None:
            for target in included_files(path.parent, imported):
                problems += include_problems(target, tags, seen)
    return problems


def entry_points() -> list[Path]:
    """Every role's task entry points (meta/argument_specs.yml: main, and e.g. gpu_validation's cluster)."""
    found = []
    for specs in sorted(ROLES.glob("*/meta/argument_specs.yml")):
        for entry in yaml.safe_load(specs.read_text())["argument_specs"]:
            path = specs.parent.parent / "tasks" / f"{entry}.yml"
            if path.exists():
                found.append(path)
    return found


@pytest.mark.parametrize("entry", entry_points(), ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_tagged_includes_pass_their_tags_on(entry: Path) -> None:
    assert include_problems(entry, frozenset(), set()) == []


def test_the_walker_finds_includes_that_drop_their_tags(tmp_path: Path) -> None:
    tasks = tmp_path / "role" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "main.yml").write_text(
        "- name: Install\n  ansible.builtin.include_tasks: install-{{ x }}.yml\n  tags: [r, install]\n"
        "- name: Configure\n  ansible.builtin.include_tasks:\n    file: configure.yml\n"
        "    apply:\n      tags: [r, configure]\n  tags: [r, configure]\n"
    )
    (tasks / "install-Debian.yml").write_text("- name: Package\n  ansible.builtin.debug: {}\n")
    (tasks / "configure.yml").write_text("- name: Nested\n  ansible.builtin.include_tasks: more.yml\n")
    (tasks / "more.yml").write_text("- name: Step\n  ansible.builtin.debug: {}\n")
    assert include_problems(tasks / "main.yml", frozenset(), set()) == [
        "role/tasks/main.yml: include of install-{{ x }}.yml has tags ['install', 'r'] but applies []",
        "role/tasks/configure.yml: include of more.yml has tags ['configure', 'r'] but applies []",
    ]


def tagged_tasks(path: Path, inherited: frozenset[str], tag: str, found: list[str]) -> list[str]:
    """Names of the tasks reached from `path` that carry `tag` (their own, a block's, an import's or an
    include's applied tags)."""
    found += [str(task.get("name")) for task in tagged_task_entries(path, inherited, tag, [])]
    return found


def tagged_task_entries(
    path: Path, inherited: frozenset[str], tag: str, found: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The tasks themselves (as written) that tagged_tasks names."""
    for task in yaml.safe_load(path.read_text()) or []:
        tags = inherited | frozenset(task.get("tags", []) or [])
        for key in ("block", "rescue", "always"):
            for inner in task.get(key, []) or []:
                if tag in tags | frozenset(inner.get("tags", []) or []):
                    found.append(inner)
        include = next((task[k] for k in _INCLUDES if k in task), None)
        imported = next((task[k] for k in _IMPORTS if k in task), None)
        if imported is not None:
            for target in included_files(path.parent, imported):
                tagged_task_entries(target, tags, tag, found)
        elif include is not None and isinstance(include, dict):
            for target in included_files(path.parent, include["file"]):
                applied = frozenset((include.get("apply") or {}).get("tags", []))
                tagged_task_entries(target, applied, tag, found)
        elif tag in tags:
            found.append(task)
    return found


def test_the_join_steps_undo_the_seal() -> None:
    """A node started from its pool's image (infra/backends/local/node_image.py) runs only the `join` steps.
    The seal (image_seal.sh) removed the MUNGE key and disabled munge and slurmd; the node's health check
    names the node. So `join` must install the key, write the health check and start both services."""
    seal = (ROOT / "infra" / "backends" / "aws" / "image_seal.sh").read_text()
    assert "munge.service" in seal and "slurmd.service" in seal and "/etc/munge/munge.key" in seal
    joined = {
        role: tagged_tasks(ROLES / role / "tasks" / "main.yml", frozenset(), "join", [])
        for role in ("munge", "slurm_compute")
    }
    assert {"Install the key provisioned on this host", "Start munge"} <= set(joined["munge"])
    assert {"Install the node health check", "Start slurmd"} <= set(joined["slurm_compute"])


@pytest.mark.parametrize(
    ("role", "service"), [("munge", "{{ munge_service_name }}"), ("slurm_compute", "slurmd")]
)
def test_the_join_steps_start_and_enable_the_sealed_services(role: str, service: str) -> None:
    """Whatever the task is called, `join` starts the service the seal disabled and enables it again, with
    nothing that could skip it."""
    joined = tagged_task_entries(ROLES / role / "tasks" / "main.yml", frozenset(), "join", [])
    starts = [t for t in joined if (t.get("ansible.builtin.systemd_service") or {}).get("name") == service]
    assert len(starts) == 1, f"{role}: no join step starts {service}"
    (start,) = starts
    assert start["ansible.builtin.systemd_service"]["state"] == "started"
    assert start["ansible.builtin.systemd_service"]["enabled"] is True
    assert "when" not in start and "ignore_errors" not in start
    if role == "munge":
        defaults = yaml.safe_load((ROLES / "munge" / "defaults" / "main.yml").read_text())
        assert defaults["munge_service_name"] == "munge"  # the unit image_seal.sh disables
