"""Policy rules on resources in shapes this project's program does not emit: the CrossGuard pack judges any
program's resources (an EC2 SecurityGroupRule instead of the VPC rules, a security group's inline rules,
node affinity instead of a nodeSelector), so the rules read every shape AWS and Kubernetes accept. Each
case is a few resource views built by hand; the program's own shapes are tested on recordings
(tests/pulumi/test_policy_rules.py)."""

from __future__ import annotations

from typing import Any

import pytest

from infra.k8s.objects import LABEL_POOL, LABEL_ROLE
from infra.platform.resolve import ResolvedPlatform
from infra.policy.rules import PolicyContext, Verdict, check_efa_security_group
from infra.policy.rules.base import _get, _items, _number, _stack_label, _truthy
from infra.policy.rules.kubernetes import (
    _selected_pools,
    _tolerated,
    kubernetes_objects,
    object_label,
    pod_specs,
)
from infra.policy.rules.resource_types import (
    EGRESS_RULE,
    INGRESS_RULE,
    LAUNCH_TEMPLATE,
    SECURITY_GROUP,
    SG_RULE,
)
from infra.policy.view import ResourceIndex, ResourceView


def _view(type_: str, name: str, **props: Any) -> ResourceView:
    return ResourceView(
        type_, name, props, urn=f"urn:pulumi:s::p::{type_}::{name}", ids=frozenset({f"{name}-id"})
    )


def test_value_helpers() -> None:
    document = {"a": [{"b": 1}, "x"], "s": "text"}
    assert _get(document, "a", 0, "b") == 1
    assert _get(document, "a", 2) is None and _get(document, "a", 1, "b") is None
    assert _get(document, "s", 0) is None  # a string is no list of items
    assert _get([1], "a") is None and _get(document) == document
    assert _items([1, 2]) == [1, 2] and _items((1,)) == [1] and _items("ab") == [] and _items(None) == []
    assert [_truthy(v) for v in (True, "true", "TRUE", "yes", 1, None)] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    assert _number(3) == 3.0 and _number("2.5") == 2.5 and _number(True, 7) == 7
    assert _number("many", 4) == 4 and _number(None) == 0 and _number([1]) == 0


def test_a_finding_without_a_platform_names_the_stack(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    assert _stack_label(PolicyContext(None)) == "stack"
    assert _stack_label(PolicyContext(shipped_platforms["local"])) == "stack local"
    verdict = Verdict("r", "advisory", "pool a", "why", "fix", urn="urn:x")
    assert verdict.to_dict() == {
        "rule": "r",
        "severity": "advisory",
        "resource": "pool a",
        "message": "why",
        "remediation": "fix",
    }


def _efa_stack(*rules: ResourceView, ingress: Any = None, egress: Any = None) -> ResourceIndex:
    group = _view(SECURITY_GROUP, "train-sg", ingress=ingress or [], egress=egress or [])
    template = _view(
        LAUNCH_TEMPLATE,
        "train-lt",
        networkInterfaces=[
            {"interfaceType": "efa", "securityGroups": ["train-sg-id"]},
            {"interfaceType": "interface", "securityGroups": ["other-sg-id"]},
        ],
    )
    return ResourceIndex([group, template, _view(SECURITY_GROUP, "other-sg"), *rules])


def _efa_findings(index: ResourceIndex) -> list[str]:
    return [
        f.resource + ": " + f.message.split(" itself")[0]
        for f in check_efa_security_group(index, PolicyContext(None))
    ]


def test_efa_self_rules_in_every_shape() -> None:
    """All traffic to and from the group itself, as inline rules (protocol -1 or all), EC2 security group
    rules (self, or the group as the source) or VPC rules (the group referenced); a TCP-only rule is not
    enough, and only the EFA interface's group is judged."""
    missing = "train-sg: security group 'train-sg' carries EFA interfaces but has no rule allowing all"
    assert _efa_findings(_efa_stack()) == [
        f"{missing} inbound traffic from",
        f"{missing} outbound traffic to",
    ]
    inline = [{"self": True, "protocol": "-1"}]
    assert _efa_findings(_efa_stack(ingress=inline, egress=[{"self": "true", "protocol": "all"}])) == []
    assert len(_efa_findings(_efa_stack(ingress=[{"self": True, "protocol": "tcp"}], egress=inline))) == 1
    assert len(_efa_findings(_efa_stack(ingress=[{"self": False, "protocol": "-1"}], egress=inline))) == 1
    ec2_rules = [
        _view(SG_RULE, "in", type="ingress", protocol="all", securityGroupId="train-sg-id", self=True),
        _view(SG_RULE, "out", type="egress", protocol="-1", securityGroupId="train-sg-id",
              sourceSecurityGroupId="train-sg-id"),
    ]  # fmt: skip
    assert _efa_findings(_efa_stack(*ec2_rules)) == []
    tcp = _view(SG_RULE, "in", type="ingress", protocol="tcp", securityGroupId="train-sg-id", self=True)
    assert len(_efa_findings(_efa_stack(tcp, ec2_rules[1]))) == 1
    vpc_rules = [
        _view(INGRESS_RULE, "in", ipProtocol="-1", securityGroupId="train-sg-id",
              referencedSecurityGroupId="train-sg-id"),
        _view(EGRESS_RULE, "out", ipProtocol="-1", securityGroupId="train-sg-id",
              referencedSecurityGroupId="train-sg-id"),
    ]  # fmt: skip
    assert _efa_findings(_efa_stack(*vpc_rules)) == []
    elsewhere = _view(EGRESS_RULE, "out", ipProtocol="-1", securityGroupId="train-sg-id",
                      referencedSecurityGroupId="other-sg-id")  # fmt: skip
    assert len(_efa_findings(_efa_stack(vpc_rules[0], elsewhere))) == 1


def _pod(**spec: Any) -> dict[str, Any]:
    return {"containers": [{"name": "c"}], **spec}


def test_the_pools_a_pod_selects_by_pool_role_or_node_affinity(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    platform = shipped_platforms["aws-k8s"]
    training = {p.name for p in platform.pools_with_role("train")}
    assert training == {"train", "train-spot"}
    assert _selected_pools(_pod(), platform) == set()
    assert _selected_pools(_pod(nodeSelector={LABEL_POOL: "infer"}), platform) == {"infer"}
    assert _selected_pools(_pod(nodeSelector={LABEL_ROLE: "train"}), platform) == training
    assert _selected_pools(_pod(nodeSelector={LABEL_ROLE: "nobody"}), platform) == set()

    def affinity(*expressions: dict[str, Any]) -> dict[str, Any]:
        terms = [{"matchExpressions": list(expressions)}]
        return {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }

    by_pool = {"key": LABEL_POOL, "operator": "In", "values": ["infer"]}
    by_role = {"key": LABEL_ROLE, "operator": "In", "values": ["train", "nobody"]}
    excluded = {"key": LABEL_POOL, "operator": "NotIn", "values": ["system"]}
    assert _selected_pools(_pod(affinity=affinity(by_pool)), platform) == {"infer"}
    assert _selected_pools(_pod(affinity=affinity(by_role, excluded)), platform) == training
    both = _pod(nodeSelector={LABEL_POOL: "system"}, affinity=affinity(by_pool, "not a mapping"))
    assert _selected_pools(both, platform) == {"system", "infer"}


def test_tolerations_of_a_taint_or_of_every_taint() -> None:
    keys = {"gpuplat/inference"}
    pod = {
        "tolerations": [
            "not a mapping",
            {"key": "gpuplat/spot", "operator": "Exists"},
            {"key": "gpuplat/inference", "operator": "Equal", "value": "true"},
            {"operator": "Exists"},
            {"operator": "Equal"},
        ]
    }
    assert _tolerated(pod, keys) == ["gpuplat/inference", "every taint"]
    assert _tolerated({}, keys) == []


def test_kubernetes_objects_and_their_labels() -> None:
    deployment = _view("kubernetes:apps/v1:Deployment", "d", kind="Deployment",
                       metadata={"name": "server", "namespace": "serving"})  # fmt: skip
    patch = _view("kubernetes:apps/v1:DeploymentPatch", "p", kind="Deployment", metadata={"name": "x"})
    unnamed = _view("kubernetes:core/v1:Namespace", "ns-res", kind="Namespace", metadata={})
    index = ResourceIndex([deployment, patch, unnamed, _view(SECURITY_GROUP, "sg", kind="Deployment")])
    assert kubernetes_objects(index) == [deployment, unnamed]
    assert kubernetes_objects(index, "Deployment") == [deployment]
    assert object_label(deployment) == "Deployment serving/server"
    assert object_label(unnamed) == "Namespace ns-res"
    assert object_label(_view("kubernetes:v1:X", "raw", kind="X", metadata="?")) == "X raw"
    spec = {"template": {"spec": _pod()}, "replicatedJobs": [{"template": {"spec": _pod(hostNetwork=True)}}]}
    assert [p.get("hostNetwork", False) for p in pod_specs(spec)] == [False, True]


@pytest.mark.parametrize("value", [None, "text", 3])
def test_pod_specs_of_what_holds_none(value: Any) -> None:
    assert list(pod_specs(value)) == []
