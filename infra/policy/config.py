"""Policy settings: thresholds and switches, with defaults; the same file format as Pulumi's.

`pulumi preview --policy-pack infra/policy --policy-pack-config FILE` and `gpuplat check
--policy-config FILE` read one JSON (or YAML) document: per rule id, an `enforcementLevel`
(advisory | mandatory | disabled) and the rule's own properties; `"all"` sets every rule's level.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.errors import SpecError

Enforcement = Literal["mandatory", "advisory", "disabled"]


class PolicyConfig(BaseModel):
    """Every setting a rule reads. Property names (aliases) are what the policy config file uses."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    min_spot_share: float = Field(
        0.5,
        ge=0,
        le=1,
        alias="minSpotShare",
        description="share of training GPUs (at full size) that non-production aws stacks run on spot",
    )
    required_tags: tuple[str, ...] = Field(
        ("owner", "team", "cost-center"),
        alias="requiredTags",
        description="tag keys every taggable cloud resource carries",
    )
    isolate_subnets: bool = Field(
        False,
        alias="isolateSubnets",
        description="also forbid a subnet shared by training and inference node groups",
    )
    inference_label: str | None = Field(
        None,
        alias="inferenceLabel",
        pattern=r"^[^=]+=.*$",
        description="KEY=VALUE node label that counts, like a NoSchedule taint, as keeping training "
        "jobs off inference nodes; default: only a taint counts",
    )
    enforcement: dict[str, Enforcement] = Field(
        default_factory=dict, description="rule id -> enforcement level override (offline check)"
    )

    @classmethod
    def option_schema(cls, field_name: str) -> tuple[str, dict[str, Any]]:
        """The policy-config property name and JSON schema of one setting (for PolicyConfigSchema)."""
        info = cls.model_fields[field_name]
        schema = cls.model_json_schema(by_alias=True)["properties"][info.alias or field_name]
        schema.pop("title", None)
        return info.alias or field_name, schema

    @classmethod
    def from_properties(cls, properties: Mapping[str, Any] | None) -> PolicyConfig:
        """Settings from one policy's config properties (CrossGuard hands each policy its own)."""
        data = {k: v for k, v in (properties or {}).items() if k != "enforcementLevel"}
        return cls.model_validate(data)


def parse_policy_config(document: Mapping[str, Any], source: str = "policy config") -> PolicyConfig:
    """Merge a Pulumi-style policy config document (rule id -> level or {enforcementLevel, ...})."""
    from infra.policy.rules import RULES

    known = {rule.id for rule in RULES}
    properties: dict[str, Any] = {}
    enforcement: dict[str, str] = {}
    for key, value in document.items():
        if key != "all" and key not in known:
            raise SpecError(f"{source}: unknown rule {key!r}; known rules: {', '.join(sorted(known))}.")
        if isinstance(value, str):
            level: Any = value
            settings: Mapping[str, Any] = {}
        elif isinstance(value, Mapping):
            level = value.get("enforcementLevel")
            settings = value
        else:
            raise SpecError(f"{source}: {key}: give an enforcement level or a mapping of settings.")
        if level is not None:
            for rule_id in sorted(known) if key == "all" else [key]:
                if key == "all" and rule_id in enforcement:
                    continue
                enforcement[rule_id] = level
        properties.update({k: v for k, v in settings.items() if k != "enforcementLevel"})
    try:
        return PolicyConfig.model_validate({**properties, "enforcement": enforcement})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise SpecError(f"{source}: {problems}.") from exc


def load_policy_config(path: Path) -> PolicyConfig:
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: policy config file not found.") from None
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: cannot read policy config: {exc}") from exc
    if document is None:
        return PolicyConfig()
    if not isinstance(document, Mapping):
        raise SpecError(f"{path}: a policy config is a mapping of rule id to settings.")
    return parse_policy_config(document, str(path))
