"""What every rule is built from: the context, findings, rule and verdict records, and value helpers.

The helpers read loosely typed resource properties (nested mappings and lists, strings that mean
booleans or numbers) without raising.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from infra.platform.resolve import ResolvedPlatform
from infra.policy.settings import PolicyConfig
from infra.policy.view import ResourceIndex, ResourceView

Severity = Literal["mandatory", "advisory"]


@dataclass(frozen=True)
class PolicyContext:
    """What rules know besides the resources: the resolved platform (None where it cannot be found)
    and the policy settings."""

    platform: ResolvedPlatform | None
    config: PolicyConfig = field(default_factory=PolicyConfig)


@dataclass(frozen=True)
class Finding:
    resource: str
    message: str
    urn: str | None = None


ResourceCheck = Callable[[ResourceView, PolicyContext], Iterable[str]]
StackCheck = Callable[[ResourceIndex, PolicyContext], Iterable[Finding]]


@dataclass(frozen=True, kw_only=True)
class Rule:
    id: str
    group: str
    description: str
    remediation: str
    severity: Severity = "mandatory"
    options: tuple[str, ...] = ()  # PolicyConfig fields the rule reads
    needs_platform: bool = False


@dataclass(frozen=True, kw_only=True)
class ResourceRule(Rule):
    types: tuple[str, ...]
    check: ResourceCheck
    any_tagged: bool = False  # also judge any resource whose props carry tags


@dataclass(frozen=True, kw_only=True)
class StackRule(Rule):
    check: StackCheck


@dataclass(frozen=True)
class Verdict:
    rule: str
    severity: str
    resource: str
    message: str
    remediation: str
    urn: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "resource": self.resource,
            "message": self.message,
            "remediation": self.remediation,
        }


# ---------------------------------------------------------------------------------------------------
# helpers


def _get(value: Any, *path: str | int) -> Any:
    for key in path:
        if isinstance(key, int):
            if not isinstance(value, Sequence) or isinstance(value, str) or key >= len(value):
                return None
            value = value[key]
        else:
            if not isinstance(value, Mapping):
                return None
            value = value.get(key)
    return value


def _items(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _number(value: Any, default: float = 0) -> float:
    if isinstance(value, bool):
        return default
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return default
    return default


def _stack_label(ctx: PolicyContext) -> str:
    return f"stack {ctx.platform.name}" if ctx.platform else "stack"
