"""roles/slurm_elastic as Ansible renders it (no containers): its variables, the controller timers
(keep-static, reconcile) and the settings file the program reads."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from gpuplat_ec2_nodes.settings import load_settings

from tests.roles.ansible_values import render_value
from tests.roles.test_ec2_nodes import ROLE

yaml = pytest.importorskip("yaml")
jinja2 = pytest.importorskip("jinja2")


def load(relative: str) -> Any:
    return yaml.safe_load((ROLE / relative).read_text())


def role_variables(**overrides: Any) -> dict[str, Any]:
    """defaults, the inventory's values, then vars (rendered in order), as Ansible resolves them."""
    env = jinja2.Environment()
    env.filters["to_nice_json"] = lambda value: json.dumps(value, indent=4)
    variables: dict[str, Any] = {
        "ansible_managed": "managed",
        **load("defaults/main.yml"),
        "slurm_elastic_stack": "prod",
        "slurm_elastic_region": "us-east-1",
        "slurm_elastic_pools": {
            "train": {"launch_template_id": "lt-1", "subnet_id": None, "static_nodes": []}
        },
        **overrides,
    }
    for key, value in load("vars/main.yml").items():
        if isinstance(value, dict):
            variables[key] = {k: resolve(env, v, variables) for k, v in value.items()}
        elif isinstance(value, list):
            variables[key] = [resolve(env, v, variables) for v in value]
        else:
            variables[key] = resolve(env, value, variables)
    return variables


def resolve(env: Any, value: Any, variables: dict[str, Any]) -> Any:
    """A lone expression keeps its type (a dict, an int), as Ansible's templating gives it."""
    lone = re.fullmatch(r"\{\{(.*)\}\}", value.strip()) if isinstance(value, str) else None
    if lone and "{{" not in lone.group(1):
        return env.compile_expression(lone.group(1).strip())(**variables)
    return render_value(env, value, variables)


def render(template: str, variables: dict[str, Any]) -> str:
    return jinja2.Template((ROLE / "templates" / template).read_text()).render(**variables)


def unit(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def test_every_default_is_declared_in_the_argument_specs() -> None:
    specs = load("meta/argument_specs.yml")["argument_specs"]
    declared = {name: option for entry in specs.values() for name, option in entry["options"].items()}
    defaults = load("defaults/main.yml")
    assert sorted(set(defaults) - set(declared)) == []
    for name, value in defaults.items():
        assert name.startswith("slurm_elastic_")
        assert declared[name]["default"] == value, name


def test_the_reconcile_timer_runs_every_interval_as_slurm_user() -> None:
    variables = role_variables(slurm_elastic_reconcile_interval_s=45)
    timer = unit(render("gpuplat-reconcile.timer.j2", variables))
    assert timer["OnUnitActiveSec"] == timer["OnBootSec"] == "45s"
    service = unit(render("gpuplat-reconcile.service.j2", variables))
    assert service["Type"] == "oneshot" and service["User"] == "slurm"
    assert service["ExecStart"] == (
        "/usr/local/sbin/gpuplat-ec2-nodes --config /etc/gpuplat/ec2-nodes.json "
        "--log-file /var/log/gpuplat/ec2-nodes.log reconcile"
    )
    assert unit(render("gpuplat-reconcile.timer.j2", role_variables()))["OnUnitActiveSec"] == "60s"


def test_the_controller_commands_take_the_endpoint_when_one_is_set() -> None:
    variables = role_variables(slurm_elastic_endpoint_url="http://10.9.0.1:5000")
    keep_static = unit(render("gpuplat-keep-static.service.j2", variables))["ExecStart"]
    assert keep_static.endswith("--endpoint-url http://10.9.0.1:5000 keep-static")
    wrapper = render("gpuplat-slurm-wrapper.j2", {**variables, "item": {"command": "resume"}})
    assert '--endpoint-url http://10.9.0.1:5000 resume "$@"' in wrapper


def test_the_role_installs_and_starts_both_controller_timers() -> None:
    tasks = {task["name"]: task for task in load("tasks/main.yml")}
    variables = role_variables()
    env = jinja2.Environment()
    files = [
        render_value(env, item, variables)
        for item in tasks["Controller timers (keep-static, reconcile)"]["loop"]
    ]
    assert files == [
        "gpuplat-keep-static.service",
        "gpuplat-keep-static.timer",
        "gpuplat-reconcile.service",
        "gpuplat-reconcile.timer",
    ]
    for name in files:
        assert (ROLE / "templates" / f"{name}.j2").is_file()
    started = tasks["Start the controller timers"]
    assert started["loop"] == "{{ __slurm_elastic_timer_units }}"
    assert variables["__slurm_elastic_timer_units"] == ["gpuplat-keep-static", "gpuplat-reconcile"]
    state_dir = tasks["State directory (keep-static's back-off, reconcile's record; written by SlurmUser)"]
    assert state_dir["ansible.builtin.file"]["owner"] == "{{ slurm_elastic_slurm_user }}"


def test_the_settings_file_is_what_the_program_reads(tmp_path: Path) -> None:
    variables = role_variables(
        slurm_elastic_orphan_grace_s=120,
        slurm_elastic_static_backoff_base_s=30,
        slurm_elastic_pools={
            "train": {"launch_template_id": "lt-1", "subnet_id": None, "static_nodes": ["train-0"]}
        },
    )
    path = tmp_path / "ec2-nodes.json"
    path.write_text(json.dumps(variables["__slurm_elastic_settings"]))
    settings = load_settings(path)
    assert settings.state_dir == Path("/var/lib/gpuplat")
    assert (settings.orphan_grace_s, settings.static_backoff_base_s, settings.static_backoff_max_s) == (
        120.0,
        30.0,
        3600.0,
    )
    assert settings.static_nodes == ["train-0"]


def test_the_role_installs_the_whole_package_where_its_launcher_looks() -> None:
    """tasks/program.yml copies files/gpuplat_ec2_nodes/*.py one by one (not the __pycache__ the tests
    leave there), so the package stays flat; the launcher the wrappers and units run puts the directory
    holding the package first on sys.path, and the spot watcher restarts when any of it changes."""
    package = ROLE / "files" / "gpuplat_ec2_nodes"
    assert [p.name for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"] == []
    assert {"__init__.py", "__main__.py", "cli.py"} <= {p.name for p in package.glob("*.py")}
    tasks = {task["name"]: task for task in load("tasks/program.yml")}
    modules = tasks["Install the gpuplat-ec2-nodes package"]
    assert modules["loop"] == "{{ query('ansible.builtin.fileglob', 'gpuplat_ec2_nodes/*.py') | sort }}"
    copy = modules["ansible.builtin.copy"]
    assert copy["dest"] == "{{ __slurm_elastic_package_dir }}/{{ item | basename }}"
    variables = role_variables()
    lib = variables["__slurm_elastic_program_lib"]
    assert variables["__slurm_elastic_package_dir"] == f"{lib}/gpuplat_ec2_nodes"
    launcher_task = tasks["Install gpuplat-ec2-nodes (runs the package)"]
    assert launcher_task["ansible.builtin.template"]["dest"] == "{{ __slurm_elastic_program }}"
    assert variables["__slurm_elastic_program"] == "/usr/local/sbin/gpuplat-ec2-nodes"
    launcher = render("gpuplat-ec2-nodes.j2", variables)
    assert f'sys.path.insert(0, "{lib}")' in launcher
    compile(launcher, "gpuplat-ec2-nodes", "exec")
    for task in (modules, launcher_task):
        assert task["notify"] == "slurm_elastic spot-watch changed"
