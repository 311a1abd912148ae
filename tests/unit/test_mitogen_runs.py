"""Mitogen for Ansible on the local platform's container nodes (infra/nodes/mitogen.py): which runs use it,
what they hand ansible-playbook, and, against a real container, that a module runs with the node's own
environment and not the controller's."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible_mitogen import affinity

from infra.backends.local.cluster import BASE_IMAGE
from infra.errors import GpuPlatError
from infra.nodes import mitogen, playbook_run
from infra.nodes.podman import exists, podman


def _project_strategy() -> Any:
    spec = importlib.util.spec_from_file_location(
        "gpuplat_mitogen_linear", mitogen.PROJECT_STRATEGIES / f"{mitogen.STRATEGY}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpuplat_strategy = _project_strategy()

PROXY = "http://proxy.example:3128"
RECAP = "PLAY RECAP ***\nnode-0 : ok=1 changed=0 unreachable=0 failed=0 skipped=0 rescued=0 ignored=0\n"


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ansible-playbook stand-in that records its arguments and environment, and ends with a recap."""
    record = tmp_path / "record.json"
    program = tmp_path / "ansible-playbook"
    program.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(record)!r}, 'w'))\n"
        f"print({RECAP!r})\n"
    )
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(playbook_run, "ansible_playbook_binary", lambda: str(program))
    monkeypatch.delenv(mitogen.SWITCH, raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    return record


def _run(tmp_path: Path, record: Path, **options: object) -> dict[str, object]:
    playbook_run.run_playbook("site.yml", tmp_path / "inventory", tmp_path / "logs", **options)  # type: ignore[arg-type]
    recorded: dict[str, object] = json.loads(record.read_text())
    return recorded


def _extra_vars(argv: list[str]) -> dict[str, str]:
    found = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-e" and argv[i + 1].startswith("{")]
    return json.loads(found[0]) if found else {}


def test_runs_on_container_nodes_use_mitogens_setns_with_a_clean_interpreter(
    tmp_path: Path, recorder: Path
) -> None:
    recorded = _run(tmp_path, recorder, containers=True)
    env, argv = recorded["env"], recorded["argv"]
    assert isinstance(env, dict) and isinstance(argv, list)
    assert env["ANSIBLE_STRATEGY"] == "gpuplat_mitogen_linear"
    project, mitogens = env["ANSIBLE_STRATEGY_PLUGINS"].split(":")[:2]
    assert Path(project, "gpuplat_mitogen_linear.py").is_file()
    assert Path(mitogens, "mitogen_linear.py").is_file()
    extra = _extra_vars(argv)
    assert extra["ansible_connection"] == "setns" and extra["mitogen_kind"] == "docker"
    assert Path(extra["mitogen_docker_path"]).name == "podman"
    interpreter = shlex.split(extra["ansible_python_interpreter"])
    assert interpreter == ["/usr/bin/python3", "-I", "-c", mitogen.ADOPT_CONTAINER_ENVIRONMENT]


def test_other_runs_and_the_switched_off_or_unprivileged_ones_use_plain_ansible(
    tmp_path: Path, recorder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def plain(recorded: dict[str, object]) -> bool:
        env, argv = recorded["env"], recorded["argv"]
        assert isinstance(env, dict) and isinstance(argv, list)
        return "ANSIBLE_STRATEGY" not in env and not _extra_vars(argv)

    # A playbook that may delegate to localhost (validate.yml) is not run as container nodes.
    assert plain(_run(tmp_path, recorder))
    monkeypatch.setenv(mitogen.SWITCH, "0")
    assert plain(_run(tmp_path, recorder, containers=True))
    monkeypatch.delenv(mitogen.SWITCH)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # setns needs root
    assert plain(_run(tmp_path, recorder, containers=True))


def test_a_strategy_path_of_the_users_is_kept_after_mitogens(
    tmp_path: Path, recorder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANSIBLE_STRATEGY_PLUGINS", "/opt/mine")
    env = _run(tmp_path, recorder, containers=True)["env"]
    assert isinstance(env, dict)
    assert env["ANSIBLE_STRATEGY_PLUGINS"].endswith(":/opt/mine")


BROKEN = """Traceback (most recent call last):
  File "site-packages/ansible_mitogen/plugins/strategy/mitogen_linear.py", line 1, in <module>
ImportError: cannot import name 'x' from 'ansible.plugins.loader'
ERROR! Unexpected Exception, this is probably a bug: cannot import name 'x' from 'ansible.plugins.loader'
"""


def test_a_run_that_fails_in_mitogen_itself_says_how_to_run_without_it(
    tmp_path: Path, recorder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    program = tmp_path / "ansible-playbook"
    program.write_text(f"#!{sys.executable}\nimport sys\nprint({BROKEN!r})\nsys.exit(250)\n")
    with pytest.raises(GpuPlatError) as failed:
        playbook_run.run_playbook("site.yml", tmp_path / "inventory", tmp_path / "logs", containers=True)
    assert f"{mitogen.SWITCH}=0 runs the playbooks with plain Ansible" in str(failed.value)
    # A plain run's failure says nothing of Mitogen.
    with pytest.raises(GpuPlatError) as plain:
        playbook_run.run_playbook("site.yml", tmp_path / "inventory", tmp_path / "logs")
    assert mitogen.SWITCH not in str(plain.value)


@pytest.fixture
def node() -> Iterator[str]:
    name = f"gpuplat-test-mitogen-{uuid.uuid4().hex[:8]}"
    # A variable the container was started with, as podman passes the host's proxy variables by default.
    podman("run", "--detach", "--name", name, "--env", f"HTTPS_PROXY={PROXY}", BASE_IMAGE, "sleep", "600")
    yield name
    podman("rm", "--force", "--time", "0", name, check=False)


NEEDS_A_NODE = pytest.mark.skipif(
    shutil.which("podman") is None or os.geteuid() != 0 or not exists("image", BASE_IMAGE),
    reason=f"needs root, podman and the base image {BASE_IMAGE} (make image)",
)


def _play_on(node: str, tasks: list[dict[str, object]], tmp_path: Path, **env: str) -> None:
    """Run `tasks` on the container `node` the way gpuplat runs site.yml there (Mitogen's setns)."""
    speedup = mitogen.container_speedup(dict(os.environ))
    assert speedup is not None
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"node-0": {"ansible_host": node}}}}))
    (tmp_path / "play.yml").write_text(json.dumps([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    environment = {**os.environ, **speedup.env, **env}
    environment["ANSIBLE_CONFIG"] = str(playbook_run.PROJECT_ROOT / "ansible.cfg")
    command = [
        playbook_run.ansible_playbook_binary(),
        "-i",
        str(tmp_path / "hosts.yml"),
        str(tmp_path / "play.yml"),
    ]
    done = subprocess.run(
        [*command, "-e", json.dumps(speedup.extra_vars)],
        capture_output=True, text=True, env=environment, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.mark.containers
@NEEDS_A_NODE
def test_a_module_run_through_setns_sees_the_nodes_environment_not_the_controllers(
    tmp_path: Path, node: str
) -> None:
    tasks = [
        {"ansible.builtin.command": "env", "register": "seen", "changed_when": False},
        {"ansible.builtin.copy": {"content": "{{ seen.stdout }}", "dest": "/tmp/seen"}},
    ]
    _play_on(node, tasks, tmp_path, GPUPLAT_CONTROLLER_ONLY="1")
    seen = dict(
        line.partition("=")[::2] for line in podman("exec", node, "cat", "/tmp/seen").stdout.splitlines()
    )
    assert "GPUPLAT_CONTROLLER_ONLY" not in seen and "ANSIBLE_STRATEGY" not in seen
    # What the container was started with (the image's, podman's and --env), as gpuplat_podman hands a module.
    started = podman("container", "inspect", "--format", "{{json .Config.Env}}", node).stdout
    for variable in json.loads(started):
        name, _, value = variable.partition("=")
        assert seen.get(name) == value, (variable, seen)
    assert seen["HTTPS_PROXY"] == PROXY and seen["container"] == "podman"


def _cpus(status_line: str) -> set[int]:
    """The CPUs of a /proc/PID/status `Cpus_allowed_list:` line ("0-1,4")."""
    found: set[int] = set()
    for part in status_line.split(":", 1)[1].strip().split(","):
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


@pytest.mark.containers
@NEEDS_A_NODE
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell a pinned process")
def test_a_worker_and_a_module_in_the_node_may_run_on_every_cpu_of_the_run(tmp_path: Path, node: str) -> None:
    """Mitogen's own placement (ansible_mitogen/affinity.py) pins the controller, its workers and the nodes'
    interpreters, with every module they run, to CPU 1 of a 2-CPU machine (to CPUs 2.. of a larger one);
    the strategy gpuplat names (playbooks/strategy_plugins/gpuplat_mitogen_linear.py) places nothing."""
    tasks = [
        # The module's process, a child of the node's interpreter that the multiplexer started.
        {"ansible.builtin.command": "grep Cpus_allowed_list /proc/self/status", "register": "module"},
        # A lookup runs in the task's worker, forked from the controller: $PPID of its shell is the worker.
        {"ansible.builtin.copy": {
            "content": "{{ module.stdout }}\n{{ lookup('ansible.builtin.pipe', 'grep Cpus_allowed_list "
            "/proc/$PPID/status') }}\n",
            "dest": "/tmp/cpus",
        }},
    ]  # fmt: skip
    _play_on(node, tasks, tmp_path)
    module, worker = podman("exec", node, "cat", "/tmp/cpus").stdout.splitlines()
    every = os.sched_getaffinity(0)
    if multiprocessing.cpu_count() < gpuplat_strategy.SPREADS_FROM_CPUS:
        assert _cpus(module) == every and _cpus(worker) == every, (module, worker, every)
    else:  # Mitogen's own placement: CPUs 0 and 1 kept for its multiplexer and the controller
        assert not _cpus(module) & {0, 1} and len(_cpus(worker)) == 1, (module, worker, every)


@pytest.mark.parametrize(("cpus", "kept"), [(1, False), (2, False), (3, False), (4, True), (16, True)])
def test_mitogens_placement_is_kept_only_where_it_spreads_the_work(cpus: int, kept: bool) -> None:
    """Below 4 CPUs Mitogen reserves CPU 0 for its multiplexer and crowds everything else together."""
    mitogens = affinity.FixedPolicy(cpu_count=cpus)
    chosen = gpuplat_strategy.placement(mitogens)
    assert (chosen is mitogens) == kept
    assert kept or type(chosen) is affinity.Policy


def test_the_local_platforms_site_runs_and_only_those_ask_for_container_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node joining (whole, by its join tags, and the node-list roles again) runs site.yml on containers."""
    from types import SimpleNamespace

    from infra.backends.local import join

    runs: list[dict[str, object]] = []

    def run_playbook(
        playbook: str, inventory: Path, log_dir: Path, **options: object
    ) -> playbook_run.PlaybookRun:
        runs.append({"playbook": playbook, **options})
        return playbook_run.PlaybookRun(playbook, 0, [], log_dir / "site.log")

    monkeypatch.setattr(join, "run_playbook", run_playbook)
    monkeypatch.setattr(join, "provision_munge_key", lambda cluster, names: None)
    monkeypatch.setenv("GPUPLAT_STATE_DIR", str(tmp_path))
    cluster = SimpleNamespace(
        platform=SimpleNamespace(name="local"),
        node=lambda name: SimpleNamespace(name=name),
        started_from_image=lambda node: node.name == "train-1",
    )
    join.join(cluster, ["train-1", "train-2"], tmp_path / "inventory")  # type: ignore[arg-type]
    assert [run.get("tags") for run in runs] == [None, join.JOIN_TAGS, join.NODE_LIST_ROLES]
    assert all(run["playbook"] == "site.yml" and run.get("containers") is True for run in runs), runs


def _reached_roles(playbook: Path, seen: set[str]) -> list[dict[str, object]]:
    """The plays of a playbook and those it imports; `seen` gets the roles they reach (their roles, the roles
    those include, and their meta dependencies)."""
    import yaml

    plays: list[dict[str, object]] = []
    for play in yaml.safe_load(playbook.read_text()) or []:
        imported = play.get("ansible.builtin.import_playbook")
        if imported:
            plays += _reached_roles(playbook.parent / imported, seen)
            continue
        plays.append(play)
        names = [r["role"] if isinstance(r, dict) else r for r in play.get("roles", [])]
        names += re.findall(r"name: (\w+)", yaml.safe_dump(play.get("tasks", [])))
        pending = list(names)
        while pending:
            role = pending.pop()
            if role in seen or not (ROLES / role).is_dir():
                continue
            seen.add(role)
            text = "".join(f.read_text() for f in (ROLES / role).glob("*/*.yml"))
            pending += re.findall(r"role: (\w+)", text) + re.findall(r"name: (\w+)\n", text)
    return plays


ROLES = playbook_run.PROJECT_ROOT / "roles"
ON_THE_CONTROLLER = re.compile(
    r"delegate_to: *[\"']?(localhost|127\.0\.0\.1)|connection: *local|local_action|hosts: *localhost"
)


def test_nothing_site_yml_reaches_runs_on_the_controller() -> None:
    """Mitogen's connection is given as extra variables, which outrank the inventory for every host,
    localhost too: a play, task or handler of site.yml that runs on the controller would be sent into a
    container named localhost. validate.yml, which does, runs without it."""
    roles: set[str] = set()
    plays = _reached_roles(playbook_run.PROJECT_ROOT / "playbooks" / "site.yml", roles)
    assert {"node_identity", "shared_fs", "slurm_controller", "inference_server", "munge"} <= roles, roles
    found = [f"playbook: {play.get('name')}" for play in plays if ON_THE_CONTROLLER.search(json.dumps(play))]
    for role in sorted(roles):
        for path in sorted((ROLES / role).glob("*/*.yml")):
            found += [f"{path}: {m.group(0)}" for m in ON_THE_CONTROLLER.finditer(path.read_text())]
    assert not found, found
    validate_roles: set[str] = set()
    _reached_roles(playbook_run.PROJECT_ROOT / "playbooks" / "validate.yml", validate_roles)
    assert any(
        ON_THE_CONTROLLER.search(path.read_text())
        for role in validate_roles
        for path in (ROLES / role).glob("*/*.yml")
    ), "the check finds validate.yml's steps on the controller"
