"""A group of steps under a condition that holds for the whole run is one include, not its steps imported.

Ansible gives the condition of an `import_tasks`, an `import_role` or a `block` to each step inside it: a
run where the condition is false still takes every one of those steps on every host and skips it there
(a worker started per host and step, the condition templated again each time). A run where it is false
for a whole group (an FSx client on a stack with a local volume, NVML on simulated GPUs, a backup
controller's database on a single controller) pays that for nothing: a no-change converge of the local
platform skipped 167 steps on every host, 9.1 s of its 58 s (docs/local-platform.md, measured). An
`include_tasks` under the same condition is one step, skipped once.

The rule covers conditions that no step of the run can change: they read only the stack's and the roles'
settings and the facts gathered, never a variable that a step registers or sets (those are decided as
the run goes, and an imported group may rely on its condition being read again at each step). Groups of
fewer than three steps stay as they are: an include is a step of its own where it runs. So do groups whose
steps carry tags of their own that the group lacks (a role's whole body under its on/off switch, its
phases tagged install, configure, service): Ansible selects an include by the include's tags alone, so
as one include `--tags install` would no longer reach them (tests/roles/test_role_tags.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jinja2 import Environment, meta

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
_IMPORT_TASKS = ("ansible.builtin.import_tasks", "import_tasks")
_IMPORT_ROLES = ("ansible.builtin.import_role", "import_role")
_SET_FACT = ("ansible.builtin.set_fact", "set_fact")
# Fixed for a run, but false in every converge: a group under `not ansible_check_mode` runs each time and
# is skipped only by a dry run (`--check`), whose time no one waits on.
_DRY_RUN = {"ansible_check_mode"}
SMALLEST_GROUP = 3


class _Any(dict[str, Any]):
    """Every filter and test name is known: only the variables a template reads matter here."""

    def __contains__(self, key: object) -> bool:
        return True

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key, lambda *args, **kwargs: None)


_JINJA = Environment()
_JINJA.filters, _JINJA.tests = _Any(_JINJA.filters), _Any(_JINJA.tests)


def task_files() -> list[Path]:
    return sorted(ROLES.glob("*/tasks/*.yml"))


def load(path: Path) -> list[dict[str, Any]]:
    return [task for task in yaml.safe_load(path.read_text()) or [] if isinstance(task, dict)]


def all_tasks(tasks: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for task in tasks:
        yield task
        for key in ("block", "rescue", "always"):
            yield from all_tasks(task.get(key) or [])


def set_by(tasks: list[dict[str, Any]]) -> set[str]:
    """The variables these steps register or set (set_fact)."""
    names: set[str] = set()
    for task in all_tasks(tasks):
        if isinstance(task.get("register"), str):
            names.add(task["register"])
        facts = next((task[k] for k in _SET_FACT if k in task), None)
        if isinstance(facts, dict):
            names |= {name for name in facts if name != "cacheable"}
    return names


def set_during_the_run() -> set[str]:
    """Every variable a step or a handler of a role registers or sets."""
    handlers = sorted(ROLES.glob("*/handlers/*.yml"))
    return set().union(*(set_by(load(path)) for path in task_files() + handlers))


def role_variables() -> dict[str, Any]:
    """The roles' own variables (defaults/ and vars/), whose templates a condition reads through."""
    found: dict[str, Any] = {}
    for path in sorted(ROLES.glob("*/defaults/*.yml")) + sorted(ROLES.glob("*/vars/*.yml")):
        found.update(yaml.safe_load(path.read_text()) or {})
    return found


def names_in(template: Any) -> set[str]:
    if isinstance(template, list):
        return set().union(*(names_in(part) for part in template)) if template else set()
    if isinstance(template, dict):
        return names_in(list(template.values()))
    if not isinstance(template, str):
        return set()
    text = template if "{{" in template or "{%" in template else "{{ (" + template + ") }}"
    return set(meta.find_undeclared_variables(_JINJA.parse(text)))


def read_by(condition: Any, variables: dict[str, Any]) -> set[str]:
    """The variables a condition reads, through the roles' variables that it names."""
    seen: set[str] = set()
    pending = names_in(condition)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in variables:
            pending |= names_in(variables[name])
    return seen


def steps_in(tasks: list[dict[str, Any]], directory: Path) -> int:
    """How many steps a list of tasks takes where its imports are expanded (an include is one step)."""
    count = 0
    for task in tasks:
        if "block" in task:
            count += sum(steps_in(task.get(key) or [], directory) for key in ("block", "rescue", "always"))
            continue
        imported = next((task[k] for k in _IMPORT_TASKS if k in task), None)
        role = next((task[k] for k in _IMPORT_ROLES if k in task), None)
        if isinstance(imported, str):
            count += steps_in(load(directory / imported), directory)
        elif isinstance(role, dict):
            entry = str(role.get("tasks_from", "main"))
            entry = entry if entry.endswith(".yml") else f"{entry}.yml"
            count += steps_in(load(ROLES / role["name"] / "tasks" / entry), ROLES / role["name"] / "tasks")
        else:
            count += 1
    return count


def expanded(tasks: list[dict[str, Any]], directory: Path) -> list[dict[str, Any]]:
    """The steps of a list of tasks with its blocks and imported files laid out (includes stay steps)."""
    steps: list[dict[str, Any]] = []
    for task in tasks:
        steps.append(task)
        steps += expanded(
            [t for key in ("block", "rescue", "always") for t in task.get(key) or []], directory
        )
        imported = next((task[k] for k in _IMPORT_TASKS if k in task), None)
        if isinstance(imported, str):
            steps += expanded(load(directory / imported), directory)
    return steps


def inner_tags(tasks: list[dict[str, Any]], directory: Path) -> set[str]:
    """The tags that the steps of a group carry themselves (through its blocks and imported files)."""
    return {tag for step in expanded(tasks, directory) for tag in step.get("tags") or []}


def imported_groups(path: Path) -> Iterator[tuple[str, Any, int]]:
    """(name, condition, steps) of each import and block with a condition in a task file whose steps
    carry no tags the group lacks."""

    def walk(tasks: list[dict[str, Any]]) -> Iterator[tuple[str, Any, int]]:
        for task in tasks:
            grouped = "block" in task or any(k in task for k in _IMPORT_TASKS + _IMPORT_ROLES)
            own = set(task.get("tags") or [])
            inside = [t for key in ("block", "rescue", "always") for t in task.get(key) or []]
            imported = next((task[k] for k in _IMPORT_TASKS if k in task), None)
            if isinstance(imported, str):
                inside += load(path.parent / imported)
            # A step run once under a condition that may differ between hosts runs where the first host
            # that meets it is, as an include, and nowhere where the first host of the play does not, as
            # an import: not the same step, so not asked for.
            once = any(step.get("run_once") for step in expanded(inside, path.parent))
            if grouped and "when" in task and inner_tags(inside, path.parent) <= own and not once:
                yield str(task.get("name")), task["when"], steps_in([task], path.parent)
            for key in ("block", "rescue", "always"):
                yield from walk(task.get(key) or [])

    yield from walk(load(path))


def problems(files: list[Path], runtime: set[str], variables: dict[str, Any]) -> list[str]:
    found = []
    for path in files:
        for name, condition, steps in imported_groups(path):
            read = read_by(condition, variables)
            if steps >= SMALLEST_GROUP and not read & (runtime | _DRY_RUN):
                found.append(
                    f"{path.relative_to(path.parents[2])}: {name!r} imports {steps} steps under "
                    f"{condition!r}, which no step of the run changes: include them (include_tasks with "
                    "`apply: tags`), one step"
                )
    return found


def test_no_group_under_a_condition_fixed_for_the_run_is_imported_step_by_step() -> None:
    assert problems(task_files(), set_during_the_run(), role_variables()) == []


def role(tmp_path: Path, files: dict[str, str]) -> list[Path]:
    tasks = tmp_path / "roles" / "demo" / "tasks"
    tasks.mkdir(parents=True)
    for name, text in files.items():
        (tasks / name).write_text(text)
    return sorted(tasks.glob("*.yml"))


STEPS = "".join(f"- name: Step {n}\n  ansible.builtin.debug: {{}}\n" for n in range(3))


def indented(steps: str) -> str:
    return "".join(f"    {line}\n" for line in steps.splitlines())


def test_the_rule_finds_imports_and_blocks_under_a_fixed_condition(tmp_path: Path) -> None:
    files = role(
        tmp_path,
        {
            "main.yml": (
                "- name: Cloud client\n  ansible.builtin.import_tasks: cloud.yml\n  when: kind == 'cloud'\n"
                "- name: Real GPUs\n  when: not simulated | bool\n  block:\n"
                + indented(STEPS)
                + "- name: Two steps only\n  when: kind == 'cloud'\n  block:\n"
                + indented(STEPS.split("- name: Step 2")[0])
                + "- name: Included\n  ansible.builtin.include_tasks:\n    file: cloud.yml\n"
                "    apply:\n      tags: [demo]\n  when: kind == 'cloud'\n  tags: [demo]\n"
            ),
            "cloud.yml": STEPS,
        },
    )
    assert [p.split(": ")[1].split(" imports")[0] for p in problems(files, set(), {})] == [
        "'Cloud client'",
        "'Real GPUs'",
    ]


def test_conditions_decided_during_the_run_are_left_alone(tmp_path: Path) -> None:
    block = indented(STEPS)
    files = role(
        tmp_path,
        {
            "main.yml": (
                "- name: Found\n  when: __found.rc == 0\n  block:\n"
                + block
                # through a role variable that reads a registered one
                + "- name: Unmet\n  when: __unmet | bool\n  block:\n"
                + block
                + "- name: Not a dry run\n  when: not ansible_check_mode\n  block:\n"
                + block
            )
        },
    )
    variables = {"__unmet": "{{ __check.rc != 0 }}"}
    assert problems(files, {"__found", "__check"}, variables) == []
    assert len(problems(files, set(), variables)) == 2


@pytest.mark.parametrize("name", ["fsx-lustre.yml", "lustre.yml"])
def test_the_shared_filesystems_clients_are_counted_as_steps(name: str) -> None:
    """The count reads the imported file (its blocks and the roles it imports expanded)."""
    tasks = ROLES / "shared_fs" / "tasks"
    assert steps_in([{"ansible.builtin.import_tasks": name}], tasks) >= SMALLEST_GROUP


def test_a_group_whose_steps_carry_tags_of_their_own_is_left_alone(tmp_path: Path) -> None:
    """As one include, `--tags install` would not reach its install step (the include is tagged demo)."""
    tagged = "- name: Step\n  ansible.builtin.debug: {}\n  tags: [install]\n"
    files = role(
        tmp_path,
        {
            "main.yml": "- name: Role on\n  when: demo_enabled | bool\n  tags: [demo]\n  block:\n"
            + indented(STEPS + tagged)
        },
    )
    assert problems(files, set(), {}) == []


def test_a_step_run_once_keeps_its_group_as_it_is(tmp_path: Path) -> None:
    once = "- name: Once\n  ansible.builtin.debug: {}\n  run_once: true\n"
    files = role(
        tmp_path, {"main.yml": "- name: Cloud\n  when: kind == 'cloud'\n  block:\n" + indented(STEPS + once)}
    )
    assert problems(files, set(), {}) == []


def test_a_condition_a_handler_decides_is_decided_during_the_run() -> None:
    """Handlers register too (slurm_controller's reconfigure): a group under what they register is not
    fixed."""
    handlers = set().union(*(set_by(load(path)) for path in sorted(ROLES.glob("*/handlers/*.yml"))))
    assert handlers and handlers <= set_during_the_run()


def includes_with_a_condition() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in task_files():
        for task in expanded(load(path), path.parent):
            included = task.get("ansible.builtin.include_tasks") or task.get("include_tasks")
            if included is not None and "when" in task:
                yield path, task


def test_no_included_file_changes_the_condition_it_was_included_under() -> None:
    """An include's condition is read once, when it is reached: a step inside that set what the condition
    reads would leave the steps after it running where, imported, they would have been skipped."""
    variables, found = role_variables(), []
    for path, task in includes_with_a_condition():
        included = task.get("ansible.builtin.include_tasks") or task.get("include_tasks")
        name = included["file"] if isinstance(included, dict) else included
        if "{{" in str(name):
            continue
        changed = set_by(expanded(load(path.parent / str(name)), path.parent))
        if read_by(task["when"], variables) & changed:
            found.append(f"{path.relative_to(ROLES)}: {task.get('name')!r}")
    assert found == []


def test_the_include_rule_sees_a_step_that_changes_its_condition(tmp_path: Path) -> None:
    files = role(
        tmp_path,
        {
            "main.yml": (
                "- name: Key\n  ansible.builtin.include_tasks: key.yml\n  when: key_file is undefined\n"
            ),
            "key.yml": "- name: Set it\n  ansible.builtin.set_fact:\n    key_file: /k\n" + STEPS,
        },
    )
    (main, key) = files[1], files[0]
    task = load(main)[0]
    assert read_by(task["when"], {}) & set_by(expanded(load(key), key.parent)) == {"key_file"}
