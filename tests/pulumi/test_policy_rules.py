"""Every policy rule, passing and failing, on real stacks run through the real program under the mocks.

Broken variants are modified copies of the shipped stacks, or the real program with one deliberate bug
(a Pulumi stack transformation changing one property, or one component patched), never hand-written
property dicts. Recordings are cached per variant for the module.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest import mock

import pulumi
import pulumi_aws as aws
import pytest
import yaml

from infra.backends.aws.network import GpuNetwork
from infra.plan.record import Recording, record
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.policy.check import verdicts_for
from infra.policy.rules import RULES, PolicyContext, Verdict, check_partitions, node_groups
from infra.policy.rules.service_costs import ServiceCost, service_costs
from infra.policy.settings import PolicyConfig
from infra.policy.view import (
    TAG_MAX_NODES,
    TAG_MIN_NODES,
    TAG_POOL,
    TAG_ROLE,
    ResourceIndex,
    ResourceView,
    from_recorded,
)
from infra.program import build
from infra.spec.load import CONFIG_KEY
from tests.conftest import stack_document
from tests.pulumi.findings import as_written, expected_findings

Mutate = Callable[[dict[str, Any]], None]
Program = Callable[[ResolvedPlatform], None]


def _pool(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda spec: next(p for p in spec["pools"] if p["name"] == name)


def _set(path: str, value: Any) -> Mutate:
    def mutate(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = spec
        for key in parents:
            target = _pool(key[5:])(target) if key.startswith("pool:") else target.setdefault(key, {})
        target[last] = value

    return mutate


def _team_placement(value: Any) -> Mutate:
    def mutate(spec: dict[str, Any]) -> None:
        spec["scheduler"]["teams"][0]["placement"] = value

    return mutate


def _first_host_only(pool: str) -> Mutate:
    def mutate(spec: dict[str, Any]) -> None:
        target = _pool(pool)(spec)
        target["hosts"] = target["hosts"][:1]

    return mutate


def _all(*mutations: Mutate) -> Mutate:
    def mutate(spec: dict[str, Any]) -> None:
        for m in mutations:
            m(spec)

    return mutate


def _copy(value: Any) -> Any:
    """Copy the containers of resource inputs, keeping Outputs (which cannot be deep-copied) as they are."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _transform(type_: str, change: Callable[[dict[str, Any]], None]) -> Program:
    """The real program with a stack transformation that changes the inputs of every `type_`."""

    def transformation(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult | None:
        if args.type_ != type_:
            return None
        props = _copy(dict(args.props))
        change(props)
        return pulumi.ResourceTransformationResult(props, args.opts)

    def program(platform: ResolvedPlatform) -> None:
        pulumi.runtime.register_stack_transformation(transformation)
        build(platform)

    return program


def _patched(*patches: Callable[[], Any]) -> Program:
    def program(platform: ResolvedPlatform) -> None:
        with ExitStack() as stack:
            for make in patches:
                stack.enter_context(make())
            build(platform)

    return program


def _infer_on_train_security_group() -> Any:
    original = GpuNetwork.__init__

    def init(self: GpuNetwork, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.security_groups["infer"] = self.security_groups["train"]

    return mock.patch.object(GpuNetwork, "__init__", init)


def _skip(cls_path: str, suffix: str = "") -> Callable[[], Any]:
    module, name = cls_path.rsplit(".", 1)
    target = getattr(aws, module)
    real = getattr(target, name)

    def factory(resource_name: str, *args: Any, **kwargs: Any) -> Any:
        return None if resource_name.endswith(suffix) else real(resource_name, *args, **kwargs)

    return lambda: mock.patch.object(target, name, factory)


def _munge_key_for_every_role() -> Any:
    return mock.patch("infra.backends.aws.munge_roles", lambda platform: {p.role for p in platform.pools})


def _unconditioned_launch_rights(props: dict[str, Any]) -> None:
    """The controllers' EC2 rights as they were: RunInstances and CreateTags on anything."""

    def widen(document: str) -> str:
        policy = json.loads(document)
        if "ec2:RunInstances" in document:
            policy["Statement"].append(
                {"Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateTags"], "Resource": "*"}
            )
        return json.dumps(policy)

    props["policy"] = pulumi.Output.from_input(props["policy"]).apply(widen)


# name -> (base stack, stack mutation, program)
VARIANTS: dict[str, tuple[str, Mutate | None, Program | None]] = {
    "aws-prod": ("aws-prod", None, None),
    "local": ("local", None, None),
    "onprem": ("onprem", None, None),
    "interruptible-on-demand": ("aws-prod", _set("pool:train-spot.capacity", "on-demand"), None),
    "spot-inference": ("aws-prod", _set("pool:infer.capacity", "spot"), None),
    "spot-cancel": ("aws-prod", _set("scheduler.spot_preempt_mode", "cancel"), None),
    "checkpoints-off-fs": ("aws-prod", _set("storage.checkpoint_path", "/scratch/checkpoints"), None),
    "staging-little-spot": (
        "aws-prod",
        _all(_set("environment", "staging"), _set("pool:train-spot.max", 1)),
        None,
    ),
    "infer-on-train-sg": ("aws-prod", None, _patched(_infer_on_train_security_group)),
    "untainted-inference": ("aws-prod", _set("pool:infer.taints", []), None),
    "no-fabric": ("aws-prod", _set("fabric.kind", "none"), None),
    "onprem-no-fabric": ("onprem", _set("fabric.kind", "none"), None),
    "onprem-roce": ("onprem", _set("fabric.kind", "roce"), None),
    "onprem-one-node-no-fabric": (
        "onprem",
        _all(_set("fabric.kind", "none"), _first_host_only("train")),
        None,
    ),
    "spread-placement": ("aws-prod", _set("fabric.placement", "spread"), None),
    "placement-group-spread": (
        "aws-prod",
        None,
        _transform("aws:ec2/placementGroup:PlacementGroup", lambda p: p.update(strategy="spread")),
    ),
    "efa-no-self-egress": (
        "aws-prod",
        None,
        _patched(_skip("vpc.SecurityGroupEgressRule", "-train-to-self")),
    ),
    "imdsv1": (
        "aws-prod",
        None,
        _transform(
            "aws:ec2/launchTemplate:LaunchTemplate",
            lambda p: p["metadata_options"].update(http_tokens="optional"),
        ),
    ),
    "unencrypted-ebs": (
        "aws-prod",
        None,
        _transform(
            "aws:ec2/launchTemplate:LaunchTemplate",
            lambda p: p["block_device_mappings"][0]["ebs"].update(encrypted="false"),
        ),
    ),
    "checkpoints-beside-fs": (
        "aws-prod",
        _set("storage.checkpoint_path", "/fsx/../scratch/checkpoints"),
        None,
    ),
    "fsx-default-deployment": (
        "aws-prod",
        None,
        _transform("aws:fsx/lustreFileSystem:LustreFileSystem", lambda p: p.pop("deployment_type")),
    ),
    "scratch-fsx": (
        "aws-prod",
        None,
        _transform(
            "aws:fsx/lustreFileSystem:LustreFileSystem", lambda p: p.update(deployment_type="SCRATCH_2")
        ),
    ),
    "no-bucket-encryption": (
        "aws-prod",
        None,
        _patched(_skip("s3.BucketServerSideEncryptionConfiguration")),
    ),
    "public-bucket-policy": (
        "aws-prod",
        None,
        _transform(
            "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
            lambda p: p.update(block_public_policy=False),
        ),
    ),
    "open-vpc-cidr": ("aws-prod", _set("aws", {"vpc_cidr": "0.0.0.0/0"}), None),
    "untagged-bucket": ("aws-prod", None, _transform("aws:s3/bucket:Bucket", lambda p: p.update(tags={}))),
    "munge-key-everywhere": ("aws-prod", None, _patched(_munge_key_for_every_role)),
    "unconditioned-launch": (
        "aws-prod",
        None,
        _transform("aws:iam/rolePolicy:RolePolicy", _unconditioned_launch_rights),
    ),
    "split-training-zones": ("aws-prod", _set("pool:train-spot.zone", "us-east-1b"), None),
    "alerts-to-nobody": ("aws-prod", _set("alerting.webhook_urls", []), None),
    "placement-unknown-pool": ("aws-prod", _team_placement(["train-h200", "train"]), None),
    "placement-one-gpu-type": ("aws-prod", _team_placement("cost"), None),
    "over-gpu-budget": ("aws-prod", _set("budget.max_gpus", 40), None),
    "over-cost-budget": ("aws-prod", _set("budget.max_hourly_usd", 100), None),
}


# Recordings of the variants, kept for the process rather than the module's run: recording the program is
# most of these tests' time, and pytest run again in this process (mutmut's runs of them, one per mutant
# of the policy rules, forked from the run that recorded: scripts/mutation/run.py) reuses them.
_RECORDED: dict[str, tuple[ResolvedPlatform, Recording]] = {}


@pytest.fixture(scope="module")
def recorded(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[str], tuple[ResolvedPlatform, Recording]]]:
    cache = _RECORDED
    folder = tmp_path_factory.mktemp("policy-variants")

    def get(name: str) -> tuple[ResolvedPlatform, Recording]:
        if name not in cache:
            base, mutate, program = VARIANTS[name]
            document = copy.deepcopy(stack_document(base))
            if mutate is not None:
                mutate(document["config"][CONFIG_KEY])
            path = Path(folder) / f"Pulumi.{name}.yaml"
            path.write_text(yaml.safe_dump(document, sort_keys=False))
            platform = load_platform(path)
            cache[name] = (platform, record(platform, program))
        return cache[name]

    yield get


@pytest.fixture(scope="module")
def verdicts(
    recorded: Callable[[str], tuple[ResolvedPlatform, Recording]],
) -> Callable[..., list[Verdict]]:
    def get(name: str, **config: Any) -> list[Verdict]:
        platform, recording = recorded(name)
        return verdicts_for(platform, recording, PolicyConfig.model_validate(config))

    return get


def fired(found: list[Verdict], rule: str) -> list[Verdict]:
    return [v for v in found if v.rule == rule]


# (rule, passing variant, failing variant, policy config)
CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("spot-interruptible-pools", "aws-prod", "interruptible-on-demand", {}),
    ("spot-inference-base-capacity", "aws-prod", "spot-inference", {}),
    ("spot-training-recovery", "aws-prod", "spot-cancel", {}),
    ("spot-training-recovery", "aws-prod", "checkpoints-off-fs", {}),
    ("spot-training-share", "aws-prod", "staging-little-spot", {}),
    ("isolation-shared-resources", "aws-prod", "infer-on-train-sg", {}),
    ("isolation-inference-taint", "aws-prod", "untainted-inference", {}),
    ("fabric-multi-node-rdma", "aws-prod", "no-fabric", {}),
    ("fabric-multi-node-rdma", "onprem", "onprem-no-fabric", {}),
    ("fabric-cluster-placement", "aws-prod", "spread-placement", {}),
    ("fabric-cluster-placement", "aws-prod", "placement-group-spread", {}),
    ("fabric-efa-security-group", "aws-prod", "efa-no-self-egress", {}),
    ("security-imdsv2", "aws-prod", "imdsv1", {}),
    ("security-ebs-encrypted", "aws-prod", "unencrypted-ebs", {}),
    ("security-fsx-encrypted", "aws-prod", "scratch-fsx", {}),
    ("security-s3-encrypted", "aws-prod", "no-bucket-encryption", {}),
    ("security-s3-public-access-blocked", "aws-prod", "public-bucket-policy", {}),
    ("security-no-open-ingress", "aws-prod", "open-vpc-cidr", {}),
    ("security-required-tags", "aws-prod", "untagged-bucket", {}),
    ("security-munge-key-readers", "aws-prod", "munge-key-everywhere", {}),
    ("security-ec2-launch-scoped", "aws-prod", "unconditioned-launch", {}),
    ("placement-filesystem-zone", "aws-prod", "split-training-zones", {}),
    ("alerts-reach-someone", "aws-prod", "alerts-to-nobody", {}),
    ("placement-names-pools", "aws-prod", "placement-unknown-pool", {}),
    ("placement-names-pools", "aws-prod", "placement-one-gpu-type", {}),
    ("budget-gpus", "aws-prod", "over-gpu-budget", {}),
    ("budget-hourly-cost", "aws-prod", "over-cost-budget", {}),
]


# The Kubernetes layer's rules are exercised on the Kueue stacks in tests/pulumi/test_k8s_policy.py.
KUBERNETES_RULES = {"k8s-isolation", "k8s-spot-flavors", "k8s-quotas"}
# The spec refuses a host listed in two pools, so no stack file reaches isolation-partitions' failing case:
# the rule (CrossGuard sees programs the spec never checked) is tested on a resolved platform below.
DIRECT_CASES = {"isolation-partitions"}


def test_every_rule_has_a_case() -> None:
    assert {rule.id for rule in RULES} == {case[0] for case in CASES} | KUBERNETES_RULES | DIRECT_CASES


def test_partition_rule_catches_a_host_shared_with_inference(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    onprem = shipped_platforms["onprem"]
    shared = onprem.pool("train").spec.hosts[-1]
    pools = tuple(
        replace(p, spec=p.spec.model_copy(update={"hosts": [shared]})) if p.role == "infer" else p
        for p in onprem.pools
    )
    found = list(check_partitions(ResourceIndex([]), PolicyContext(replace(onprem, pools=pools))))
    assert found and "gpu-04" in found[0].message
    assert not list(check_partitions(ResourceIndex([]), PolicyContext(onprem)))


@pytest.mark.parametrize("stack", ["local", "aws-prod", "onprem"])
def test_shipped_stacks_pass_every_rule(stack: str, verdicts: Callable[..., list[Verdict]]) -> None:
    assert verdicts(stack) == []


@pytest.mark.parametrize(
    ("rule", "passing", "failing", "config"), CASES, ids=[f"{c[0]}:{c[2]}" for c in CASES]
)
def test_rule_passes_and_fails(
    rule: str, passing: str, failing: str, config: dict[str, Any], verdicts: Callable[..., list[Verdict]]
) -> None:
    assert fired(verdicts(passing, **config), rule) == []
    found = fired(verdicts(failing, **config), rule)
    assert found, f"{rule} did not fire on {failing}"
    expected = next(r.severity for r in RULES if r.id == rule)
    assert all(v.severity == expected and v.message and v.remediation for v in found)


def test_interruptible_names_the_pool_group_and_saving(verdicts: Callable[..., list[Verdict]]) -> None:
    (verdict,) = fired(verdicts("interruptible-on-demand"), "spot-interruptible-pools")
    # a training pool is Slurm-managed: the finding names the launch template Slurm launches from
    assert verdict.resource == "aws-prod-train-spot-lt"
    assert "train-spot" in verdict.message and "% less" in verdict.message


def test_spot_rules_leave_backends_without_spot_market_alone(verdicts: Callable[..., list[Verdict]]) -> None:
    # local's train pool is interruptible on on-demand capacity: there is no spot market on podman.
    assert verdicts("local") == []


def test_spot_share_is_advisory_and_configurable(verdicts: Callable[..., list[Verdict]]) -> None:
    (verdict,) = fired(verdicts("staging-little-spot"), "spot-training-share")
    assert verdict.severity == "advisory" and "8 of 40" in verdict.message
    assert fired(verdicts("staging-little-spot", minSpotShare=0.2), "spot-training-share") == []


def test_shared_security_group_is_named(verdicts: Callable[..., list[Verdict]]) -> None:
    found = fired(verdicts("infer-on-train-sg"), "isolation-shared-resources")
    assert [v.resource for v in found] == ["aws-prod-train-sg"]
    assert "aws-prod-infer-asg" in found[0].message


def test_shared_subnet_counts_only_when_configured(verdicts: Callable[..., list[Verdict]]) -> None:
    assert fired(verdicts("aws-prod"), "isolation-shared-resources") == []
    found = fired(verdicts("aws-prod", isolateSubnets=True), "isolation-shared-resources")
    assert [v.resource for v in found] == ["aws-prod-private-us-east-1a"]


def test_inference_label_can_stand_in_for_the_taint(verdicts: Callable[..., list[Verdict]]) -> None:
    config = {"inferenceLabel": "workload=inference"}
    assert fired(verdicts("untainted-inference", **config), "isolation-inference-taint") == []


def test_required_tags_are_configurable(verdicts: Callable[..., list[Verdict]]) -> None:
    found = fired(verdicts("aws-prod", requiredTags=["owner", "project"]), "security-required-tags")
    assert found and all("project" in v.message for v in found)


def test_enforcement_overrides(verdicts: Callable[..., list[Verdict]]) -> None:
    downgraded = verdicts("over-gpu-budget", enforcement={"budget-gpus": "advisory"})
    assert [v.severity for v in fired(downgraded, "budget-gpus")] == ["advisory"]
    assert fired(verdicts("over-gpu-budget", enforcement={"budget-gpus": "disabled"}), "budget-gpus") == []


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_is_told_what_it_was_told(variant: str, verdicts: Callable[..., list[Verdict]]) -> None:
    """Each variant's findings word for word (tests/data/policy_findings.yaml): the resource each one
    names, its URN and its message, with the figures it quotes."""
    assert as_written(verdicts(variant)) == expected_findings("policy_rules", variant)


def _groups(index: ResourceIndex, platform: ResolvedPlatform | None) -> list[tuple[Any, ...]]:
    return [
        (g.kind, g.role, g.pool, g.anchor.name, [t.name for t in g.templates],
         [pg.name for pg in g.placement_groups], [s.name for s in g.subnets],
         sorted({sg.name for sg in g.security_groups}), g.min_size, g.max_size)
        for g in node_groups(index, PolicyContext(platform) if platform else None)
    ]  # fmt: skip


def _without(recorded: Recording, *tags: str, parents: bool = True) -> ResourceIndex:
    """The recording's views with the given gpuplat tags gone (and their parent components, unless kept)."""

    def keep(view: ResourceView) -> ResourceView:
        raw = view.props.get("tags")
        if isinstance(raw, dict):
            raw = {k: v for k, v in raw.items() if k not in tags}
        elif isinstance(raw, list):
            raw = [t for t in raw if not (isinstance(t, dict) and t.get("key") in tags)]
        return replace(view, props={**view.props, "tags": raw}, parent=view.parent if parents else None)

    return ResourceIndex(keep(from_recorded(r)) for r in recorded.resources)


def test_node_groups_of_the_aws_stack(recorded: Callable[[str], tuple[ResolvedPlatform, Recording]]) -> None:
    """The inference pool's Auto Scaling group and the training pools' Slurm-managed templates, with what
    each launches into and its size range; the same from the parent components where the gpuplat tags
    are gone (a program that does not tag), or from the stack's pool named by the tag alone."""
    platform, recording = recorded("aws-prod")
    private_a, private_b = "aws-prod-private-us-east-1a", "aws-prod-private-us-east-1b"
    expected = [
        ("asg", "infer", "infer", "aws-prod-infer-asg", ["aws-prod-infer-lt"], [], [private_a, private_b],
         ["aws-prod-infer-sg"], 2, 8),
        ("slurm", "train", "train", "aws-prod-train-lt", ["aws-prod-train-lt"], ["aws-prod-train-placement"],
         [private_a], ["aws-prod-train-sg"], 4, 4),
        ("slurm", "train", "train-spot", "aws-prod-train-spot-lt", ["aws-prod-train-spot-lt"],
         ["aws-prod-train-spot-placement"], [private_a], ["aws-prod-train-sg"], 0, 4),
    ]  # fmt: skip
    tagged = ResourceIndex(from_recorded(r) for r in recording.resources)
    assert _groups(tagged, platform) == expected
    assert _groups(tagged, None) == expected  # the tags alone say it
    gpuplat_tags = (TAG_POOL, TAG_ROLE, TAG_MIN_NODES, TAG_MAX_NODES)
    assert _groups(_without(recording, *gpuplat_tags), platform) == expected
    assert _groups(_without(recording, TAG_MIN_NODES, TAG_MAX_NODES, parents=False), platform) == expected
    # Neither tags nor a platform to match components against: no pool, so no Slurm pool either.
    untagged = _groups(_without(recording, *gpuplat_tags), None)
    assert untagged == [(*expected[0][:1], None, None, *expected[0][3:])]


def test_what_the_aws_stack_pays_besides_instances(
    recorded: Callable[[str], tuple[ResolvedPlatform, Recording]],
) -> None:
    """Its NAT gateway and that gateway's public address by the hour, and 48000 GiB of FSx for Lustre at
    1000 MB/s/TiB ($0.60 per GB-month, infra/data/service_prices.yaml) over the 730 hours of a month."""
    _, recording = recorded("aws-prod")
    assert service_costs(from_recorded(r) for r in recording.resources) == [
        ServiceCost("aws-prod-nat-ip", "public IPv4 address", 0.005),
        ServiceCost("aws-prod-nat", "NAT gateway", 0.045),
        ServiceCost(
            "aws-prod-fs-lustre", "FSx for Lustre, 48000 GiB at 1000 MB/s/TiB", round(48000 * 0.6 / 730, 4)
        ),
    ]
