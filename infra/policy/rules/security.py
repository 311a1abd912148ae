"""Security rules: IMDSv2, encryption at rest, S3 public access, open ingress, required tags."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from infra.policy.rules.base import Finding, PolicyContext, _get, _items, _truthy
from infra.policy.rules.resource_types import (
    BUCKET_PAB,
    BUCKET_SSE,
    BUCKETS,
    INGRESS_RULE,
    INSTANCE,
    LAUNCH_TEMPLATE,
    OPEN_IPV4,
    OPEN_IPV6,
    SG_RULE,
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
