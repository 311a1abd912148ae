"""The rules a stack's report shows as skipped (infra/policy/rules/registry.py not_applicable): the resource
rules that judge no resource of the stack; a stack rule is never among them. Its mutants had no test in the
policy-rules session (`make mutation`, docs/developing.md#mutation-score)."""

from __future__ import annotations

from infra.policy.rules.base import ResourceRule
from infra.policy.rules.registry import RULES, not_applicable
from infra.policy.view import ResourceView

RESOURCE_RULES = [rule.id for rule in RULES if isinstance(rule, ResourceRule)]


def test_a_stack_without_aws_resources_skips_every_resource_rule_and_no_stack_rule() -> None:
    assert not_applicable([]) == RESOURCE_RULES
    untagged = ResourceView("kubernetes:core/v1:Namespace", "training", {})
    assert not_applicable([untagged]) == RESOURCE_RULES
    assert len(RESOURCE_RULES) < len(RULES)  # the stack rules are not listed


def test_a_rule_judging_one_resource_of_the_stack_is_not_skipped() -> None:
    volume = ResourceView("aws:fsx/lustreFileSystem:LustreFileSystem", "scratch", {})
    assert not_applicable([volume]) == [
        rule for rule in RESOURCE_RULES if rule not in ("security-fsx-encrypted", "security-required-tags")
    ]
    # A rule that also judges whatever carries tags is not skipped on a tagged resource of another type.
    tagged = ResourceView("kubernetes:core/v1:Namespace", "training", {"tags": {"team": "ml"}})
    assert "security-required-tags" not in not_applicable([tagged])
    assert "security-imdsv2" in not_applicable([tagged])
