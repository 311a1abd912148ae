"""The CrossGuard policies' validate functions, fed ResourceValidationArgs / StackValidationArgs built
from resources the real program recorded under the mocks (props wrapped in pulumi_policy's
unknown-checking proxy, as the policy server does)."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi_policy import (
    PolicyConfigSchema,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.policy import _NotApplicableError
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from infra.plan.record import RecordedResource, Recording, record
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.policy.pack import policies
from infra.policy.rules import RULES
from infra.spec.load import CONFIG_KEY, stack_file
from tests.conftest import stack_document

Violations = list[tuple[str, str | None]]


def _options(resource: RecordedResource) -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [], resource.parent_urn)


def resource_args(resource: RecordedResource, config: dict[str, Any] | None = None) -> ResourceValidationArgs:
    return ResourceValidationArgs(
        resource.type,
        unknown_checking_proxy(copy.deepcopy(resource.inputs)),
        resource.urn,
        resource.name,
        _options(resource),
        None,
        config,
    )


def stack_args(recording: Recording, config: dict[str, Any] | None = None) -> StackValidationArgs:
    resources = {
        r.urn: PolicyResource(
            r.type,
            unknown_checking_proxy(copy.deepcopy(r.inputs)),
            r.urn,
            r.name,
            _options(r),
            None,
            None,
            [],
            {},
        )
        for r in recording.resources
    }
    for r in recording.resources:
        if r.parent_urn in resources:
            resources[r.urn].parent = resources[r.parent_urn]
    return StackValidationArgs(list(resources.values()), config)


def run_policy(policy: Any, recording: Recording, config: dict[str, Any] | None = None) -> Violations:
    violations: Violations = []

    def report(message: str, urn: str | None = None) -> None:
        violations.append((message, urn))

    if isinstance(policy, StackValidationPolicy):
        policy.validate(stack_args(recording, config), report)
    else:
        for resource in recording.resources:
            policy.validate(resource_args(resource, config), report)
    return violations


@pytest.fixture(scope="module")
def aws_prod() -> tuple[ResolvedPlatform, Recording]:
    platform = load_platform(stack_file("aws-prod"))
    return platform, record(platform)


@pytest.fixture(scope="module")
def over_budget(tmp_path_factory: pytest.TempPathFactory) -> tuple[ResolvedPlatform, Recording]:
    document = stack_document("aws-prod")
    document["config"][CONFIG_KEY]["budget"]["max_gpus"] = 8
    document["config"][CONFIG_KEY]["aws"] = {"vpc_cidr": "0.0.0.0/0"}
    path = Path(tmp_path_factory.mktemp("pack")) / "Pulumi.over.yaml"
    path.write_text(yaml.safe_dump(document))
    platform = load_platform(path)
    return platform, record(platform)


def by_name(loader: Callable[[], ResolvedPlatform | None]) -> dict[str, Any]:
    return {p.name: p for p in policies(loader)}


def test_one_policy_per_rule_with_metadata() -> None:
    pack = by_name(lambda: None)
    assert list(pack) == [r.id for r in RULES]
    for rule in RULES:
        policy = pack[rule.id]
        kind = ResourceValidationPolicy if hasattr(rule, "types") else StackValidationPolicy
        assert isinstance(policy, kind)
        assert policy.enforcement_level.value == rule.severity
        assert policy.remediation_steps == rule.remediation
    schema = pack["spot-training-share"].config_schema
    assert isinstance(schema, PolicyConfigSchema)
    assert schema.properties["minSpotShare"]["default"] == 0.5
    assert pack["security-required-tags"].config_schema.properties["requiredTags"]["default"] == [
        "owner",
        "team",
        "cost-center",
    ]


def test_shipped_stack_passes_every_policy(aws_prod: tuple[ResolvedPlatform, Recording]) -> None:
    platform, recording = aws_prod
    for name, policy in by_name(lambda: platform).items():
        assert run_policy(policy, recording) == [], name


def test_stack_policy_reports_budget_with_remediation(
    over_budget: tuple[ResolvedPlatform, Recording],
) -> None:
    platform, recording = over_budget
    ((message, urn),) = run_policy(by_name(lambda: platform)["budget-gpus"], recording)
    assert "72 GPUs" in message and "over the budget of 8" in message and "Fix:" in message
    assert urn is None


def test_resource_policy_reports_open_ingress(over_budget: tuple[ResolvedPlatform, Recording]) -> None:
    platform, recording = over_budget
    violations = run_policy(by_name(lambda: platform)["security-no-open-ingress"], recording)
    assert len(violations) == 1 and "0.0.0.0/0" in violations[0][0]


def test_stack_policy_config_is_read(aws_prod: tuple[ResolvedPlatform, Recording]) -> None:
    platform, recording = aws_prod
    policy = by_name(lambda: platform)["isolation-shared-resources"]
    ((message, urn),) = run_policy(policy, recording, {"isolateSubnets": True})
    assert "aws-prod-private-us-east-1a" in message
    assert urn == recording.named("aws-prod-private-us-east-1a").urn


def test_a_property_under_the_wrong_rule_stops_the_pack_as_it_stops_check(
    aws_prod: tuple[ResolvedPlatform, Recording], tmp_path: Path
) -> None:
    """requiredTags given to budget-gpus and minSpotShare to security-imdsv2 (a resource rule, validated once
    per resource): each policy reports it once, as `gpuplat check` refuses the same config."""
    platform, recording = aws_prod
    pack = by_name(lambda: platform)
    (budget,) = run_policy(pack["budget-gpus"], recording, {"requiredTags": ["owner"]})
    assert "policy config: rule budget-gpus has no property 'requiredTags'" in budget[0]
    (imds,) = run_policy(pack["security-imdsv2"], recording, {"minSpotShare": 0.7})
    assert "rule security-imdsv2 has no property 'minSpotShare'" in imds[0]
    config = tmp_path / "policy.json"
    config.write_text('{"budget-gpus": {"requiredTags": ["owner"]}}')
    refused = subprocess.run(
        [sys.executable, "-c", "from infra.cli.app import main; main()", "check", "--stack", "aws-prod",
         "--policy-config", str(config)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert refused.returncode == 2 and "rule budget-gpus has no property 'requiredTags'" in refused.stderr


def test_platform_rules_not_applicable_without_platform(aws_prod: tuple[ResolvedPlatform, Recording]) -> None:
    _, recording = aws_prod
    pack = by_name(lambda: None)
    with pytest.raises(_NotApplicableError) as raised:
        run_policy(pack["budget-gpus"], recording)
    assert "platform description was not found" in (raised.value.reason or "")
    # resource-level rules still judge the resources
    assert run_policy(pack["fabric-efa-security-group"], recording) == []


def test_unknown_values_at_preview_do_not_break_rules(aws_prod: tuple[ResolvedPlatform, Recording]) -> None:
    platform, recording = aws_prod
    template = recording.named("aws-prod-train-lt")
    inputs = copy.deepcopy(template.inputs)
    inputs["imageId"] = UNKNOWN_STRING_VALUE
    inputs["networkInterfaces"][0]["securityGroups"] = [UNKNOWN_STRING_VALUE]
    unknown = RecordedResource(template.type, template.name, template.urn, inputs, template.parent_urn, True)
    violations: Violations = []
    for name in ("security-imdsv2", "security-ebs-encrypted", "security-required-tags"):
        by_name(lambda: platform)[name].validate(
            resource_args(unknown), lambda m, u=None: violations.append((m, u))
        )
    assert violations == []


def _preview_placement(recording: Recording, *, with_dependency: bool) -> Violations:
    """Run fabric-cluster-placement as at `pulumi preview`: a training template's placement group name is
    not computed yet, and the engine says (property dependencies) which resource it comes from."""
    args = stack_args(recording)
    by_urn = {r.urn: r for r in args.resources}
    for template in recording.of_type("aws:ec2/launchTemplate:LaunchTemplate"):
        if "placement" not in template.inputs:
            continue
        inputs = copy.deepcopy(template.inputs)
        inputs["placement"]["groupName"] = UNKNOWN_STRING_VALUE
        resource = by_urn[template.urn]
        resource.props = unknown_checking_proxy(inputs)
        group = next(
            r for r in args.resources if r.name == template.inputs["placement"]["groupName"]
        )  # the mocks name the group after its resource
        resource.property_dependencies = {"placement": [group]} if with_dependency else {}
    violations: Violations = []
    policy = by_name(lambda: None)["fabric-cluster-placement"]
    policy.validate(args, lambda m, u=None: violations.append((m, u)))
    return violations


def test_slurm_pool_placement_group_found_through_dependencies(
    aws_prod: tuple[ResolvedPlatform, Recording],
) -> None:
    _, recording = aws_prod
    # the training pools are Slurm-managed: launch templates naming their placement group, no ASG
    assert not [r for r in recording.of_type("aws:autoscaling/group:Group") if "-train" in r.name]
    assert _preview_placement(recording, with_dependency=True) == []
    # without the engine's word the group cannot be found, and the rule names each template
    found = _preview_placement(recording, with_dependency=False)
    urns = {recording.named(n).urn for n in ("aws-prod-train-lt", "aws-prod-train-spot-lt")}
    assert {urn for _, urn in found} == urns
    assert all("no placement group" in message for message, _ in found)


def test_pack_main_starts_a_policy_server() -> None:
    """`infra/policy/__main__.py` builds the pack: the server prints its port and waits."""
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", "infra/policy"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = process.stdout.readline().strip()
        assert port.isdigit(), process.stderr.read() if process.stderr else ""
    finally:
        process.kill()
        process.wait()
