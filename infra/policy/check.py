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
    pools: tuple[str, ...] = ()  # the stack's pool names: a finding on one points at its line
    not_applicable: tuple[str, ...] = ()  # rules that judged no resource of this stack
    seconds: dict[str, float] = field(default_factory=dict)  # each rule's time on this stack
    total_seconds: float = 0.0  # the stack's whole check: recording the program and every rule

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


@dataclass(frozen=True)
class StackProblem:
    """A stack that could not be checked (its file does not parse or validate): one error in a report of
    several stacks, which keep their own results."""

    stack: str
    source: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"stack": self.stack, "source": self.source, "error": self.message}


def verdicts_for(
    platform: ResolvedPlatform, recording: Recording, config: PolicyConfig | None = None
) -> list[Verdict]:
    views = [from_recorded(r) for r in recording.resources]
    return evaluate(views, PolicyContext(platform, config or PolicyConfig()))
