#!/usr/bin/python
"""A user's private folder under a sticky, world-writable directory, looked at and made in one step."""

from __future__ import annotations

import errno
import os
import pwd
import stat
from collections.abc import Callable
from typing import NoReturn

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: shared_fs_private_folder
short_description: Make a user's private folder in a sticky, world-writable directory, or refuse.
description:
  - Makes I(parent)/I(user), owned by I(user) and their primary group, mode 0700, as root. The look and the
    making go through one file descriptor (mkdir, then open without following links, then fchown and
    fchmod), so nothing another user puts there between two steps is handed to I(user).
  - A name that is already taken by anything but a folder of I(user)'s or root's (a link, a file, another
    user's folder) fails the task and is left untouched.
  - A user with no account on the host gets no folder (a name someone else took still fails).
options:
  parent:
    description: The directory the folder is made in.
    type: path
    required: true
  user:
    description: The folder's user, and its name.
    type: str
    required: true
"""


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "link"
    return "folder" if stat.S_ISDIR(mode) else "file"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "parent": {"type": "path", "required": True},
            "user": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    parent, user = module.params["parent"], module.params["user"]
    path = os.path.join(parent, user)
    if "/" in user or user in ("", ".", ".."):
        module.fail_json(msg=f"shared_fs: {user!r} is not a user name a folder can be made for")
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        account = None

    def refuse(found: os.stat_result) -> NoReturn:
        module.fail_json(
            msg=f"shared_fs: {path} exists and is not {user}'s folder (a {_kind(found.st_mode)} owned by "
            f"{_owner(found.st_uid)}). Someone made it before the platform did; check what is in it, remove "
            f"it, and run again: the platform then makes the folder for {user}, private to them."
        )
        raise AssertionError("fail_json exits")

    try:
        make(module, parent, user, account, refuse)
    except OSError as refused:
        module.fail_json(
            msg=f"shared_fs: root could not make {path} for {user}: {refused.strerror}. The folders are made "
            "and handed over by root on the shared filesystem: an NFS export with root_squash (not covered: "
            "roles/shared_fs/README.md) or a read-only mount refuses it; make the folder on the server, "
            f"owned by {user} with mode 0700, and run again."
        )


def make(
    module: AnsibleModule,
    parent: str,
    user: str,
    account: pwd.struct_passwd | None,
    refuse: Callable[[os.stat_result], NoReturn],
) -> None:
    path = os.path.join(parent, user)
    parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        created = False
        if account is not None and not module.check_mode:
            try:
                os.mkdir(user, 0o700, dir_fd=parent_fd)
                created = True
            except FileExistsError:
                pass
        try:
            folder_fd = os.open(user, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
        except FileNotFoundError:
            # Nothing there: no account (nothing to make), or check mode (it would be made).
            module.exit_json(changed=account is not None, path=path)
        except OSError as taken:
            if taken.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            refuse(os.lstat(user, dir_fd=parent_fd))
        try:
            found = os.fstat(folder_fd)
            if account is None:
                if found.st_uid != 0:
                    refuse(found)
                module.exit_json(changed=False, path=path)
                return
            if not created and found.st_uid not in (0, account.pw_uid):
                refuse(found)
            changed = created or (found.st_uid, found.st_gid, stat.S_IMODE(found.st_mode)) != (
                account.pw_uid, account.pw_gid, 0o700,
            )  # fmt: skip
            if changed and not module.check_mode:
                os.fchown(folder_fd, account.pw_uid, account.pw_gid)
                os.fchmod(folder_fd, 0o700)
        finally:
            os.close(folder_fd)
    finally:
        os.close(parent_fd)
    module.exit_json(changed=changed, path=path, uid=account.pw_uid, gid=account.pw_gid)


if __name__ == "__main__":
    main()
