"""The aws backend with scheduler.kind kueue: an EKS cluster whose managed node groups are the stack's pools,
recorded under the Pulumi SDK's mocks from stacks/Pulumi.aws-k8s.yaml, and the policy rules judging its
node groups as they judge Auto Scaling groups and Slurm-managed templates."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pulumi
import pytest

from infra.backends.aws.eks import accelerator_label, eks_problems, kubeconfig
from infra.errors import SpecError
from infra.k8s.facts import AUTOSCALER_NAMESPACE, AUTOSCALER_SERVICE_ACCOUNT, MODEL_SERVER_ACCOUNT
from infra.k8s.objects import CRD_SUFFIX, node_labels
from infra.plan.record import SECRET, Recording, record
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.policy.check import verdicts_for
from infra.policy.rules import PolicyContext, Verdict, node_groups
from infra.policy.settings import PolicyConfig
from infra.policy.view import TAG_POOL, TAG_ROLE, ResourceIndex, ResourceView, from_recorded
from infra.program import build
from infra.spec.load import stack_file
from tests.pulumi.test_policy_rules import _copy

STACK = "aws-k8s"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
POOLS = ("system", "train", "train-spot", "infer")
# What a managed node group's launch template must not set (EKS user guide, launch-templates.adoc), in the
# provider's property names; the spot market is the node group's capacity type.
FORBIDDEN = (
    "iamInstanceProfile",
    "imageId",
    "userData",
    "instanceInitiatedShutdownBehavior",
    "hibernationOptions",
)

Change = Callable[[str, dict[str, Any]], None]  # (resource name, inputs), in place


def _program(
    type_: str | None = None, change: Change | None = None, options: dict[str, Any] | None = None
) -> Callable[[ResolvedPlatform], None]:
    """The real program; a stack transformation may change the inputs of every resource of `type_` and
    collects the resource options of the node groups into `options`."""

    def transformation(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult | None:
        if options is not None and args.type_ == NODE_GROUP:
            options[args.name] = args.opts
        if args.type_ != type_ or change is None:
            return None
        props = _copy(dict(args.props))
        change(args.name, props)
        return pulumi.ResourceTransformationResult(props, args.opts)

    def program(platform: ResolvedPlatform) -> None:
        pulumi.runtime.register_stack_transformation(transformation)
        build(platform)

    return program


@pytest.fixture(scope="module")
def platform() -> ResolvedPlatform:
    return load_platform(stack_file(STACK))


# The shipped stack recorded once per process, with the node groups' resource options collected on the
# way: recording is most of these tests' time, and pytest run again in this process (mutmut's runs of the
# policy tests here, forked from the run that recorded: scripts/mutation/run.py) reuses it.
_RECORDED: dict[str, tuple[Recording, dict[str, Any]]] = {}


def _shipped(platform: ResolvedPlatform) -> tuple[Recording, dict[str, Any]]:
    if STACK not in _RECORDED:
        options: dict[str, Any] = {}
        _RECORDED[STACK] = (record(platform, _program(options=options)), options)
    return _RECORDED[STACK]


@pytest.fixture(scope="module")
def options(platform: ResolvedPlatform) -> dict[str, Any]:
    return _shipped(platform)[1]


@pytest.fixture(scope="module")
def eks(platform: ResolvedPlatform) -> Recording:
    return _shipped(platform)[0]


def _variant(write_stack: Callable[..., Path], mutate: Callable[[dict[str, Any]], None]) -> ResolvedPlatform:
    return load_platform(write_stack(STACK, mutate))


def _pool(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in spec["pools"] if p["name"] == name)


def _fired(verdicts: list[Verdict], rule: str) -> list[Verdict]:
    return [v for v in verdicts if v.rule == rule]


# ---------------------------------------------------------------------------------------------------
# the cluster


def test_cluster_version_subnets_access_logs_and_secrets(eks: Recording) -> None:
    cluster = eks.of_type("aws:eks/cluster:Cluster")
    assert len(cluster) == 1
    inputs = cluster[0].inputs
    assert inputs["version"] == "1.34"
    assert inputs["vpcConfig"]["subnetIds"] == [
        "aws-k8s-private-us-east-1a-id",
        "aws-k8s-private-us-east-1b-id",
    ]
    assert inputs["accessConfig"]["authenticationMode"] == "API"
    assert inputs["enabledClusterLogTypes"] == [
        "api",
        "audit",
        "authenticator",
        "controllerManager",
        "scheduler",
    ]
    key = eks.of_type("aws:kms/key:Key")
    assert [k.inputs["enableKeyRotation"] for k in key] == [True]
    assert inputs["encryptionConfig"] == {
        "provider": {"keyArn": f"arn:aws:mock:::key/{key[0].name}"},
        "resources": ["secrets"],
    }
    assert inputs["bootstrapSelfManagedAddons"] is False


def test_managed_addons_at_the_default_version(eks: Recording) -> None:
    addons = {a.inputs["addonName"]: a.inputs for a in eks.of_type("aws:eks/addon:Addon")}
    assert set(addons) == {"vpc-cni", "coredns", "kube-proxy", "eks-pod-identity-agent"}
    assert all("addonVersion" not in a for a in addons.values())


def test_network_policies_are_enforced_by_the_vpc_cni(eks: Recording) -> None:
    """Without the VPC CNI's network policy agent, EKS accepts the tenancy NetworkPolicies and enforces
    none of them (EKS user guide, cni-network-policy.html)."""
    [cni] = [r for r in eks.of_type("aws:eks/addon:Addon") if r.inputs["addonName"] == "vpc-cni"]
    assert json.loads(cni.inputs["configurationValues"]) == {"enableNetworkPolicy": "true"}
    others = [r for r in eks.of_type("aws:eks/addon:Addon") if r.inputs["addonName"] != "vpc-cni"]
    assert others and all("configurationValues" not in r.inputs for r in others)


def test_team_members_log_in_into_their_teams_group(eks: Recording, platform: ResolvedPlatform) -> None:
    """RoleBindings name the group gpuplat:<team>; without an access entry putting the team's IAM principals
    in it, no team member could authenticate to the cluster at all (only the admins had entries)."""
    entries = {
        r.inputs["principalArn"]: r.inputs.get("kubernetesGroups")
        for r in eks.of_type("aws:eks/accessEntry:AccessEntry")
        if "-team-" in r.name
    }
    expected = {
        arn: [f"gpuplat:{team.name}"] for team in platform.spec.scheduler.teams for arn in team.iam_principals
    }
    assert entries == expected and expected
    policies = eks.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    assert not [p for p in policies if p.inputs["principalArn"] in expected], "members get no cluster policy"


def test_gpu_node_groups_say_they_have_gpus(eks: Recording, platform: ResolvedPlatform) -> None:
    """cluster-autoscaler treats a node with k8s.amazonaws.com/accelerator as a GPU node whose GPUs are still
    coming; without it, one pending GPU pod can scale a group out again before the first node's device
    plugin reports."""
    for pool in platform.pools:
        labels = eks.named(f"aws-k8s-{pool.name}-ng").inputs.get("labels", {})
        gpu = pool.node_type.gpu
        if gpu and gpu.count:
            assert labels["k8s.amazonaws.com/accelerator"] == f"nvidia-{gpu.model.lower()}"
        else:
            assert "k8s.amazonaws.com/accelerator" not in labels


def test_inference_nodes_reach_lustre(eks: Recording) -> None:
    rules = [r.inputs for r in eks.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")]
    to_lustre = {
        (r["referencedSecurityGroupId"], r["fromPort"], r["toPort"])
        for r in rules
        if r["securityGroupId"] == "aws-k8s-lustre-sg-id"
    }
    assert {("aws-k8s-infer-sg-id", 988, 988), ("aws-k8s-infer-sg-id", 1018, 1023)} <= to_lustre
    assert {("aws-k8s-train-sg-id", 988, 988), ("aws-k8s-service-sg-id", 988, 988)} <= to_lustre


def test_outputs_name_the_cluster_and_its_node_groups(eks: Recording) -> None:
    assert eks.outputs["cluster_name"] == "aws-k8s-eks-cluster"
    assert eks.outputs["cluster_endpoint"].startswith("https://")
    assert eks.outputs["kubeconfig"] == SECRET
    assert eks.outputs["node_groups"] == {pool: f"aws-k8s-{pool}-ng" for pool in POOLS}
    assert eks.outputs["fsx_mount_name"] == "mockmnt"


def test_kubeconfig_gets_a_token_with_the_callers_credentials() -> None:
    config = json.loads(kubeconfig("c1", "https://c1.example", "Q0E=", "us-east-1"))
    assert config["clusters"][0]["cluster"] == {
        "server": "https://c1.example",
        "certificate-authority-data": "Q0E=",
    }
    user = config["users"][0]["user"]["exec"]
    assert user["command"] == "aws"
    assert user["args"] == ["eks", "get-token", "--cluster-name", "c1", "--region", "us-east-1"]
    assert config["current-context"] == "c1"


# ---------------------------------------------------------------------------------------------------
# node groups and their templates


def test_one_node_group_per_pool_on_its_own_template(eks: Recording, platform: ResolvedPlatform) -> None:
    groups = {g.name: g.inputs for g in eks.of_type(NODE_GROUP)}
    assert sorted(groups) == sorted(f"aws-k8s-{pool}-ng" for pool in POOLS)
    templates = {t.name for t in eks.of_type(LT)}
    assert templates == {f"aws-k8s-{pool}-lt" for pool in POOLS}
    for pool in platform.pools:
        group = groups[f"aws-k8s-{pool.name}-ng"]
        assert group["launchTemplate"]["id"] == f"aws-k8s-{pool.name}-lt-id"
        assert group["labels"] == {**node_labels(pool), **accelerator_label(pool)}
        assert group["clusterName"] == "aws-k8s-eks-cluster"
        assert group["tags"]["gpuplat:pool"] == pool.name
    assert groups["aws-k8s-infer-ng"]["taints"] == [
        {"key": "gpuplat/inference", "value": "true", "effect": "NO_SCHEDULE"}
    ]
    assert groups["aws-k8s-train-spot-ng"]["taints"] == [
        {"key": "gpuplat/spot", "value": "true", "effect": "NO_SCHEDULE"}
    ]
    assert groups["aws-k8s-train-ng"]["taints"] == [
        {"key": "gpuplat/training", "value": "true", "effect": "NO_SCHEDULE"}
    ]


def test_templates_leave_to_eks_what_the_node_group_owns(eks: Recording) -> None:
    for template in eks.of_type(LT):
        inputs = template.inputs
        assert not [key for key in FORBIDDEN if key in inputs], template.name
        assert "instanceMarketOptions" not in inputs, template.name
        assert all("subnetId" not in i for i in inputs.get("networkInterfaces", [])), template.name
        assert inputs["metadataOptions"]["httpTokens"] == "required"
        root = inputs["blockDeviceMappings"][0]
        assert root["deviceName"] == "/dev/xvda"
        assert root["ebs"]["encrypted"] == "true" and root["ebs"]["volumeType"] == "gp3"
        assert inputs["tagSpecifications"][0]["tags"]["gpuplat:stack"] == "aws-k8s"
    for group in eks.of_type(NODE_GROUP):
        assert "instanceTypes" not in group.inputs and "diskSize" not in group.inputs


def test_efa_on_every_card_and_cluster_placement_for_training(eks: Recording) -> None:
    placement = {g.name: g.inputs["strategy"] for g in eks.of_type("aws:ec2/placementGroup:PlacementGroup")}
    assert placement == {"aws-k8s-train-placement": "cluster", "aws-k8s-train-spot-placement": "cluster"}
    for pool in ("train", "train-spot"):
        template = eks.named(f"aws-k8s-{pool}-lt").inputs
        interfaces = template["networkInterfaces"]
        assert [i["networkCardIndex"] for i in interfaces] == list(range(32))
        assert {i["interfaceType"] for i in interfaces} == {"efa"}
        assert [i["deviceIndex"] for i in interfaces] == [0] + [1] * 31
        assert interfaces[0]["securityGroups"] == ["aws-k8s-train-sg-id", "aws-k8s-eks-cluster-id-sg"]
        assert template["placement"] == {"groupName": f"aws-k8s-{pool}-placement"}
        assert eks.named(f"aws-k8s-{pool}-ng").inputs["subnetIds"] == ["aws-k8s-private-us-east-1a-id"]
    infer = eks.named("aws-k8s-infer-lt").inputs
    assert "networkInterfaces" not in infer and "placement" not in infer
    assert infer["vpcSecurityGroupIds"] == ["aws-k8s-infer-sg-id", "aws-k8s-eks-cluster-id-sg"]


def test_capacity_and_ami_types(eks: Recording) -> None:
    groups = {g.name.removeprefix("aws-k8s-").removesuffix("-ng"): g.inputs for g in eks.of_type(NODE_GROUP)}
    assert {p: g["capacityType"] for p, g in groups.items()} == {
        "system": "ON_DEMAND",
        "train": "ON_DEMAND",
        "train-spot": "SPOT",
        "infer": "ON_DEMAND",
    }
    assert {p: g["amiType"] for p, g in groups.items()} == {
        "system": "AL2023_x86_64_STANDARD",
        "train": "AL2023_x86_64_NVIDIA",
        "train-spot": "AL2023_x86_64_NVIDIA",
        "infer": "AL2023_x86_64_NVIDIA",
    }


def test_the_autoscaler_owns_the_desired_size(eks: Recording, options: dict[str, Any]) -> None:
    sizes = {g.name: g.inputs["scalingConfig"] for g in eks.of_type(NODE_GROUP)}
    assert sizes["aws-k8s-train-spot-ng"] == {"minSize": 0, "maxSize": 4, "desiredSize": 0}
    assert sizes["aws-k8s-infer-ng"] == {"minSize": 2, "maxSize": 8, "desiredSize": 2}
    assert sorted(options) == sorted(sizes)
    assert all(opts.ignore_changes == ["scalingConfig.desiredSize"] for opts in options.values())


def test_scale_from_zero_knows_the_efa_interfaces(eks: Recording) -> None:
    tag = "k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"
    tags = {g.name: g.inputs["tags"] for g in eks.of_type(NODE_GROUP)}
    assert tags["aws-k8s-train-spot-ng"][tag] == "32"
    assert tag not in tags["aws-k8s-infer-ng"] and tag not in tags["aws-k8s-system-ng"]


def test_capacity_block_pool(write_stack: Callable[..., Path]) -> None:
    def block(spec: dict[str, Any]) -> None:
        _pool(spec, "train").update(
            capacity="reserved",
            zone="us-east-1b",
            reservation={"kind": "capacity-block", "id": "cr-0123456789abcdef0"},
        )

    recording = record(_variant(write_stack, block))
    group = recording.named("aws-k8s-train-ng").inputs
    assert group["capacityType"] == "CAPACITY_BLOCK"
    assert group["subnetIds"] == ["aws-k8s-private-us-east-1b-id"]
    template = recording.named("aws-k8s-train-lt").inputs
    assert template["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert template["capacityReservationSpecification"]["capacityReservationTarget"] == {
        "capacityReservationId": "cr-0123456789abcdef0"
    }


# ---------------------------------------------------------------------------------------------------
# identities


def test_nothing_of_slurm(eks: Recording) -> None:
    slurm_only = (
        "aws:ec2/instance:Instance",
        "aws:ssm/parameter:Parameter",
        "aws:s3/bucketObjectv2:BucketObjectv2",
        "aws:autoscaling/group:Group",
        "aws:iam/instanceProfile:InstanceProfile",
    )
    for kind in slurm_only:
        assert not eks.of_type(kind), kind
    assert sorted(b.name for b in eks.of_type("aws:s3/bucket:Bucket")) == [
        "aws-k8s-objects-checkpoints",
        "aws-k8s-objects-datasets",
        "aws-k8s-objects-models",
    ]
    policies = " ".join(p.inputs["policy"] for p in eks.of_type("aws:iam/rolePolicy:RolePolicy"))
    assert "ec2:RunInstances" not in policies and "ssm:GetParameter" not in policies
    assert "controller_addresses" not in eks.outputs and "bootstrap_bundle" not in eks.outputs


def test_node_roles_per_pool_role_with_their_buckets(eks: Recording) -> None:
    attached: dict[str, set[str]] = {}
    for attachment in eks.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment"):
        attached.setdefault(attachment.inputs["role"], set()).add(
            attachment.inputs["policyArn"].rsplit("/", 1)[1]
        )
    node_policies = {
        "AmazonEKSWorkerNodePolicy",
        "AmazonEC2ContainerRegistryPullOnly",
        "AmazonEKS_CNI_Policy",
        "AmazonSSMManagedInstanceCore",
    }
    for role in ("train", "infer", "service"):
        assert attached[f"aws-k8s-eks-{role}-node-role"] == node_policies
    assert attached["aws-k8s-eks-cluster-role"] == {"AmazonEKSClusterPolicy"}
    roles = {g.name: g.inputs["nodeRoleArn"].rsplit("/", 1)[1] for g in eks.of_type(NODE_GROUP)}
    assert roles["aws-k8s-train-spot-ng"] == "aws-k8s-eks-train-node-role"
    assert roles["aws-k8s-system-ng"] == "aws-k8s-eks-service-node-role"
    infer = eks.named("aws-k8s-eks-infer-node-buckets").inputs["policy"]
    assert "models" in infer and "datasets" not in infer and "s3:PutObject" not in infer
    assert not [
        p
        for p in eks.of_type("aws:iam/rolePolicy:RolePolicy")
        if p.name == "aws-k8s-eks-service-node-buckets"
    ]


def test_the_model_server_reads_the_stacks_models_bucket_as_itself(eks: Recording) -> None:
    """`s3://models/...` in the spec names the stack's models bucket (its name is generated), and the
    model server reads it with its own Pod Identity role, which reads that bucket and nothing else."""
    [association] = [
        a
        for a in eks.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
        if a.inputs["serviceAccount"] == MODEL_SERVER_ACCOUNT
    ]
    assert association.inputs["namespace"] == "serving"
    assert association.inputs["roleArn"].endswith("/aws-k8s-eks-model-server-role")
    trust = json.loads(eks.named("aws-k8s-eks-model-server-role").inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    [read] = json.loads(eks.named("aws-k8s-eks-model-server-buckets").inputs["policy"])["Statement"]
    assert "s3:GetObject" in read["Action"] and not any("Put" in a or "Delete" in a for a in read["Action"])
    models = next(
        b for b in eks.of_type("aws:s3/bucket:Bucket") if b.inputs["bucketPrefix"].endswith("models-")
    )
    # The mocks' names (infra/plan/record.py): an ARN from the resource name, the bucket from its prefix.
    assert {r.removesuffix("/*") for r in read["Resource"]} == {f"arn:aws:mock:::bucket/{models.name}"}
    [deployment] = [
        d
        for d in eks.of_type("kubernetes:apps/v1:Deployment")
        if d.inputs["metadata"]["name"] == "model-server"
    ]
    pod = deployment.inputs["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == MODEL_SERVER_ACCOUNT and pod["automountServiceAccountToken"] is True
    [model] = [e["value"] for e in pod["containers"][0]["env"] if e["name"] == "GPUPLAT_MODEL"]
    assert model == f"s3://{models.inputs['bucketPrefix']}mock/meta-llama/Llama-3.1-8B-Instruct"
    assert not model.startswith("s3://models/")
    accounts = eks.of_type("kubernetes:core/v1:ServiceAccount")
    assert ("serving", MODEL_SERVER_ACCOUNT) in {
        (a.inputs["metadata"].get("namespace"), a.inputs["metadata"]["name"]) for a in accounts
    }


def test_the_autoscaler_scales_only_this_clusters_groups_through_pod_identity(eks: Recording) -> None:
    [association] = [
        a
        for a in eks.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
        if a.inputs["serviceAccount"] == AUTOSCALER_SERVICE_ACCOUNT
    ]
    assert association.inputs["namespace"] == AUTOSCALER_NAMESPACE
    assert association.inputs["serviceAccount"] == AUTOSCALER_SERVICE_ACCOUNT
    assert association.inputs["roleArn"].endswith("/aws-k8s-eks-autoscaler-role")
    trust = json.loads(eks.named("aws-k8s-eks-autoscaler-role").inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert trust["Action"] == ["sts:AssumeRole", "sts:TagSession"]
    statements = json.loads(eks.named("aws-k8s-eks-autoscaler-scaling").inputs["policy"])["Statement"]
    scale = next(s for s in statements if "autoscaling:SetDesiredCapacity" in s["Action"])
    assert scale["Condition"] == {
        "Null": {"aws:ResourceTag/k8s.io/cluster-autoscaler/aws-k8s-eks-cluster": "false"}
    }
    read = next(s for s in statements if s is not scale)
    assert "eks:DescribeNodegroup" in read["Action"] and not any(
        "Set" in a or "Terminate" in a for a in read["Action"]
    )


def test_admins_and_no_autoscaler(write_stack: Callable[..., Path]) -> None:
    admin = "arn:aws:iam::123456789012:role/platform-admin"

    def admins(spec: dict[str, Any]) -> None:
        spec["kubernetes"].update(admin_arns=[admin], autoscaler="none")

    recording = record(_variant(write_stack, admins))
    [entry] = [e for e in recording.of_type("aws:eks/accessEntry:AccessEntry") if "-admin-" in e.name]
    assert entry.inputs["principalArn"] == admin
    [association] = recording.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    assert association.inputs["principalArn"] == admin
    assert (
        association.inputs["policyArn"]
        == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
    )
    assert association.inputs["accessScope"] == {"type": "cluster"}
    assert [
        a.inputs["serviceAccount"]
        for a in recording.of_type("aws:eks/podIdentityAssociation:PodIdentityAssociation")
    ] == [MODEL_SERVER_ACCOUNT]
    assert not [r for r in recording.of_type("aws:iam/role:Role") if "autoscaler" in r.name]


def test_what_eks_cannot_do_is_refused_naming_the_field(write_stack: Callable[..., Path]) -> None:
    def unusable(spec: dict[str, Any]) -> None:
        spec["aws"] = {"image_id": "ami-0123456789abcdef0"}
        _pool(spec, "train-spot").update(min=0, max=0)

    platform = _variant(write_stack, unusable)
    assert [field for field, _ in eks_problems(platform)] == [
        "gpu-platform:platform.aws.image_id",
        "gpu-platform:platform.pools[2].max",
    ]
    with pytest.raises(SpecError, match=r"pools\[2\]\.max"):
        record(platform)


# ---------------------------------------------------------------------------------------------------
# policy


def test_node_groups_read_eks_node_groups(eks: Recording, platform: ResolvedPlatform) -> None:
    index = ResourceIndex(from_recorded(r) for r in eks.resources)
    groups = {g.pool: g for g in node_groups(index, PolicyContext(platform))}
    assert set(groups) == set(POOLS)
    assert {g.kind for g in groups.values()} == {"eks"}
    train, spot, infer = groups["train"], groups["train-spot"], groups["infer"]
    assert (train.anchor.name, train.role, train.min_size, train.max_size) == (
        "aws-k8s-train-ng",
        "train",
        4,
        4,
    )
    assert [t.name for t in train.templates] == ["aws-k8s-train-lt"]
    assert [(pg.name, pg.props["strategy"]) for pg in train.placement_groups] == [
        ("aws-k8s-train-placement", "cluster")
    ]
    assert [s.name for s in train.subnets] == ["aws-k8s-private-us-east-1a"]
    assert {sg.name for sg in train.security_groups} == {"aws-k8s-train-sg"}
    assert (train.on_demand_base, train.on_demand_percentage_above_base) == (4, 100.0)
    assert (spot.on_demand_base, spot.on_demand_percentage_above_base) == (0, 0.0)
    assert (infer.role, infer.min_size, infer.max_size, infer.on_demand_base) == ("infer", 2, 8, 8)


def test_the_shipped_stack_passes_every_rule(eks: Recording, platform: ResolvedPlatform) -> None:
    assert verdicts_for(platform, eks, PolicyConfig()) == []


def _changed(name: str, change: Change) -> Change:
    def apply(resource: str, props: dict[str, Any]) -> None:
        if resource == name:
            change(resource, props)

    return apply


@pytest.fixture(scope="module")
def broken(platform: ResolvedPlatform) -> Iterator[Callable[[str, str, Change], list[Verdict]]]:
    def verdicts(type_: str, name: str, change: Change) -> list[Verdict]:
        recording = record(platform, _program(type_, _changed(name, change)))
        return verdicts_for(platform, recording, PolicyConfig())

    yield verdicts


def test_a_training_group_on_the_inference_template_is_refused(
    broken: Callable[[str, str, Change], list[Verdict]],
) -> None:
    def share(name: str, props: dict[str, Any]) -> None:
        props["launch_template"] = {"id": "aws-k8s-infer-lt-id", "version": "1"}

    found = _fired(broken(NODE_GROUP, "aws-k8s-train-ng", share), "isolation-shared-resources")
    assert {v.resource for v in found} == {"aws-k8s-infer-lt", "aws-k8s-infer-sg"}


def test_a_spot_pool_on_on_demand_capacity_is_refused(
    broken: Callable[[str, str, Change], list[Verdict]],
) -> None:
    found = broken(
        NODE_GROUP, "aws-k8s-train-spot-ng", lambda _, props: props.update(capacity_type="ON_DEMAND")
    )
    assert [v.resource for v in _fired(found, "spot-interruptible-pools")] == ["aws-k8s-train-spot-ng"]


def test_training_templates_without_efa_or_placement_are_refused(
    broken: Callable[[str, str, Change], list[Verdict]],
) -> None:
    def strip(name: str, props: dict[str, Any]) -> None:
        props["network_interfaces"] = props["network_interfaces"][:8]
        props.pop("placement")

    found = broken(LT, "aws-k8s-train-lt", strip)
    assert [v.resource for v in _fired(found, "fabric-multi-node-rdma")] == ["aws-k8s-train-lt"]
    assert [v.resource for v in _fired(found, "fabric-cluster-placement")] == ["aws-k8s-train-ng"]


def test_an_untainted_inference_pool_is_refused(write_stack: Callable[..., Path]) -> None:
    platform = _variant(write_stack, lambda spec: _pool(spec, "infer").update(taints=[]))
    recording = record(platform)
    assert recording.named("aws-k8s-infer-ng").inputs["taints"] == []
    found = _fired(verdicts_for(platform, recording, PolicyConfig()), "isolation-inference-taint")
    assert [v.resource for v in found] == ["pool infer"]


def test_eks_node_groups_read_from_labels_templates_or_components(
    eks: Recording, platform: ResolvedPlatform
) -> None:
    """A node group's pool and role: its gpuplat tags, else its node labels, else its launch template's
    tags, else its parent component; a program that sets fewer of them is read the same."""

    def groups(index: ResourceIndex, context: PolicyContext | None) -> dict[str | None, tuple[Any, ...]]:
        return {
            g.anchor.name: (g.kind, g.role, g.pool, [t.name for t in g.templates],
                            [pg.name for pg in g.placement_groups], [s.name for s in g.subnets],
                            sorted({sg.name for sg in g.security_groups}), g.min_size, g.max_size)
            for g in node_groups(index, context)
        }  # fmt: skip

    def without(*, labels: bool = False, templates: bool = False, parents: bool = True) -> ResourceIndex:
        """The node groups without their gpuplat tags (and labels, their templates' tags, their parents)."""

        def strip(view: ResourceView) -> ResourceView:
            props = dict(view.props)
            if view.type == NODE_GROUP or (templates and view.type == LT):
                props["tags"] = {k: v for k, v in props["tags"].items() if k not in (TAG_POOL, TAG_ROLE)}
                if labels:
                    props.pop("labels", None)
            return replace(view, props=props, parent=view.parent if parents else None)

        return ResourceIndex(strip(from_recorded(r)) for r in eks.resources)

    context = PolicyContext(platform)
    full = groups(ResourceIndex(from_recorded(r) for r in eks.resources), context)
    assert {name: (kind, role, pool) for name, (kind, role, pool, *_) in full.items()} == {
        "aws-k8s-train-ng": ("eks", "train", "train"),
        "aws-k8s-train-spot-ng": ("eks", "train", "train-spot"),
        "aws-k8s-infer-ng": ("eks", "infer", "infer"),
        "aws-k8s-system-ng": ("eks", "service", "system"),
    }
    assert full["aws-k8s-infer-ng"][3:] == (
        ["aws-k8s-infer-lt"], [], ["aws-k8s-private-us-east-1a", "aws-k8s-private-us-east-1b"],
        ["aws-k8s-infer-sg"], 2, 8,
    )  # fmt: skip
    assert groups(without(), context) == full  # the node labels
    assert groups(without(labels=True, parents=False), None) == full  # the templates' tags
    assert groups(without(labels=True, templates=True), context) == full  # the parent components
    unknown = groups(without(labels=True, templates=True), None)
    assert {(role, pool) for _, role, pool, *_ in unknown.values()} == {(None, None)}


def test_kueue_starts_after_the_provisioning_request_crd(eks: Recording) -> None:
    """Kueue sets up its ProvisioningRequest admission check only if the CRD is served when it starts
    (cmd/kueue/main.go:512-526 at v0.19.2); the chart must wait for the CRD the autoscaler's release
    applies, or every ClusterQueue with the check stays inactive (clusterqueue.go:253-262)."""
    crd = eks.named(f"cluster-autoscaler{CRD_SUFFIX}0")
    assert crd.urn in eks.named("kueue").dependencies
