"""The Molecule tiers under Mitogen for Ansible (infra/nodes/mitogen.py, scripts/lib/molecule-mitogen.sh):
what `python -m infra.nodes.mitogen` exports, rendered by Molecule itself into each scenario's inventory and
environment, reaches every instance through setns with the gpuplat_mitogen_linear strategy, leaves localhost
alone, and falls back to gpuplat_podman where Mitogen is off."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.nodes import mitogen
from molecule import config

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ["node_base", "gpu_stack", "slurm_cluster", "serving"]
SCRIPTS = ["scripts/test-roles.sh", "scripts/test-scheduler.sh", "scripts/test-serving.sh"]


def _exports(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """What the scripts' `eval "$(python -m infra.nodes.mitogen)"` sets, read back as the shell reads it."""
    assert mitogen.main() == 0
    found: dict[str, str] = {}
    for line in capsys.readouterr().out.splitlines():
        export, assignment = shlex.split(line)
        assert export == "export"
        name, _, value = assignment.partition("=")
        found[name] = value
    return found


def _rendered(
    scenario: str, exported: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> config.Config:
    """Molecule's own view of a scenario (base config merged, variables interpolated) in this environment."""
    for name in list(os.environ):
        if name.startswith(mitogen.MOLECULE_PREFIX) or name.startswith("ANSIBLE_STRATEGY"):
            monkeypatch.delenv(name)
    for name, value in exported.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # ansible-config
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(ROOT)
    return config.Config(
        molecule_file=f"molecule/{scenario}/molecule.yml",
        args={"base_config": [".config/molecule/config.yml"]},
        command_args={},
        ansible_args=(),
    )


@pytest.fixture
def as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mitogen.SWITCH, raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_instance_of_a_scenario_runs_under_mitogens_setns_as_root(
    scenario: str,
    as_root: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    exported = _exports(capsys)
    speedup = mitogen.container_speedup(dict(os.environ))
    assert speedup is not None, "the unit tests run where the local platform would use Mitogen"
    rendered = _rendered(scenario, exported, monkeypatch, tmp_path)
    assert rendered.provisioner is not None
    hosts = rendered.provisioner.inventory["all"]["hosts"]
    assert hosts and "localhost" not in hosts
    for name, options in hosts.items():
        # The interpreter survives the shell's quoting and Molecule's interpolation unchanged.
        assert {key: options[key] for key in speedup.extra_vars} == speedup.extra_vars, name
    # The scenario's own host variables do not put a connection back (they outrank Molecule's host entries).
    for name, variables in rendered.config_data["provisioner"]["inventory"]["host_vars"].items():
        assert "ansible_connection" not in variables, name
    env = rendered.provisioner.env
    assert env["ANSIBLE_STRATEGY"] == mitogen.STRATEGY
    assert env["ANSIBLE_STRATEGY_PLUGINS"] == speedup.env["ANSIBLE_STRATEGY_PLUGINS"]


@pytest.mark.parametrize("switched_off", ["GPUPLAT_MITOGEN=0", "not root"])
def test_without_mitogen_every_instance_is_reached_through_gpuplat_podman(
    switched_off: str,
    as_root: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    if switched_off == "not root":
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
    else:
        monkeypatch.setenv(mitogen.SWITCH, "0")
    exported = _exports(capsys)
    assert exported == {}
    rendered = _rendered("slurm_cluster", exported, monkeypatch, tmp_path)
    assert rendered.provisioner is not None
    for name, options in rendered.provisioner.inventory["all"]["hosts"].items():
        assert options["ansible_connection"] == "gpuplat_podman", name
        assert options["ansible_python_interpreter"] == "auto_silent", name
    assert "ANSIBLE_STRATEGY" not in rendered.provisioner.env


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_molecule_tier_script_takes_the_shared_settings(script: str) -> None:
    text = (ROOT / script).read_text()
    if 'source "$ROOT/scripts/lib/test-steps.sh"' in text:  # test-roles.sh, test-serving.sh
        text = (ROOT / "scripts/lib/test-steps.sh").read_text()
    # a line of its own, run unconditionally (not `: source ...` nor behind `false &&`)
    sources = [line for line in text.splitlines() if line.endswith('lib/molecule-mitogen.sh"')]
    assert sources and all(line.startswith("source ") for line in sources), sources


def _sourced(environment: dict[str, str], directory: Path) -> dict[str, str]:
    """What scripts/lib/molecule-mitogen.sh leaves set in a bash that sources it from `directory`."""
    shown = subprocess.run(
        [
            "bash",
            "-c",
            f"source {shlex.quote(str(ROOT / 'scripts/lib/molecule-mitogen.sh'))} >/dev/null; env -0",
        ],
        cwd=directory,
        env=environment,
        capture_output=True,
        check=True,
    ).stdout.decode()
    pairs = (entry.partition("=") for entry in shown.split("\0") if entry)
    return {
        name: value
        for name, _, value in pairs
        if name.startswith(mitogen.MOLECULE_PREFIX) or name.startswith("ANSIBLE_STRATEGY")
    }


def test_the_sourced_file_sets_what_the_module_says_from_any_directory_and_clears_it_when_switched_off(
    tmp_path: Path,
) -> None:
    """The shell's side, run: from another directory (test-scheduler.sh sources it before its `cd`), its
    settings are the module's own; sourced again with GPUPLAT_MITOGEN=0 in a shell that kept them, none stay
    (a partial leftover, setns without the strategy, fails every task)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(mitogen.MOLECULE_PREFIX)}
    environment = {k: v for k, v in environment.items() if not k.startswith("ANSIBLE_STRATEGY")}
    environment |= {"VENV": str(Path(sys.executable).parent.parent)}
    environment.pop(mitogen.SWITCH, None)
    expected = mitogen.molecule_environment(environment)
    assert _sourced(environment, tmp_path) == expected
    kept = environment | expected | {mitogen.SWITCH: "0"}
    assert _sourced(kept, tmp_path) == {}


SYSTEMD_READY = ROOT / "molecule/shared/systemd_ready.yml"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_creates_its_instances_then_waits_for_their_systemd_through_the_shared_retried_task(
    scenario: str,
    as_root: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    rendered = _rendered(scenario, _exports(capsys), monkeypatch, tmp_path)
    assert rendered.provisioner is not None
    create = Path(rendered.provisioner.playbooks.create)
    tasks = [task for play in yaml.safe_load(create.read_text()) for task in play.get("tasks", [])]
    started = next(i for i, task in enumerate(tasks) if "containers.podman.podman_container" in task)
    imports = [
        (create.parent / task["ansible.builtin.import_tasks"]).resolve()
        for task in tasks[started + 1 :]
        if "ansible.builtin.import_tasks" in task
    ]
    assert SYSTEMD_READY in imports, f"{create.relative_to(ROOT)} does not wait for systemd after its start"
    assert "is-system-running" not in create.read_text(), "the wait is written once, in the shared file"


def test_the_shared_systemd_wait_asks_again_until_the_bus_answers() -> None:
    (wait,) = yaml.safe_load(SYSTEMD_READY.read_text())
    assert "systemctl is-system-running --wait" in wait["ansible.builtin.command"]
    assert wait["until"] == wait["failed_when"].replace("not in", "in")
    assert wait["retries"] * wait["delay"] >= 30
