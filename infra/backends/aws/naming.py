"""Bucket names: S3 bucket prefixes (AWS limits them more tightly than the spec does), and URIs that
name a bucket by its purpose.

The provider appends a 26-character unique suffix to `bucket_prefix` and allows a prefix of at most
37 characters, so that the bucket name stays within S3's 63 (pulumi-aws `s3.Bucket`, argument
`bucket_prefix`). A stack name may be 31 characters and a purpose 11, so long stack names are cut and
keep a short digest of the whole name: two stacks never share a prefix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

BUCKET_PREFIX_MAX = 37
# Bucket names may not start with these (S3 user guide, "General purpose bucket naming rules").
_RESERVED_STARTS = ("xn--", "sthree-", "amzn-s3-demo-")


def bucket_prefix(stack: str, purpose: str) -> str:
    base = f"gp-{stack}" if f"{stack}-".startswith(_RESERVED_STARTS) else stack
    tail = f"-{purpose}-"
    if len(base) + len(tail) <= BUCKET_PREFIX_MAX:
        return f"{base}{tail}"
    digest = hashlib.sha256(stack.encode()).hexdigest()[:6]
    room = BUCKET_PREFIX_MAX - len(tail) - len(digest) - 1
    return f"{base[:room].rstrip('-')}-{digest}{tail}"


def stack_bucket_uri(uri: str, bucket_names: Mapping[str, str]) -> str:
    """`s3://<purpose>/<key>` names the stack's bucket of that purpose, whose name S3 only knows once it
    is created (a prefix and a generated suffix): the URI with that name in place. Another URI (a bucket
    that is no purpose of the stack, a path, a model id) is returned as it is."""
    if not uri.startswith("s3://"):
        return uri
    purpose, _, key = uri.removeprefix("s3://").partition("/")
    name = bucket_names.get(purpose)
    return uri if name is None else f"s3://{name}/{key}"
