"""The AWS backend's resource graph, recorded under the Pulumi SDK's mocks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.plan.record import Recording, record
from infra.resolve import ResolvedPlatform, load_platform
from infra.storage import aggregate_gbps

LT = "aws:ec2/launchTemplate:LaunchTemplate"
ASG = "aws:autoscaling/group:Group"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"


@pytest.fixture(scope="module")
def aws_prod(shipped_platforms: dict[str, ResolvedPlatform]) -> Recording:
    return record(shipped_platforms["aws-prod"])


def test_every_efa_interface_of_p5(aws_prod: Recording) -> None:
    interfaces = aws_prod.named("aws-prod-train-lt").inputs["networkInterfaces"]
    assert len(interfaces) == 32
    assert {i["interfaceType"] for i in interfaces} == {"efa"}
    assert [i["networkCardIndex"] for i in interfaces] == list(range(32))
    assert [i["deviceIndex"] for i in interfaces] == [0] + [1] * 31


def test_inference_and_service_templates_have_no_efa(aws_prod: Recording) -> None:
    for name in ("aws-prod-infer-lt", "aws-prod-head-lt"):
        assert "networkInterfaces" not in aws_prod.named(name).inputs


def test_training_pools_in_cluster_placement_groups(aws_prod: Recording) -> None:
    groups = aws_prod.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert sorted(g.name for g in groups) == ["aws-prod-train-placement", "aws-prod-train-spot-placement"]
    assert {g.inputs["strategy"] for g in groups} == {"cluster"}
    assert aws_prod.named("aws-prod-train-asg").inputs["placementGroup"] == "aws-prod-train-placement-id"
    assert len(aws_prod.named("aws-prod-train-asg").inputs["vpcZoneIdentifiers"]) == 1
    assert "placementGroup" not in aws_prod.named("aws-prod-infer-asg").inputs


def test_efa_security_group_references_itself(aws_prod: Recording) -> None:
    train_sg = "aws-prod-train-sg-id"

    def self_rules(type_token: str) -> list[dict[str, Any]]:
        return [
            r.inputs
            for r in aws_prod.of_type(type_token)
            if r.inputs["securityGroupId"] == train_sg
            and r.inputs.get("referencedSecurityGroupId") == train_sg
        ]

    assert [r["ipProtocol"] for r in self_rules(INGRESS)] == ["-1"]
    assert [r["ipProtocol"] for r in self_rules(EGRESS)] == ["-1"]


def test_no_ingress_from_anywhere(aws_prod: Recording) -> None:
    assert all(r.inputs.get("cidrIpv4") != "0.0.0.0/0" for r in aws_prod.of_type(INGRESS))


def test_inference_accepts_only_the_gateway_group(aws_prod: Recording) -> None:
    rules = [
        r.inputs for r in aws_prod.of_type(INGRESS) if r.inputs["securityGroupId"] == "aws-prod-infer-sg-id"
    ]
    assert {r["referencedSecurityGroupId"] for r in rules} == {"aws-prod-service-sg-id"}
    assert 8000 in {r["fromPort"] for r in rules}


def test_imdsv2_and_encrypted_root_volumes(aws_prod: Recording) -> None:
    for template in aws_prod.of_type(LT):
        assert template.inputs["metadataOptions"]["httpTokens"] == "required"
        ebs = template.inputs["blockDeviceMappings"][0]["ebs"]
        assert ebs["encrypted"] == "true" and ebs["volumeType"] == "gp3"


def test_buckets_are_private_versioned_encrypted_tls_only(aws_prod: Recording) -> None:
    purposes = {"datasets", "checkpoints", "models"}
    kinds = (
        "bucketVersioning:BucketVersioning",
        "bucketPublicAccessBlock:BucketPublicAccessBlock",
        "bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        "bucketPolicy:BucketPolicy",
        "bucketLifecycleConfiguration:BucketLifecycleConfiguration",
    )
    for kind in kinds:
        assert len(aws_prod.of_type(f"aws:s3/{kind}")) == len(purposes)
    block = aws_prod.named("aws-prod-objects-checkpoints-public-access-block").inputs
    assert all(
        block[k]
        for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    )
    assert (
        '"aws:SecureTransport": "false"'
        in aws_prod.named("aws-prod-objects-checkpoints-tls-only").inputs["policy"]
    )
    lifecycle = aws_prod.named("aws-prod-objects-checkpoints-lifecycle").inputs["rules"][0]
    assert lifecycle["noncurrentVersionExpiration"]["noncurrentDays"] == 14


def test_fsx_meets_gpu_read_demand(
    aws_prod: Recording, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    fs = aws_prod.named("aws-prod-fs-lustre").inputs
    assert fs["deploymentType"] == "PERSISTENT_2"
    supply = aggregate_gbps(fs["storageCapacity"], fs["perUnitStorageThroughput"])
    assert supply >= shipped_platforms["aws-prod"].storage_demand_gbps
    associations = aws_prod.of_type("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    assert sorted(a.inputs["fileSystemPath"] for a in associations) == ["/checkpoints", "/datasets"]


def test_capacity_per_pool(aws_prod: Recording) -> None:
    spot = aws_prod.named("aws-prod-train-spot-asg").inputs["mixedInstancesPolicy"]["instancesDistribution"]
    assert spot["onDemandBaseCapacity"] == 0 and spot["onDemandPercentageAboveBaseCapacity"] == 0
    infer = aws_prod.named("aws-prod-infer-asg").inputs
    distribution = infer["mixedInstancesPolicy"]["instancesDistribution"]
    assert distribution["onDemandBaseCapacity"] == infer["minSize"] == 2
    on_demand = aws_prod.named("aws-prod-train-asg").inputs
    assert "mixedInstancesPolicy" not in on_demand and on_demand["minSize"] == on_demand["maxSize"] == 4


def test_inference_scales_on_gpu_memory_and_requests(aws_prod: Recording) -> None:
    policies = aws_prod.of_type("aws:autoscaling/policy:Policy")
    metrics = {
        p.inputs["targetTrackingConfiguration"]["customizedMetricSpecification"]["metricName"]
        for p in policies
    }
    assert metrics == {"KVCacheUtilization", "RequestsPerSecond"}


def test_pool_tags_for_the_inventory(aws_prod: Recording) -> None:
    tags = {t["key"]: t["value"] for t in aws_prod.named("aws-prod-train-spot-asg").inputs["tags"]}
    assert tags["gpuplat:stack"] == "aws-prod" and tags["gpuplat:pool"] == "train-spot"
    assert tags["gpuplat:role"] == "train" and tags["gpuplat:group"] == "pool_train_spot"
    assert {"owner", "team", "cost-center"} <= set(tags)


def test_iam_least_privilege(aws_prod: Recording) -> None:
    infer_policy = aws_prod.named("aws-prod-infer-buckets").inputs["policy"]
    assert "models" in infer_policy and "datasets" not in infer_policy and "s3:PutObject" not in infer_policy
    assert not [
        r for r in aws_prod.of_type("aws:iam/rolePolicy:RolePolicy") if r.name == "aws-prod-service-buckets"
    ]


def test_every_child_is_parented_to_a_component(aws_prod: Recording) -> None:
    components = {r.urn for r in aws_prod.resources if not r.custom}
    assert all(r.parent_urn in components for r in aws_prod.resources if r.custom)


def _variant(write_stack: Callable[..., Path], mutate: Callable[[dict[str, Any]], None]) -> Recording:
    return record(load_platform(write_stack("aws-prod", mutate)))


def test_p4d_gets_four_efa_interfaces(write_stack: Callable[..., Path]) -> None:
    def p4d(platform: dict[str, Any]) -> None:
        platform["pools"][1]["instance_type"] = "p4d.24xlarge"

    recording = _variant(write_stack, p4d)
    assert len(recording.named("aws-prod-train-lt").inputs["networkInterfaces"]) == 4


def test_capacity_block(write_stack: Callable[..., Path]) -> None:
    def block(platform: dict[str, Any]) -> None:
        platform["pools"][1]["capacity"] = "reserved"
        platform["pools"][1]["reservation"] = {"kind": "capacity-block", "id": "cr-0123456789abcdef0"}

    template = _variant(write_stack, block).named("aws-prod-train-lt").inputs
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    target = template["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target["capacityReservationId"] == "cr-0123456789abcdef0"


def test_fsx_grows_when_demand_exceeds_capacity(write_stack: Callable[..., Path]) -> None:
    def hungry(platform: dict[str, Any]) -> None:
        platform["storage"]["parallel_fs"]["read_gbps_per_gpu"] = 2.0

    fs = _variant(write_stack, hungry).named("aws-prod-fs-lustre").inputs
    assert fs["perUnitStorageThroughput"] == 1000
    assert aggregate_gbps(fs["storageCapacity"], fs["perUnitStorageThroughput"]) >= 64 * 2.0
    assert fs["storageCapacity"] % 2400 == 0


def test_ami_from_stack_config(write_stack: Callable[..., Path]) -> None:
    def pinned(platform: dict[str, Any]) -> None:
        platform["aws"] = {"image_id": "ami-0123456789abcdef0"}

    assert (
        _variant(write_stack, pinned).named("aws-prod-train-lt").inputs["imageId"] == "ami-0123456789abcdef0"
    )
