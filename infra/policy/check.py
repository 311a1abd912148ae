"""The offline policy check: record the real program under the SDK mocks, then run every rule.

Used by `gpuplat check` and `gpuplat plan`; needs no cloud account and no Pulumi CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infra.policy.config import PolicyConfig
from infra.policy.rules import PolicyContext, Verdict, evaluate
from infra.policy.view import from_recorded
from infra.resolve import ResolvedPlatform

if TYPE_CHECKING:
    from infra.plan.record import Recording


@dataclass
class CheckReport:
    stack: str
    backend: str
    source: str
    resources: int
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def mandatory(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.severity == "mandatory"]

    @property
    def passed(self) -> bool:
        return not self.mandatory

    def to_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "backend": self.backend,
            "source": self.source,
            "resources": self.resources,
            "passed": self.passed,
            "verdicts": [v.to_dict() for v in self.verdicts],
        }


def verdicts_for(
    platform: ResolvedPlatform, recording: Recording, config: PolicyConfig | None = None
) -> list[Verdict]:
    views = [from_recorded(r) for r in recording.resources]
    return evaluate(views, PolicyContext(platform, config or PolicyConfig()))


def check_platform(
    platform: ResolvedPlatform, config: PolicyConfig | None = None, recording: Recording | None = None
) -> CheckReport:
    if recording is None:
        from infra.plan.record import record

        recording = record(platform)
    return CheckReport(
        stack=platform.name,
        backend=platform.spec.backend,
        source=str(platform.source),
        resources=len(recording.resources),
        verdicts=verdicts_for(platform, recording, config),
    )
