"""The package_pins role: whether an apt task with state=present would leave a host as it is, told by one
dpkg-query (files/packages_met.py), and every role's package task running apt only then."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "roles" / "package_pins" / "files" / "packages_met.py"
INSTALL_MODULES = ("ansible.builtin.apt", "ansible.builtin.package")
GUARD = "package_pins_check.rc != 0"

# What `dpkg-query -W -f '${Package}\t${db:Status-Abbrev}\t${Version}\n'` prints for each state: the
# desired action, the status, the error flag (dpkg-query(1), "db:Status-Abbrev"; dpkg(1) for the letters).
DPKG = {
    "bash": ("ii ", "5.2.15-2+b8"),
    "nvidia-driver-cuda": ("hi ", "570.195.03-1"),  # held: still installed
    "libcuda1": ("ii ", "580.95.05-1"),  # drifted off a 570 pin
    "datacenter-gpu-manager": ("ii ", "1:3.3.9"),  # an epoch
    "munge": ("rc ", ""),  # removed, its configuration files left
    "slurmd": ("iU ", "22.05.8-4"),  # unpacked, not configured
    "slurmctld": ("iiR", "22.05.8-4"),  # installed, reinstallation required
    "libnccl2": ("hi ", "2.27.3-1+cuda12.9"),  # roles/nccl's pin: a wildcard inside the version
}


@pytest.fixture
def fake_dpkg(tmp_path: Path) -> dict[str, str]:
    """PATH with a dpkg-query that answers from DPKG as the real one does (rc 1 for an unknown name)."""
    tool = tmp_path / "bin" / "dpkg-query"
    tool.parent.mkdir()
    tool.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"known = json.loads({json.dumps(json.dumps(DPKG))})\n"
        "args = sys.argv[1:]\n"
        "assert args[:3] == ['-W', '-f', '${Package}\\t${db:Status-Abbrev}\\t${Version}\\n'], args\n"
        "rc = 0\n"
        "for name in args[args.index('--') + 1:]:\n"
        "    if name in known:\n"
        "        status, version = known[name]\n"
        "        sys.stdout.write(f'{name}\\t{status}\\t{version}\\n')\n"
        "    else:\n"
        "        sys.stderr.write(f'dpkg-query: no packages found matching {name}\\n')\n"
        "        rc = 1\n"
        "sys.exit(rc)\n"
    )
    tool.chmod(0o755)
    return {"PATH": f"{tool.parent}:/usr/bin:/bin"}


def check(environment: dict[str, str], *specs: str) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-I", str(CHECK), *specs],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
        timeout=60,
    )
    return result.returncode, result.stdout.strip()


def test_met_when_every_package_is_installed_at_its_pin(fake_dpkg: dict[str, str]) -> None:
    assert check(fake_dpkg, "bash") == (0, "met")
    assert check(fake_dpkg, "bash=5.2.15-*", "nvidia-driver-cuda=570.195.03-*") == (0, "met")
    assert check(fake_dpkg, "datacenter-gpu-manager=1:3.3.9*") == (0, "met")
    assert check(fake_dpkg, "libnccl2=2.27.3-*+cuda12.9") == (0, "met")  # fnmatch, not a prefix


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("libcuda1=570.195.03-*", "libcuda1=570.195.03-*: 580.95.05-1 installed"),  # drift: apt downgrades
        ("bash=5.3*", "bash=5.3*: 5.2.15-2+b8 installed"),  # an upgrade to the pin
        ("datacenter-gpu-manager=3.3.9*", "3.3.9*: 1:3.3.9 installed"),  # the epoch is part of the version
        ("libnccl2=2.27.3-*+cuda12.8", "2.27.3-1+cuda12.9 installed"),  # another CUDA build of the release
        ("libnccl2=2.27.3-1+cuda12", "2.27.3-1+cuda12.9 installed"),  # the whole version, not a prefix
        ("nfs-common", "nfs-common: not installed"),  # unknown to dpkg
        ("munge", "munge: not installed"),  # configuration files only
        ("slurmd", "slurmd: not installed"),  # half installed
        ("slurmctld", "slurmctld: not installed"),  # needs reinstalling
        ("slurm*", "slurm*: left to apt"),  # a name pattern: apt expands it
        ("bash>=5", "bash>=5: left to apt"),
    ],
)
def test_not_met_names_the_package_and_why(fake_dpkg: dict[str, str], spec: str, why: str) -> None:
    rc, said = check(fake_dpkg, "bash", spec)
    assert rc == 1
    assert said.endswith(why)


def test_against_this_hosts_own_dpkg() -> None:
    """The real dpkg-query's answer read right (the format, the status letters): this host's python3 is
    installed at its version, and at no other."""
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    found = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", "python3"], capture_output=True, text=True, check=True
    )
    version = found.stdout.strip()
    assert check(environment, "python3", f"python3={version}") == (0, "met")
    assert check(environment, f"python3={version.split('.')[0]}.*") == (0, "met")
    assert check(environment, "python3=0.0.1-*") == (1, f"python3=0.0.1-*: {version} installed")
    assert check(environment, "gpuplat-no-such-package") == (1, "gpuplat-no-such-package: not installed")


def test_not_met_without_dpkg_query(tmp_path: Path) -> None:
    rc, said = check({"PATH": str(tmp_path)}, "bash")
    assert rc == 1
    assert said.startswith("dpkg-query could not run")


def test_the_role_tells_through_ansible(tmp_path: Path, fake_dpkg: dict[str, str]) -> None:
    """The role as the roles import it, run by ansible-playbook on this host, in check mode too: a list, a
    single name (a role's package variable may be a string), a pin met and one drifted."""
    pytest.importorskip("ansible")
    cases: list[tuple[Any, int]] = [
        (["bash", "nvidia-driver-cuda=570.195.03-*"], 0),
        ("bash", 0),
        (["bash", "libcuda1=570.195.03-*"], 1),
        ("munge", 1),
    ]
    tasks: list[dict[str, Any]] = []
    for packages, rc in cases:
        tasks.append(
            {
                "name": f"Check {packages}",
                "ansible.builtin.include_role": {"name": "package_pins", "rolespec_validate": False},
                "vars": {"package_pins_packages": packages},
            }
        )
        expected = "package_pins_check.rc == 0" if rc == 0 else GUARD
        tasks.append({"name": "Assert", "ansible.builtin.assert": {"that": [expected]}})
    play = [{"name": "package_pins", "hosts": "localhost", "gather_facts": False, "tasks": tasks}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            *("-i", "localhost,", "-c", "local", "--check"),
            *("-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "play.yml")),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "HOME": os.environ.get("HOME", "/root"),
            **fake_dpkg,
        },
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]


def task_lists(node: Any) -> list[list[dict[str, Any]]]:
    """Every list of tasks in a task file: the file's own and each block's, rescue's and always'."""
    found: list[list[dict[str, Any]]] = []
    if isinstance(node, list):
        found.append([task for task in node if isinstance(task, dict)])
        for task in node:
            if isinstance(task, dict):
                for key in ("block", "rescue", "always"):
                    found += task_lists(task.get(key))
    return found


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]


def installs(task: dict[str, Any]) -> dict[str, Any] | None:
    """The module arguments of a task that installs packages by name, else None."""
    for module in INSTALL_MODULES:
        arguments = task.get(module)
        if (
            isinstance(arguments, dict)
            and "name" in arguments
            and arguments.get("state") in (None, "present")
        ):
            return arguments
    return None


def package_tasks() -> list[tuple[str, list[dict[str, Any]], int]]:
    found = []
    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        for tasks in task_lists(yaml.safe_load(path.read_text())):
            where = str(path.relative_to(ROOT))
            found += [(where, tasks, i) for i, task in enumerate(tasks) if installs(task)]
    return found


def test_the_walker_finds_the_roles_package_tasks() -> None:
    files = {path for path, _, _ in package_tasks()}
    assert {"roles/munge/tasks/main.yml", "roles/gpu_driver/tasks/install-Debian.yml"} <= files
    assert "roles/python_requirements/tasks/restore_archive.yml" not in files
    assert "roles/slurm_compute/tasks/gpus-nvml.yml" in files
    assert "roles/training_env/tasks/main.yml" in files  # inside a block
    assert len(package_tasks()) >= 30


@pytest.mark.parametrize(
    ("path", "tasks", "index"),
    package_tasks(),
    ids=lambda v: str(v) if isinstance(v, (str, int)) else "tasks",
)
def test_every_package_task_runs_apt_only_when_its_packages_are_not_met(
    path: str, tasks: list[dict[str, Any]], index: int
) -> None:
    """On a converge that changes nothing, no package task starts apt (each start reads the whole package
    cache: 0.3 to 0.5 s a task on the local platform): the task before it checks the same list, under the
    same conditions and tags, and the task runs only when the check is not met."""
    task = tasks[index]
    arguments = installs(task)
    assert arguments is not None
    assert "loop" not in task and "with_items" not in task, f"{path}: {task['name']}: one check for a loop"
    check = tasks[index - 1] if index > 0 else {}
    assert check.get("ansible.builtin.import_role", {}).get("name") == "package_pins", (
        f"{path}: {task['name']!r} has no package_pins check right before it"
    )
    listed = check["vars"]["package_pins_packages"]
    assert listed == arguments["name"], f"{path}: the check's list is not the task's"
    assert as_list(task.get("when"))[-1:] == [GUARD], f"{path}: {task['name']!r} runs whatever the check says"
    assert as_list(check.get("when")) == as_list(task.get("when"))[:-1], f"{path}: conditions differ"
    assert as_list(check.get("tags")) == as_list(task.get("tags")), f"{path}: tags differ"
    for where in ("become", "become_user", "delegate_to", "run_once"):  # the same host, as the same user
        assert check.get(where) == task.get(where), (
            f"{path}: {task['name']!r}: {where} differs from its check's"
        )


@pytest.mark.parametrize(
    ("path", "tasks", "index"),
    package_tasks(),
    ids=lambda v: str(v) if isinstance(v, (str, int)) else "tasks",
)
def test_every_package_task_refreshes_a_stale_index_itself(
    path: str, tasks: list[dict[str, Any]], index: int
) -> None:
    """Before the check, the first apt task of a converge (node_exporter's, first on every host in
    site.yml, cache_valid_time 3600) refreshed an index older than an hour for every install after it; that
    task is now skipped where its package is installed, so a pin raised on day 2 (the driver, NCCL) would be
    looked up in an index as old as the node's last install and not be found. Each guarded task therefore
    refreshes an index older than an hour itself, at no cost when it is skipped (apt.py at v2.19.14,
    l.1395-1444: cache_valid_time sets update_cache and updates when the index is older)."""
    arguments = installs(tasks[index])
    assert arguments is not None
    refreshes = arguments.get("update_cache") is True or arguments.get("cache_valid_time") not in (
        None,
        "",
        0,
    )
    assert refreshes, f"{path}: {tasks[index]['name']!r} installs from whatever index an earlier task left"
