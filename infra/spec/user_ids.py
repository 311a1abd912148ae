"""The uid of each team user the platform creates on its nodes (roles/slurm_common, where
slurm_common_create_users; the gid of the user's own group is the same number).

A user's uid is the stack's `scheduler.user_ids` entry for them (users whose numbers come from a
directory), else a number derived from their name alone: adding or removing another user never changes
it, and it is the number roles/slurm_common derived before the stack could name one, so a cluster that is
already up keeps every user's uid. Names can share a derived number (10,000 of them: about 12 % for 50
users), and two users of one uid are one owner of each other's files: a stack whose users would share
one is refused before anything runs, with a free number to pin one of them to.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from infra.errors.problems import FieldProblem

if TYPE_CHECKING:
    from infra.spec.models import Scheduler

DERIVED_UID_BASE = 20000
DERIVED_UID_SPAN = 10000
# Explicit uids: a regular user's (login.defs UID_MIN 1000) up to the largest uid_t that is not -1;
# 65534 is `nobody` and 65535 the 16-bit -1 (useradd(8) refuses both for a named user).
EXPLICIT_UID_MIN = 1000
EXPLICIT_UID_MAX = 2**32 - 2
# And the platform's own service accounts of a fixed uid (and gid) on every node, whose files lie on the
# shared filesystem: a team user given one would own them (tests/unit/test_user_ids.py holds every
# role's fixed uid to this list).
RESERVED_UIDS = {
    19900: "the model registry's service user's (roles/model_registry: model_registry_uid)",
    65534: "nobody's",
    65535: "the 16-bit -1",
}
ALLOWED = (
    f"a number from {EXPLICIT_UID_MIN} to {EXPLICIT_UID_MAX}, not {', '.join(map(str, RESERVED_UIDS))}, "
    "that no other user has "
    f"(the names' own numbers are {DERIVED_UID_BASE}-{DERIVED_UID_BASE + DERIVED_UID_SPAN - 1})"
)


def derived_uid(user: str) -> int:
    """The number a user's name alone gives: 20000 + the first 16 bits of md5(name) mod 10000, as
    roles/slurm_common's `hash('md5')` derivation had it (an existing cluster's users keep theirs)."""
    digest = hashlib.md5(user.encode("utf-8"), usedforsecurity=False).hexdigest()
    return DERIVED_UID_BASE + int(digest[:4], 16) % DERIVED_UID_SPAN


def team_users(scheduler: Scheduler) -> list[str]:
    """Every team user once, in the order the stack first lists them."""
    return list(dict.fromkeys(user for team in scheduler.teams for user in team.users))


def user_uids(scheduler: Scheduler) -> dict[str, int]:
    """Each team user -> their uid (unique once the stack has loaded: `uid_problems`)."""
    return {user: scheduler.user_ids.get(user, derived_uid(user)) for user in team_users(scheduler)}


def uid_problems(scheduler: Scheduler) -> list[FieldProblem]:
    """A user_ids entry for no team user, a reserved one, and every user whose uid another user has."""
    users = team_users(scheduler)
    problems: list[FieldProblem] = [
        (("user_ids", user), f"'{user}' is no team's user (scheduler.teams[].users): give uids to team users")
        for user in scheduler.user_ids
        if user not in users
    ]
    problems += [
        (("user_ids", user), f"uid {uid} is {RESERVED_UIDS[uid]}; allowed: {ALLOWED}")
        for user, uid in scheduler.user_ids.items()
        if uid in RESERVED_UIDS
    ]
    uids = user_uids(scheduler)
    owner: dict[int, str] = {}
    # The derived numbers first: a collision is blamed on the entry that can change (an explicit uid),
    # else on the user the stack lists later.
    for user in sorted(users, key=lambda user: user in scheduler.user_ids):
        uid = uids[user]
        first = owner.setdefault(uid, user)
        if first == user:
            continue
        problems.append((_place(scheduler, user), _shared(scheduler, user, first, uid, set(uids.values()))))
    return problems


def _how(scheduler: Scheduler, user: str) -> str:
    if user in scheduler.user_ids:
        return f"scheduler.user_ids.{user}"
    return f"derived from the name: {DERIVED_UID_BASE} + md5 mod {DERIVED_UID_SPAN}"


def _shared(scheduler: Scheduler, user: str, first: str, uid: int, taken: set[int]) -> str:
    free = next(n for n in range(DERIVED_UID_BASE + DERIVED_UID_SPAN, EXPLICIT_UID_MAX) if n not in taken)
    return (
        f"user '{user}' would get uid {uid} ({_how(scheduler, user)}), which '{first}' has "
        f"({_how(scheduler, first)}): two users may not share a uid. Give one of them its own in "
        f"scheduler.user_ids, e.g. `{user}: {free}`: {ALLOWED}. Pin the one the nodes do not have yet: a "
        "user a running cluster already has keeps their uid"
    )


def _place(scheduler: Scheduler, user: str) -> tuple[str | int, ...]:
    """Where the user's uid comes from: their user_ids entry, else their first place in a team."""
    if user in scheduler.user_ids:
        return ("user_ids", user)
    for index, team in enumerate(scheduler.teams):
        if user in team.users:
            return ("teams", index, "users", team.users.index(user))
    raise ValueError(f"{user} is no team's user")
