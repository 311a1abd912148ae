"""Storage: FSx for Lustre sized for the training GPUs' read demand, and the S3 buckets."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.backends.aws.naming import bucket_prefix, stack_bucket_uri
from infra.platform.storage import LustreLayout


@dataclass(frozen=True)
class BucketArgs:
    purpose: str
    noncurrent_retention_days: int
    expire_days: int | None = None  # current objects too (transfer buckets)


@dataclass(frozen=True)
class ObjectStoreArgs:
    stack: str
    buckets: list[BucketArgs]
    tags: dict[str, str]


def stack_object_uri(uri: str, buckets: dict[str, aws.s3.Bucket]) -> pulumi.Input[str]:
    """`stack_bucket_uri` with the buckets the program declares (their names are outputs)."""
    purposes = sorted(buckets)
    return pulumi.Output.all(*[buckets[p].bucket for p in purposes]).apply(
        lambda names: stack_bucket_uri(uri, dict(zip(purposes, names, strict=True)))
    )


def tls_only_policy(bucket_arn: str) -> str:
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "DenyInsecureTransport",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": [bucket_arn, f"{bucket_arn}/*"],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }],
    }, sort_keys=True)  # fmt: skip


class ObjectStore(pulumi.ComponentResource):
    """Versioned, encrypted, private, TLS-only buckets; old checkpoint versions expire."""

    def __init__(self, name: str, args: ObjectStoreArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-platform:aws:ObjectStore", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.buckets: dict[str, aws.s3.Bucket] = {}
        for spec in args.buckets:
            prefix = f"{name}-{spec.purpose}"
            bucket = aws.s3.Bucket(
                prefix,
                bucket_prefix=bucket_prefix(args.stack, spec.purpose),
                tags={**args.tags, "gpuplat:purpose": spec.purpose},
                opts=child,
            )
            aws.s3.BucketVersioning(
                f"{prefix}-versioning",
                bucket=bucket.id,
                versioning_configuration={"status": "Enabled"},
                opts=child,
            )
            aws.s3.BucketServerSideEncryptionConfiguration(
                f"{prefix}-encryption",
                bucket=bucket.id,
                rules=[
                    {
                        "apply_server_side_encryption_by_default": {"sse_algorithm": "aws:kms"},
                        "bucket_key_enabled": True,
                    }
                ],
                opts=child,
            )
            aws.s3.BucketPublicAccessBlock(
                f"{prefix}-public-access-block",
                bucket=bucket.id,
                block_public_acls=True,
                block_public_policy=True,
                ignore_public_acls=True,
                restrict_public_buckets=True,
                opts=child,
            )
            aws.s3.BucketPolicy(
                f"{prefix}-tls-only", bucket=bucket.id, policy=bucket.arn.apply(tls_only_policy), opts=child
            )
            rule: aws.s3.BucketLifecycleConfigurationRuleArgsDict = {
                "id": "expire-noncurrent-versions",
                "status": "Enabled",
                "filter": {},
                "noncurrent_version_expiration": {"noncurrent_days": spec.noncurrent_retention_days},
                "abort_incomplete_multipart_upload": {"days_after_initiation": 7},
            }
            if spec.expire_days is not None:
                rule["expiration"] = {"days": spec.expire_days}
            aws.s3.BucketLifecycleConfiguration(
                f"{prefix}-lifecycle", bucket=bucket.id, rules=[rule], opts=child
            )
            self.buckets[spec.purpose] = bucket
        self.register_outputs({purpose: b.bucket for purpose, b in self.buckets.items()})


@dataclass(frozen=True)
class ParallelFilesystemArgs:
    layout: LustreLayout
    subnet_id: pulumi.Input[str]
    security_group_id: pulumi.Input[str]
    repositories: dict[str, pulumi.Input[str]]  # file system path -> bucket name
    tags: dict[str, str]


class ParallelFilesystem(pulumi.ComponentResource):
    """FSx for Lustre PERSISTENT_2 (always encrypted at rest) linked to the dataset and checkpoint buckets."""

    def __init__(
        self, name: str, args: ParallelFilesystemArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpu-platform:aws:ParallelFilesystem", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.filesystem = aws.fsx.LustreFileSystem(
            f"{name}-lustre",
            deployment_type="PERSISTENT_2",
            storage_type="SSD",
            storage_capacity=args.layout.capacity_gib,
            per_unit_storage_throughput=args.layout.per_unit_mbps,
            data_compression_type="LZ4",
            subnet_ids=args.subnet_id,
            security_group_ids=[args.security_group_id],
            file_system_type_version="2.15",
            tags=args.tags,
            opts=child,
        )
        for path, bucket in sorted(args.repositories.items()):
            aws.fsx.DataRepositoryAssociation(
                f"{name}-dra-{path.strip('/').replace('/', '-')}",
                file_system_id=self.filesystem.id,
                file_system_path=path,
                data_repository_path=pulumi.Output.concat("s3://", bucket),
                batch_import_meta_data_on_create=True,
                s3={
                    "auto_import_policy": {"events": ["NEW", "CHANGED", "DELETED"]},
                    "auto_export_policy": {"events": ["NEW", "CHANGED", "DELETED"]},
                },
                tags=args.tags,
                opts=child,
            )
        self.register_outputs(
            {
                "dns_name": self.filesystem.dns_name,
                "mount_name": self.filesystem.mount_name,
                "aggregate_gbps": args.layout.aggregate_gbps,
            }
        )
