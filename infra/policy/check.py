"""The offline policy check's results: every rule run on the resources a recording of the program holds.

Used by `gpuplat check` and `gpuplat plan` (infra/plan/check.py records the program); needs no cloud account
and no Pulumi CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infra.platform.resolve import ResolvedPlatform
from infra.policy.rules import PolicyContext, Verdict, evaluate
from infra.policy.settings import PolicyConfig
from infra.policy.view import from_recorded

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
