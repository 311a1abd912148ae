"""Render an Ansible role's template outside Ansible, so that what the Kubernetes layer puts in a
ConfigMap or an environment is what the role writes on a node: one source for both platforms.

Only plain Jinja and the filters the rendered templates use are available; a template that needs
another Ansible filter fails to render here (jinja2's error names it) rather than rendering wrongly.
"""

from __future__ import annotations

import copy
import posixpath
import re
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import yaml

from infra.spec.load import PROJECT_ROOT

ROLES_DIR = PROJECT_ROOT / "roles"
ANSIBLE_MANAGED = "Managed by gpu-platform: local changes are overwritten"


def _comment(text: str) -> str:
    """Ansible's `comment` filter with its defaults: the text between two `#` lines."""
    lines = ["#", *(f"# {line}" if line else "#" for line in str(text).splitlines()), "#"]
    return "\n".join(lines)


def _regex_replace(value: object, pattern: str, replacement: str) -> str:
    return re.sub(pattern, replacement, str(value))


@cache
def _environment(role_dir: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(role_dir / "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
    )
    env.filters["comment"] = _comment
    # Ansible's filters of the same names, as the templates use them (a path's parts; re.sub).
    env.filters["basename"] = posixpath.basename
    env.filters["dirname"] = posixpath.dirname
    env.filters["regex_replace"] = _regex_replace
    return env


def role_defaults(role: str) -> dict[str, Any]:
    return _role_mapping(role, "defaults")


def role_vars(role: str) -> dict[str, Any]:
    """A role's vars/main.yml as written (values that are templates stay text)."""
    return _role_mapping(role, "vars")


def _role_mapping(role: str, folder: str) -> dict[str, Any]:
    """A copy of the role's file, which the caller may change: the file is parsed once per process."""
    return copy.deepcopy(_parsed_role_file(ROLES_DIR / role / folder / "main.yml"))


# The inventory, the serving objects and the templates ask for the same few roles' files again and again
# (2079 parses in one run of the unit tier, 4 CPU-s of pure-Python YAML); they are the repository's own
# files, not changed while a command runs.
@cache
def _parsed_role_file(path: Path) -> dict[str, Any]:
    values = yaml.safe_load(path.read_text()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path}: role {path.parent.name} are a mapping")
    return values


def render_role_template(role: str, template: str, values: dict[str, Any]) -> str:
    """`roles/<role>/templates/<template>` rendered with the role's defaults overlaid by `values`
    (the variables the inventory gives the role). Defaults that are themselves templates are passed
    as written: a template that prints one renders its text, not its value."""
    variables = {**role_defaults(role), "ansible_managed": ANSIBLE_MANAGED, **values}
    return _environment(ROLES_DIR / role).get_template(template).render(**variables)
