"""Names AWS limits more tightly than the spec does: S3 bucket prefixes.

The provider appends a 26-character unique suffix to `bucket_prefix` and allows a prefix of at most
37 characters, so that the bucket name stays within S3's 63 (pulumi-aws `s3.Bucket`, argument
`bucket_prefix`). A stack name may be 31 characters and a purpose 11, so long stack names are cut and
keep a short digest of the whole name: two stacks never share a prefix.
"""

from __future__ import annotations

import hashlib

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
