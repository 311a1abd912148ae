"""Facts live only under `ansible_facts` (ansible.cfg `inject_facts_as_vars = False`): Ansible does not copy
them into every host's variables as `ansible_<fact>`, which cost every task, for every host, a deep copy of
the host's facts (docs/local-platform.md, Measured). So no role, playbook or scenario may read a fact by its
top-level name: there it would be undefined."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible import constants as C
from ansible.config.manager import ConfigManager
from ansible.module_utils.facts import default_collectors
from ansible.module_utils.parsing.convert_bool import boolean

ROOT = Path(__file__).resolve().parents[2]

# Facts that the setup module of ansible-core 2.19.14 gathered on a local platform node (Debian 12) and that
# no fact collector lists in its `_fact_ids`, which the names below add to.
GATHERED_OUTSIDE_FACT_IDS = frozenset(
    [
        "bios_date",
        "bios_vendor",
        "bios_version",
        "board_asset_tag",
        "board_name",
        "board_serial",
        "board_vendor",
        "board_version",
        "chassis_asset_tag",
        "chassis_serial",
        "chassis_vendor",
        "chassis_version",
        "device_links",
        "distribution_file_parsed",
        "distribution_file_path",
        "distribution_file_variety",
        "distribution_minor_version",
        "domain",
        "effective_group_id",
        "form_factor",
        "fqdn",
        "hostname",
        "hostnqn",
        "iscsi_iqn",
        "locally_reachable_ips",
        "lvm",
        "memfree_mb",
        "memory_mb",
        "memtotal_mb",
        "nodename",
        "proc_cmdline",
        "processor_nproc",
        "processor_threads_per_core",
        "processor_vcpus",
        "product_name",
        "product_serial",
        "product_uuid",
        "product_version",
        "real_group_id",
        "selinux_python_present",
        "swapfree_mb",
        "swaptotal_mb",
        "system_vendor",
        "uptime_seconds",
        "userspace_architecture",
        "userspace_bits",
    ]
)
# Facts that modules the roles run return (ansible.builtin.getent, package_facts, service_facts): without
# the ansible_ prefix at the top level, ansible_facts['getent_passwd'] and the like under ansible_facts.
MODULE_FACTS = re.compile(
    r"\b(getent_[a-z]+)\b"
    r"|(?<![.'\"\[])\b(packages|services)(?=\[|\s*\|)"
    r"|['\"]\s+in\s+(packages|services)\b(?![.\[])"
)
# Facts named after each network interface of the node (ansible_eth0, ansible_ens5, ansible_enp0s3,
# ansible_ib0, ansible_lo, ansible_bond0, ansible_docker0, ...), and those of amazon.aws.ec2_metadata_facts
# (ansible_ec2_instance_id, ...): no collector lists them.
NAMED_FACTS = re.compile(
    r"lo|(eth|ens|eno|ib|bond|docker|virbr|podman|cni_podman)\d+\w*|enp\d+s\d+\w*|enx[0-9a-f]{12}|veth\w+"
    r"|ec2_\w+"
)
# A fact's name put together in a template ('ansible_' ~ iface, 'ansible_%s' | format(x)): hostvars[h][...],
# vars[...] or lookup('vars', ...) of it would be undefined, and no scan can name the fact.
BUILT_NAMES = re.compile(r"""['"]ansible_['"]\s*[~+]|['"]ansible_%s""")
# Read under ansible_facts: ansible_facts['NAME'], ansible_facts.NAME, ansible_facts.get('NAME'), the same of
# hostvars[h]['ansible_facts'], a path ['ansible_facts', 'NAME'].
UNDER_FACTS = re.compile(
    r"""ansible_facts(['"]\])?(\[['"]\w+['"]\]|\.get\(\s*['"]\w+['"]|\.\w+|['"],\s*['"]\w+['"])"""
)


def fact_names() -> frozenset[str]:
    names = set(GATHERED_OUTSIDE_FACT_IDS)
    for collector in default_collectors.collectors:
        names |= set(collector._fact_ids) | {collector.name}
    # Not facts: Ansible's own variables (the user collector's name `user` is ansible_user, the remote user
    # of a connection), and ansible_local, which get_vars puts at the top level with injection off too
    # (ansible-core 2.19.14, ansible/vars/manager.py, "always 'promote' ansible_local").
    own = {name for names_of in C.MAGIC_VARIABLE_MAPPING.values() for name in names_of}
    return frozenset(names - {name.removeprefix("ansible_") for name in own} - {"local"})


def turns_injection_on(config: dict[str, Any]) -> bool:
    """Whether a Molecule config turns injection on for its playbooks: in the ansible.cfg it writes (the
    provisioner's config_options, Molecule 26's ansible.cfg) or by ANSIBLE_INJECT_FACT_VARS in their
    environment, which wins over the file."""
    settings = []
    for section, cfg in (("provisioner", "config_options"), ("ansible", "cfg")):
        part = config.get(section) or {}
        settings.append(((part.get(cfg) or {}).get("defaults") or {}).get("inject_facts_as_vars"))
        settings.append((part.get("env") or {}).get("ANSIBLE_INJECT_FACT_VARS"))
    return any(boolean(value, strict=False) for value in settings if value is not None)


def ansible_files() -> list[Path]:
    tracked = subprocess.run(
        ["git", "ls-files", "roles", "playbooks", "molecule", ".config"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return [ROOT / name for name in tracked if name.endswith((".yml", ".yaml", ".j2"))]


def top_level_facts(text: str, names: frozenset[str]) -> list[str]:
    """The facts `text` reads by their top-level names (ansible_<fact>, getent_<database>, ...)."""
    text = UNDER_FACTS.sub("", text)
    found = [
        word
        for word in re.findall(r"\bansible_([a-z0-9_]+)", text)
        if word in names or NAMED_FACTS.fullmatch(word)
    ]
    found += BUILT_NAMES.findall(text)
    found += [next(group for group in match.groups() if group) for match in MODULE_FACTS.finditer(text)]
    return found


@pytest.fixture(autouse=True)
def no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANSIBLE_INJECT_FACT_VARS", raising=False)


def test_the_projects_ansible_config_keeps_facts_under_ansible_facts() -> None:
    config = ConfigManager(conf_file=str(ROOT / "ansible.cfg"))
    assert config.get_config_value("INJECT_FACTS_AS_VARS") is False


def test_molecule_scenarios_keep_facts_under_ansible_facts_as_the_platform_does() -> None:
    shared = yaml.safe_load((ROOT / ".config" / "molecule" / "config.yml").read_text())
    assert shared["provisioner"]["config_options"]["defaults"]["inject_facts_as_vars"] is False
    # A scenario's own config_options are merged over the shared ones: none may turn it back on.
    assert not turns_injection_on(shared)
    for scenario in sorted(ROOT.glob("**/molecule/*/molecule.yml")):
        assert not turns_injection_on(yaml.safe_load(scenario.read_text()) or {}), scenario


@pytest.mark.parametrize(
    ("config", "on"),
    [
        ({}, False),
        ({"provisioner": {"config_options": {"defaults": {"inject_facts_as_vars": False}}}}, False),
        ({"provisioner": {"config_options": {"defaults": {"inject_facts_as_vars": True}}}}, True),
        ({"provisioner": {"config_options": {"defaults": {"inject_facts_as_vars": "yes"}}}}, True),
        # Molecule 26's own spelling of the same settings (molecule/config.py `_get_ansible_key_mapping`).
        ({"ansible": {"cfg": {"defaults": {"inject_facts_as_vars": True}}}}, True),
        # The variable wins over the ansible.cfg Molecule writes (config/base.yml INJECT_FACTS_AS_VARS).
        ({"provisioner": {"env": {"ANSIBLE_INJECT_FACT_VARS": "true"}}}, True),
        ({"ansible": {"env": {"ANSIBLE_INJECT_FACT_VARS": "1"}}}, True),
        ({"provisioner": {"env": {"ANSIBLE_INJECT_FACT_VARS": "false"}}}, False),
    ],
)
def test_a_scenario_that_turns_injection_back_on_is_told(config: dict[str, Any], on: bool) -> None:
    assert turns_injection_on(config) is on


def test_the_scan_reads_every_kind_of_ansible_file() -> None:
    scanned = {str(path.relative_to(ROOT)) for path in ansible_files()}
    assert {
        "playbooks/site.yml",
        "roles/node_identity/templates/node.yml.j2",
        "molecule/serving/verify.yml",
        "molecule/shared/create.yml",
        ".config/molecule/config.yml",
    } <= scanned


def test_no_role_playbook_or_scenario_reads_a_fact_by_its_top_level_name() -> None:
    names = fact_names()
    assert {"distribution", "os_family", "memtotal_mb", "hostname", "default_ipv4"} <= names
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in ansible_files()
        if (found := top_level_facts(path.read_text(), names))
    }
    assert not offenders, f"read these under ansible_facts (ansible_facts['NAME']): {offenders}"


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("when: ansible_distribution == 'Debian'", ["distribution"]),
        ("{{ hostvars[h]['ansible_memtotal_mb'] }}", ["memtotal_mb"]),
        ('loop: "{{ getent_passwd | dict2items }}"', ["getent_passwd"]),
        ("when: \"'slurmd' in packages['slurmd']\"", ["packages"]),
        ("{{ ansible_facts['distribution'] }} {{ ansible_facts.memtotal_mb }}", []),
        ("{{ ansible_facts['getent_passwd'] }} {{ ansible_facts.packages['x'] }}", []),
        ("{{ hosts | map('extract', hostvars, ['ansible_facts', 'getent_passwd', user]) }}", []),
        ("{{ ansible_check_mode }} {{ ansible_host }} {{ ansible_managed }}", []),
        # Ansible's own variables, not facts: the remote user (a connection variable, no fact `user`), and
        # ansible_local, which ansible-core puts at the top level either way (vars/manager.py get_vars).
        ("become_user: '{{ ansible_user }}' {{ ansible_local.gpuplat | default({}) }}", []),
        # A fact named after each network interface (ansible_eth0, ansible_ens5, ansible_ib0, ansible_lo).
        (
            "{{ ansible_eth0.ipv4.address }} {{ hostvars[h].ansible_ens5 }} {{ ansible_lo }} "
            "{{ ansible_ib0 }}",
            ["eth0", "ens5", "lo", "ib0"],
        ),
        ("{{ ansible_ec2_instance_id }}", ["ec2_instance_id"]),
        ("{{ ansible_facts['eth0'] }} {{ ansible_facts.ec2_instance_id }} {{ ansible_env_x }}", []),
        # A fact's name put together: no name to look up, so the construction itself.
        (
            "{{ hostvars[h]['ansible_' ~ iface] }} {{ lookup('vars', 'ansible_' + name) }}",
            ["'ansible_' ~", "'ansible_' +"],
        ),
        ("when: \"'slurmd' in packages\"", ["packages"]),
        ('loop: "{{ services | dict2items }}"', ["services"]),
        # Other spellings of a fact under ansible_facts.
        (
            "{{ hostvars[h]['ansible_facts']['getent_passwd'] }} "
            "{{ hostvars[h]['ansible_facts'].getent_group }}",
            [],
        ),
        ("{{ ansible_facts.get('getent_passwd', {}) }} {{ ansible_facts.get(\"distribution\") }}", []),
        # A registered result's or another variable's packages, not the fact.
        ("{{ result.packages['x'] }} {{ apt_packages['x'] }} {{ 'x' in result.packages }}", []),
    ],
)
def test_the_scan_tells_top_level_facts_from_facts_under_ansible_facts(text: str, found: list[str]) -> None:
    assert top_level_facts(text, fact_names()) == found
