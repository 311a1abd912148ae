"""The policy rules judge Slurm-managed training pools (a launch template, no Auto Scaling group) as they
judge Auto Scaling groups: each rule fires on a broken launch-template-only pool and is quiet on a good one.

The recordings come from the real program under the SDK mocks, which declares training pools the way Slurm
power saving needs them (ResumeProgram runs RunInstances from the pool's launch template): the template
carries the size range in `gpuplat:min-nodes`/`gpuplat:max-nodes` tags, the placement group by name, one
network interface per network card with the pool's subnet and security groups, the spot market; no Auto
Scaling group. Broken variants are a stack mutation or one stack transformation away from aws-prod.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from infra.plan.record import Recording, record
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.policy.check import verdicts_for
from infra.policy.rules import RULES, PolicyContext, Verdict, check_multi_node_rdma, node_groups, nodes
from infra.policy.settings import PolicyConfig
from infra.policy.view import ResourceIndex, from_recorded
from infra.program import build
from infra.spec.load import CONFIG_KEY
from tests.conftest import stack_document
from tests.pulumi.findings import as_written, expected_findings

Mutate = Callable[[dict[str, Any]], None]
Change = Callable[[str, dict[str, Any]], None]  # (resource name, inputs)

LT = "aws:ec2/launchTemplate:LaunchTemplate"
PG = "aws:ec2/placementGroup:PlacementGroup"


def _program(type_: str | None = None, change: Change | None = None) -> Callable[[ResolvedPlatform], None]:
    """The real program, with (optionally) one stack transformation changing the inputs of every
    resource of `type_`."""

    def transformation(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult | None:
        if args.type_ != type_ or change is None:
            return None
        props = _copy(dict(args.props))
        change(args.name, props)
        return pulumi.ResourceTransformationResult(props, args.opts)

    def program(platform: ResolvedPlatform) -> None:
        if type_ is not None:
            pulumi.runtime.register_stack_transformation(transformation)
        build(platform)

    return program


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _training(change: Change) -> Change:
    """Apply `change` to training pools' resources only (their names carry the pool: `-train`)."""

    def apply(name: str, props: dict[str, Any]) -> None:
        if "-train" in name:
            change(name, props)

    return apply


def _pool(name: str, **values: Any) -> Mutate:
    def mutate(spec: dict[str, Any]) -> None:
        next(p for p in spec["pools"] if p["name"] == name).update(values)

    return mutate


def _set(key: str, value: Any) -> Mutate:
    def mutate(spec: dict[str, Any]) -> None:
        target = spec
        *parents, last = key.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[last] = value

    return mutate


def _drop(key: str) -> Change:
    return lambda name, props: props.pop(key, None)


def _keep_interfaces(count: int) -> Change:
    return lambda name, props: props.__setitem__("network_interfaces", props["network_interfaces"][:count])


def _max_nodes(nodes: int, pool: str) -> Change:
    def change(name: str, props: dict[str, Any]) -> None:
        if name.endswith(f"-{pool}-lt"):
            props["tags"] = {**props["tags"], "gpuplat:max-nodes": str(nodes)}

    return change


RESERVATION = {"kind": "capacity-reservation", "id": "cr-0123456789abcdef0"}

# name -> (stack mutation, resource type, change of its inputs)
VARIANTS: dict[str, tuple[Mutate | None, str | None, Change | None]] = {
    "slurm": (None, None, None),
    "no-placement": (None, LT, _training(_drop("placement"))),
    "placement-none": (_set("fabric.placement", "none"), None, None),
    "spread-group": (None, PG, lambda name, props: props.update(strategy="spread")),
    "no-efa": (_set("fabric.kind", "none"), None, None),
    "few-efa": (None, LT, _training(_keep_interfaces(8))),
    "ethernet": (_pool("train", instance_type="g6e.xlarge"), None, None),
    "one-ethernet-node": (_pool("train", instance_type="g6e.xlarge", count=1), None, None),
    "spot-on-demand": (None, LT, _training(_drop("instance_market_options"))),
    "interruptible-on-demand": (_pool("train-spot", capacity="on-demand"), None, None),
    "spot-cancel": (_set("scheduler.spot_preempt_mode", "cancel"), None, None),
    "bigger-than-stack": (None, LT, _max_nodes(16, "train")),
    "reserved": (_pool("train", capacity="reserved", zone="us-east-1a", reservation=RESERVATION), None, None),
}  # fmt: skip


# Recordings of the variants, kept for the process rather than the module's run: recording the program is
# most of these tests' time, and pytest run again in this process (mutmut's runs of them, one per mutant
# of the policy rules, forked from the run that recorded: scripts/mutation/run.py) reuses them.
_RECORDED: dict[str, tuple[ResolvedPlatform, Recording]] = {}


@pytest.fixture(scope="module")
def recorded(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[[str], tuple[ResolvedPlatform, Recording]]]:
    cache = _RECORDED
    folder = tmp_path_factory.mktemp("slurm-variants")

    def get(name: str) -> tuple[ResolvedPlatform, Recording]:
        if name not in cache:
            mutate, type_, change = VARIANTS[name]
            document = copy.deepcopy(stack_document("aws-prod"))
            if mutate is not None:
                mutate(document["config"][CONFIG_KEY])
            path = Path(folder) / f"Pulumi.{name}.yaml"
            path.write_text(yaml.safe_dump(document, sort_keys=False))
            platform = load_platform(path)
            cache[name] = (platform, record(platform, _program(type_, change)))
        return cache[name]

    yield get


@pytest.fixture(scope="module")
def verdicts(recorded: Callable[[str], tuple[ResolvedPlatform, Recording]]) -> Callable[..., list[Verdict]]:
    def get(name: str, **config: Any) -> list[Verdict]:
        platform, recording = recorded(name)
        return verdicts_for(platform, recording, PolicyConfig.model_validate(config))

    return get


def fired(found: list[Verdict], rule: str) -> list[Verdict]:
    return [v for v in found if v.rule == rule]


# ---------------------------------------------------------------------------------------------------
# node groups


def test_node_groups_read_slurm_pools_like_auto_scaling_groups(
    recorded: Callable[[str], tuple[ResolvedPlatform, Recording]],
) -> None:
    platform, recording = recorded("slurm")
    # the recording is what it claims: training pools are launch templates without Auto Scaling groups
    asgs = {r.name for r in recording.of_type("aws:autoscaling/group:Group")}
    assert asgs == {"aws-prod-infer-asg"}
    template = recording.named("aws-prod-train-lt").inputs
    assert template["tags"]["gpuplat:max-nodes"] == "4" and template["placement"]["groupName"]
    assert all(i["subnetId"] for i in template["networkInterfaces"])

    index = ResourceIndex(from_recorded(r) for r in recording.resources)
    groups = {g.pool: g for g in node_groups(index, PolicyContext(platform))}
    assert set(groups) == {"infer", "train", "train-spot"}
    train, spot, infer = groups["train"], groups["train-spot"], groups["infer"]
    assert (train.kind, train.anchor.name, train.role) == ("slurm", "aws-prod-train-lt", "train")
    assert [t.name for t in train.templates] == ["aws-prod-train-lt"]
    assert (train.min_size, train.max_size, spot.min_size, spot.max_size) == (4, 4, 0, 4)
    assert [(pg.name, pg.props["strategy"]) for pg in train.placement_groups] == [
        ("aws-prod-train-placement", "cluster")
    ]
    assert [s.name for s in train.subnets] == ["aws-prod-private-us-east-1a"]
    assert {sg.name for sg in train.security_groups} == {"aws-prod-train-sg"}
    # on-demand pool: every node on-demand; spot pool: none
    assert (train.on_demand_base, train.on_demand_percentage_above_base) == (4, 100.0)
    assert (spot.on_demand_base, spot.on_demand_percentage_above_base) == (0, 0.0)
    assert not train.reserved and not spot.reserved
    # inference keeps its Auto Scaling group, read as before
    assert (infer.kind, infer.anchor.name, infer.min_size, infer.max_size) == (
        "asg",
        "aws-prod-infer-asg",
        2,
        8,
    )


def test_node_groups_are_found_once_per_index_and_platform(
    recorded: Callable[[str], tuple[ResolvedPlatform, Recording]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rules share one finding of the node groups per index (ResourceIndex.derived): each caller gets
    its own list, another platform finds them again, another stack's index has its own."""
    found: list[ResourceIndex] = []
    find = nodes._node_groups

    def counted(index: ResourceIndex, ctx: PolicyContext | None) -> list[nodes.NodeGroup]:
        found.append(index)
        return find(index, ctx)

    monkeypatch.setattr(nodes, "_node_groups", counted)
    platform, recording = recorded("slurm")
    index = ResourceIndex(from_recorded(r) for r in recording.resources)
    first = node_groups(index, PolicyContext(platform))
    first.clear()  # a caller's list is its own
    second = node_groups(index, PolicyContext(platform))
    assert {g.pool for g in second} == {"infer", "train", "train-spot"} and found == [index]
    assert node_groups(index, None) == find(index, None) and found == [index, index]
    reserved_platform, reserved = recorded("reserved")
    other = ResourceIndex(from_recorded(r) for r in reserved.resources)
    assert {g.pool: g.reserved for g in node_groups(other, PolicyContext(reserved_platform))}["train"]
    assert not {g.pool: g.reserved for g in node_groups(index, PolicyContext(platform))}["train"]
    assert found == [index, index, other, index]


def test_reserved_slurm_pool_is_reserved(
    recorded: Callable[[str], tuple[ResolvedPlatform, Recording]],
) -> None:
    platform, recording = recorded("reserved")
    index = ResourceIndex(from_recorded(r) for r in recording.resources)
    groups = {g.pool: g for g in node_groups(index, PolicyContext(platform))}
    assert groups["train"].reserved and not groups["train-spot"].reserved


# ---------------------------------------------------------------------------------------------------
# every rule: quiet on the good Slurm stack, firing on a broken one, naming the launch template


# (rule, failing variant, resources the findings name, policy config)
CASES: list[tuple[str, str, set[str], dict[str, Any]]] = [
    ("fabric-cluster-placement", "no-placement", {"aws-prod-train-lt", "aws-prod-train-spot-lt"}, {}),
    (
        "fabric-cluster-placement",
        "placement-none",
        {"aws-prod-train-lt", "aws-prod-train-spot-lt", "stack aws-prod"},
        {},
    ),
    ("fabric-cluster-placement", "spread-group", {"aws-prod-train-lt", "aws-prod-train-spot-lt"}, {}),
    ("fabric-multi-node-rdma", "no-efa", {"aws-prod-train-lt", "aws-prod-train-spot-lt"}, {}),
    ("fabric-multi-node-rdma", "few-efa", {"aws-prod-train-lt", "aws-prod-train-spot-lt"}, {}),
    ("fabric-multi-node-rdma", "ethernet", {"aws-prod-train-lt"}, {}),
    ("spot-interruptible-pools", "spot-on-demand", {"aws-prod-train-spot-lt"}, {}),
    ("spot-interruptible-pools", "interruptible-on-demand", {"aws-prod-train-spot-lt"}, {}),
    ("isolation-shared-resources", "slurm", {"aws-prod-private-us-east-1a"}, {"isolateSubnets": True}),
    ("budget-gpus", "bigger-than-stack", {"stack aws-prod"}, {}),
    ("budget-hourly-cost", "bigger-than-stack", {"stack aws-prod"}, {}),
]


@pytest.mark.parametrize(("rule", "failing", "named", "config"), CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_rule_fires_on_broken_slurm_pool(
    rule: str, failing: str, named: set[str], config: dict[str, Any], verdicts: Callable[..., list[Verdict]]
) -> None:
    assert verdicts("slurm") == []  # the good Slurm stack passes every rule (with the default config)
    found = fired(verdicts(failing, **config), rule)
    assert {v.resource for v in found} == named
    severity = next(r.severity for r in RULES if r.id == rule)
    assert all(v.severity == severity and v.message and v.remediation for v in found)


def test_findings_carry_the_launch_template_urn(
    recorded: Callable[[str], tuple[ResolvedPlatform, Recording]], verdicts: Callable[..., list[Verdict]]
) -> None:
    _, recording = recorded("no-placement")
    (verdict,) = [
        v for v in fired(verdicts("no-placement"), "fabric-cluster-placement") if "-spot" not in v.resource
    ]
    assert verdict.urn == recording.named("aws-prod-train-lt").urn
    assert "scales to 4 nodes with no placement group" in verdict.message
    # spot-training-recovery labels its finding with the partition; the urn is the pool's template
    _, recording = recorded("spot-cancel")
    (spot,) = fired(verdicts("spot-cancel"), "spot-training-recovery")
    assert spot.urn == recording.named("aws-prod-train-spot-lt").urn


def test_missing_efa_interfaces_are_counted(verdicts: Callable[..., list[Verdict]]) -> None:
    templates = ["aws-prod-train-lt", "aws-prod-train-spot-lt"]
    few = fired(verdicts("few-efa"), "fabric-multi-node-rdma")
    assert sorted(v.resource for v in few) == templates
    assert all("attaches 8 of the 32 EFA interfaces" in v.message for v in few)
    none = fired(verdicts("no-efa"), "fabric-multi-node-rdma")
    assert sorted(v.resource for v in none) == templates
    assert all("attaches 0 of the 32" in v.message and "over TCP" in v.message for v in none)


def test_ethernet_instance_type_has_no_rdma(verdicts: Callable[..., list[Verdict]]) -> None:
    (verdict,) = fired(verdicts("ethernet"), "fabric-multi-node-rdma")
    assert "g6e.xlarge" in verdict.message and "no RDMA (ethernet" in verdict.message
    assert "'aws-prod-train-lt' scales to 4 nodes" in verdict.message


def test_spot_pool_launching_on_demand_is_named(verdicts: Callable[..., list[Verdict]]) -> None:
    (verdict,) = fired(verdicts("spot-on-demand"), "spot-interruptible-pools")
    assert "Slurm-managed launch template 'aws-prod-train-spot-lt' launches on-demand" in verdict.message
    assert "base 4, 100% above base" in verdict.message


def test_shared_subnet_names_the_slurm_pool(verdicts: Callable[..., list[Verdict]]) -> None:
    (verdict,) = fired(verdicts("slurm", isolateSubnets=True), "isolation-shared-resources")
    assert "aws-prod-train-lt" in verdict.message and "aws-prod-infer-asg" in verdict.message


def test_budget_counts_the_nodes_the_template_declares(verdicts: Callable[..., list[Verdict]]) -> None:
    (gpus,) = fired(verdicts("bigger-than-stack"), "budget-gpus")
    # train: 16 p5.48xlarge as the template says (not the stack's 4), train-spot 4, infer 8 g6e.xlarge
    assert "hold 168 GPUs" in gpus.message
    assert "aws-prod-train-lt declares 16 nodes for pool 'train', which the stack sizes at 4" in gpus.message


def test_ethernet_pool_without_declared_nodes_is_judged_from_the_stack(
    recorded: Callable[[str], tuple[ResolvedPlatform, Recording]],
) -> None:
    # no resource declares the pool's nodes (yet): the rule judges the stack's pool, not nothing
    platform, _ = recorded("ethernet")
    (finding,) = check_multi_node_rdma(ResourceIndex([]), PolicyContext(platform))
    assert finding.resource == "pool train" and "no RDMA (ethernet" in finding.message
    good, _ = recorded("slurm")
    assert list(check_multi_node_rdma(ResourceIndex([]), PolicyContext(good))) == []


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_variant_is_told_what_it_was_told(variant: str, verdicts: Callable[..., list[Verdict]]) -> None:
    """Each variant's findings word for word (tests/data/policy_findings.yaml)."""
    assert as_written(verdicts(variant)) == expected_findings("slurm_pools", variant)
