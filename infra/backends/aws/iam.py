"""One IAM role and instance profile per pool role, least privilege: its buckets, SSM, CloudWatch agent.

Beyond its buckets a role gets only what its nodes do (the statement builders below): every node reads
the bootstrap bundle; only the roles whose nodes run munged read the MUNGE key (infra/nodes/munge.py); the
controllers' role launches, names and terminates the stack's training nodes, scoped so that the tag
condition on termination holds (see `cluster_manager_statements`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.nodes.inventory import TAG_NODE, TAG_POOL, TAG_ROLE, TAG_STACK

MANAGED_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
    "arn:aws:iam::aws:policy/CloudWatchAgentServerPolicy",
)
_READ = ["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"]
_WRITE = ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]

# Which buckets (by purpose) each pool role reads and writes.
BUCKET_ACCESS: dict[str, dict[str, list[str]]] = {
    "train": {"read": ["datasets", "checkpoints", "models"], "write": ["checkpoints", "models"]},
    "infer": {"read": ["models"], "write": []},
    "service": {"read": [], "write": []},
}


@dataclass(frozen=True)
class NodeIdentityArgs:
    role: str
    bucket_arns: dict[str, pulumi.Output[str]] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    # What the role's nodes need beyond their buckets (bootstrap, cluster management): a policy document.
    platform_policy: pulumi.Input[str] | None = None


def bucket_policy_document(role: str, arns: dict[str, str]) -> str:
    access = BUCKET_ACCESS[role]
    statements: list[dict[str, Any]] = []
    for verb, actions in (("read", _READ), ("write", _WRITE)):
        targets = [arns[p] for p in access[verb] if p in arns]
        if targets:
            statements.append(
                {
                    "Sid": f"{verb.capitalize()}Buckets",
                    "Effect": "Allow",
                    "Action": actions,
                    "Resource": sorted(targets + [f"{a}/*" for a in targets]),
                }
            )
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, sort_keys=True)


def service_trust_policy(service: str, actions: Sequence[str] = ("sts:AssumeRole",)) -> str:
    """A role's trust policy: `service` (ec2.amazonaws.com, eks.amazonaws.com, ...) may assume it."""
    action: str | list[str] = actions[0] if len(actions) == 1 else list(actions)
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": action}],
        }
    )


def node_role(
    name: str, args: NodeIdentityArgs, managed_policies: Sequence[str], opts: pulumi.ResourceOptions
) -> aws.iam.Role:
    """The IAM role of a pool role's nodes: the managed policies, its buckets, its platform policy."""
    role = aws.iam.Role(
        f"{name}-role",
        assume_role_policy=service_trust_policy("ec2.amazonaws.com"),
        # The pool role it serves: the policy rules find which nodes hold which permissions by it.
        tags={**args.tags, TAG_ROLE: args.role},
        opts=opts,
    )
    for index, policy in enumerate(managed_policies):
        aws.iam.RolePolicyAttachment(f"{name}-managed-{index}", role=role.name, policy_arn=policy, opts=opts)
    if any(BUCKET_ACCESS[args.role].values()) and args.bucket_arns:
        purposes = sorted(args.bucket_arns)
        document = pulumi.Output.all(*[args.bucket_arns[p] for p in purposes]).apply(
            lambda arns: bucket_policy_document(args.role, dict(zip(purposes, arns, strict=True)))
        )
        aws.iam.RolePolicy(f"{name}-buckets", role=role.id, policy=document, opts=opts)
    if args.platform_policy is not None:
        aws.iam.RolePolicy(f"{name}-platform", role=role.id, policy=args.platform_policy, opts=opts)
    return role


class NodeIdentity(pulumi.ComponentResource):
    def __init__(self, name: str, args: NodeIdentityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-platform:aws:NodeIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role = node_role(name, args, MANAGED_POLICIES, child)
        self.profile = aws.iam.InstanceProfile(
            f"{name}-profile", role=self.role.name, tags=args.tags, opts=child
        )
        self.register_outputs({"role_arn": self.role.arn, "instance_profile_arn": self.profile.arn})


def bootstrap_statements(platform_bucket_arn: str) -> list[dict[str, Any]]:
    """Every node: read the bundle and the group vars."""
    return [
        {"Sid": "ReadBootstrapBundle", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": [f"{platform_bucket_arn}/bootstrap/*"]},
    ]  # fmt: skip


def munge_key_statements(munge_parameter_arn: str) -> list[dict[str, Any]]:
    """Nodes that run munged (the Slurm controllers and training nodes, infra/nodes/munge.py): read the MUNGE
    key. Anyone holding it can mint credentials Slurm trusts as any user: inference and other nodes never
    get it."""
    return [
        {"Sid": "ReadMungeKey", "Effect": "Allow", "Action": ["ssm:GetParameter"],
         "Resource": [munge_parameter_arn]},
    ]  # fmt: skip


# What reads a parameter's value: AmazonSSMManagedInstanceCore, which every node role and the image build
# role carry (SSM Session Manager, Image Builder's agent), allows ssm:GetParameter and ssm:GetParameters on
# "*" (the policy's document as moto 5.2 ships it, moto/iam/aws_managed_policies.py), and the key is a
# SecureString under the account's aws/ssm KMS key, whose policy lets every principal of the account decrypt
# through SSM. So a role that must not read the key is denied it outright: an explicit Deny overrides any
# Allow (IAM User Guide, "Policy evaluation logic").
_PARAMETER_READS = ["ssm:GetParameter", "ssm:GetParameters", "ssm:GetParameterHistory"]


def munge_key_denied_statements(munge_parameter_arn: str) -> list[dict[str, Any]]:
    """Every other role (inference nodes, whose model server a job's user may reach, the image builds):
    no read of the MUNGE key, by name or by path, whatever a managed policy allows."""
    prefix, _, name = munge_parameter_arn.partition(":parameter/")
    parts = name.split("/")
    paths = [f"{prefix}:parameter/{'/'.join(parts[:n])}" for n in range(1, len(parts))] + [
        f"{prefix}:parameter/"
    ]
    return [
        {"Sid": "NoMungeKey", "Effect": "Deny", "Action": _PARAMETER_READS,
         "Resource": [munge_parameter_arn]},
        {"Sid": "NoMungeKeyByPath", "Effect": "Deny", "Action": ["ssm:GetParametersByPath"],
         "Resource": paths},
    ]  # fmt: skip


# The EC2 Spot service-linked role (AWSServiceRoleForEC2Spot): "If you use the AWS CLI or an API to
# request a Spot Instance, you must first ensure that this role exists" (EC2 User Guide, "Service-linked
# role for Spot Instance requests"). EC2 creates it on the first spot RunInstances of an account when the
# caller may: the controllers' resume program is that caller on a fresh account.
SPOT_SERVICE = "spot.amazonaws.com"
SPOT_SERVICE_LINKED_ROLE = "AWSServiceRoleForEC2Spot"
# The resource types RunInstances touches when it launches from a training pool's template: the
# template, the image and its snapshots, the network (subnet, security groups, the EFA/ENA interfaces it
# creates), the root volume it creates, the cluster placement group, a capacity reservation or Capacity
# Block, and the spot request a spot template makes. As AWS ParallelCluster's head node lists them
# (aws/aws-parallelcluster, cli/src/pcluster/templates/cdk_builder_utils.py: EC2RunInstancesCreateFleet,
# AllowRunningReservedCapacity) and Karpenter's controller (snapshot, spot-instances-request). Images and
# snapshots may be another account's (AWS or a marketplace): no account in their ARNs.
# The network ones must be in the stack's VPC (`ec2:Vpc`: the resume program names a pool's subnet in the
# request); the others must come from the launch template (`ec2:IsLaunchTemplateResource`), so a
# controller cannot launch another image or attach another volume or reservation (EC2 User Guide,
# "Example policies to control access the Amazon EC2 API": launch instances into a specific VPC, and
# "Work with launch templates": IsLaunchTemplateResource). The spot request is the launch's own.
# Which key applies to which resource type, per the Service Authorization Reference's EC2 table
# ("Actions, resources, and condition keys for Amazon EC2", as stored in salesforce/policy_sentry,
# policy_sentry/shared/data/docs/list_amazonec2.html at c0d416c, 2026-05-10): RunInstances lists
# ec2:Vpc for subnet, security-group and network-interface; ec2:IsLaunchTemplateResource and
# ec2:LaunchTemplate for every resource type it names (image, snapshot, volume, placement-group,
# capacity-reservation, launch-template, instance ...); aws:ResourceTag for the existing ones (the
# template), aws:RequestTag for the created ones (instance, volume, network-interface). CreateTags lists
# ec2:CreateAction for every resource type, aws:ResourceTag and aws:TagKeys for instance;
# TerminateInstances ec2:ResourceTag and aws:ResourceTag for instance. spot-instances-request is listed
# under CreateTags only, not RunInstances or CreateFleet: LaunchItsSpotRequest is Karpenter's, kept as an
# allow that matches nothing if EC2 never asks it (tests/pulumi/test_aws_iam.py checks each statement's
# keys against that table).
_LAUNCH_NETWORK = ("subnet", "security-group", "network-interface")
_LAUNCH_FROM_TEMPLATE = ("volume", "placement-group", "capacity-reservation")
_LAUNCH_CREATES = ("spot-instances-request",)
_OWNERLESS = ("image", "snapshot")
# What a launch from those templates creates and tags (the templates' tag specifications, the request's).
_TAGGED_AT_LAUNCH = ("instance", "volume", "network-interface", "spot-instances-request")
# The tags the resume program sets on an instance after launch (roles/slurm_elastic/files/
# gpuplat_ec2_nodes/ec2.py, Ec2Nodes.tag_node): its node name and its Name. Nothing else, on existing
# instances: never gpuplat:stack, which the termination condition trusts.
NODE_TAG_KEYS = (TAG_NODE, "Name")
# The fleet's stop: `gpuplat down` tags the stack's training templates so before it terminates the fleet
# (roles/slurm_elastic/files/gpuplat_ec2_nodes/ec2.py TAG_FLEET, teardown.py), and no launch from a
# template so tagged is allowed, whatever the program on a controller does. A template without the tag
# passes: "If the policy condition requires that the key is not matched, such as StringNotLike or
# ArnNotLike, and the right key is not present, the condition is true" (IAM User Guide, "IAM JSON policy
# elements: Condition operators", https://docs.aws.amazon.com/IAM/latest/UserGuide/
# reference_policies_elements_condition_operators.html). Nothing here may tag a template.
TAG_FLEET = "gpuplat:fleet"
FLEET_STOPPED = "stopped"
NOT_STOPPED = {"StringNotEquals": {f"aws:ResourceTag/{TAG_FLEET}": FLEET_STOPPED}}


@dataclass(frozen=True)
class AccountScope:
    """Where ARNs point: the partition, the stack's region and account."""

    partition: str
    region: str
    account: str

    def ec2(self, resource: str, account: str | None = None) -> str:
        owner = self.account if account is None else account
        return f"arn:{self.partition}:ec2:{self.region}:{owner}:{resource}"

    def ssm_parameter(self, name: str) -> str:
        """A parameter's ARN: a name of a hierarchy (leading /) follows `parameter` without a second slash
        (Service Authorization Reference, AWS Systems Manager: arn:${Partition}:ssm:${Region}:${Account}:
        parameter/${ParameterNameWithoutLeadingSlash})."""
        return f"arn:{self.partition}:ssm:{self.region}:{self.account}:parameter/{name.lstrip('/')}"


def cluster_manager_statements(
    stack: str,
    train_role_arns: list[str],
    scope: AccountScope,
    vpc_arn: str,
    spot: bool = False,
    fleet_pools: Mapping[str, Sequence[str]] | None = None,
) -> list[dict[str, Any]]:
    """The controllers: launch, name and terminate training nodes (Slurm power saving), find inference
    nodes (gateway and Prometheus discovery) and, with a spot training pool, let EC2 create the spot
    service-linked role.

    The termination condition (tag gpuplat:stack) holds only if nothing else can set that tag, so:
    - RunInstances creates an instance only from a launch template (`ec2:LaunchTemplate` on the instance)
      and only with the request tag gpuplat:stack of this stack, and the template must be one of the
      stack's training templates (tagged gpuplat:stack and gpuplat:role train, which only `pulumi up`
      sets; nothing here may tag a template). Every resource of a launch must be allowed, so what the
      template uses (image, subnet, security groups, volumes, ...) needs no condition of its own;
    - CreateTags only as part of that launch (`ec2:CreateAction` RunInstances), or on an instance that
      already carries this stack's tag and then only the keys the resume program sets (gpuplat:node,
      Name): gpuplat:stack is never changed on an existing instance;
    - TerminateInstances, and CreateTags on existing instances, only of instances tagged with this stack
      and the training role: never a controller or an inference node of the stack;
    - the launch's subnet, security groups and interfaces in the stack's VPC, its image, snapshots,
      volumes, placement group and reservation those of the template.
    What the resume program does (roles/slurm_elastic/files/gpuplat_ec2_nodes) stays allowed:
    RunInstances with LaunchTemplate and TagSpecifications (gpuplat:stack, gpuplat:pool), then
    CreateTags (gpuplat:node, Name) on the new instance. The pattern is Karpenter's controller policy
    (aws/karpenter-provider-aws, getting-started cloudformation.yaml: AllowScopedEC2InstanceActions,
    AllowScopedResourceCreationTagging, AllowScopedResourceTagging, AllowScopedDeletion) and the EC2
    User Guide's launch-template examples (ExamplePolicies_EC2, "Launch templates").
    """
    templates = scope.ec2("launch-template/*")
    from_template = {"ArnLike": {"ec2:LaunchTemplate": templates}}
    instances = scope.ec2("instance/*")
    own_nodes = {f"aws:ResourceTag/{TAG_STACK}": stack, f"aws:ResourceTag/{TAG_ROLE}": "train"}
    # CreateTags' ec2:CreateAction: the launch that creates and tags (the reference lists the key for
    # every resource type of CreateTags); an instant fleet tags the fleet too.
    fleet = bool(fleet_pools)
    launch_actions = ["RunInstances", "CreateFleet"] if fleet else "RunInstances"
    tagged_at_launch = _TAGGED_AT_LAUNCH + (("fleet",) if fleet else ())
    statements: list[dict[str, Any]] = [
        {"Sid": "DiscoverInstances", "Effect": "Allow",
         "Action": ["ec2:DescribeInstances", "ec2:DescribeInstanceStatus",
                    "autoscaling:DescribeAutoScalingInstances"], "Resource": "*"},
        # The resume program reads the fleet's stop from the templates' tags (Ec2Nodes.stopped_templates),
        # reconcile which template version each node runs (gpuplat_ec2_nodes/outdated.py). Neither action
        # takes a resource ARN (the reference lists no resource type for them: list_amazonec2.html at
        # c0d416c, lines 33004 and 31418).
        {"Sid": "ReadFleetStopAndPoolDefinitions", "Effect": "Allow",
         "Action": ["ec2:DescribeTags", "ec2:DescribeLaunchTemplateVersions"], "Resource": "*"},
        {"Sid": "LaunchFromStackTrainingTemplates", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": [templates],
         "Condition": {"StringEquals": {f"aws:ResourceTag/{TAG_STACK}": stack,
                                        f"aws:ResourceTag/{TAG_ROLE}": "train"}, **NOT_STOPPED}},
        {"Sid": "LaunchInTheStackVpc", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": sorted(scope.ec2(f"{kind}/*") for kind in _LAUNCH_NETWORK),
         "Condition": {"ArnEquals": {"ec2:Vpc": vpc_arn}}},
        {"Sid": "LaunchWhatTheTemplateUses", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": sorted([scope.ec2(f"{kind}/*") for kind in _LAUNCH_FROM_TEMPLATE]
                            + [scope.ec2(f"{kind}/*", account="") for kind in _OWNERLESS]),
         "Condition": {"Bool": {"ec2:IsLaunchTemplateResource": "true"}}},
        {"Sid": "LaunchItsSpotRequest", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": [scope.ec2(f"{kind}/*") for kind in _LAUNCH_CREATES]},
        {"Sid": "LaunchStackTaggedInstances", "Effect": "Allow", "Action": ["ec2:RunInstances"],
         "Resource": [instances],
         "Condition": {**from_template, "StringEquals": {f"aws:RequestTag/{TAG_STACK}": stack}}},
        {"Sid": "TagAtLaunch", "Effect": "Allow", "Action": ["ec2:CreateTags"],
         "Resource": sorted(scope.ec2(f"{kind}/*") for kind in tagged_at_launch),
         "Condition": {"StringEquals": {"ec2:CreateAction": launch_actions}}},
        {"Sid": "NameOwnNodes", "Effect": "Allow", "Action": ["ec2:CreateTags"], "Resource": [instances],
         "Condition": {"StringEquals": own_nodes,
                       "ForAllValues:StringEquals": {"aws:TagKeys": list(NODE_TAG_KEYS)}}},
        {"Sid": "TerminateOwnNodes", "Effect": "Allow", "Action": ["ec2:TerminateInstances"],
         "Resource": [instances],
         "Condition": {"StringEquals": {f"ec2:ResourceTag/{TAG_STACK}": stack,
                                        f"ec2:ResourceTag/{TAG_ROLE}": "train"}}},
        {"Sid": "PassTrainingRole", "Effect": "Allow", "Action": ["iam:PassRole"],
         "Resource": sorted(train_role_arns),
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}},
    ]  # fmt: skip
    if fleet_pools:
        statements += fleet_statements(stack, scope, vpc_arn, fleet_pools)
    if spot:
        statements.append(
            {"Sid": "CreateSpotServiceLinkedRole", "Effect": "Allow",
             "Action": ["iam:CreateServiceLinkedRole"],
             "Resource": [f"arn:{scope.partition}:iam::{scope.account}:role/aws-service-role/{SPOT_SERVICE}/"
                          f"{SPOT_SERVICE_LINKED_ROLE}"],
             "Condition": {"StringEquals": {"iam:AWSServiceName": SPOT_SERVICE}}}
        )  # fmt: skip
    return statements


def fleet_statements(
    stack: str, scope: AccountScope, vpc_arn: str, pool_types: Mapping[str, Sequence[str]]
) -> list[dict[str, Any]]:
    """CreateFleet (type instant) for pools with several instance types or zones
    (roles/slurm_elastic/files/gpuplat_ec2_nodes/ec2.py, Ec2Nodes.fleet_request), per the Service
    Authorization Reference's EC2 table ("Actions, resources, and condition keys for Amazon EC2", as
    stored in salesforce/policy_sentry, policy_sentry/shared/data/docs/list_amazonec2.html at c0d416c,
    2026-05-10): CreateFleet touches fleet* and instance* (aws:RequestTag), launch-template
    (aws:ResourceTag), subnet (ec2:Vpc), and image, placement-group and volume; "Resource-level
    permissions for this action do not include the resources specified in a launch template. To specify
    resource-level permissions for resources specified in a launch template, you must include the
    resources in the RunInstances action statement". So the template's image, network, volumes and
    placement group stay under the RunInstances statements (ec2:IsLaunchTemplateResource, ec2:Vpc), and
    CreateFleet is allowed on what the request itself names: the stack's training templates, the
    subnets of the stack's VPC (the overrides), and the fleet and instances tagged with this stack at
    launch. An override of the image, volumes or placement group is not allowed. An instant fleet needs
    no EC2 Fleet service-linked role (EC2 User Guide, "EC2 Fleet prerequisites": "An instant EC2 Fleet
    does not require this role").

    The instances of each pool only of the types the pool declares (its own and its alternates): the
    reference lists ec2:InstanceType ("Filters access by the type of instance") for CreateFleet's
    instance* (list_amazonec2.html at c0d416c, line 6758), and the resume program tags each instance with
    its pool at launch (aws:RequestTag/gpuplat:pool, Ec2Nodes.launch_tags). IAM cannot tie the type to
    the template named in the same request, so a pool's statement holds its pool tag, not its template."""
    statements: list[dict[str, Any]] = [
        {"Sid": "FleetFromStackTrainingTemplates", "Effect": "Allow", "Action": ["ec2:CreateFleet"],
         "Resource": [scope.ec2("launch-template/*")],
         "Condition": {"StringEquals": {f"aws:ResourceTag/{TAG_STACK}": stack,
                                        f"aws:ResourceTag/{TAG_ROLE}": "train"}, **NOT_STOPPED}},
        {"Sid": "FleetInTheStackVpc", "Effect": "Allow", "Action": ["ec2:CreateFleet"],
         "Resource": [scope.ec2("subnet/*")],
         "Condition": {"ArnEquals": {"ec2:Vpc": vpc_arn}}},
        {"Sid": "FleetTaggedWithTheStack", "Effect": "Allow", "Action": ["ec2:CreateFleet"],
         "Resource": [scope.ec2("fleet/*")],
         "Condition": {"StringEquals": {f"aws:RequestTag/{TAG_STACK}": stack}}},
    ]  # fmt: skip
    for index, (pool, types) in enumerate(sorted(pool_types.items())):
        statements.append(
            {"Sid": f"FleetInstancesOfPool{index}", "Effect": "Allow", "Action": ["ec2:CreateFleet"],
             "Resource": [scope.ec2("instance/*")],
             "Condition": {"StringEquals": {f"aws:RequestTag/{TAG_STACK}": stack,
                                            f"aws:RequestTag/{TAG_POOL}": pool,
                                            "ec2:InstanceType": sorted(set(types))}}}
        )  # fmt: skip
    return statements


def inference_node_statements(stack: str) -> list[dict[str, Any]]:
    """Inference nodes complete the termination hook of their own group once drained (the scaling
    agent); only groups of this stack (the group's tag; Service Authorization Reference, Amazon EC2 Auto
    Scaling: CompleteLifecycleAction takes aws:ResourceTag on the autoScalingGroup resource)."""
    own_groups = {"StringEquals": {f"aws:ResourceTag/{TAG_STACK}": stack}}
    return [
        {
            "Sid": "CompleteOwnTermination",
            "Effect": "Allow",
            "Action": ["autoscaling:CompleteLifecycleAction"],
            "Resource": "*",
            "Condition": own_groups,
        }
    ]


# Every call that changes a parameter or its metadata (Service Authorization Reference, AWS Systems Manager,
# actions on the `parameter` resource type that write or tag).
_PARAMETER_WRITES = [
    "ssm:PutParameter", "ssm:DeleteParameter", "ssm:DeleteParameters", "ssm:LabelParameterVersion",
    "ssm:UnlabelParameterVersion", "ssm:AddTagsToResource", "ssm:RemoveTagsFromResource",
]  # fmt: skip


def serving_version_statements(record_arn: str, reader: bool) -> list[dict[str, Any]]:
    """The stack's serving version record (infra/serving/version_record.py): the inference nodes read it at
    boot (`reader`); no node role writes it (a compromised model server would otherwise choose what every
    instance started later serves), and every other node role is denied a read, whatever
    AmazonSSMManagedInstanceCore allows (ssm:GetParameter on "*", see _PARAMETER_READS). The operator's own
    credentials write it."""
    read = {"Action": _PARAMETER_READS, "Resource": [record_arn]}
    return [
        {"Sid": "ServingVersionRead" if reader else "NoServingVersionRead",
         "Effect": "Allow" if reader else "Deny", **read},
        {"Sid": "NoServingVersionWrite", "Effect": "Deny", "Action": _PARAMETER_WRITES,
         "Resource": [record_arn]},
    ]  # fmt: skip


def policy_document(statements: list[dict[str, Any]]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, sort_keys=True)


def inline_policy(
    name: str,
    role: aws.iam.Role,
    subject: pulumi.Input[str],
    statements: Callable[[str], list[dict[str, Any]]],
    opts: pulumi.ResourceOptions,
) -> aws.iam.RolePolicy:
    """A role's inline policy of the statements about one resource known only once it exists (an ARN,
    a cluster name)."""
    document = pulumi.Output.from_input(subject).apply(lambda value: policy_document(statements(value)))
    return aws.iam.RolePolicy(name, role=role.id, policy=document, opts=opts)
