"""The AWS backend's resource graph, recorded under the Pulumi SDK's mocks."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.backends.aws.bootstrap import settings_digest
from infra.backends.aws.naming import stack_bucket_uri
from infra.backends.aws.network import NODE_AGENT_PORT
from infra.plan.record import Recording, record
from infra.platform.boot_time import expected_boot_s
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.platform.serving_layout import startup_budget_s
from infra.platform.storage import aggregate_gbps
from infra.spec.load import stack_file

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


def test_inference_templates_and_controllers_have_no_efa(aws_prod: Recording) -> None:
    assert "networkInterfaces" not in aws_prod.named("aws-prod-infer-lt").inputs
    for node in ("head-0", "head-1"):
        assert "networkInterfaces" not in aws_prod.named(f"aws-prod-head-{node}").inputs


def test_training_pools_in_cluster_placement_groups(aws_prod: Recording) -> None:
    groups = aws_prod.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert sorted(g.name for g in groups) == ["aws-prod-train-placement", "aws-prod-train-spot-placement"]
    assert {g.inputs["strategy"] for g in groups} == {"cluster"}
    template = aws_prod.named("aws-prod-train-lt").inputs
    assert template["placement"] == {"groupName": "aws-prod-train-placement"}  # the mocks name it so
    assert {i["subnetId"] for i in template["networkInterfaces"]} == {"aws-prod-private-us-east-1a-id"}
    assert "placementGroup" not in aws_prod.named("aws-prod-infer-asg").inputs


def test_slurm_launches_training_nodes_not_an_autoscaling_group(aws_prod: Recording) -> None:
    groups = {g.name for g in aws_prod.of_type(ASG)}
    assert groups == {"aws-prod-infer-asg"}
    spot = aws_prod.named("aws-prod-train-spot-lt").inputs
    assert spot["instanceMarketOptions"]["marketType"] == "spot"
    assert {t["key"]: t["value"] for t in _tag_list(spot)}["gpuplat:max-nodes"] == "4"
    assert "instanceMarketOptions" not in aws_prod.named("aws-prod-train-lt").inputs


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
    # Every replica's port (8000 + i), and the canary slot `gpuplat serve deploy --canary` starts.
    replicas = load_platform(stack_file("aws-prod")).serving_layout
    assert replicas is not None
    assert (8000, 8000 + replicas.replicas - 1) in {(r["fromPort"], r["toPort"]) for r in rules}
    assert (8100, 8100) in {(r["fromPort"], r["toPort"]) for r in rules}
    # The gateways' agent check of each node's scaling agent (a Spot interruption drains it).
    assert NODE_AGENT_PORT in {r["fromPort"] for r in rules}


def test_the_gateways_reach_every_replica_of_a_node_serving_several(write_stack: Callable[..., Path]) -> None:
    """A node of four GPUs serves four replicas (ports 8000..8003): the gateways reach each, not only the
    first (aws-prod's nodes serve one, where the range is a single port and proves nothing)."""

    def four_gpus(platform: dict[str, Any]) -> None:
        infer = next(pool for pool in platform["pools"] if pool["name"] == "infer")
        infer["instance_type"] = "g6e.12xlarge"  # 4 L40S GPUs

    platform = load_platform(write_stack("aws-prod", four_gpus, name="aws-prod"))
    assert platform.serving_layout is not None and platform.serving_layout.replicas == 4
    rules = [
        (r.inputs["fromPort"], r.inputs["toPort"])
        for r in record(platform).of_type(INGRESS)
        if r.inputs["securityGroupId"] == "aws-prod-infer-sg-id"
    ]
    assert (8000, 8003) in rules
    assert (8100, 8100) in rules


def test_imdsv2_and_encrypted_root_volumes(aws_prod: Recording) -> None:
    for template in aws_prod.of_type(LT):
        assert template.inputs["metadataOptions"]["httpTokens"] == "required"
        ebs = template.inputs["blockDeviceMappings"][0]["ebs"]
        assert ebs["encrypted"] == "true" and ebs["volumeType"] == "gp3"


def test_instance_metadata_stays_on_the_host(aws_prod: Recording) -> None:
    """Nothing containerised on a Slurm stack's nodes needs the instance profile: the IMDSv2 token never
    leaves the host's network namespace (hop limit 1), on the pools' templates and the controllers. The
    instance tags stay readable: the boot reads its gpuplat:node name from them."""
    instances = aws_prod.of_type("aws:ec2/instance:Instance")
    assert instances
    for resource in [*aws_prod.of_type(LT), *instances]:
        options = resource.inputs["metadataOptions"]
        assert options["httpPutResponseHopLimit"] == 1, resource.name
        assert options["instanceMetadataTags"] == "enabled"


def test_eks_pods_never_reach_the_node_role(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    """On EKS a pod in its own network namespace is a hop further than the host: with hop limit 1 it
    gets no instance metadata token, so no pod can act as its node. The pods that call AWS have their
    own identities (EKS Pod Identity: tests/pulumi/test_eks.py)."""
    recording = record(shipped_platforms["aws-k8s"])
    templates = recording.of_type(LT)
    assert templates
    assert {t.inputs["metadataOptions"]["httpPutResponseHopLimit"] for t in templates} == {1}


def test_buckets_are_private_versioned_encrypted_tls_only(aws_prod: Recording) -> None:
    purposes = {"datasets", "checkpoints", "models", "bootstrap", "ssm-transfer"}
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
    infer = aws_prod.named("aws-prod-infer-asg").inputs
    distribution = infer["mixedInstancesPolicy"]["instancesDistribution"]
    assert distribution["onDemandBaseCapacity"] == infer["minSize"] == 2
    assert distribution["onDemandPercentageAboveBaseCapacity"] == 0


def test_scaling_policies_own_the_desired_capacity_and_up_never_waits(aws_prod: Recording) -> None:
    for group in aws_prod.of_type(ASG):
        assert "desiredCapacity" not in group.inputs
        assert group.inputs["waitForCapacityTimeout"] == "0"


def test_inference_scales_on_kv_cache_requests_and_the_gateway_backlog(aws_prod: Recording) -> None:
    policies = aws_prod.of_type("aws:autoscaling/policy:Policy")
    targets = {
        p.inputs["targetTrackingConfiguration"]["customizedMetricSpecification"]["metricName"]: p.inputs[
            "targetTrackingConfiguration"
        ]["targetValue"]
        for p in policies
    }
    # aws-prod: one replica per g6e.xlarge node, so one request queued at the gateways per node.
    assert targets == {
        "KVCacheUtilization": 75.0,
        "RequestsPerSecond": 20.0,
        "GatewayBacklogPerInstance": 1.0,
    }


def _tag_list(template: dict[str, Any]) -> list[dict[str, str]]:
    return [{"key": k, "value": v} for k, v in template["tags"].items()]


def test_pool_tags_for_the_inventory(aws_prod: Recording) -> None:
    tags = aws_prod.named("aws-prod-train-spot-lt").inputs["tagSpecifications"][0]["tags"]
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
        platform["pools"][1]["zone"] = "us-east-1b"

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


def test_efa_only_on_instance_types_that_have_it(write_stack: Callable[..., Path]) -> None:
    def ethernet(platform: dict[str, Any]) -> None:
        platform["pools"][1]["instance_type"] = "g6e.2xlarge"

    template = _variant(write_stack, ethernet).named("aws-prod-train-lt").inputs
    assert [i.get("interfaceType") for i in template["networkInterfaces"]] == [None]


def test_a_pool_launches_in_its_own_zone(write_stack: Callable[..., Path]) -> None:
    def reserved_in_b(platform: dict[str, Any]) -> None:
        platform["pools"][1]["capacity"] = "reserved"
        platform["pools"][1]["reservation"] = {"kind": "capacity-reservation", "id": "cr-0123456789abcdef0"}
        platform["pools"][1]["zone"] = "us-east-1b"
        platform["pools"][3]["zone"] = "us-east-1b"

    recording = _variant(write_stack, reserved_in_b)
    interfaces = recording.named("aws-prod-train-lt").inputs["networkInterfaces"]
    assert {i["subnetId"] for i in interfaces} == {"aws-prod-private-us-east-1b-id"}
    assert recording.named("aws-prod-infer-asg").inputs["vpcZoneIdentifiers"] == [
        "aws-prod-private-us-east-1b-id"
    ]


def test_reserved_inference_never_spills_to_spot(write_stack: Callable[..., Path]) -> None:
    def reserved_infer(platform: dict[str, Any]) -> None:
        platform["pools"][3]["capacity"] = "reserved"
        platform["pools"][3]["reservation"] = {"kind": "capacity-reservation", "id": "cr-0123456789abcdef0"}
        platform["pools"][3]["zone"] = "us-east-1a"

    group = _variant(write_stack, reserved_infer).named("aws-prod-infer-asg").inputs
    assert "mixedInstancesPolicy" not in group and "launchTemplate" in group


@pytest.mark.parametrize(("placement", "strategies"), [("spread", {"spread"}), ("none", set())])
def test_placement_as_the_spec_says(
    write_stack: Callable[..., Path], placement: str, strategies: set[str]
) -> None:
    def placed(platform: dict[str, Any]) -> None:
        platform["fabric"]["placement"] = placement

    recording = _variant(write_stack, placed)
    groups = recording.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert {g.inputs["strategy"] for g in groups} == strategies
    assert ("placement" in recording.named("aws-prod-train-lt").inputs) == bool(strategies)


def test_bucket_prefixes_fit_for_a_long_stack_name(write_stack: Callable[..., Path]) -> None:
    def long_name(platform: dict[str, Any]) -> None:
        platform["name"] = "research-platform-production-a"

    buckets = _variant(write_stack, long_name).of_type("aws:s3/bucket:Bucket")
    assert buckets and all(len(b.inputs["bucketPrefix"]) <= 37 for b in buckets)


def test_controllers_have_their_names_and_fixed_addresses_in_two_zones(aws_prod: Recording) -> None:
    head0, head1 = (aws_prod.named(f"aws-prod-head-{n}").inputs for n in ("head-0", "head-1"))
    assert (head0["privateIp"], head1["privateIp"]) == ("10.64.0.10", "10.64.16.11")
    assert head0["subnetId"] != head1["subnetId"]
    assert head0["tags"]["gpuplat:node"] == "head-0"
    assert head0["maintenanceOptions"] == {"autoRecovery": "default"}
    assert aws_prod.outputs["controller_addresses"] == {"head-0": "10.64.0.10", "head-1": "10.64.16.11"}


def test_every_node_boots_into_the_published_bundle(aws_prod: Recording) -> None:
    key = aws_prod.outputs["bootstrap_bundle"]
    assert aws_prod.named("aws-prod-bundle").inputs["key"] == key
    scripts = {
        name: base64.b64decode(aws_prod.named(name).inputs[field]).decode()
        for name, field in (
            ("aws-prod-train-spot-lt", "userData"),
            ("aws-prod-head-head-1", "userDataBase64"),
        )
    }
    assert f"BUNDLE_KEY={key}" in scripts["aws-prod-train-spot-lt"]
    # controllers: the one the group vars name (their user data must not change with the roles)
    assert "GPUPLAT_BUNDLE_KEY=''" in scripts["aws-prod-head-head-1"]
    assert json.loads(aws_prod.named("aws-prod-group-vars").inputs["content"])["gpuplat_bundle_key"] == key
    assert "NODE_NAME=head-1" in scripts["aws-prod-head-head-1"]
    assert "NODE_NAME=''" in scripts["aws-prod-train-spot-lt"]
    assert "def take_name(" in scripts["aws-prod-train-spot-lt"]  # the join program rides along
    assert "pool_train_spot:" in scripts["aws-prod-train-spot-lt"]


def test_a_training_node_whose_boot_fails_is_terminated_not_kept(aws_prod: Recording) -> None:
    """Its boot script powers it off (bootstrap.py POWER_OFF_STEP) and its template terminates it on
    shutdown, as ParallelCluster's compute nodes; inference nodes and controllers stay up for an
    operator to look at."""
    for pool in ("train", "train-spot"):
        template = aws_prod.named(f"aws-prod-{pool}-lt").inputs
        assert template["instanceInitiatedShutdownBehavior"] == "terminate"
        assert "GPUPLAT_POWER_OFF_ON_FAILURE=1\n" in base64.b64decode(template["userData"]).decode()
    infer = aws_prod.named("aws-prod-infer-lt").inputs
    assert "instanceInitiatedShutdownBehavior" not in infer
    assert "GPUPLAT_POWER_OFF_ON_FAILURE=''" in base64.b64decode(infer["userData"]).decode()
    head = base64.b64decode(aws_prod.named("aws-prod-head-head-0").inputs["userDataBase64"]).decode()
    assert "GPUPLAT_POWER_OFF_ON_FAILURE=''" in head


def test_training_templates_change_with_the_stacks_values_and_controllers_do_not(
    aws_prod: Recording, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    """The training templates' user data names the digest of the stack's values (bootstrap.py
    settings_digest), so a changed value is a new template version whose nodes are drained after their
    jobs (gpuplat_ec2_nodes/outdated.py); a controller's user data never changes with it (a stop/start)."""
    digest = f"GPUPLAT_SETTINGS_DIGEST={settings_digest(shipped_platforms['aws-prod'])}\n"
    for pool in ("train", "train-spot"):
        assert digest in base64.b64decode(aws_prod.named(f"aws-prod-{pool}-lt").inputs["userData"]).decode()
    assert (
        "GPUPLAT_SETTINGS_DIGEST"
        not in base64.b64decode(aws_prod.named("aws-prod-infer-lt").inputs["userData"]).decode()
    )
    head = base64.b64decode(aws_prod.named("aws-prod-head-head-0").inputs["userDataBase64"]).decode()
    assert "GPUPLAT_SETTINGS_DIGEST" not in head


def test_only_controllers_launch_and_terminate_nodes(aws_prod: Recording) -> None:
    policies = {r.name: r.inputs["policy"] for r in aws_prod.of_type("aws:iam/rolePolicy:RolePolicy")}
    assert "ec2:RunInstances" in policies["aws-prod-service-platform"]
    assert "iam:PassRole" in policies["aws-prod-service-platform"]
    assert "ec2:ResourceTag/gpuplat:stack" in policies["aws-prod-service-platform"]
    for role in ("train", "infer"):
        assert "ec2:" not in policies[f"aws-prod-{role}-platform"]
    # the MUNGE key: only nodes that run munged (tests/pulumi/test_aws_munge_key.py judges the effective
    # policies, managed ones included)
    assert "ReadMungeKey" in policies["aws-prod-train-platform"]
    assert "ReadMungeKey" not in policies["aws-prod-infer-platform"]


def test_inventory_reaches_nodes_through_ssm(aws_prod: Recording) -> None:
    config = aws_prod.outputs["inventory_config"]
    assert config["hostnames"][0] == "tag:gpuplat:node"
    assert config["compose"]["ansible_host"] == "instance_id"
    assert config["compose"]["ansible_aws_ssm_region"] == "'us-east-1'"
    assert config["compose"]["ansible_aws_ssm_bucket_name"].startswith("'")


def test_one_gateway_address_in_front_of_both_gateways(aws_prod: Recording) -> None:
    assert aws_prod.named("aws-prod-gateway-nlb").inputs["internal"] is True
    attached = {
        a.inputs["targetId"] for a in aws_prod.of_type("aws:lb/targetGroupAttachment:TargetGroupAttachment")
    }
    assert attached == {"aws-prod-head-head-0-id", "aws-prod-head-head-1-id"}
    assert aws_prod.outputs["gateway_endpoint"].endswith(":8080/v1")


def test_what_launches_at_once_waits_for_what_its_boot_script_fetches(aws_prod: Recording) -> None:
    """Controllers and Auto Scaling groups start booting when created and user data runs once: the bundle
    and the group vars (which wait for the filesystem) must exist first."""
    fetched = {aws_prod.named(n).urn for n in ("aws-prod-bundle", "aws-prod-group-vars")}
    launchers = [
        *aws_prod.of_type("aws:ec2/instance:Instance"),
        *aws_prod.of_type("aws:autoscaling/group:Group"),
    ]
    expected = {"aws-prod-head-head-0", "aws-prod-head-head-1", "aws-prod-infer-asg"}
    assert {r.name for r in launchers} >= expected
    for resource in launchers:
        missing = fetched - set(resource.dependencies)
        assert not missing, f"{resource.name} boots before {missing}"


def test_booting_inference_nodes_read_the_stacks_models_bucket(aws_prod: Recording) -> None:
    """`serving.model: s3://models/<key>` names the stack's models bucket, whose name S3 generates: the
    group vars every booting node reads (and the stack output the inventory lays over its own) carry
    the real name, which the inference role may read, never a bucket literally called `models`."""
    models = next(
        b for b in aws_prod.of_type("aws:s3/bucket:Bucket") if b.inputs["bucketPrefix"].endswith("-models-")
    )
    written = next(
        o for o in aws_prod.of_type("aws:s3/bucketObjectv2:BucketObjectv2") if o.name == "aws-prod-group-vars"
    )
    model = json.loads(written.inputs["content"])["inference_model"]
    # The mocks name a bucket after its prefix (infra/plan/record.py).
    assert model == f"s3://{models.inputs['bucketPrefix']}mock/meta-llama/Llama-3.1-8B-Instruct"
    assert aws_prod.outputs["group_vars"]["inference_model"] == model


def test_a_uri_of_a_bucket_the_stack_does_not_have_is_left_alone() -> None:
    names = {"models": "aws-prod-models-abc"}
    assert stack_bucket_uri("s3://models/org/m", names) == "s3://aws-prod-models-abc/org/m"
    assert stack_bucket_uri("s3://their-bucket/org/m", names) == "s3://their-bucket/org/m"
    assert stack_bucket_uri("/fsx/models/m", names) == "/fsx/models/m"


def test_a_loading_inference_node_is_not_counted_before_it_serves(
    aws_prod: Recording, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    """Target tracking would count a node that is still booting or loading its model as capacity (or
    read its idle metrics) and keep adding nodes: the group's warmup and the policies' cover the boot
    (infra/data/boot_times.yaml) plus the replica's start budget."""
    platform = shipped_platforms["aws-prod"]
    pool = platform.pool("infer")
    assert platform.spec.serving is not None and platform.serving_layout is not None
    expected = expected_boot_s(platform.spec) + startup_budget_s(
        platform.spec.serving, platform.serving_layout, pool.node_type
    )
    [group] = [g for g in aws_prod.of_type(ASG) if g.name == "aws-prod-infer-asg"]
    assert group.inputs["defaultInstanceWarmup"] == expected >= 1500
    policies = aws_prod.of_type("aws:autoscaling/policy:Policy")
    assert policies and {p.inputs["estimatedInstanceWarmup"] for p in policies} == {expected}


def test_a_leaving_inference_node_is_held_until_it_has_drained(aws_prod: Recording) -> None:
    """Scale-in and instance replacement terminate through the group's termination hook: the instance
    waits in Terminating:Wait while the gateways drain it and its requests end (the node's scaling agent
    completes the action), at most the gateway's request timeout plus the drain's margins."""
    from infra.backends.aws.node_pool import DRAIN_HOOK

    [group] = [g for g in aws_prod.of_type(ASG) if g.name == "aws-prod-infer-asg"]
    [hook] = group.inputs["initialLifecycleHooks"]
    assert hook["name"] == DRAIN_HOOK
    assert hook["lifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert hook["defaultResult"] == "CONTINUE"
    assert hook["heartbeatTimeout"] == 30 + 60 + 60  # notice + gateway_timeout_s (aws-prod: 60) + margin
    # Training groups have none: Slurm's power saving terminates those nodes.
    assert all("initialLifecycleHooks" not in g.inputs for g in aws_prod.of_type(ASG) if "train" in g.name)
    policies = {r.name: r.inputs["policy"] for r in aws_prod.of_type("aws:iam/rolePolicy:RolePolicy")}
    infer = json.loads(policies["aws-prod-infer-platform"])
    [complete] = [s for s in infer["Statement"] if s["Sid"] == "CompleteOwnTermination"]
    assert complete["Condition"] == {"StringEquals": {"aws:ResourceTag/gpuplat:stack": "aws-prod"}}
    service = json.loads(policies["aws-prod-service-platform"])
    assert any("autoscaling:DescribeAutoScalingInstances" in s["Action"] for s in service["Statement"])
