"""Every stack name the spec accepts yields bucket names S3 and the provider accept."""

from __future__ import annotations

import random
import re
import string

import pytest

from infra.backends.aws.naming import BUCKET_PREFIX_MAX, bucket_prefix

STACK_NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")  # infra.spec.models.Name
# The provider's unique suffix: 26 digits (a timestamp and a counter).
SUFFIX = "2026120102334500000000001a"
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
PURPOSES = ("datasets", "checkpoints", "models", "ssm-transfer", "bootstrap")


def _stack_names() -> list[str]:
    rng = random.Random(7)
    alphabet = string.ascii_lowercase + string.digits + "-"
    names = ["a", "xn--model", "sthree-x", "amzn-s3-demo", "a" * 31, "a-" * 15 + "b", "z" + "-" * 30]
    names += [rng.choice(string.ascii_lowercase) + "".join(rng.choices(alphabet, k=n)) for n in range(31)]
    return [n for n in names if STACK_NAME.match(n)]


@pytest.mark.parametrize("purpose", PURPOSES)
def test_every_valid_stack_name_gives_a_valid_bucket(purpose: str) -> None:
    for stack in _stack_names():
        prefix = bucket_prefix(stack, purpose)
        name = prefix + SUFFIX
        assert len(prefix) <= BUCKET_PREFIX_MAX, (stack, prefix)
        assert BUCKET_NAME.match(name), (stack, name)
        assert not name.startswith(("xn--", "sthree-", "amzn-s3-demo-")), name
        assert purpose in prefix


def test_long_stack_names_stay_distinct() -> None:
    first, second = "research-platform-production-a", "research-platform-production-b"
    assert bucket_prefix(first, "checkpoints") != bucket_prefix(second, "checkpoints")
    assert bucket_prefix("short", "datasets") == "short-datasets-"
