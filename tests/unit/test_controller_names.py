"""Every node resolves every Slurm controller's name (aws high availability).

slurm.conf names the accounting host (AccountingStorageHost=head-0) and the backup slurmctld on head-1,
like sacct on every node, must resolve it; on aws a node knows only its own name. node_identity (run on
every host first, playbooks/site.yml) writes each controller's fixed address from
gpuplat_controller_addresses into /etc/hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import yaml

from infra.nodes.inventory import stack_inventory_documents
from infra.platform.resolve import ResolvedPlatform
from infra.scheduling.slurm import controllers

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "node_identity"
ADDRESSES = {"head-1": "10.64.1.11", "head-0": "10.64.0.10"}


def hosts_task() -> dict[str, Any]:
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    return next(t for t in tasks if "ansible.builtin.blockinfile" in t)


def test_node_identity_writes_every_controller_into_the_hosts_file() -> None:
    task = hosts_task()
    args = task["ansible.builtin.blockinfile"]
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    block = env.from_string(args["block"]).render(gpuplat_controller_addresses=ADDRESSES)
    assert block.splitlines() == ["10.64.0.10 head-0", "10.64.1.11 head-1"]
    assert env.from_string(args["path"]).render(node_identity_hosts_file="/etc/hosts") == "/etc/hosts"
    condition = env.compile_expression(task["when"])
    assert condition(gpuplat_controller_addresses=ADDRESSES) is True
    assert condition() is False  # local and onprem: names resolve already, the hosts file is left alone


def test_the_role_declares_the_addresses_and_runs_on_every_host() -> None:
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]
    options = specs["options"]
    assert options["gpuplat_controller_addresses"]["type"] == "dict"
    assert not options["gpuplat_controller_addresses"].get("required")
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["node_identity_hosts_file"] == options["node_identity_hosts_file"]["default"]
    first_play = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())[0]
    assert first_play["hosts"] == "all" and {"role": "node_identity"} in first_play["roles"]


def test_the_accounting_host_is_among_the_names_every_node_resolves(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    platform = shipped_platforms["aws-prod"]
    outputs = {"controller_addresses": ADDRESSES, "fsx_dns_name": "fs-1.fsx", "fsx_mount_name": "m"}
    all_vars = stack_inventory_documents(platform, outputs)["group_vars/all.yml"]
    dbd_host = all_vars["slurm_controllers"][0]  # slurm_common_dbd_host: the first of slurm_controllers
    assert dbd_host == "head-0" and set(controllers(platform)) == set(
        all_vars["gpuplat_controller_addresses"]
    )
