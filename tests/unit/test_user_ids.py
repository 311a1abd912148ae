"""The team users' uids (infra/spec/user_ids.py): unique or refused when the stack loads, stable when
users come and go, the same numbers roles/slurm_common derived before, and explicit where a directory
gives them."""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.errors import ExitCode, SpecError
from infra.platform.resolve import load_platform
from infra.scheduling.slurm import slurm_vars
from infra.spec.models import Scheduler, Team
from infra.spec.user_ids import RESERVED_UIDS, derived_uid, user_uids
from tests.conftest import ROOT
from tests.unit.test_cli import gpuplat

# md5("user33")[:4] = 57d2, md5("user59")[:4] = 1502: 22482 and 5378, both 930 mod 10000.
SAME_DERIVED = ("user33", "user59")


def _users(research: list[str], product: list[str], user_ids: dict[str, int] | None = None) -> Any:
    def mutate(spec: dict[str, Any]) -> None:
        spec["scheduler"]["teams"][0]["users"] = research
        spec["scheduler"]["teams"][1]["users"] = product
        if user_ids is not None:
            spec["scheduler"]["user_ids"] = user_ids

    return mutate


def test_the_names_numbers_are_the_ones_clusters_already_have() -> None:
    """roles/slurm_common's derivation before this module: 20000 + int(md5(name)[:4], 16) % 10000; a
    cluster that is up keeps every user's uid."""
    assert derived_uid("alice") == 25476 and derived_uid("bob") == 20861
    assert derived_uid(SAME_DERIVED[0]) == derived_uid(SAME_DERIVED[1]) == 20930


def test_two_users_of_one_derived_uid_are_refused_before_anything_runs(
    write_stack: Callable[..., Path],
) -> None:
    path = write_stack("local", _users(["alice", SAME_DERIVED[0]], ["bob", SAME_DERIVED[1]]))
    with pytest.raises(SpecError) as raised:
        load_platform(path)
    message = raised.value.message
    assert raised.value.exit_code == ExitCode.BAD_INPUT
    assert message.startswith(f"{path}: 1 problem"), message
    assert "scheduler.teams[1].users[1]: user 'user59' would get uid 20930" in message, message
    assert "which 'user33' has" in message and "scheduler.user_ids, e.g. `user59: 30000`" in message
    result = gpuplat("plan", "--stack-file", str(path))  # the CLI: one paragraph, exit 2
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "user 'user59' would get uid 20930" in result.stderr


def test_an_explicit_uid_settles_it_and_moves_no_one_else(write_stack: Callable[..., Path]) -> None:
    pinned = _users(["alice", SAME_DERIVED[0]], ["bob", SAME_DERIVED[1]], {SAME_DERIVED[1]: 30000})
    uids = slurm_vars(load_platform(write_stack("local", pinned)))["slurm_common_user_ids"]
    assert uids == {"alice": 25476, "user33": 20930, "bob": 20861, "user59": 30000}


@pytest.mark.parametrize(
    ("user_ids", "where", "problem"),
    [
        ({"alice": 20861}, "scheduler.user_ids.alice", "user 'alice' would get uid 20861"),  # bob's derived
        ({"alice": 30000, "bob": 30000}, "scheduler.user_ids.bob", "which 'alice' has (scheduler.user_ids"),
        ({"carol": 30000}, "scheduler.user_ids.carol", "'carol' is no team's user"),
        ({"alice": 65534}, "scheduler.user_ids.alice", "uid 65534 is nobody's"),
        ({"alice": 999}, "scheduler.user_ids.alice", "greater than or equal to 1000"),
        ({"alice": 19900}, "scheduler.user_ids.alice", "uid 19900 is the model registry's service user's"),
        ({"alice": 2**32 - 1}, "scheduler.user_ids.alice", "less than or equal to 4294967294"),
    ],
    ids=[
        "explicit on derived",
        "explicit twice",
        "no such user",
        "nobody",
        "system range",
        "registry's",
        "uid_t -1",
    ],
)
def test_a_bad_explicit_uid_is_refused_at_its_entry(
    write_stack: Callable[..., Path], user_ids: dict[str, int], where: str, problem: str
) -> None:
    path = write_stack("local", _users(["alice"], ["bob"], user_ids))
    with pytest.raises(SpecError) as raised:
        load_platform(path)
    assert f"{where}: " in raised.value.message and problem in raised.value.message, raised.value.message


def test_adding_or_removing_users_renumbers_no_other() -> None:
    """Each uid is a function of its own name (or its own entry): any subset of users keeps the numbers
    the whole set gives them."""
    rng = random.Random(7)
    names = sorted({"".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(40)})
    for _ in range(20):
        kept = [n for n in names if rng.random() < 0.5]
        teams = [Team(name="a", gpu_quota=1, users=names[:20]), Team(name="b", gpu_quota=1, users=names[20:])]
        whole = Scheduler(teams=teams)
        part = Scheduler(teams=[Team(name="a", gpu_quota=1, users=kept)])
        assert {n: user_uids(whole)[n] for n in kept} == user_uids(part)


def test_the_scheduler_scenario_gives_the_uids_the_stack_would() -> None:
    """molecule/slurm_cluster writes by hand the inventory infra.scheduling renders: its users' uids are
    the ones their names give."""
    import yaml

    scenario = yaml.safe_load((ROOT / "molecule" / "slurm_cluster" / "molecule.yml").read_text())
    given = scenario["provisioner"]["inventory"]["group_vars"]["all"]
    users = [user for account in given["slurm_accounts"] for user in account["users"]]
    assert given["slurm_common_user_ids"] == {user: derived_uid(user) for user in users}


def test_every_fixed_service_uid_of_a_role_is_reserved_from_team_users() -> None:
    """A role that gives its service account a fixed uid or gid (its files on the shared filesystem) has
    that number in RESERVED_UIDS, so no scheduler.user_ids entry can hand it to a team user."""
    import yaml

    fixed = {}
    for defaults in sorted((ROOT / "roles").glob("*/defaults/main.yml")):
        for name, value in (yaml.safe_load(defaults.read_text()) or {}).items():
            if re.search(r"_(uid|gid)$", name) and isinstance(value, int):
                fixed[f"{defaults.parts[-3]}: {name}"] = value
    assert fixed, "no role's fixed uid found: the scan reads no defaults"
    assert {place: uid for place, uid in fixed.items() if uid not in RESERVED_UIDS} == {}


def test_the_derivation_is_the_old_roles_for_any_name() -> None:
    """Day 2 on a cluster the role made before (roles/slurm_common/tasks/users.yml up to this change,
    since 6f7271b): its Jinja expression, rendered with Ansible's own `hash` filter, gives every name the
    number derived_uid does, for 500 names of any shape a stack allows."""
    jinja2 = pytest.importorskip("jinja2")
    core = pytest.importorskip("ansible.plugins.filter.core")
    environment = jinja2.Environment()
    environment.filters["hash"] = core.get_hash
    old_role = environment.from_string(
        "{{ slurm_common_user_uid_base + ((item | hash('md5'))[:4] | int(base=16)) % 10000 }}"
    )
    rng = random.Random(3)
    first, rest = string.ascii_lowercase + "_", string.ascii_lowercase + string.digits + "_-"
    names = {rng.choice(first) + "".join(rng.choices(rest, k=rng.randint(0, 31))) for _ in range(500)}
    differ = {
        name: (old, derived_uid(name))
        for name in sorted(names)
        if (old := int(old_role.render(item=name, slurm_common_user_uid_base=20000))) != derived_uid(name)
    }
    assert len(names) > 450 and differ == {}
