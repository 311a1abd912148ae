"""The offline policy check of a stack: record the real program under the SDK mocks, then run every rule."""

from __future__ import annotations

from infra.plan.record import Recording, record
from infra.platform.resolve import ResolvedPlatform
from infra.policy.check import CheckReport, verdicts_for
from infra.policy.settings import PolicyConfig


def check_platform(
    platform: ResolvedPlatform, config: PolicyConfig | None = None, recording: Recording | None = None
) -> CheckReport:
    if recording is None:
        recording = record(platform)
    return CheckReport(
        stack=platform.name,
        backend=platform.spec.backend,
        source=str(platform.source),
        resources=len(recording.resources),
        verdicts=verdicts_for(platform, recording, config),
    )
