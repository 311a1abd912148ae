"""The local cluster's connection plugin (playbooks/connection_plugins/gpuplat_podman.py), against
stand-ins for podman and nsenter that record how they were called."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from ansible import constants
from ansible.errors import AnsibleConnectionFailure
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader, init_plugin_loader

from infra.nodes.playbook_run import PROJECT_ROOT

CONTAINER_ENV = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "container=podman", "HOSTNAME=train-0"]


def stand_in(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """podman answers `container inspect` with the file inspect (this test's own PID, a live process)
    and logs every call; nsenter logs its arguments and environment, then runs the command here."""
    directory = tmp_path / "bin"
    directory.mkdir()
    log = tmp_path / "calls"
    (tmp_path / "inspect").write_text(f"{os.getpid()} {json.dumps(CONTAINER_ENV)}\n")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (rootfs / "etc").mkdir()
    stand_in(
        directory,
        "podman",
        f'echo podman "$@" >> {log}\n'
        f"case $1 in container) cat {tmp_path}/inspect;; mount) echo {rootfs};; esac",
    )
    stand_in(
        directory,
        "nsenter",
        f'echo nsenter "$@" >> {log}\nenv | sort > {tmp_path}/env\n'
        'while [ "$1" != -- ]; do shift; done; shift; exec "$@"',
    )
    monkeypatch.setenv("PATH", f"{directory}:{os.environ['PATH']}")
    monkeypatch.setattr(constants, "DEFAULT_LOCAL_TMP", str(tmp_path))
    return directory


@pytest.fixture(scope="module", autouse=True)
def plugins() -> None:
    init_plugin_loader()
    connection_loader.add_directory(str(PROJECT_ROOT / "playbooks" / "connection_plugins"))


def connect(user: str | None = None) -> Any:
    context = PlayContext()
    context.remote_addr = "gpuplat-local-train-0"
    context.remote_user = user
    connection = connection_loader.get("gpuplat_podman", context, None)
    connection.set_options(var_options={"inventory_hostname": "gpuplat-local-train-0"})
    return connection


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


def test_as_root_a_task_runs_in_the_container_namespaces_with_its_environment(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    rc, out, _ = connect().exec_command("/bin/sh -c 'cat; echo done'", in_data=b"module source\n")
    assert (rc, out) == (0, b"module source\ndone\n")
    inspect, enter = calls(tmp_path)
    assert inspect.startswith("podman container inspect --format")
    assert enter == f"nsenter --target {os.getpid()} --all --root --wd -- /bin/sh -c cat; echo done"
    seen = (tmp_path / "env").read_text().splitlines()
    assert "container=podman" in seen and "HOSTNAME=train-0" in seen
    assert not any(line.startswith("VIRTUAL_ENV=") for line in seen), "the controller's environment leaked in"


def test_later_tasks_reuse_the_init_process_while_it_lives(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for _ in range(3):
        assert connect().exec_command("true")[0] == 0
    assert [c.split()[0] for c in calls(tmp_path)] == ["podman", "nsenter", "nsenter", "nsenter"]


def test_a_restarted_container_is_looked_up_again(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    connect().exec_command("true")
    cache = tmp_path / "gpuplat_podman-gpuplat-local-train-0.json"
    known = json.loads(cache.read_text())
    cache.write_text(json.dumps({**known, "start_time": "1"}))
    connect().exec_command("true")
    assert [c.split()[0] for c in calls(tmp_path)] == ["podman", "nsenter", "podman", "nsenter"]


def test_files_are_streamed_both_ways(bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    source, inside, back = tmp_path / "source", tmp_path / "in container", tmp_path / "fetched"
    source.write_bytes(b"\x00binary\nslurm.conf\n")
    connection = connect()
    connection.put_file(str(source), str(inside))
    connection.fetch_file(str(inside), str(back))
    assert inside.read_bytes() == back.read_bytes() == source.read_bytes()
    assert all(c.startswith(("podman container inspect", "nsenter")) for c in calls(tmp_path))


def test_a_stopped_container_is_unreachable(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    (tmp_path / "inspect").write_text("0 []\n")
    with pytest.raises(AnsibleConnectionFailure, match="gpuplat-local-train-0 is not running"):
        connect().exec_command("true")


@pytest.mark.parametrize(("euid", "user"), [(1000, None), (0, "slurm")])
def test_without_root_or_with_a_remote_user_modules_go_through_podman_exec(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, euid: int, user: str | None
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    connect(user).exec_command("python3 -", in_data=b"print(1)")
    last = calls(tmp_path)[-1]
    assert last.startswith("podman exec --interactive")
    assert ("--user slurm" in last) == (user is not None)
    assert not any(c.startswith("nsenter") for c in calls(tmp_path))
