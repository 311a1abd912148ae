"""A node runs Ansible on its own python3 at boot: the release it installs must run there as a controller,
and must have what the roles use; a stack whose nodes could not is refused when it is loaded."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from infra.data import node_ansible_choice
from infra.data.models import version_tuple
from infra.data.node_ansible import node_ansible_facts
from infra.data.node_ansible_choice import (
    Need,
    NodeAnsibleUnavailable,
    RolesNeed,
    bundle_files,
    node_ansible_problem,
    node_ansible_requirement,
    roles_need,
)
from infra.errors import SpecError
from infra.platform.resolve import load_platform
from infra.spec.models import OsRelease

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("release", get_args(OsRelease))
def test_every_node_release_gets_an_ansible_whose_core_runs_on_its_python(release: str) -> None:
    facts = node_ansible_facts()
    chosen = node_ansible_choice.node_ansible(release)
    python = version_tuple(chosen.python)
    package = next(r for r in facts.ansible_releases if r.version == chosen.ansible)
    controller = facts.core(package.core_series).controller_python
    assert version_tuple(package.requires_python) <= python
    assert version_tuple(controller.min) <= python <= version_tuple(controller.max)
    assert chosen.venv_package == "python3-venv"


def test_ubuntu_2204_python_310_gets_ansible_10_not_the_tested_12() -> None:
    """The default AMI: ansible 12 (ansible-core 2.19) needs Python 3.11; 10.7.0 (2.17.7) is the newest
    release whose ansible-core runs on jammy's Python 3.10."""
    chosen = node_ansible_choice.node_ansible("ubuntu2204")
    assert (chosen.python, chosen.ansible, chosen.ansible_core) == ("3.10", "10.7.0", "2.17.7")
    assert node_ansible_requirement("ubuntu2204") == "ansible==10.7.0"


@pytest.mark.parametrize(
    ("release", "python"), [("debian12", "3.11"), ("debian13", "3.13"), ("ubuntu2404", "3.12")]
)
def test_newer_releases_get_the_tested_ansible(release: str, python: str) -> None:
    chosen = node_ansible_choice.node_ansible(release)
    assert (chosen.python, chosen.requirement) == (python, "ansible==12.3.0")


def test_roles_need_comes_from_their_meta_and_the_features_they_use(tmp_path: Path) -> None:
    role = tmp_path / "roles" / "r"
    (role / "meta").mkdir(parents=True)
    (role / "tasks").mkdir()
    (role / "meta" / "main.yml").write_text("galaxy_info:\n  min_ansible_version: '2.18'\n")
    (role / "tasks" / "main.yml").write_text(
        "- community.general.modprobe: {name: x, persistent: present}\n"
        "- ansible.builtin.systemd_service: {}\n"
    )
    need = roles_need(tmp_path / "roles")
    assert need.ansible_core == Need("2.18", "roles/r/meta/main.yml min_ansible_version")
    assert need.collections["community.general"].version == "7.0.0"


def test_the_shipped_roles_need_what_their_meta_says(tmp_path: Path) -> None:
    need = roles_need()
    assert need.ansible_core.version == "2.17"
    assert need.collections["community.general"].version == "7.0.0"  # modprobe's persistent option


def test_every_collection_module_or_filter_the_roles_use_has_a_fact() -> None:
    """A collection plugin the roles start to use without a fact in node_ansible.yaml would escape the
    check: the node's Ansible may bundle a collection too old for it."""
    listed = {f.uses for f in node_ansible_facts().role_features}
    used: set[str] = set()
    for path in bundle_files(ROOT / "roles"):
        used |= set(
            re.findall(r"(?<![\w.])((?:community|ansible|amazon)\.[a-z_]+\.[a-z_0-9]+)", path.read_text())
        )
    used = {u for u in used if not u.startswith("ansible.builtin.")}
    assert sorted(used - listed) == []


def test_no_builtin_module_the_roles_use_is_newer_than_the_roles_minimum() -> None:
    """ansible-core's own version_added for every ansible.builtin module the roles and playbooks call is at
    most the minimum the roles state (modules renamed later are role_features, e.g. systemd_service)."""
    pytest.importorskip("ansible.modules")
    minimum = version_tuple(roles_need().ansible_core.version)
    too_new = []
    for path in bundle_files(ROOT / "roles"):
        for name in set(re.findall(r"(?<![\w.])ansible\.builtin\.([a-z_0-9]+):", path.read_text())):
            try:
                module = importlib.import_module(f"ansible.modules.{name}")
            except ModuleNotFoundError:
                continue  # a lookup, filter or test plugin
            added = str((yaml.safe_load(module.DOCUMENTATION) or {}).get("version_added", "historical"))
            if re.fullmatch(r"\d+\.\d+(\.\d+)?", added) and version_tuple(added) > minimum:
                too_new.append(f"{name} ({added}, {path.relative_to(ROOT)})")
    assert too_new == []


def _needing(core: str) -> Callable[..., RolesNeed]:
    return lambda roles_dir=None: RolesNeed(Need(core, "roles/x/meta/main.yml min_ansible_version"))


def test_a_stack_whose_roles_need_more_than_its_nodes_run_is_refused_at_the_os_release(
    monkeypatch: pytest.MonkeyPatch, write_stack: Callable[..., Path]
) -> None:
    monkeypatch.setattr(node_ansible_choice, "roles_need", _needing("2.18"))
    path = write_stack("aws-prod", lambda platform: None)
    with pytest.raises(SpecError) as raised:
        load_platform(path)
    message = raised.value.message
    assert str(path) in message and "gpu-platform:platform.software.os_release" in message
    assert "Ubuntu 22.04 (jammy) ships Python 3.10" in message and "ansible 10.7.0" in message
    assert "ansible-core >= 2.18 (roles/x/meta/main.yml min_ansible_version)" in message
    assert "not set: the aws default, ubuntu2204" in message
    assert "debian12, debian13, ubuntu2404" in message  # where the nodes could run it


def test_a_stack_whose_node_python_no_ansible_supports_is_refused(
    monkeypatch: pytest.MonkeyPatch, write_stack: Callable[..., Path]
) -> None:
    facts = node_ansible_facts()
    old = facts.model_copy(
        update={"os_pythons": [p.model_copy(update={"python": "3.9"}) for p in facts.os_pythons]}
    )
    monkeypatch.setattr(node_ansible_choice, "node_ansible_facts", lambda: old)

    def on_debian12(platform: dict[str, Any]) -> None:
        platform["software"] = {"os_release": "debian12"}

    with pytest.raises(SpecError) as raised:
        load_platform(write_stack("aws-prod", on_debian12))
    message = raised.value.message
    assert "software.os_release" in message and "Debian 12 (bookworm) ships Python 3.9" in message
    assert "no Ansible release in infra/data/node_ansible.yaml runs on it as a controller" in message
    with pytest.raises(NodeAnsibleUnavailable):
        node_ansible_requirement("debian12")


def test_hosts_the_operator_configures_are_not_checked(
    monkeypatch: pytest.MonkeyPatch, write_stack: Callable[..., Path]
) -> None:
    """On-prem and local nodes are Ansible's targets (the operator's machine is the controller)."""
    monkeypatch.setattr(node_ansible_choice, "roles_need", _needing("2.99"))
    assert node_ansible_problem("debian12") is not None
    load_platform(write_stack("onprem", lambda platform: None))
    load_platform(write_stack("local", lambda platform: None))
