"""The offline policy check of a stack: record the real program under the SDK mocks, then run every rule."""

from __future__ import annotations

import time

from infra.plan.record import Recording, record
from infra.platform.resolve import ResolvedPlatform
from infra.policy.check import CheckReport
from infra.policy.rules import RULES, PolicyContext, Verdict, evaluate, not_applicable
from infra.policy.settings import PolicyConfig
from infra.policy.view import ResourceIndex, from_recorded


def check_platform(
    platform: ResolvedPlatform, config: PolicyConfig | None = None, recording: Recording | None = None
) -> CheckReport:
    started_stack = time.perf_counter()
    if recording is None:
        recording = record(platform)
    index = ResourceIndex(from_recorded(r) for r in recording.resources)
    context = PolicyContext(platform, config or PolicyConfig())
    verdicts: list[Verdict] = []
    seconds: dict[str, float] = {}
    for rule in RULES:  # one at a time, for each rule's time in the test reports
        started = time.perf_counter()
        verdicts += evaluate(index, context, [rule])
        seconds[rule.id] = time.perf_counter() - started
    return CheckReport(
        stack=platform.name,
        backend=platform.spec.backend,
        source=str(platform.source),
        resources=len(recording.resources),
        verdicts=verdicts,
        pools=tuple(pool.name for pool in platform.pools),
        not_applicable=tuple(not_applicable(index)),
        seconds=seconds,
        total_seconds=time.perf_counter() - started_stack,
    )
