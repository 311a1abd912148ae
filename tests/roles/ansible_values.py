"""Render role variables the way Ansible does, for tests that read a role's own vars files."""

from __future__ import annotations

from typing import Any

import jinja2
import yaml


def render_value(env: jinja2.Environment, value: Any, variables: dict[str, Any]) -> Any:
    """Strings with a template are rendered (a rendered list becomes a list); the rest passes through."""
    if not isinstance(value, str) or "{{" not in value:
        return value
    rendered = env.from_string(value).render(**variables).strip()
    try:
        return yaml.safe_load(rendered) if rendered.startswith("[") else rendered
    except yaml.YAMLError:
        return rendered
