"""Which rules judge a stack (infra/policy/rules/registry.py evaluate): a rule disabled by the policy config,
or a platform rule without a platform, is passed over, and the rules after it still judge. Each test failed
on a mutant of evaluate the policy-rules session let through (`make mutation`,
docs/developing.md#mutation-score)."""

from __future__ import annotations

from infra.policy.rules.base import PolicyContext
from infra.policy.rules.registry import evaluate, rule
from infra.policy.settings import PolicyConfig
from infra.policy.view import ResourceView

# A launch template that leaves IMDSv1 on and carries no tags.
TEMPLATE = ResourceView("aws:ec2/launchTemplate:LaunchTemplate", "lt", {})
IMDSV2, TAGS = rule("security-imdsv2"), rule("security-required-tags")


def test_a_disabled_rule_is_passed_over_and_the_rules_after_it_still_judge() -> None:
    disabled = PolicyContext(None, PolicyConfig.model_validate({"enforcement": {IMDSV2.id: "disabled"}}))
    assert [v.rule for v in evaluate([TEMPLATE], disabled, [IMDSV2, TAGS])] == [TAGS.id]
    assert [v.rule for v in evaluate([TEMPLATE], PolicyContext(None), [IMDSV2, TAGS])] == [IMDSV2.id, TAGS.id]


def test_a_platform_rule_without_a_platform_is_passed_over_and_the_rules_after_it_still_judge() -> None:
    spot = rule("spot-training-recovery")
    assert [v.rule for v in evaluate([TEMPLATE], PolicyContext(None), [spot, IMDSV2])] == [IMDSV2.id]
