"""Policy rules on resources in shapes this project's program does not emit: the CrossGuard pack judges any
program's resources (an EC2 SecurityGroupRule instead of the VPC rules, a security group's inline rules,
node affinity instead of a nodeSelector), so the rules read every shape AWS and Kubernetes accept. Each
case is a few resource views built by hand; the program's own shapes are tested on recordings
(tests/pulumi/test_policy_rules.py)."""

from __future__ import annotations

import json
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
    ASG,
    BUCKET_SSE,
    BUCKETS,
    EGRESS_RULE,
    EKS_CLUSTER,
    IAM_ROLE,
    IAM_ROLE_POLICY,
    INGRESS_RULE,
    INSTANCE,
    LAUNCH_TEMPLATE,
    LUSTRE,
    SECURITY_GROUP,
    SG_RULE,
    SSM_PARAMETER,
    VOLUME,
)
from infra.policy.rules.security import (
    _names_parameter,
    _policy_role,
    check_ebs_encrypted,
    check_ec2_launch_scoped,
    check_fsx_encrypted,
    check_imdsv2,
    check_open_ingress,
    check_required_tags,
    check_s3_encrypted,
)
from infra.policy.rules.service_costs import ServiceCost, service_costs, total_usd_per_hour
from infra.policy.settings import PolicyConfig
from infra.policy.view import UNKNOWN, ResourceIndex, ResourceView


def _view(type_: str, logical: str, **props: Any) -> ResourceView:
    return ResourceView(
        type_, logical, props, urn=f"urn:pulumi:s::p::{type_}::{logical}", ids=frozenset({f"{logical}-id"})
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


_OPEN = (
    "ingress from {} exposes GPU nodes to the internet; administration goes through SSM and serving "
    "through the gateway"
)


def _open_ingress(resource: ResourceView) -> list[str]:
    return list(check_open_ingress(resource, PolicyContext(None)))


def test_open_ingress_in_every_rule_shape() -> None:
    assert _open_ingress(_view(INGRESS_RULE, "r", cidrIpv4="0.0.0.0/0")) == [_OPEN.format("0.0.0.0/0")]
    assert _open_ingress(_view(INGRESS_RULE, "r", cidrIpv6="::/0")) == [_OPEN.format("::/0")]
    assert _open_ingress(_view(INGRESS_RULE, "r", cidrIpv4="10.0.0.0/8")) == []
    ec2 = {"cidrBlocks": ["10.0.0.0/8", "0.0.0.0/0"], "ipv6CidrBlocks": ["::/0"]}
    assert _open_ingress(_view(SG_RULE, "r", type="ingress", **ec2)) == [
        _OPEN.format("0.0.0.0/0"),
        _OPEN.format("::/0"),
    ]
    assert _open_ingress(_view(SG_RULE, "r", type="egress", **ec2)) == []
    inline = [{"cidrBlocks": ["0.0.0.0/0"]}, {"ipv6CidrBlocks": ["::/0"]}, "not a rule"]
    assert _open_ingress(_view(SECURITY_GROUP, "sg", ingress=inline, egress=[ec2])) == [
        _OPEN.format("0.0.0.0/0"),
        _OPEN.format("::/0"),
    ]


def test_required_tags_from_tags_or_tags_all() -> None:
    context = PolicyContext(None, PolicyConfig(required_tags=("owner", "team")))
    tagged = _view(BUCKETS[0], "b", tags={"owner": "ml", "team": " "})
    assert list(check_required_tags(tagged, context)) == [
        "missing tag team: cost reports and owners are found through them"
    ]
    listed = _view(ASG, "g", tags=[{"key": "Name", "value": "x"}])
    assert list(check_required_tags(listed, context)) == [
        "missing tags owner, team: cost reports and owners are found through them"
    ]
    provider = _view(BUCKETS[0], "b", tags={"owner": "ml"}, tagsAll={"team": "research", "owner": ""})
    assert list(check_required_tags(provider, context)) == []


def _ebs(resource: ResourceView) -> list[str]:
    return [m.split(" is not")[0] for m in check_ebs_encrypted(resource, PolicyContext(None))]


def test_unencrypted_ebs_in_templates_instances_and_volumes() -> None:
    mappings = [
        {"deviceName": "/dev/xvda", "ebs": {"encrypted": "true"}},
        {"deviceName": "/dev/xvdb", "ebs": {"encrypted": False}},
        {"deviceName": "/dev/xvdc", "ebs": {}},
        {"deviceName": "/dev/xvdd", "ebs": {"encrypted": UNKNOWN}},
        {"deviceName": "/dev/xvde", "virtualName": "ephemeral0"},
    ]
    assert _ebs(_view(LAUNCH_TEMPLATE, "lt", blockDeviceMappings=mappings)) == [
        "EBS volume /dev/xvdb",
        "EBS volume /dev/xvdc",
    ]
    instance = _view(
        INSTANCE,
        "i",
        rootBlockDevice={"encrypted": True},
        ebsBlockDevices=[
            {"deviceName": "/dev/sdf", "encrypted": "false"},
            {"deviceName": "/dev/sdg", "encrypted": True},
        ],
    )
    assert _ebs(instance) == ["EBS volume /dev/sdf"]
    assert _ebs(_view(INSTANCE, "i")) == ["EBS volume root"]
    assert _ebs(_view(VOLUME, "v", encrypted=False)) == ["EBS volume volume"]
    assert _ebs(_view(VOLUME, "v", encrypted=True)) == []
    message = next(iter(check_ebs_encrypted(_view(VOLUME, "v"), PolicyContext(None))))
    assert message == "EBS volume volume is not encrypted: node disks hold datasets, checkpoints, credentials"


def test_imdsv2_and_fsx_settings_unset_or_unknown() -> None:
    context = PolicyContext(None)
    assert list(check_imdsv2(_view(LAUNCH_TEMPLATE, "lt"), context)) == [
        "metadataOptions.httpTokens is unset (optional): IMDSv1 lets any SSRF in a workload read the node's "
        "IAM credentials"
    ]
    for tokens in ("required", UNKNOWN):
        assert (
            list(check_imdsv2(_view(LAUNCH_TEMPLATE, "lt", metadataOptions={"httpTokens": tokens}), context))
            == []
        )
    assert list(check_fsx_encrypted(_view(LUSTRE, "fs"), context)) == [
        "deployment type SCRATCH_1: only PERSISTENT deployments are encrypted at rest under a KMS key you "
        "control (kmsKeyId)"
    ]
    for deployment in ("PERSISTENT_2", UNKNOWN):
        assert list(check_fsx_encrypted(_view(LUSTRE, "fs", deploymentType=deployment), context)) == []


def _ec2_findings(*statements: Any, single: bool = False) -> list[str]:
    document = {"Statement": statements[0] if single else list(statements)}
    policy = _view(IAM_ROLE_POLICY, "p", policy=json.dumps(document))
    return list(check_ec2_launch_scoped(policy, PolicyContext(None)))


def test_ec2_rights_need_conditions_that_keep_the_stack_tag() -> None:
    run = {"Sid": "Launch", "Effect": "Allow", "Action": "ec2:RunInstances", "Resource": "*"}
    assert _ec2_findings(run, single=True) == [
        "statement 'Launch' allows ec2:RunInstances on instances without a condition: anything can be "
        "launched (any template, image or tags) with the roles this principal may pass"
    ]
    assert _ec2_findings({**run, "Effect": "Deny"}) == []
    assert _ec2_findings({**run, "Resource": "arn:aws:s3:::bucket/*"}) == []
    terminate = {"Effect": "Allow", "Action": ["ec2:Terminate*"], "Resource": "arn:aws:ec2:*:*:instance/*"}
    assert _ec2_findings(terminate) == [
        "a statement allows ec2:TerminateInstances on instances without a condition: any instance of the "
        "account can be terminated"
    ]
    fleet = {"Effect": "Allow", "Action": "ec2:CreateFleet", "Resource": "arn:aws:ec2:*:*:instance/*"}
    assert _ec2_findings(fleet) == [
        "a statement allows ec2:CreateFleet on instances without a condition: instances of any template "
        "and tags can be launched through an EC2 Fleet"
    ]
    stack_tagged = {"StringEquals": {"aws:RequestTag/gpuplat:stack": "s"}}
    assert _ec2_findings({**fleet, "Condition": stack_tagged}) == []
    everything_but = {"Effect": "Allow", "NotAction": "iam:*", "NotResource": "arn:aws:s3:::b"}
    assert len(_ec2_findings(everything_but)) == 4
    assert _ec2_findings({**everything_but, "NotAction": "ec2:*"}) == []

    def tags(condition: dict[str, Any]) -> list[str]:
        return _ec2_findings(
            {"Effect": "Allow", "Action": "ec2:CreateTags", "Resource": "*", "Condition": condition}
        )

    assert tags({"StringEquals": {"ec2:CreateAction": "RunInstances"}}) == []
    assert tags({"ForAllValues:StringEquals": {"aws:TagKeys": ["Name", "owner"]}}) == []
    assert tags({"ForAllValues:StringLike": {"aws:TagKeys": "gpuplat:*"}}) == [
        "a statement allows ec2:CreateTags on existing instances with any tag key: an instance can be "
        "(re)tagged gpuplat:stack and so brought under the stack's termination right; limit it to "
        "ec2:CreateAction RunInstances or to tag keys without gpuplat:stack"
    ]
    assert len(tags({"ForAnyValue:StringEquals": {"aws:TagKeys": ["Name"]}})) == 1
    assert len(tags({"StringEquals": {"aws:ResourceTag/gpuplat:stack": "s"}})) == 1
    role = _view(IAM_ROLE, "r", inlinePolicies=[{"name": "x", "policy": json.dumps({"Statement": [run]})}])
    assert len(list(check_ec2_launch_scoped(role, PolicyContext(None)))) == 1
    for unreadable in (UNKNOWN, "not json", json.dumps(["a list"])):
        assert (
            list(check_ec2_launch_scoped(_view(IAM_ROLE_POLICY, "p", policy=unreadable), PolicyContext(None)))
            == []
        )


def test_a_policy_names_a_parameter_by_arn_wildcard_or_id_and_holds_a_role_by_tag_or_name() -> None:
    key = _view(SSM_PARAMETER, "munge-key", name="/gpuplat/s/munge.key")
    assert (
        _names_parameter("*", key)
        and _names_parameter(UNKNOWN, key)
        and _names_parameter("munge-key-id", key)
    )
    assert _names_parameter("arn:aws:ssm:us-east-1:123:parameter/gpuplat/s/munge.key", key)
    assert _names_parameter("arn:aws-cn:ssm:*:*:parameter/gpuplat/*", key)
    assert not _names_parameter("arn:aws:ssm:*:*:parameter/other/*", key)
    assert not _names_parameter("arn:aws:s3:::gpuplat/s/munge.key", key)
    unnamed = _view(SSM_PARAMETER, "munge")
    assert _names_parameter("arn:aws:ssm:*:*:parameter/munge", unnamed)
    tagged = _view(IAM_ROLE, "s-anything", tags={"gpuplat:role": "infer"})
    named = _view(IAM_ROLE, "s-train-role")
    policies = {
        name: _view(IAM_ROLE_POLICY, name, role=f"{role.name}-id")
        for name, role in (("by-tag", tagged), ("by-name", named), ("nobody", _view(IAM_ROLE, "s-x")))
    }
    index = ResourceIndex([tagged, named, _view(IAM_ROLE, "s-x"), *policies.values()])
    assert [_policy_role(index, p) for p in policies.values()] == ["infer", "train", None]


def test_bucket_encryption_inline_or_as_its_own_resource() -> None:
    """A bucket's encryption: its own serverSideEncryptionConfiguration (the older Bucket resource) or a
    configuration resource naming it; an algorithm S3 does not offer, or none, is no encryption."""

    def unencrypted(*resources: ResourceView) -> list[str]:
        return [f.resource for f in check_s3_encrypted(ResourceIndex(resources), PolicyContext(None))]

    def rules(algorithm: str) -> list[dict[str, Any]]:
        return [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": algorithm}}]

    inline = _view(BUCKETS[0], "data", serverSideEncryptionConfiguration={"rules": rules("aws:kms")})
    assert unencrypted(inline) == []
    plain = _view(BUCKETS[1], "models")
    assert unencrypted(plain) == ["models"]
    for algorithm, found in (("AES256", []), ("aws:kms:dsse", []), (UNKNOWN, []), ("rot13", ["models"])):
        setting = _view(BUCKET_SSE[0], "models-sse", bucket="models-id", rules=rules(algorithm))
        assert unencrypted(plain, setting) == found, algorithm
    elsewhere = _view(BUCKET_SSE[0], "other-sse", bucket="other-id", rules=rules("aws:kms"))
    assert unencrypted(plain, elsewhere) == ["models"]


def test_service_costs_of_every_kind_and_a_lustre_file_system_half_described() -> None:
    """An EKS control plane by the hour; FSx for Lustre by its capacity and throughput tier: without a
    tier the lowest (125 MB/s/TiB, $0.145 per GB-month), at a tier the price list does not have the
    dearest ($0.60), without a capacity nothing."""
    costs = service_costs(
        [
            _view(EKS_CLUSTER, "cluster"),
            _view(LUSTRE, "lowest", storageCapacity=1200),
            _view(LUSTRE, "odd", storageCapacity="2400", perUnitStorageThroughput=300),
            _view(LUSTRE, "empty"),
            _view(SECURITY_GROUP, "not-a-service"),
        ]
    )
    assert costs == [
        ServiceCost("cluster", "EKS control plane", 0.1),
        ServiceCost("lowest", "FSx for Lustre, 1200 GiB at 125 MB/s/TiB", round(1200 * 0.145 / 730, 4)),
        ServiceCost("odd", "FSx for Lustre, 2400 GiB at 300 MB/s/TiB", round(2400 * 0.6 / 730, 4)),
        ServiceCost("empty", "FSx for Lustre, 0 GiB at 125 MB/s/TiB", 0.0),
    ]
    assert total_usd_per_hour(costs) == round(0.1 + 1200 * 0.145 / 730 + 2400 * 0.6 / 730, 2)
