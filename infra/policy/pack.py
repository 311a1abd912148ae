"""The CrossGuard wrappers: one pulumi_policy policy per rule of `infra.policy.rules`.

Building these policies starts nothing; only constructing `PolicyPack` (in `__main__.py`) starts the
policy server. Tests call the policies' `validate` directly.

How a policy finds the platform (the spec facts that are not resource properties): the pack runs
inside `pulumi preview`/`up`, where the engine hands the analyzer the stack's name and configuration.
The platform is read, in order, from
1. the stack configuration `gpu-platform:platform` (`pulumi.Config`), which is exactly what the
   program read, resolved the same way (`infra.platform.resolve`); then
2. the stack file `stacks/Pulumi.<stack>.yaml` of the stack being previewed (`pulumi.get_stack()`,
   i.e. PULUMI_STACK), honouring GPUPLAT_STACKS_DIR.
Where neither yields a platform, the resource-level checks still run and the rules that need the
platform report themselves not applicable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pulumi
import pulumi_policy as pp

from infra.errors import GpuPlatError
from infra.platform.resolve import ResolvedPlatform, load_platform, resolve
from infra.policy.config import unknown_properties
from infra.policy.rules import (
    RULES,
    PolicyContext,
    ResourceRule,
    StackRule,
    applies_to,
)
from infra.policy.settings import ENFORCEMENT_KEY, PolicyConfig
from infra.policy.view import ResourceIndex, from_policy_args, from_policy_resource
from infra.spec.load import CONFIG_KEY, parse_spec, stack_file

PACK_NAME = "gpu-platform"
PlatformLoader = Callable[[], ResolvedPlatform | None]

_LEVELS = {"mandatory": pp.EnforcementLevel.MANDATORY, "advisory": pp.EnforcementLevel.ADVISORY}
_SEVERITY = {"mandatory": pp.Severity.HIGH, "advisory": pp.Severity.LOW}
_cache: dict[str, ResolvedPlatform | None] = {}


def _stack_name() -> str | None:
    """The engine sets PULUMI_STACK for the analyzer; pulumi_policy also configures the runtime with it."""
    if os.environ.get("PULUMI_STACK"):
        return os.environ["PULUMI_STACK"]
    try:
        return pulumi.get_stack() or None
    except Exception:  # runtime settings absent outside the engine
        return None


def platform_from_stack() -> ResolvedPlatform | None:
    """The platform of the stack under preview: its config first, then its stack file (see above)."""
    stack = _stack_name()
    key = stack or ""
    if key in _cache:
        return _cache[key]
    platform: ResolvedPlatform | None = None
    try:
        raw: Any = pulumi.Config(CONFIG_KEY.split(":")[0]).get_object(CONFIG_KEY.split(":")[1])
    except Exception:  # no config in this process
        raw = None
    try:
        if raw is not None:
            source = stack_file(stack) if stack else Path("Pulumi.yaml")
            platform = resolve(parse_spec(raw, source), source)
        elif stack and stack_file(stack).is_file():
            platform = load_platform(stack_file(stack))
    except GpuPlatError:
        platform = None  # the program itself reports a bad spec; resource rules still run
    _cache[key] = platform
    return platform


def _config_schema(rule: ResourceRule | StackRule) -> pp.PolicyConfigSchema | None:
    if not rule.options:
        return None
    return pp.PolicyConfigSchema(properties=dict(PolicyConfig.option_schema(o) for o in rule.options))


def _context(config: Mapping[str, Any] | None, loader: PlatformLoader) -> PolicyContext:
    return PolicyContext(loader(), PolicyConfig.from_properties(config))


def _misplaced_settings(rule: ResourceRule | StackRule, config: Mapping[str, Any] | None) -> list[str]:
    """Properties the config gives this rule that it does not take. Pulumi hands each policy its own
    entry and validates it against the policy's schema, which (in the Python SDK) cannot forbid extra
    properties; `gpuplat check` refuses such a config, and the pack reports it as the rule's violation
    so that both stop the same change."""
    given = {str(k): v for k, v in (config or {}).items() if k != ENFORCEMENT_KEY}
    taken = [PolicyConfig.property_name(option) for option in rule.options]
    return [f"policy config: {message}" for _, message in unknown_properties(rule.id, given, taken)]


def _report_config_once(
    rule: ResourceRule | StackRule,
    reported: set[str],
    config: Mapping[str, Any] | None,
    report: Callable[..., None],
) -> None:
    for message in _misplaced_settings(rule, config):
        if message not in reported:
            reported.add(message)
            report(message, None)


def _message(message: str, remediation: str) -> str:
    return f"{message}.\nFix: {remediation}"


def _policy_fields(rule: ResourceRule | StackRule) -> dict[str, Any]:
    """What a CrossGuard policy says about its rule, the same for resource and stack policies."""
    return {
        "name": rule.id,
        "description": rule.description,
        "enforcement_level": _LEVELS[rule.severity],
        "config_schema": _config_schema(rule),
        "severity": _SEVERITY[rule.severity],
        "tags": [rule.group],
        "remediation_steps": rule.remediation,
    }


def resource_policy(rule: ResourceRule, loader: PlatformLoader = platform_from_stack) -> Any:
    reported: set[str] = set()

    def validate(args: Any, report_violation: Callable[[str, str | None], None]) -> None:
        _report_config_once(rule, reported, args.get_config(), report_violation)
        view = from_policy_args(args)
        if not applies_to(rule, view):
            return
        ctx = _context(args.get_config(), loader)
        for message in rule.check(view, ctx):
            report_violation(_message(message, rule.remediation), None)

    return pp.ResourceValidationPolicy(validate=validate, **_policy_fields(rule))


def stack_policy(rule: StackRule, loader: PlatformLoader = platform_from_stack) -> Any:
    reported: set[str] = set()

    def validate(args: Any, report_violation: Callable[[str, str | None], None]) -> None:
        _report_config_once(rule, reported, args.get_config(), report_violation)
        ctx = _context(args.get_config(), loader)
        if rule.needs_platform and ctx.platform is None:
            args.not_applicable(
                f"the platform description was not found: no `{CONFIG_KEY}` in the stack config and no "
                "stacks/Pulumi.<stack>.yaml for this stack"
            )
            return
        index = ResourceIndex(from_policy_resource(r) for r in args.resources)
        for finding in rule.check(index, ctx):
            report_violation(
                _message(f"{finding.resource}: {finding.message}", rule.remediation), finding.urn
            )

    return pp.StackValidationPolicy(validate=validate, **_policy_fields(rule))


def policies(loader: PlatformLoader = platform_from_stack) -> list[Any]:
    """One CrossGuard policy per rule, in the order of `RULES`."""
    return [
        resource_policy(rule, loader) if isinstance(rule, ResourceRule) else stack_policy(rule, loader)
        for rule in RULES
    ]
