"""The guard's analysis of a running canary against the stable version, on counts since the canary started.

Two parts, as Argo Rollouts' AnalysisRun and Flagger's canary analysis do it, and a sequential test beside:
- fixed, non-overlapping intervals of `interval_s`, `intervals` of them (Argo: `interval` and `count`,
  pkg/apis/rollouts/v1alpha1/analysis_types.go:93-101 at v1.10.0-rc1-70-g9f8d111; Flagger: `interval` and
  `iterations`, pkg/apis/flagger/v1beta1/canary.go:259-264 at v1.44.0). Each interval tests each metric on
  that interval's counts: passed, failed, or inconclusive (too few canary requests). A metric failed more
  than `failure_limit` times rolls the canary back, inconclusive more than `inconclusive_limit` times ends
  the analysis inconclusive (Argo: analysis/analysis.go:667 `result.Failed > failureLimit`, :677
  `result.Inconclusive > inconclusiveLimit`; Flagger counts failed checks up to `threshold`,
  pkg/controller/scheduler.go:950);
- the sequential tests, on every look (statistics.log_evidence): the canary's errors since it started
  against a rate at most the stable's plus `max_error_rate_increase`, and its answers slower than the
  stable's median bucket against the stable's share of them plus `max_slow_share_increase`: a canary
  failing outright, or plainly slower, is rolled back as soon as the evidence allows, not at the end of an
  interval.
After the last interval the canary is promote-ready, or inconclusive with fewer than `min_requests` answered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import accumulate

from infra.serving.counts import Counts, SinceStart
from infra.serving.statistics import error_rate_p, log_evidence, rollback_boundary, slower_p
from infra.spec.models import Canary

PROMOTE_READY, CONTINUE, ROLLBACK, INCONCLUSIVE = "promote-ready", "continue", "rollback", "inconclusive"
PASSED, FAILED = "passed", "failed"
ERRORS, LATENCY = "errors", "latency"


@dataclass(frozen=True)
class Verdict:
    action: str
    """promote-ready, continue (the analysis is not over), rollback or inconclusive"""
    reason: str


@dataclass(frozen=True)
class Measurement:
    metric: str
    outcome: str
    """passed, failed or inconclusive"""
    detail: str


def _rate(counts: Counts) -> str:
    return f"{counts.error_rate:.1%} ({counts.errors}/{counts.requests})"


def measure_errors(stable: Counts, canary: Counts, rules: Canary) -> Measurement:
    if canary.requests < rules.interval_min_requests:
        return Measurement(
            ERRORS,
            INCONCLUSIVE,
            f"{canary.requests} canary requests, fewer than {rules.interval_min_requests}",
        )
    p = error_rate_p(
        canary.errors, canary.requests, stable.errors, stable.requests, rules.max_error_rate_increase
    )
    outcome = FAILED if p < rules.alpha else PASSED
    return Measurement(
        ERRORS,
        outcome,
        f"canary error rate {_rate(canary)} against the stable version's {_rate(stable)} plus "
        f"max_error_rate_increase {rules.max_error_rate_increase:.1%}: p = {p:.2g}, alpha {rules.alpha:g}",
    )


def measure_latency(stable: Counts, canary: Counts, rules: Canary) -> Measurement:
    fast, slow = stable.latency, canary.latency
    if slow is None or slow.count < rules.interval_min_requests:
        seen = 0 if slow is None else slow.count
        return Measurement(
            LATENCY,
            INCONCLUSIVE,
            f"{seen} canary latencies recorded, fewer than {rules.interval_min_requests}",
        )
    if fast is None or not fast.count or not fast.sum_s:
        return Measurement(LATENCY, INCONCLUSIVE, "no stable latencies recorded")
    p = slower_p(slow.counts, fast.counts)
    ratio = (slow.mean_s or 0.0) / (fast.mean_s or math.inf)
    outcome = FAILED if p < rules.alpha and ratio > rules.max_latency_ratio else PASSED
    return Measurement(
        LATENCY,
        outcome,
        f"canary mean latency {1000 * (slow.mean_s or 0):.0f} ms is {ratio:.2f} x the stable version's "
        f"{1000 * (fast.mean_s or 0):.0f} ms (max_latency_ratio {rules.max_latency_ratio:g}); slower by "
        f"rank: p = {p:.2g}, alpha {rules.alpha:g}",
    )


def sequential_errors(stable: Counts, canary: Counts, rules: Canary) -> Verdict | None:
    """A rollback as soon as the canary's errors since it started are evidence enough (None: not yet)."""
    bound = min(1.0, stable.error_rate + rules.max_error_rate_increase)
    evidence = log_evidence(canary.errors, canary.requests, bound)
    if evidence < rollback_boundary(rules.sequential_alpha):
        return None
    return Verdict(
        ROLLBACK,
        f"canary error rate {_rate(canary)} since it started is above the stable version's {_rate(stable)} "
        f"plus max_error_rate_increase {rules.max_error_rate_increase:.1%}: the sequential test's evidence "
        f"{math.exp(evidence):.3g} passed 1/sequential_alpha ({1 / rules.sequential_alpha:g})",
    )


def sequential_latency(stable: Counts, canary: Counts, rules: Canary) -> Verdict | None:
    """A rollback as soon as the canary's answers slower than the stable's median bucket are evidence
    enough (None: not yet). The stable's share of them is an estimate: its bound adds two of its largest
    possible standard errors, 2 sqrt(1/4 / n)."""
    fast, slow = stable.latency, canary.latency
    if fast is None or slow is None or not fast.count or not slow.count:
        return None
    median = next(i for i, below in enumerate(accumulate(fast.counts)) if 2 * below >= fast.count)
    stable_slow, canary_slow = sum(fast.counts[median + 1 :]), sum(slow.counts[median + 1 :])
    bound = stable_slow / fast.count + rules.max_slow_share_increase + 1 / math.sqrt(fast.count)
    evidence = log_evidence(canary_slow, slow.count, min(1.0, bound))
    if evidence < rollback_boundary(rules.sequential_alpha):
        return None
    return Verdict(
        ROLLBACK,
        f"{canary_slow} of the canary's {slow.count} answers since it started "
        f"({canary_slow / slow.count:.0%}) took longer than {fast.bounds[median]:g} s, the stable version's "
        f"median bucket, against {stable_slow / fast.count:.0%} of the stable's {fast.count} plus "
        f"max_slow_share_increase {rules.max_slow_share_increase:.0%}: the sequential test's evidence "
        f"{math.exp(evidence):.3g} passed 1/sequential_alpha ({1 / rules.sequential_alpha:g})",
    )


MEASURES = (measure_errors, measure_latency)
SEQUENTIAL = (sequential_errors, sequential_latency)


@dataclass
class Analysis:
    """One canary's analysis: `look` at the counts since the canary started, `elapsed_s` after it."""

    rules: Canary
    results: dict[str, list[Measurement]] = field(default_factory=lambda: {ERRORS: [], LATENCY: []})
    _at_boundary: tuple[Counts, Counts] = (Counts(), Counts())

    @property
    def intervals_done(self) -> int:
        return len(self.results[ERRORS])

    def look(self, elapsed_s: float, stable: Counts, canary: Counts) -> Verdict:
        rules = self.rules
        for sequential in SEQUENTIAL:
            early = sequential(stable, canary, rules)
            if early is not None:
                return early
        if (
            self.intervals_done < rules.intervals
            and elapsed_s >= (self.intervals_done + 1) * rules.interval_s
        ):
            verdict = self._close_interval(stable, canary)
            if verdict is not None:
                return verdict
        if self.intervals_done < rules.intervals:
            return Verdict(
                CONTINUE,
                f"{self.intervals_done} of {rules.intervals} intervals of {rules.interval_s} s analysed; the "
                f"canary answered {canary.requests} requests ({canary.errors} errors) since it started",
            )
        if canary.requests < rules.min_requests:
            return Verdict(
                INCONCLUSIVE,
                f"the canary answered {canary.requests} requests in its {rules.analysis_s} s analysis, fewer "
                f"than min_requests {rules.min_requests}: give it a larger share or a longer analysis",
            )
        return Verdict(
            PROMOTE_READY,
            f"{rules.intervals} intervals passed: canary error rate {_rate(canary)}, stable {_rate(stable)}; "
            + self.results[LATENCY][-1].detail,
        )

    def _close_interval(self, stable: Counts, canary: Counts) -> Verdict | None:
        rules = self.rules
        stable_then, canary_then = self._at_boundary
        self._at_boundary = (stable, canary)
        number = self.intervals_done + 1
        for measure in MEASURES:
            measurement = measure(stable.minus(stable_then), canary.minus(canary_then), rules)
            self.results[measurement.metric].append(measurement)
        for metric, measured in self.results.items():
            failed = [m for m in measured if m.outcome == FAILED]
            if len(failed) > rules.failure_limit:
                return Verdict(
                    ROLLBACK,
                    f"{metric} failed {len(failed)} of {number} intervals (failure_limit "
                    f"{rules.failure_limit}): {failed[-1].detail}",
                )
            unjudged = [m for m in measured if m.outcome == INCONCLUSIVE]
            if len(unjudged) > rules.inconclusive_limit:
                return Verdict(
                    INCONCLUSIVE,
                    f"{metric} could not be judged in {len(unjudged)} of {number} intervals "
                    f"(inconclusive_limit {rules.inconclusive_limit}): {unjudged[-1].detail}; give the "
                    "canary a larger share or longer intervals",
                )
        return None


class Guard:
    """An analysis fed with raw readings (cumulative since each process started), from the first one on."""

    def __init__(self, rules: Canary, started_s: float, stable: Counts, canary: Counts) -> None:
        self.analysis = Analysis(rules)
        self.started_s = started_s
        self.stable, self.canary = SinceStart(stable), SinceStart(canary)

    def look(self, now_s: float, stable: Counts, canary: Counts) -> Verdict:
        return self.analysis.look(now_s - self.started_s, self.stable.add(stable), self.canary.add(canary))
