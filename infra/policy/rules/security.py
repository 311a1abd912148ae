"""Security rules: IMDSv2, encryption at rest, S3 public access, open ingress, required tags, and the
IAM grants that must stay narrow: the MUNGE key only for nodes that run munged, and EC2 launch, tag and
terminate rights only under conditions that keep the stack tag trustworthy."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from fnmatch import fnmatchcase
from typing import Any

from infra.nodes.inventory import TAG_ROLE, TAG_STACK
from infra.nodes.munge import munge_pools, munge_roles
from infra.policy.rules.base import Finding, PolicyContext, _get, _items, _truthy
from infra.policy.rules.resource_types import (
    BUCKET_PAB,
    BUCKET_SSE,
    BUCKETS,
    IAM_ROLE,
    IAM_ROLE_POLICY,
    INGRESS_RULE,
    INSTANCE,
    LAUNCH_TEMPLATE,
    OPEN_IPV4,
    OPEN_IPV6,
    SG_RULE,
    SSM_PARAMETER,
    VOLUME,
)
from infra.policy.view import UNKNOWN, ResourceIndex, ResourceView


def check_imdsv2(resource: ResourceView, ctx: PolicyContext) -> Iterator[str]:
    tokens = _get(resource.props, "metadataOptions", "httpTokens")
    if tokens == UNKNOWN:
        return
    if tokens != "required":
        yield (
            f"metadataOptions.httpTokens is {tokens or 'unset (optional)'}: IMDSv1 lets any SSRF in a "
            "workload read the node's IAM credentials"
        )


def check_ebs_encrypted(resource: ResourceView, ctx: PolicyContext) -> Iterator[str]:
    volumes: list[tuple[str, Any]] = []
    if resource.type == LAUNCH_TEMPLATE:
        for mapping in _items(resource.props.get("blockDeviceMappings")):
            if isinstance(_get(mapping, "ebs"), Mapping):
                volumes.append((str(_get(mapping, "deviceName")), _get(mapping, "ebs", "encrypted")))
    elif resource.type == INSTANCE:
        volumes.append(("root", _get(resource.props, "rootBlockDevice", "encrypted")))
        for device in _items(resource.props.get("ebsBlockDevices")):
            volumes.append((str(_get(device, "deviceName")), _get(device, "encrypted")))
    elif resource.type == VOLUME:
        volumes.append(("volume", resource.props.get("encrypted")))
    for device, encrypted in volumes:
        if encrypted != UNKNOWN and not _truthy(encrypted):
            yield f"EBS volume {device} is not encrypted: node disks hold datasets, checkpoints, credentials"


def check_fsx_encrypted(resource: ResourceView, ctx: PolicyContext) -> Iterator[str]:
    deployment = str(resource.props.get("deploymentType") or "SCRATCH_1")
    if deployment != UNKNOWN and not deployment.startswith("PERSISTENT"):
        yield (
            f"deployment type {deployment}: only PERSISTENT deployments are encrypted at rest under a KMS "
            "key you control (kmsKeyId)"
        )


def _bucket_settings(index: ResourceIndex, types: tuple[str, ...]) -> dict[str, list[ResourceView]]:
    result: dict[str, list[ResourceView]] = {}
    for setting in index.of_type(*types):
        for bucket in index.referenced(setting, "bucket"):
            result.setdefault(bucket.urn or bucket.name, []).append(setting)
    return result


def check_s3_encrypted(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    settings = _bucket_settings(index, BUCKET_SSE)
    for bucket in index.of_type(*BUCKETS):
        configured = [
            _get(rule, "applyServerSideEncryptionByDefault", "sseAlgorithm")
            for s in settings.get(bucket.urn or bucket.name, [])
            for rule in _items(s.props.get("rules"))
        ]
        configured += [
            _get(rule, "applyServerSideEncryptionByDefault", "sseAlgorithm")
            for rule in _items(_get(bucket.props, "serverSideEncryptionConfiguration", "rules"))
        ]
        if not any(a in ("aws:kms", "aws:kms:dsse", "AES256", UNKNOWN) for a in configured):
            yield Finding(
                bucket.name,
                f"bucket {bucket.name!r} has no server-side encryption configuration: datasets, models and "
                "checkpoints must be encrypted at rest under a key the platform chooses",
                bucket.urn or None,
            )


_PAB_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")


def check_s3_public_access(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    blocks = _bucket_settings(index, (BUCKET_PAB,))
    for bucket in index.of_type(*BUCKETS):
        found = blocks.get(bucket.urn or bucket.name, [])
        open_flags = sorted(
            {
                f
                for b in found
                for f in _PAB_FLAGS
                if not _truthy(b.props.get(f)) and b.props.get(f) != UNKNOWN
            }
        )
        if not found or open_flags:
            detail = f"{', '.join(open_flags)} off" if found else "no public access block"
            yield Finding(
                bucket.name,
                f"bucket {bucket.name!r} has {detail}: one wrong ACL or policy publishes training data",
                bucket.urn or None,
            )


def check_open_ingress(resource: ResourceView, ctx: PolicyContext) -> Iterator[str]:
    props = resource.props
    if resource.type == INGRESS_RULE:
        cidrs = [props.get("cidrIpv4"), props.get("cidrIpv6")]
    elif resource.type == SG_RULE:
        if props.get("type") != "ingress":
            return
        cidrs = _items(props.get("cidrBlocks")) + _items(props.get("ipv6CidrBlocks"))
    else:
        cidrs = [
            cidr
            for rule in _items(props.get("ingress"))
            for cidr in _items(_get(rule, "cidrBlocks")) + _items(_get(rule, "ipv6CidrBlocks"))
        ]
    for cidr in cidrs:
        if cidr in (OPEN_IPV4, OPEN_IPV6):
            yield (
                f"ingress from {cidr} exposes GPU nodes to the internet; administration goes through SSM "
                "and serving through the gateway"
            )


def check_required_tags(resource: ResourceView, ctx: PolicyContext) -> Iterator[str]:
    tags = resource.tags()
    tags_all = resource.props.get("tagsAll")
    if isinstance(tags_all, Mapping):
        tags = {**{str(k): str(v) for k, v in tags_all.items()}, **tags}
    missing = [key for key in ctx.config.required_tags if not tags.get(key, "").strip()]
    if missing:
        yield (
            f"missing tag{'s' if len(missing) > 1 else ''} {', '.join(missing)}: cost reports and owners are "
            "found through them"
        )


# ---------------------------------------------------------------------------------------------------
# IAM: who may read the MUNGE key, and launch, tag and terminate instances


def _policy_statements(document: Any) -> list[Mapping[str, Any]] | None:
    """The statements of an IAM policy document (a JSON string or a mapping); None where it is not
    known (a preview's unknown) or not a policy."""
    if isinstance(document, str):
        if document == UNKNOWN:
            return None
        try:
            document = json.loads(document)
        except ValueError:
            return None
    if not isinstance(document, Mapping):
        return None
    statements = document.get("Statement")
    if isinstance(statements, Mapping):
        statements = [statements]
    return [s for s in _items(statements) if isinstance(s, Mapping)]


def _strings(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in _items(value)]


def _allows(statement: Mapping[str, Any], action: str) -> bool:
    """An Allow statement that grants `action` (wildcards as IAM matches them, case-insensitive)."""
    if statement.get("Effect") != "Allow":
        return False
    if "NotAction" in statement:
        return not any(fnmatchcase(action.lower(), a.lower()) for a in _strings(statement["NotAction"]))
    return any(fnmatchcase(action.lower(), a.lower()) for a in _strings(statement.get("Action")))


def _covers(statement: Mapping[str, Any], arn_matches: Callable[[str], bool]) -> bool:
    """Whether the statement's resources include one `arn_matches` accepts (`*` includes all)."""
    if "NotResource" in statement:
        return True  # everything but some: judged as covering (the rule errs towards flagging)
    return any(r == UNKNOWN or arn_matches(r) for r in _strings(statement.get("Resource")))


def _instance_arn(pattern: str) -> bool:
    """An ARN pattern that matches EC2 instances (`*`, `arn:aws:ec2:*:*:instance/*`, ...), in any
    partition, region and account."""
    if pattern == "*":
        return True
    parts = pattern.split(":", 5)
    return (
        len(parts) == 6
        and fnmatchcase("ec2", parts[2])
        and fnmatchcase("instance/i-0123456789abcdef0", parts[5])
    )


def _condition_keys(statement: Mapping[str, Any]) -> dict[str, list[tuple[str, list[str]]]]:
    """Condition key (lower case) -> [(operator, values)]."""
    found: dict[str, list[tuple[str, list[str]]]] = {}
    condition = statement.get("Condition")
    if not isinstance(condition, Mapping):
        return found
    for operator, block in condition.items():
        if isinstance(block, Mapping):
            for key, values in block.items():
                found.setdefault(str(key).lower(), []).append((str(operator), _strings(values)))
    return found


_STACK_TAG_KEY = TAG_STACK.lower()


def _retags_stack(keys: dict[str, list[tuple[str, list[str]]]]) -> bool:
    """CreateTags on existing instances that may set the stack tag: not limited to a launch
    (ec2:CreateAction) nor to tag keys that exclude gpuplat:stack (ForAllValues on aws:TagKeys)."""
    if "ec2:createaction" in keys:
        return False
    for operator, values in keys.get("aws:tagkeys", []):
        listed = operator.startswith("ForAllValues:") and operator.endswith(("StringEquals", "StringLike"))
        if listed and not any(fnmatchcase(_STACK_TAG_KEY, v.lower()) for v in values):
            return False
    return True


def _ec2_problems(statements: list[Mapping[str, Any]]) -> Iterator[str]:
    for statement in statements:
        sid = f"statement {statement.get('Sid')!r}" if statement.get("Sid") else "a statement"
        if not _covers(statement, _instance_arn):
            continue
        keys = _condition_keys(statement)
        for action in ("ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateTags", "ec2:TerminateInstances"):
            if not _allows(statement, action):
                continue
            if not keys:
                yield (
                    f"{sid} allows {action} on instances without a condition: "
                    + {
                        "ec2:RunInstances": "anything can be launched (any template, image or tags) with "
                        "the roles this principal may pass",
                        "ec2:CreateFleet": "instances of any template and tags can be launched through an "
                        "EC2 Fleet",
                        "ec2:CreateTags": "any instance can be tagged gpuplat:stack and then terminated "
                        "through the tag-conditioned termination",
                        "ec2:TerminateInstances": "any instance of the account can be terminated",
                    }[action]
                )
            elif action == "ec2:CreateTags" and _retags_stack(keys):
                yield (
                    f"{sid} allows ec2:CreateTags on existing instances with any tag key: an instance "
                    f"can be (re)tagged {TAG_STACK} and so brought under the stack's termination right; "
                    "limit it to ec2:CreateAction RunInstances or to tag keys without gpuplat:stack"
                )


def check_ec2_launch_scoped(resource: ResourceView, ctx: PolicyContext) -> Iterator[str]:
    """RunInstances, CreateFleet, CreateTags and TerminateInstances are never granted on instances without
    a condition, and CreateTags never lets an existing instance get the stack tag."""
    for document in _policy_documents(resource):
        statements = _policy_statements(document)
        if statements is not None:
            yield from _ec2_problems(statements)


def _policy_documents(resource: ResourceView) -> list[Any]:
    if resource.type == IAM_ROLE:
        return [_get(p, "policy") for p in _items(resource.props.get("inlinePolicies"))]
    return [resource.props.get("policy")]


_SSM_READS = ("ssm:GetParameter", "ssm:GetParameters", "ssm:GetParametersByPath", "ssm:GetParameterHistory")


def _munge_parameters(index: ResourceIndex) -> list[ResourceView]:
    return [p for p in index.of_type(SSM_PARAMETER) if "munge" in str(p.props.get("name") or p.name).lower()]


def _names_parameter(pattern: str, parameter: ResourceView) -> bool:
    """Whether a Resource entry of a policy names the parameter: `*`, its ARN (any partition, region
    and account: `arn:...:parameter/<name>`), or a wildcard that matches it."""
    if pattern in ("*", UNKNOWN) or pattern in parameter.ids:
        return True
    if ":parameter" not in pattern:
        return False
    path = pattern.split(":parameter", 1)[1]
    names = {str(parameter.props.get("name") or ""), "/" + parameter.name}
    return any(name and fnmatchcase(name, path) for name in names)


def _reads_munge_key(statements: list[Mapping[str, Any]], parameters: list[ResourceView]) -> bool:
    return any(
        _allows(s, action) and _covers(s, lambda r: any(_names_parameter(r, p) for p in parameters))
        for s in statements
        for action in _SSM_READS
    )


def _policy_role(index: ResourceIndex, policy: ResourceView) -> str | None:
    """The pool role (train, infer, service) whose nodes hold a role policy: its IAM role's gpuplat:role
    tag, else the role's name (`<stack>-<role>-role`, the NodeIdentity naming)."""
    for role in index.referenced(policy, "role", type_=IAM_ROLE):
        tagged = role.tag(TAG_ROLE)
        if tagged and tagged != UNKNOWN:
            return tagged
        for pool_role in ("train", "infer", "service"):
            if role.name.endswith(f"-{pool_role}-role"):
                return pool_role
    return None


def check_munge_key_readers(index: ResourceIndex, ctx: PolicyContext) -> Iterator[Finding]:
    """Only the node roles of pools that run munged (infra/nodes/munge.py) may read the MUNGE key."""
    platform = ctx.platform
    if platform is None:
        return
    parameters = _munge_parameters(index)
    if not parameters:
        return
    readers = munge_roles(platform)
    for policy in index.of_type(IAM_ROLE_POLICY):
        statements = _policy_statements(policy.props.get("policy"))
        if statements is None or not _reads_munge_key(statements, parameters):
            continue
        role = _policy_role(index, policy)
        if role is not None and role in readers:
            continue
        pools = ", ".join(p.name for p in platform.pools if p.role == role) or "no pool of the stack"
        runners = ", ".join(sorted(p.name for p in munge_pools(platform))) or "none"
        yield Finding(
            policy.name,
            f"{policy.name} lets the {role or 'unknown'} nodes ({pools}) read the MUNGE key, but they do "
            f"not run munged (pools that do: {runners}): whoever holds the key can forge Slurm "
            "credentials for any user",
            policy.urn or None,
        )
