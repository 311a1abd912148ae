"""The inventory and the roles agree on variable names, both ways.

A variable the inventory writes that no role declares is silently ignored by Ansible (a setting
lost on its way to the node); a variable a role requires that the inventory never writes fails
only on a real run. Both directions are checked for every shipped stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.nodes.inventory import inventory_documents
from infra.platform.resolve import ResolvedPlatform

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"

# Ansible's own connection variables: read by Ansible, not by a role.
ANSIBLE_VARIABLES = {
    "ansible_connection",
    "ansible_host",
    "ansible_user",
    "ansible_python_interpreter",
    # the amazon.aws.aws_ssm connection plugin's
    "ansible_aws_ssm_region",
    "ansible_aws_ssm_bucket_name",
}


def declared_options() -> dict[str, dict[str, dict[str, Any]]]:
    """role -> option name -> its spec, over every entry point of the role."""
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for specs_file in sorted(ROLES.glob("*/meta/argument_specs.yml")):
        role = specs_file.parent.parent.name
        options: dict[str, dict[str, Any]] = {}
        for entry in (yaml.safe_load(specs_file.read_text())["argument_specs"] or {}).values():
            options.update(entry.get("options") or {})
        result[role] = options
    return result


def inventory_variables(platform: ResolvedPlatform) -> set[str]:
    """Every variable name the rendered inventory sets, at any level (all, group, host)."""
    names: set[str] = set()

    def walk_group(group: dict[str, Any]) -> None:
        names.update((group.get("vars") or {}).keys())
        for host_vars in (group.get("hosts") or {}).values():
            names.update((host_vars or {}).keys())
        for child in (group.get("children") or {}).values():
            walk_group(child or {})

    for file_name, document in inventory_documents(platform).items():
        if file_name == "hosts.yml":
            walk_group(document["all"])
        elif file_name.startswith("group_vars/"):
            names.update(document)
        elif file_name == "aws_ec2.yml":
            names.update(document.get("compose", {}))
    return names


@pytest.mark.parametrize("stack", ["local", "aws-prod", "onprem", "onprem-k8s"])
def test_every_inventory_variable_reaches_a_role(
    stack: str, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    declared = {name for options in declared_options().values() for name in options}
    written = inventory_variables(shipped_platforms[stack]) - ANSIBLE_VARIABLES
    unused = sorted(written - declared)
    assert not unused, (
        f"stack {stack}: the inventory writes {unused}, which no role declares in "
        "meta/argument_specs.yml: Ansible would ignore them silently"
    )


@pytest.mark.parametrize("stack", ["local", "aws-prod", "onprem"])
def test_every_required_role_variable_comes_from_the_inventory(
    stack: str, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    written = inventory_variables(shipped_platforms[stack])
    missing = sorted(
        f"{role}.{name}"
        for role, options in declared_options().items()
        for name, spec in options.items()
        if spec.get("required") and name not in written
    )
    assert not missing, f"stack {stack}: required role variables the inventory never writes: {missing}"


def test_the_checker_sees_a_misnamed_variable(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    """Guard the guard: the walk finds group and all-level variables of the static inventory."""
    written = inventory_variables(shipped_platforms["onprem"])
    assert {"gpuplat_gpu_count", "gpu_driver_version", "ansible_host"} <= written
