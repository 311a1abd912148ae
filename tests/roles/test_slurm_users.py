"""roles/slurm_common tasks/users.yml, run by ansible-playbook on this host in check mode: the uids are
the inventory's (infra/spec/user_ids.py), and a user this host already has under another uid, or a uid
another account holds, stops the play before a group or user is created or renumbered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("ansible")

ROOT = Path(__file__).resolve().parents[2]
FREE_NAME = "gpuplat-no-such-user"
FREE_UID = 3999999999  # no account of a test host has it


def _check(tmp_path: Path, users: list[str], user_ids: dict[str, int]) -> subprocess.CompletedProcess[str]:
    from infra.nodes.playbook_run import ansible_playbook_binary

    play = [
        {
            "name": "The team users",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Create them",
                    "ansible.builtin.include_role": {"name": "slurm_common", "tasks_from": "users"},
                    "vars": {"slurm_accounts": [{"users": users}], "slurm_common_user_ids": user_ids},
                }
            ],
        }
    ]
    playbook = tmp_path / "users.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    command = [ansible_playbook_binary(), "--check", "-i", "localhost,", "-c", "local", str(playbook)]
    command += ["-e", f"ansible_python_interpreter={sys.executable}"]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    return subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=300, cwd=ROOT, env=env
    )  # fmt: skip


def test_the_uid_is_the_inventorys(tmp_path: Path) -> None:
    done = _check(tmp_path, [FREE_NAME], {FREE_NAME: FREE_UID})
    assert done.returncode == 0, done.stdout[-3000:]
    assert "Create the team users" in done.stdout


def _group_without_its_user() -> tuple[str, int]:
    """A group of this host with no user of its name and a gid that is no user's uid (Debian's `adm`)."""
    import grp
    import pwd

    users = pwd.getpwall()
    names, uids = {user.pw_name for user in users}, {user.pw_uid for user in users}
    group = next(g for g in grp.getgrall() if g.gr_name not in names and g.gr_gid not in uids)
    return group.gr_name, group.gr_gid


def test_a_gid_the_host_disagrees_with_stops_before_anything_is_made(tmp_path: Path) -> None:
    """The user's own group has their uid for its gid: a group of their name under another gid is not
    renumbered, and a gid another group holds is not taken (groupadd would fail halfway through)."""
    group, gid = _group_without_its_user()
    renumbered = _check(tmp_path, [group], {group: FREE_UID})
    assert renumbered.returncode != 0, renumbered.stdout[-3000:]
    said = renumbered.stdout
    assert f"has a group {group} with gid {gid}, the stack gives" in said, said[-3000:]
    assert "Create the team users' groups" not in renumbered.stdout
    taken = _check(tmp_path, [FREE_NAME], {FREE_NAME: gid})
    assert taken.returncode != 0, taken.stdout[-3000:]
    assert f"gid {gid} is the group {group}'s" in " ".join(taken.stdout.split()), taken.stdout[-3000:]
    assert "Create the team users' groups" not in taken.stdout


@pytest.mark.parametrize(
    ("users", "user_ids", "message"),
    [
        (["daemon"], {"daemon": FREE_UID}, f"has them with uid 1, the stack gives {FREE_UID}"),
        ([FREE_NAME], {FREE_NAME: 0}, "uid 0 is root's on localhost"),
        ([FREE_NAME], {}, "no uid in slurm_common_user_ids"),
    ],
    ids=["renumbered", "uid taken", "no uid"],
)
def test_a_uid_the_host_disagrees_with_stops_before_anything_is_made(
    tmp_path: Path, users: list[str], user_ids: dict[str, int], message: str
) -> None:
    done = _check(tmp_path, users, user_ids)
    assert done.returncode != 0, done.stdout[-3000:]
    assert message in done.stdout, done.stdout[-3000:]
    assert "Create the team users' groups" not in done.stdout
