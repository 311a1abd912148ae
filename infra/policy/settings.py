"""Every setting a policy rule reads (PolicyConfig), with its default and the name the policy config file
gives it. Reading and checking a policy config file is infra/policy/config.py's job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictBool

Enforcement = Literal["mandatory", "advisory", "disabled"]
ENFORCEMENT_KEY = "enforcementLevel"
ALL_RULES = "all"


class PolicyConfig(BaseModel):
    """Every setting a rule reads. Property names (aliases) are what the policy config file uses."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    min_spot_share: float = Field(
        0.5,
        ge=0,
        le=1,
        strict=True,
        alias="minSpotShare",
        description="share of training GPUs (at full size) that non-production aws stacks run on spot",
    )
    required_tags: tuple[str, ...] = Field(
        ("owner", "team", "cost-center"),
        alias="requiredTags",
        description="tag keys every taggable cloud resource carries (keys of the stack's tags section)",
    )
    isolate_subnets: StrictBool = Field(
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
    def property_name(cls, field_name: str) -> str:
        info = cls.model_fields[field_name]
        return info.alias or field_name

    @classmethod
    def option_schema(cls, field_name: str) -> tuple[str, dict[str, Any]]:
        """The policy-config property name and JSON schema of one setting (for PolicyConfigSchema)."""
        schema = cls.model_json_schema(by_alias=True)["properties"][cls.property_name(field_name)]
        schema.pop("title", None)
        return cls.property_name(field_name), schema

    @classmethod
    def from_properties(cls, properties: Mapping[str, Any] | None) -> PolicyConfig:
        """Settings from one policy's config properties (CrossGuard hands each policy its own)."""
        data = {k: v for k, v in (properties or {}).items() if k != ENFORCEMENT_KEY}
        return cls.model_validate(data)


ENFORCEMENT_LEVELS: tuple[str, ...] = get_args(Enforcement)
