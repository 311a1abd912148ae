"""Which Ansible a node installs to configure itself, from its OS release (infra/data/node_ansible.yaml).

A cloud node runs the project's playbooks on itself at boot (infra/backends/aws/bootstrap.py): it is
Ansible's controller, so the `ansible` release must support the image's own python3 as a controller
Python. The choice: the newest release in the facts whose Requires-Python and whose ansible-core's
controller Pythons include the node's Python. It must also have what the roles need: the ansible-core
of every role's meta/main.yml `min_ansible_version` and of the features they use, and the collection
versions their modules and filters need. A stack whose nodes could not run the roles is refused when
it is loaded (infra/spec/catalog_checks.py), at `software.os_release`.

Pure: reads the facts and the roles/ tree of this checkout (the bundle the nodes get), nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

from infra.data.models import version_tuple
from infra.data.node_ansible import AnsibleRelease, NodeAnsibleFacts, node_ansible_facts
from infra.data.packages import package_facts

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"
DATA_FILE = "infra/data/node_ansible.yaml"
_ROLE_FILE_SUFFIXES = (".yml", ".yaml", ".j2")


@dataclass(frozen=True)
class Need:
    """A version something needs, and why (for messages)."""

    version: str
    reason: str


@dataclass(frozen=True)
class RolesNeed:
    """What the roles need of the Ansible that runs them."""

    ansible_core: Need
    collections: dict[str, Need] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeAnsible:
    """The Ansible a node of `os_release` installs into a venv of its own python3."""

    os_release: str
    python: str
    venv_package: str
    ansible: str
    ansible_core: str

    @property
    def requirement(self) -> str:
        """The pip requirement, e.g. 'ansible==10.7.0'."""
        return f"ansible=={self.ansible}"


class NodeAnsibleUnavailable(ValueError):
    """No Ansible in the facts runs on the node's Python, or none that has what the roles need."""


def bundle_files(roles_dir: Path) -> list[Path]:
    """The YAML and template files of the bundle the nodes run: roles/ and the playbooks/ beside it."""
    trees = [roles_dir, roles_dir.parent / "playbooks"]
    return sorted(
        p
        for tree in trees
        if tree.is_dir()
        for p in tree.rglob("*")
        if p.is_file() and p.suffix in _ROLE_FILE_SUFFIXES
    )


def _older(a: str, b: str) -> bool:
    return version_tuple(a) < version_tuple(b)


@cache
def roles_need(roles_dir: Path = ROLES_DIR) -> RolesNeed:
    """The newest ansible-core and collection versions the roles under `roles_dir` need: every role's
    meta/main.yml min_ansible_version, and the role_features of the facts that the role and playbook files
    use."""
    core = Need("2.0", "no role states a minimum")
    for meta in sorted(roles_dir.glob("*/meta/main.yml")):
        info = (yaml.safe_load(meta.read_text(encoding="utf-8")) or {}).get("galaxy_info") or {}
        minimum = str(info.get("min_ansible_version", "")).strip()
        if minimum and _older(core.version, minimum):
            core = Need(minimum, f"{meta.relative_to(roles_dir.parent)} min_ansible_version")
    texts = {path: path.read_text(encoding="utf-8", errors="replace") for path in bundle_files(roles_dir)}
    collections: dict[str, Need] = {}
    for feature in node_ansible_facts().role_features:
        pattern = re.compile(rf"(?<![\w.]){re.escape(feature.uses)}(?![\w])")
        user = next((path for path, text in texts.items() if pattern.search(text)), None)
        if user is None:
            continue
        where = f"{feature.uses} in {user.relative_to(roles_dir.parent)}"
        if feature.ansible_core is not None and _older(core.version, feature.ansible_core):
            core = Need(feature.ansible_core, where)
        if feature.collection is not None and feature.version is not None:
            known = collections.get(feature.collection)
            if known is None or _older(known.version, feature.version):
                collections[feature.collection] = Need(feature.version, where)
    return RolesNeed(core, collections)


def _release_name(os_release: str) -> str:
    try:
        return package_facts().release(os_release).name
    except StopIteration:
        return os_release


def _runs_on(release: AnsibleRelease, python: str, facts: NodeAnsibleFacts) -> bool:
    return version_tuple(release.requires_python) <= version_tuple(python) and facts.core(
        release.core_series
    ).controller_python.holds(python)


def node_ansible(os_release: str) -> NodeAnsible:
    """The Ansible a node of `os_release` runs; NodeAnsibleUnavailable says why there is none."""
    facts = node_ansible_facts()
    name = _release_name(os_release)
    os_python = facts.os_python(os_release)
    if os_python is None:
        known = ", ".join(p.release for p in facts.os_pythons)
        raise NodeAnsibleUnavailable(
            f"{DATA_FILE} has no Python for {name} (os_pythons lists {known}), so no Ansible can be chosen "
            "for its nodes"
        )
    python = os_python.python
    runnable = [r for r in facts.ansible_releases if _runs_on(r, python, facts)]
    if not runnable:
        offered = ", ".join(
            f"{r.version} (ansible-core {r.ansible_core}, controller Python "
            f"{facts.core(r.core_series).controller_python.min}-{facts.core(r.core_series).controller_python.max})"
            for r in facts.ansible_releases
        )
        raise NodeAnsibleUnavailable(
            f"{name} ships Python {python}, and no Ansible release in {DATA_FILE} runs on it as a controller "
            f"(the node runs Ansible on itself at boot): {offered}"
        )
    chosen = max(runnable, key=lambda r: version_tuple(r.version))
    need = roles_need()
    lacking: list[str] = []
    if _older(chosen.ansible_core, need.ansible_core.version):
        lacking.append(f"ansible-core >= {need.ansible_core.version} ({need.ansible_core.reason})")
    for collection, wanted in sorted(need.collections.items()):
        bundled = chosen.collections.get(collection)
        if bundled is None or _older(bundled, wanted.version):
            lacking.append(
                f"{collection} >= {wanted.version} ({wanted.reason}; ansible {chosen.version} bundles "
                f"{bundled or 'none'})"
            )
    if lacking:
        raise NodeAnsibleUnavailable(
            f"{name} ships Python {python}; the newest Ansible that runs on it is ansible {chosen.version} "
            f"(ansible-core {chosen.ansible_core}, {DATA_FILE}), but the roles need {'; '.join(lacking)}"
        )
    return NodeAnsible(
        os_release=os_release,
        python=python,
        venv_package=os_python.venv_package,
        ansible=chosen.version,
        ansible_core=chosen.ansible_core,
    )


def node_ansible_requirement(os_release: str) -> str:
    """The pip requirement of the Ansible a node of `os_release` installs, e.g. 'ansible==10.7.0' on
    ubuntu2204 (Python 3.10). Raises NodeAnsibleUnavailable where there is none (a stack that loads has
    passed node_ansible_problem, so its nodes' release always has one)."""
    return node_ansible(os_release).requirement


def node_ansible_problem(os_release: str) -> str | None:
    """Why nodes of `os_release` cannot run the roles on themselves, or None."""
    try:
        node_ansible(os_release)
    except NodeAnsibleUnavailable as exc:
        return str(exc)
    return None


def runnable_releases() -> list[str]:
    """OS releases of the facts whose nodes can run the roles (for messages)."""
    return [p.release for p in node_ansible_facts().os_pythons if node_ansible_problem(p.release) is None]
