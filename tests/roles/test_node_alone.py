"""The role defaults resolve in the inventory a cloud node configures itself with: its own pool and
role groups, and no other host (infra/backends/aws/bootstrap.py, node_inventory). A default that reads
another group (groups['slurm_controller']) broke every Slurm-launched node's boot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from infra.backends.aws.bootstrap import node_inventory
from infra.platform.resolve import ResolvedPlatform
from infra.scheduling.slurm import slurm_vars
from tests.roles.ansible_values import render_value

ROLES = Path(__file__).resolve().parents[2] / "roles"


def groups_of(inventory: dict[str, Any], node: str) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {"all": [node], "ungrouped": []}
    children = inventory["all"]["children"]
    for name, group in children.items():
        if "hosts" in group:
            groups[name] = [node]
    for name, group in children.items():
        if "children" in group:
            groups[name] = [node for child in group["children"] for node in groups.get(child, [])]
    return groups


def defaults_with_groups(role: str) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}
    return {k: v for k, v in values.items() if isinstance(v, str) and "groups[" in v}


ROLES_READING_GROUPS = sorted(
    r.name for r in ROLES.iterdir() if (r / "defaults" / "main.yml").exists() and defaults_with_groups(r.name)
)


def test_some_role_defaults_read_groups() -> None:
    assert {"munge", "slurm_common"} <= set(ROLES_READING_GROUPS)


@pytest.mark.parametrize("role", ROLES_READING_GROUPS)
def test_role_defaults_resolve_on_a_training_node_alone(
    role: str, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    platform = shipped_platforms["aws-prod"]
    pool = platform.pool("train-spot")
    inventory = node_inventory(platform, pool)
    variables = {
        "groups": groups_of(inventory, "train-spot-0"),
        "inventory_hostname": "train-spot-0",
        **slurm_vars(platform),
    }
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    for name, value in defaults_with_groups(role).items():
        try:
            rendered = render_value(env, value, variables)
        except jinja2.UndefinedError as err:
            raise AssertionError(f"{role}: {name} = {value} fails on a node alone: {err}") from err
        assert rendered, f"{role}: {name} is empty on a node alone"
