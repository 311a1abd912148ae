"""The team users' job folders (roles/shared_fs tasks/user_folders.yml), run for real by ansible-playbook
on this host: each user's folder made private to them, a second run changing nothing, and a name someone
else took first (a link, a file, another user's folder) stopping the run untouched instead of being
handed over."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("ansible")

ROOT = Path(__file__).resolve().parents[2]
USERS = ["daemon", "nobody"]  # accounts every Debian host has
MISSING = "gpuplat-no-such-user"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to another user needs root")


# An Ansible callback that makes a folder as another user at the start of the task that makes the folders:
# the moment a user racing the platform would pick, after every look the play took before it.
RACER = """
import os
from ansible.plugins.callback import CallbackBase

class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "racer"

    def v2_playbook_on_task_start(self, task, is_conditional):
        if task.get_name().endswith("Give each team user a private job folder"):
            os.mkdir(os.environ["RACE_PATH"], 0o777)
            os.chown(os.environ["RACE_PATH"], int(os.environ["RACE_UID"]), -1)
"""


def _converge(
    tmp_path: Path, jobs: Path, users: list[str], race: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    play = [
        {
            "name": "The team users' job folders",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Make them",
                    "ansible.builtin.include_role": {"name": "shared_fs", "tasks_from": "user_folders"},
                    "vars": {"shared_fs_jobs_path": str(jobs), "shared_fs_job_users": users},
                }
            ],
        }
    ]
    from infra.nodes.playbook_run import ansible_playbook_binary

    playbook = tmp_path / "folders.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    command = [ansible_playbook_binary(), "-i", "localhost,", "-c", "local", str(playbook)]
    command += ["-e", f"ansible_python_interpreter={sys.executable}"]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    if race:
        (tmp_path / "callbacks").mkdir(exist_ok=True)
        (tmp_path / "callbacks" / "racer.py").write_text(RACER)
        env |= {"ANSIBLE_CALLBACK_PLUGINS": str(tmp_path / "callbacks"), "ANSIBLE_CALLBACKS_ENABLED": "racer"}
        env |= race
    return subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=300, cwd=ROOT, env=env
    )  # fmt: skip


def _jobs(tmp_path: Path) -> Path:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    jobs.chmod(0o1777)
    return jobs


def test_each_user_gets_a_private_folder_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    from infra.nodes.playbook_run import parse_recap

    jobs = _jobs(tmp_path)
    first = _converge(tmp_path, jobs, [*USERS, MISSING])
    assert first.returncode == 0, first.stdout[-3000:]
    for user in USERS:
        folder = (jobs / user).lstat()
        assert folder.st_uid == pwd.getpwnam(user).pw_uid, user
        assert folder.st_gid == pwd.getpwnam(user).pw_gid, user
        assert folder.st_mode & 0o7777 == 0o700, oct(folder.st_mode)
    assert not (jobs / MISSING).exists(), "a name with no account on the host gets no folder"
    assert parse_recap(first.stdout)[0] == 1  # the one task that made the folders

    second = _converge(tmp_path, jobs, [*USERS, MISSING])
    assert second.returncode == 0, second.stdout[-3000:]
    assert parse_recap(second.stdout)[0] == 0


@pytest.mark.parametrize("taken_as", ["link", "file", "another user's folder"])
def test_a_name_taken_first_stops_the_run_and_is_left_as_it_was(tmp_path: Path, taken_as: str) -> None:
    jobs = _jobs(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    taken = jobs / "daemon"
    if taken_as == "link":
        taken.symlink_to(elsewhere)
        os.lchown(taken, pwd.getpwnam("nobody").pw_uid, -1)
    elif taken_as == "file":
        taken.write_text("")
        os.chown(taken, pwd.getpwnam("nobody").pw_uid, -1)
    else:
        taken.mkdir(mode=0o777)
        os.chown(taken, pwd.getpwnam("nobody").pw_uid, -1)
    before = taken.lstat()

    done = _converge(tmp_path, jobs, ["daemon"])
    assert done.returncode != 0
    assert f"{taken} exists and is not daemon's folder" in done.stdout, done.stdout[-3000:]
    assert "owned by nobody" in done.stdout
    after = taken.lstat()
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)
    assert elsewhere.stat().st_uid == 0 and elsewhere.stat().st_mode & 0o777 == 0o755


def test_a_folder_another_user_makes_after_the_platform_looked_is_not_handed_over(tmp_path: Path) -> None:
    """The look and the making are one step: a folder that appears in between (another user racing the
    run) stops it, instead of being given, with what that user put in it, to the team user."""
    jobs = _jobs(tmp_path)
    nobody = pwd.getpwnam("nobody").pw_uid
    race = {"RACE_PATH": str(jobs / "daemon"), "RACE_UID": str(nobody)}
    done = _converge(tmp_path, jobs, ["daemon"], race)
    assert (jobs / "daemon").lstat().st_uid == nobody, "the racer's folder was handed to daemon"
    assert done.returncode != 0
    assert f"{jobs / 'daemon'} exists and is not daemon's folder" in done.stdout, done.stdout[-3000:]


def test_a_folder_of_an_owner_with_no_account_here_stops_the_run_with_the_message(tmp_path: Path) -> None:
    """A folder whose owner has no account on this host (a removed user, or one known only to the compute
    nodes' directory service): the same message, naming the owner by number."""
    jobs = _jobs(tmp_path)
    (jobs / "daemon").mkdir(mode=0o700)
    os.chown(jobs / "daemon", 54321, 54321)
    done = _converge(tmp_path, jobs, ["daemon"])
    assert done.returncode != 0
    assert f"{jobs / 'daemon'} exists and is not daemon's folder" in done.stdout, done.stdout[-3000:]
    assert "owned by 54321" in done.stdout


def test_a_filesystem_that_refuses_root_stops_the_run_with_one_paragraph(tmp_path: Path) -> None:
    """Where root may not write (an NFS export with root_squash; here, an immutable job path, which refuses
    root's mkdir with the same EPERM), the run stops with what to do, not a module traceback."""
    jobs = _jobs(tmp_path)
    if subprocess.run(["chattr", "+i", str(jobs)], capture_output=True, check=False).returncode != 0:
        pytest.skip("needs chattr and a filesystem with the immutable attribute (ext4, xfs)")
    try:
        done = _converge(tmp_path, jobs, ["daemon"])
    finally:
        subprocess.run(["chattr", "-i", str(jobs)], check=True)
    assert done.returncode != 0
    assert f"root could not make {jobs / 'daemon'} for daemon: Operation not permitted" in done.stdout, (
        done.stdout[-3000:]
    )
    assert "Traceback" not in done.stdout + done.stderr
    assert not (jobs / "daemon").exists()
