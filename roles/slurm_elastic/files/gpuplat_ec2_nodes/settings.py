"""The configuration file (``--config``) and the pools: which pool a node name belongs to."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .exit_codes import EXIT_OK, EXIT_UNKNOWN_NODE, UsageError
from .logs import LOG

DEFAULT_CONFIG = "/etc/gpuplat/ec2-nodes.json"
DEFAULT_STATE_DIR = "/var/lib/gpuplat"


CAPACITY_TYPES = ("on-demand", "spot")


@dataclass(frozen=True)
class Pool:
    """A training pool. `instance_types` and `subnet_ids` are the choices a launch may take beyond the
    template's own (its type and subnet first); with more than one choice, the pool launches through
    CreateFleet (ec2.py)."""

    name: str
    launch_template_id: str
    subnet_id: str | None
    static_nodes: tuple[str, ...]
    instance_types: tuple[str, ...] = ()
    subnet_ids: tuple[str, ...] = ()
    capacity: str = "on-demand"

    @property
    def launch_choices(self) -> list[tuple[str | None, str | None]]:
        """(instance type, subnet) pairs a launch may take; None: the template's."""
        types: list[str | None] = list(self.instance_types) or [None]
        subnets: list[str | None] = list(self.subnet_ids) or [self.subnet_id]
        return [(kind, subnet) for kind in types for subnet in subnets]


@dataclass(frozen=True)
class Settings:
    stack: str
    region: str
    scontrol: str
    pools: dict[str, Pool]
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    orphan_grace_s: float = 300.0
    static_backoff_base_s: float = 60.0
    static_backoff_max_s: float = 3600.0
    insufficient_capacity_timeout_s: float = 600.0
    protected_failure_count: int = 10

    @property
    def static_nodes(self) -> list[str]:
        return [name for pool in self.pools.values() for name in pool.static_nodes]


def load_settings(path: Path) -> Settings:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read configuration {path}: {err}") from err
    try:
        pools = {name: parse_pool(name, entry) for name, entry in raw["pools"].items()}
        return Settings(
            stack=str(raw["stack"]),
            region=str(raw["region"]),
            scontrol=str(raw.get("scontrol") or "/usr/bin/scontrol"),
            pools=pools,
            state_dir=Path(raw.get("state_dir") or DEFAULT_STATE_DIR),
            orphan_grace_s=seconds(raw, "orphan_grace_s", 300.0),
            static_backoff_base_s=seconds(raw, "static_backoff_base_s", 60.0),
            static_backoff_max_s=seconds(raw, "static_backoff_max_s", 3600.0),
            insufficient_capacity_timeout_s=seconds(raw, "insufficient_capacity_timeout_s", 600.0),
            protected_failure_count=count(raw, "protected_failure_count", 10),
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise UsageError(f"configuration {path}: missing or malformed entry {err}") from err
    except ValueError as err:
        raise UsageError(f"configuration {path}: {err}") from err


def parse_pool(name: str, entry: dict[str, Any]) -> Pool:
    capacity = str(entry.get("capacity") or "on-demand")
    if capacity not in CAPACITY_TYPES:
        raise ValueError(
            f"pool {name}: capacity must be one of {', '.join(CAPACITY_TYPES)}, not {capacity!r}"
        )
    return Pool(
        name=name,
        launch_template_id=str(entry["launch_template_id"]),
        subnet_id=entry.get("subnet_id") or None,
        static_nodes=tuple(str(node) for node in entry.get("static_nodes") or ()),
        instance_types=names_of(name, entry, "instance_types"),
        subnet_ids=names_of(name, entry, "subnet_ids"),
        capacity=capacity,
    )


def names_of(pool: str, entry: dict[str, Any], key: str) -> tuple[str, ...]:
    values = entry.get(key) or []
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise ValueError(f"pool {pool}: {key} must be a list of names, not {values!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"pool {pool}: {key} lists a name twice: {values!r}")
    return tuple(values)


def seconds(raw: dict[str, Any], key: str, default: float) -> float:
    value = float(raw.get(key, default))
    if value < 0:
        raise ValueError(f"{key} must not be negative (seconds), not {value}")
    return value


def count(raw: dict[str, Any], key: str, default: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, str) and value.strip().isdigit():  # a template's rendering
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be a whole number, 0 or more (0 turns it off), not {value!r}")
    return value


def pool_of(name: str, pools: dict[str, Pool]) -> str | None:
    """The pool of ``<pool>-<int>``; the index has no dash, so this is the longest-prefix match."""
    prefix, dash, index = name.rpartition("-")
    return prefix if dash and index.isdigit() and prefix in pools else None


def group_by_pool(names: Iterable[str], pools: dict[str, Pool]) -> tuple[dict[str, list[str]], list[str]]:
    groups: dict[str, list[str]] = {}
    unknown: list[str] = []
    for name in names:
        pool = pool_of(name, pools)
        if pool is None:
            unknown.append(name)
        else:
            groups.setdefault(pool, []).append(name)
    return groups, unknown


def report_unknown(names: list[str], pools: dict[str, Pool], action: str) -> int:
    if not names:
        return EXIT_OK
    LOG.error(
        "%s: %s belong to no configured pool (pools: %s); names are <pool>-<index>",
        action,
        ",".join(names),
        ",".join(sorted(pools)) or "none",
    )
    return EXIT_UNKNOWN_NODE
