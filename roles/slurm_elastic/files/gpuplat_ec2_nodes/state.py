"""The commands' state files (<state_dir>, /var/lib/gpuplat): JSON objects, replaced atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .logs import LOG


def read_state(path: Path) -> dict[str, Any]:
    """The JSON object in the file; empty when it is missing or unreadable (logged)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        LOG.warning("cannot read the state file %s (%s); starting afresh", path, err)
        return {}
    return data if isinstance(data, dict) else {}


def write_state(path: Path, data: dict[str, Any]) -> bool:
    """Replace the file atomically; False (logged) when it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(path.name + ".new")
        scratch.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        scratch.replace(path)
    except OSError as err:
        LOG.error("cannot write the state file %s: %s", path, err)
        return False
    return True


def number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
