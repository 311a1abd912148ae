"""AWS backend: GPU node pools on EFA, FSx for Lustre, S3 and IAM."""

from __future__ import annotations

from typing import Any

from infra.backends.base import common_outputs
from infra.resolve import ResolvedPlatform


class AwsBackend:
    def declare(self, platform: ResolvedPlatform) -> dict[str, Any]:
        return common_outputs(platform)
