"""roles/imds_guard without a host: its contract, the rules it writes (rendered with Ansible's own
templating, from the role's files), where playbooks/site.yml runs it, and its agreement with the AWS
facts in infra/data/aws_security.yaml.

What it must do on a node: instance metadata for root and the platform's service users (SlurmUser on
the controllers, Prometheus, the inference scaling agent), refused to every other user and to bridged
containers; on hosts that are not EC2 instances (gpuplat_backend local or onprem) nothing at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.backends.aws.iam import SPOT_SERVICE, SPOT_SERVICE_LINKED_ROLE
from infra.backends.aws.node_pool import HOST_ONLY_HOP_LIMIT

ansible_template = pytest.importorskip("ansible.template")
from ansible.parsing.dataloader import DataLoader  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "imds_guard"
FACTS = yaml.safe_load((ROOT / "infra" / "data" / "aws_security.yaml").read_text())

# getent passwd as the getent module reports it: user -> [password, uid, gid, gecos, home, shell]
PASSWD = {
    "root": ["x", "0", "0", "root", "/root", "/bin/bash"],
    "slurm": ["x", "64030", "64030", "", "/nonexistent", "/usr/sbin/nologin"],
    "prometheus": ["x", "105", "111", "", "/var/lib/prometheus", "/usr/sbin/nologin"],
    "gpuplat-inference": ["x", "996", "996", "", "/opt/gpuplat-inference", "/usr/sbin/nologin"],
    "alice": ["x", "7321", "7321", "", "/home/alice", "/bin/bash"],
}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def trusted(value: Any) -> Any:
    """Role files as Ansible reads them: their templates are trusted (yaml.safe_load's are not)."""
    if isinstance(value, str):
        return ansible_template.trust_as_template(value)
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [trusted(v) for v in value]
    return value


def templar(variables: dict[str, Any]) -> Any:
    return ansible_template.Templar(loader=DataLoader(), variables=variables)


def host(
    groups: list[str], backend: str = "aws", passwd: dict[str, list[str]] | None = None
) -> dict[str, Any]:
    """The variables of a host of `groups`, and the facts the role's set_fact task derives."""
    variables: dict[str, Any] = {
        **trusted(load(ROLE / "defaults" / "main.yml")),
        **load(ROLE / "vars" / "main.yml"),
        "gpuplat_backend": backend,
        "group_names": groups,
        "ansible_facts": {"getent_passwd": PASSWD if passwd is None else passwd},
        "ansible_managed": "Ansible managed",
    }
    task = next(t for t in load(ROLE / "tasks" / "guard.yml") if "ansible.builtin.set_fact" in t)
    local = {k: templar(variables).template(trusted(v)) for k, v in task["vars"].items()}
    facts = {
        k: templar({**variables, **local}).template(trusted(v))
        for k, v in task["ansible.builtin.set_fact"].items()
    }
    return {**variables, **facts}


def rules(variables: dict[str, Any]) -> str:
    text = (ROLE / "templates" / "imds-guard.nft.j2").read_text()
    return str(templar(variables).template(trusted(text)))


def chain(text: str, name: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"chain {name} {{")
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "}")
    return [
        line.strip() for line in lines[start + 1 : end] if line.strip() and not line.strip().startswith("#")
    ]


# ---------------------------------------------------------------------------------------------------
# contract


def spec_options() -> dict[str, Any]:
    specs = load(ROLE / "meta" / "argument_specs.yml")["argument_specs"]
    return {name: option for entry in specs.values() for name, option in entry["options"].items()}


def test_defaults_are_declared_and_prefixed_and_the_backend_comes_from_the_inventory() -> None:
    defaults = load(ROLE / "defaults" / "main.yml")
    options = spec_options()
    assert set(defaults) <= set(options)
    assert all(name.startswith("imds_guard_") for name in defaults)
    assert options["gpuplat_backend"]["required"] is True and "gpuplat_backend" not in defaults


def test_the_service_users_are_the_names_their_roles_create() -> None:
    by_group = load(ROLE / "defaults" / "main.yml")["imds_guard_users_by_group"]
    slurm = load(ROOT / "roles" / "slurm_common" / "defaults" / "main.yml")["slurm_common_user"]
    inference = load(ROOT / "roles" / "inference_server" / "defaults" / "main.yml")["inference_server_user"]
    assert by_group["slurm_controller"] == [slurm]
    assert by_group["inference_server"] == [inference]
    # Prometheus discovers the nodes through EC2 (ec2_sd_configs) on the monitoring hosts
    assert "ec2_sd_configs" in (ROOT / "roles" / "monitoring" / "templates" / "prometheus.yml.j2").read_text()


# ---------------------------------------------------------------------------------------------------
# the rules


def test_a_controller_keeps_metadata_for_root_slurm_and_prometheus_only() -> None:
    variables = host(["pool_head", "service", "slurm_controller", "monitoring", "inference_gateway"])
    assert variables["__imds_guard_users"] == ["root", "slurm", "prometheus"]
    assert variables["__imds_guard_uids"] == [0, 105, 64030]
    output = chain(rules(variables), "output")
    assert output == [
        "type filter hook output priority filter; policy accept;",
        "ip daddr 169.254.169.254 meta skuid { 0, 105, 64030 } accept",
        "ip daddr 169.254.169.254 counter reject",
        "ip6 daddr fd00:ec2::254 meta skuid { 0, 105, 64030 } accept",
        "ip6 daddr fd00:ec2::254 counter reject",
    ]


def test_a_training_node_keeps_metadata_for_root_only_and_never_for_containers() -> None:
    variables = host(["pool_train", "train", "gpu_nodes", "slurm_compute"])
    text = rules(variables)
    assert variables["__imds_guard_uids"] == [0]
    assert "meta skuid { 0 } accept" in text and "7321" not in text  # the tenants' uids are refused
    assert chain(text, "forward")[1:] == [
        "ip daddr 169.254.169.254 counter reject",
        "ip6 daddr fd00:ec2::254 counter reject",
    ]
    # the whole table is replaced in one transaction: never a moment without the guard
    assert text.index("table inet gpuplat_imds\n") < text.index("delete table inet gpuplat_imds\n")


def test_service_users_not_created_yet_are_named_and_left_out() -> None:
    passwd = {user: entry for user, entry in PASSWD.items() if user != "gpuplat-inference"}
    variables = host(["pool_infer", "infer", "gpu_nodes", "inference_server"], passwd=passwd)
    assert variables["__imds_guard_missing"] == ["gpuplat-inference"]
    assert variables["__imds_guard_uids"] == [0]


@pytest.mark.parametrize(("backend", "enabled"), [("aws", True), ("local", False), ("onprem", False)])
def test_only_ec2_instances_are_guarded(backend: str, enabled: bool) -> None:
    variables = host(["pool_train"], backend=backend)
    assert templar(variables).template(variables["imds_guard_enabled"]) is enabled


def test_the_unit_loads_the_rules_before_the_network_and_reloads_them_whole() -> None:
    variables = host(["pool_head"])
    unit = str(
        templar(variables).template(
            trusted((ROLE / "templates" / "gpuplat-imds-guard.service.j2").read_text())
        )
    )
    assert "Before=network-pre.target" in unit and "WantedBy=sysinit.target" in unit
    assert "ExecReload=/usr/sbin/nft --file /etc/gpuplat/imds-guard.nft" in unit


# ---------------------------------------------------------------------------------------------------
# site.yml


def test_site_guards_every_node_first_and_again_last() -> None:
    plays = load(ROOT / "playbooks" / "site.yml")
    guarded = [i for i, play in enumerate(plays) if {"role": "imds_guard"} in play.get("roles", [])]
    first_import = next(i for i, play in enumerate(plays) if "ansible.builtin.import_playbook" in play)
    assert len(guarded) == 2 and guarded[0] < first_import and guarded[-1] == len(plays) - 1
    assert all(plays[i]["hosts"] == "all" and plays[i]["become"] is True for i in guarded)


def test_site_passes_ansible_syntax_check() -> None:
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "--syntax-check",
            "-i",
            "localhost,",
            "playbooks/site.yml",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------------
# the facts


def test_role_and_program_follow_the_aws_facts() -> None:
    metadata = FACTS["instance_metadata"]
    defaults = load(ROLE / "defaults" / "main.yml")
    assert defaults["imds_guard_addresses_ipv4"] == [metadata["addresses"]["ipv4"]]
    assert defaults["imds_guard_addresses_ipv6"] == [metadata["addresses"]["ipv6"]]
    assert metadata["hop_limit"] == {"host_only": HOST_ONLY_HOP_LIMIT}
    spot = FACTS["spot_service_linked_role"]
    assert (spot["service"], spot["role"]) == (SPOT_SERVICE, SPOT_SERVICE_LINKED_ROLE)
