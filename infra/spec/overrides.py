"""`--set KEY=VALUE`: a value of the platform description given on the command line, over the stack file's.

KEY is the path the plan's setting changes print: keys joined by dots, a list item that has a `name` by
that name in brackets (`budget.max_gpus`, `scheduler.teams[research].gpu_quota`, `pools[infer].max`).
VALUE is read as YAML, so `8` is a number and `true` a boolean; quote it (`'"1.30"'`) for text. The result
is validated as the file is: an unknown key or a wrong value is reported at its field.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import yaml

from infra.errors import SpecError

_SEGMENT = re.compile(r"^(?P<key>[A-Za-z0-9_-]+)(?:\[(?P<name>[^\]]+)\])?$")


def _segments(key: str, text: str) -> list[tuple[str, str | None]]:
    parts = []
    for part in key.split("."):
        match = _SEGMENT.match(part)
        if match is None:
            raise SpecError(
                f"--set {text}: {part!r} is not a key; give keys joined by dots, a named list item in "
                "brackets (e.g. scheduler.teams[research].gpu_quota=8)"
            )
        parts.append((match["key"], match["name"]))
    return parts


def parse_override(text: str) -> tuple[list[tuple[str, str | None]], Any]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise SpecError(f"--set {text}: give KEY=VALUE (e.g. budget.max_gpus=64)")
    try:
        parsed = yaml.safe_load(value) if value else ""
    except yaml.YAMLError as exc:
        raise SpecError(f"--set {text}: the value is not a YAML value ({exc.__class__.__name__})") from None
    return _segments(key, text), parsed


def apply_overrides(platform: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of the platform mapping with each override set in order; the file's mapping is untouched."""
    result = copy.deepcopy(platform)
    for text in overrides:
        segments, value = parse_override(text)
        node: Any = result
        for index, (key, name) in enumerate(segments):
            last = index == len(segments) - 1
            if name is None:
                if last:
                    node[key] = value
                    break
                node = node.setdefault(key, {})
            else:
                items = node.get(key)
                if not isinstance(items, list):
                    raise SpecError(f"--set {text}: {key} is not a list of named items here")
                found = next((i for i in items if isinstance(i, dict) and i.get("name") == name), None)
                if found is None:
                    names = ", ".join(str(i.get("name")) for i in items if isinstance(i, dict))
                    raise SpecError(f"--set {text}: no {key} item named {name!r}; there are: {names}")
                if last:
                    raise SpecError(f"--set {text}: name a field of {key}[{name}], not the item itself")
                node = found
            if not isinstance(node, dict):
                raise SpecError(f"--set {text}: {key} holds a value, not keys")
    return result
