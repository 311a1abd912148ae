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
- the sequential tests, on every look (statistics.log_evidence_above, one two-sample test on both
  versions' counts since the canary started): the canary's error rate against at most the stable's plus
  `max_error_rate_increase`, and its share of answers above the bucket holding `max_latency_ratio` x the
  stable's median against at most the stable's share plus `max_slow_share_increase`: a canary failing
  outright, or plainly slower, is rolled back as soon as the evidence allows, not at the end of an interval.
The stable's rate in an interval's error test is an upper confidence bound of it (statistics.rate_upper_bound
at half the test's alpha; the test itself at the other half), not its observed value, which may be low by
chance: a test's false rollbacks are at most its alpha.
After the last interval the canary is promote-ready, or inconclusive with fewer than `min_requests` answered
or a metric never judged.
A canary server busier than a stable one (`load_ratio`, infra/serving/load.py) has its latencies judged by
neither test: its queue, not its version, may make it slower; its errors are judged as ever. Where the
ratio moves during the analysis (the servers up changed: a replica down, autoscaling) beyond what
load.same_load pools, the latency evidence so far is dropped (`Analysis.reweigh`): its tests start again
from the next interval, which the analysis waits for as many intervals as it asks; errors go on judging.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from infra.serving.counts import Counts, Histogram, Reading, SinceStart
from infra.serving.load import LOAD_TOLERANCE, busier, same_load
from infra.serving.statistics import (
    error_rate_p,
    log_evidence_above,
    rate_upper_bound,
    rollback_boundary,
    slower_p,
)


class Canary(Protocol):
    """The settings the analysis reads: serving.canary (infra/spec/models.Canary), or on a gateway node,
    where the detached guard runs without the spec's models, the values a CLI read from it (RulesRead)."""

    @property
    def alpha(self) -> float: ...
    @property
    def sequential_alpha(self) -> float: ...
    @property
    def max_error_rate_increase(self) -> float: ...
    @property
    def max_latency_ratio(self) -> float: ...
    @property
    def max_slow_share_increase(self) -> float: ...
    @property
    def initial_delay_s(self) -> int: ...
    @property
    def interval_s(self) -> int: ...
    @property
    def intervals(self) -> int: ...
    @property
    def failure_limit(self) -> int: ...
    @property
    def inconclusive_limit(self) -> int: ...
    @property
    def min_requests(self) -> int: ...
    @property
    def analysis_s(self) -> int: ...
    @property
    def interval_min_requests(self) -> int: ...


@dataclass(frozen=True)
class RulesRead:
    """A Canary's values as read (its computed ones included, so that they are computed in one place)."""

    alpha: float
    sequential_alpha: float
    max_error_rate_increase: float
    max_latency_ratio: float
    max_slow_share_increase: float
    initial_delay_s: int
    interval_s: int
    intervals: int
    failure_limit: int
    inconclusive_limit: int
    min_requests: int
    analysis_s: int
    interval_min_requests: int

    @classmethod
    def of(cls, rules: Canary) -> RulesRead:
        return cls(**{name: getattr(rules, name) for name in cls.__dataclass_fields__})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def with_interval(self, interval_s: int) -> RulesRead:
        """These settings with intervals of `interval_s` (the analysis' length with them)."""
        return replace(self, interval_s=interval_s, analysis_s=interval_s * self.intervals)


PROMOTE_READY, CONTINUE, ROLLBACK, INCONCLUSIVE = "promote-ready", "continue", "rollback", "inconclusive"
PASSED, FAILED = "passed", "failed"
ERRORS, LATENCY, ITL = "errors", "latency", "inter-token latency"
_OBSERVATIONS = {LATENCY: "latencies", ITL: "answers with inter-token latencies"}


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
    if stable.requests < rules.interval_min_requests:
        return Measurement(ERRORS, INCONCLUSIVE, _too_few_stable(stable.requests, "requests", rules))
    bound = error_bound(stable, rules, rules.alpha)
    p = error_rate_p(canary.errors, canary.requests, bound)
    outcome = FAILED if p < rules.alpha / 2 else PASSED
    return Measurement(
        ERRORS,
        outcome,
        f"canary error rate {_rate(canary)} against the stable version's {_rate(stable)} (at most "
        f"{bound - rules.max_error_rate_increase:.1%}) plus max_error_rate_increase "
        f"{rules.max_error_rate_increase:.1%}: p = {p:.2g}, alpha {rules.alpha:g}",
    )


def _too_few_stable(seen: int, what: str, rules: Canary) -> str:
    """A canary with nearly all the traffic leaves the stable version too few answers to compare with."""
    return (
        f"{seen} stable {what}, fewer than {rules.interval_min_requests}: at this share the stable version "
        "answers too few to compare the canary with"
    )


def error_bound(stable: Counts, rules: Canary, alpha: float) -> float:
    """The canary error rate a test at level `alpha` allows: the stable's rate's upper confidence bound at
    alpha / 2, plus max_error_rate_increase."""
    return min(
        1.0, rate_upper_bound(stable.errors, stable.requests, alpha / 2) + rules.max_error_rate_increase
    )


def measure_latency(stable: Counts, canary: Counts, rules: Canary) -> Measurement:
    return _measure_slower(LATENCY, stable.latency, canary.latency, rules)


def measure_itl(stable: Counts, canary: Counts, rules: Canary) -> Measurement | None:
    """The inter-token latency, an LLM engine's second latency (vLLM's histogram of the gaps between an
    answer's tokens): the same test as the time to the first token, on its own histogram. None where
    neither version recorded a gap in the interval (the CPU reference server answers in one piece, an
    embedding model served by vLLM streams no tokens, answers of one token have no gap)."""
    if not (stable.itl and stable.itl.count) and not (canary.itl and canary.itl.count):
        return None
    return _measure_slower(ITL, stable.itl, canary.itl, rules, (_answers(stable), _answers(canary)))


def _answers(counts: Counts) -> int:
    """The answers a version gave in an interval: its first tokens (one per answer), else its requests."""
    return counts.latency.count if counts.latency is not None else counts.requests


def _measure_slower(
    metric: str,
    fast: Histogram | None,
    slow: Histogram | None,
    rules: Canary,
    answers: tuple[int, int] | None = None,
) -> Measurement:
    """`metric` of one interval: failed only if the canary is slower by rank (one-sided Mann-Whitney on the
    bucket counts) and its mean (_sum / _count) more than max_latency_ratio x the stable's. With `answers`
    (the stable's and the canary's in the interval) the observations are many per answer and alike within
    one (an answer's token gaps): each version's bucket counts are weighed down to its answers, as if each
    answer's gaps were one observation, for the rank test and the interval's minimum alike. A rank test on
    the gaps as independent observations was significant in about a third of an identical canary's
    intervals at alpha 0.01 (24 answers of 64 tokens against 96, gaps lognormal around each answer's own
    median), leaving the mean-ratio bound alone to decide (tests/unit/test_canary_itl.py)."""
    fast_weight = slow_weight = 1.0
    if answers is not None:
        fast_weight = min(1.0, answers[0] / fast.count) if fast is not None and fast.count else 1.0
        slow_weight = min(1.0, answers[1] / slow.count) if slow is not None and slow.count else 1.0
    if slow is None or slow.count * slow_weight < rules.interval_min_requests:
        seen = 0 if slow is None else round(slow.count * slow_weight)
        return Measurement(
            metric,
            INCONCLUSIVE,
            f"{seen} canary {_OBSERVATIONS[metric]} recorded, fewer than {rules.interval_min_requests}",
        )
    if fast is None or not fast.count or not fast.sum_s:
        return Measurement(metric, INCONCLUSIVE, f"no stable {_OBSERVATIONS[metric]} recorded")
    if fast.count * fast_weight < rules.interval_min_requests:
        seen = round(fast.count * fast_weight)
        return Measurement(
            metric, INCONCLUSIVE, _too_few_stable(seen, f"{_OBSERVATIONS[metric]} recorded", rules)
        )
    if fast.bounds != slow.bounds:
        return Measurement(
            metric,
            INCONCLUSIVE,
            f"the versions' {metric} histograms have different buckets (stable {list(fast.bounds)}, canary "
            f"{list(slow.bounds)}): they cannot be compared; serve both with the same engine version",
        )
    p = slower_p([c * slow_weight for c in slow.counts], [c * fast_weight for c in fast.counts])
    ratio = (slow.mean_s or 0.0) / (fast.mean_s or math.inf)
    outcome = FAILED if p < rules.alpha and ratio > rules.max_latency_ratio else PASSED
    return Measurement(
        metric,
        outcome,
        f"canary mean {metric} {1000 * (slow.mean_s or 0):.0f} ms is {ratio:.2f} x the stable version's "
        f"{1000 * (fast.mean_s or 0):.0f} ms (max_latency_ratio {rules.max_latency_ratio:g}); slower by "
        f"rank: p = {p:.2g}, alpha {rules.alpha:g}",
    )


def _evidence(log_evidence: float) -> str:
    """The sequential test's evidence as a reason shows it: a number, or e to a power where it is too large
    for a float (a canary failing thousands of requests: exp of more than about 709 overflows)."""
    if log_evidence < 700:
        return f"{math.exp(log_evidence):.3g}"
    return f"e^{log_evidence:.0f}"


def sequential_errors(stable: Counts, canary: Counts, rules: Canary) -> Verdict | None:
    """A rollback as soon as the canary's errors since it started are evidence enough (None: not yet)."""
    evidence = log_evidence_above(
        canary.errors, canary.requests, stable.errors, stable.requests, rules.max_error_rate_increase
    )
    if evidence < rollback_boundary(rules.sequential_alpha):
        return None
    return Verdict(
        ROLLBACK,
        f"canary error rate {_rate(canary)} since it started is above the stable version's {_rate(stable)} "
        f"plus max_error_rate_increase {rules.max_error_rate_increase:.1%}: the sequential test's evidence "
        f"{_evidence(evidence)} passed 1/sequential_alpha ({1 / rules.sequential_alpha:g})",
    )


def slow_bucket(stable: Histogram, ratio: float) -> int:
    """The bucket holding `ratio` x the stable's median (the median interpolated within its bucket, as
    Prometheus' histogram_quantile does): answers above it are slower than max_latency_ratio allows."""
    half = stable.count / 2
    below = 0
    for index, count in enumerate(stable.counts):
        if below + count >= half and count:
            lower = stable.bounds[index - 1] if index else 0.0
            upper = stable.bounds[index]
            if math.isinf(upper):
                return index
            median = lower + (upper - lower) * (half - below) / count
            return next(i for i, bound in enumerate(stable.bounds) if bound >= ratio * median)
        below += count
    return len(stable.counts) - 1


def sequential_latency(stable: Counts, canary: Counts, rules: Canary) -> Verdict | None:
    """A rollback as soon as the canary's answers above `slow_bucket` (max_latency_ratio x the stable's
    median) are evidence enough (None: not yet), against the stable's share of them plus
    max_slow_share_increase."""
    fast, slow = stable.latency, canary.latency
    if fast is None or slow is None or not fast.count or not slow.count or fast.bounds != slow.bounds:
        return None
    edge = slow_bucket(fast, rules.max_latency_ratio)
    stable_slow, canary_slow = sum(fast.counts[edge + 1 :]), sum(slow.counts[edge + 1 :])
    margin = rules.max_slow_share_increase
    evidence = log_evidence_above(canary_slow, slow.count, stable_slow, fast.count, margin)
    if evidence < rollback_boundary(rules.sequential_alpha):
        return None
    return Verdict(
        ROLLBACK,
        f"{canary_slow} of the canary's {slow.count} answers since it started "
        f"({canary_slow / slow.count:.0%}) took longer than {fast.bounds[edge]:g} s, the bucket holding "
        f"max_latency_ratio {rules.max_latency_ratio:g} x the stable version's median, against "
        f"{stable_slow / fast.count:.0%} of the stable's {fast.count} plus max_slow_share_increase "
        f"{margin:.0%}: the sequential test's evidence {_evidence(evidence)} passed 1/sequential_alpha "
        f"({1 / rules.sequential_alpha:g})",
    )


MEASURES = (measure_errors, measure_latency, measure_itl)
"""Each interval's tests; one that answers None has nothing to judge on this engine (no inter-token latency
on the CPU reference server). The inter-token latency has no sequential test: its observations are an
answer's token gaps, many per request and alike within one (a slow request gives many slow gaps), while the
sequential test's bound holds for independent observations. Its interval test fails only where the mean
ratio passes max_latency_ratio too, which an identical canary's many gaps do not reach by chance."""
SEQUENTIAL = (sequential_errors, sequential_latency)


@dataclass
class Analysis:
    """One canary's analysis: `look` at the counts since the canary started, `elapsed_s` after it."""

    rules: Canary
    results: dict[str, list[Measurement]] = field(default_factory=lambda: {ERRORS: [], LATENCY: []})
    _at_boundary: tuple[Counts, Counts] = (Counts(), Counts())
    load_ratio: float = 1.0
    """each canary server's load over each stable server's at this share (infra/serving/load.py): above
    1 + LOAD_TOLERANCE the latencies are not judged"""
    latency_ratio: float | None = None
    """the load ratio the latency evidence so far was read at (None: `load_ratio`, never moved)"""
    latency_from: int = 0
    """the intervals closed, the one running included, when the latency evidence was last dropped: its
    interval tests judge the intervals after, and the analysis asks `intervals` of them"""
    latency_base: tuple[Counts, Counts] | None = None
    """both versions' counts since the canary started when the latency evidence was last dropped: the
    sequential latency test counts from there"""
    restarts: list[str] = field(default_factory=list)
    """why the latency evidence was dropped, each time"""
    judged_before: float | None = None
    """the ratio the latency was judged at before the servers up moved the canary's servers to a busier one
    (None: never): such an analysis was the one meant to judge latency, and cannot promote on errors alone"""

    @property
    def judges_latency(self) -> bool:
        return not busier(self.load_ratio)

    def _unjudged_latency(self) -> str:
        return (
            f"latency not judged: each canary server takes {self.load_ratio:.2f} x a stable server's load "
            f"(more than 1 + {LOAD_TOLERANCE:g}), which alone makes it slower"
        )

    @property
    def intervals_done(self) -> int:
        return len(self.results[ERRORS])

    @property
    def intervals_asked(self) -> int:
        """The intervals this analysis closes: `intervals`, and where its latency evidence was dropped and
        latency is judged, as many again after that."""
        return self.rules.intervals + (self.latency_from if self.judges_latency else 0)

    @property
    def added_s(self) -> int:
        """How much longer the analysis runs for the intervals it asks beyond `intervals` (its latency
        evidence dropped: `reweigh`)."""
        return (self.intervals_asked - self.rules.intervals) * self.rules.interval_s

    def reweigh(self, ratio: float, stable: Counts, canary: Counts) -> str | None:
        """The load ratio now `ratio` (the servers up read again at a look), with both versions' counts
        since the canary started: where load.same_load does not pool it with the ratio the latency evidence
        was read at, that evidence is dropped (the interval running now is not judged on latency, the
        sequential test counts from these counts) and the reason is returned; None where nothing changed."""
        before = self.load_ratio if self.latency_ratio is None else self.latency_ratio
        self.load_ratio = ratio
        if same_load(ratio, before):
            # Moves within the tolerance are weighed against the ratio the evidence was first read at: they
            # do not add up, unseen, to a larger one.
            self.latency_ratio = before
            return None
        if self.judged_before is None and not busier(before) and busier(ratio):
            self.judged_before = before
        self.latency_ratio = ratio
        self.latency_from = self.intervals_done + 1
        self.latency_base = (stable, canary)
        for metric in (LATENCY, ITL):
            if metric in self.results:
                self.results[metric] = []
        reason = (
            f"the latency analysis started again at interval {self.latency_from}: each canary server's load "
            f"moved from {before:.2f} x a stable server's to {ratio:.2f} x (the servers up changed), and "
            f"latencies read at one load are not evidence at the other"
            + ("" if self.judges_latency else "; latency is not judged at this load")
        )
        self.restarts.append(reason)
        return reason

    def _restarted(self) -> str:
        return f"; {self.restarts[-1]}" if self.restarts else ""

    def look(self, elapsed_s: float, stable: Counts, canary: Counts) -> Verdict:
        rules = self.rules
        for sequential in SEQUENTIAL if self.judges_latency else (sequential_errors,):
            # The latency since its evidence was last dropped (reweigh), the errors since the start.
            since = (stable, canary)
            if sequential is not sequential_errors and self.latency_base is not None:
                since = (stable.minus(self.latency_base[0]), canary.minus(self.latency_base[1]))
            early = sequential(*since, rules)
            if early is not None:
                return early
        if self.judges_latency and self.latency_from > rules.intervals:
            # Servers up that keep moving (a replica bouncing) would ask the intervals again for ever: the
            # analysis asks at most its own length again, then ends without promoting.
            return Verdict(
                INCONCLUSIVE,
                f"the servers up moved {len(self.restarts)} times and the latency analysis started again "
                f"after interval {rules.intervals}: its latency could not be judged at one load within twice "
                f"its {rules.intervals} intervals; error rate canary {_rate(canary)}, stable {_rate(stable)}"
                + self._restarted(),
            )
        asked = self.intervals_asked
        if self.intervals_done < asked and elapsed_s >= (self.intervals_done + 1) * rules.interval_s:
            verdict = self._close_interval(stable, canary)
            if verdict is not None:
                return verdict
        if self.intervals_done < asked:
            return Verdict(
                CONTINUE,
                f"{self.intervals_done} of {asked} intervals of {rules.interval_s} s analysed; the "
                f"canary answered {canary.requests} requests ({canary.errors} errors) since it started"
                + self._restarted(),
            )
        if canary.requests < rules.min_requests:
            return Verdict(
                INCONCLUSIVE,
                f"the canary answered {canary.requests} requests in its {rules.analysis_s} s analysis, fewer "
                f"than min_requests {rules.min_requests}: give it a larger share or a longer analysis",
            )
        never = [
            metric
            for metric, measured in self.results.items()
            if (measured or metric != LATENCY or self.judges_latency)
            and all(m.outcome == INCONCLUSIVE for m in measured)
        ]
        if never:
            return Verdict(
                INCONCLUSIVE,
                f"{' and '.join(never)} could not be judged in any of the {rules.intervals} intervals: "
                + "; ".join(self.results[metric][-1].detail for metric in never),
            )
        if not self.judges_latency and self.judged_before is not None:
            # Its latency judged where it started, then not after the servers moved: promote-ready would
            # rest on the errors alone, and no analysis the guard planned judges the latency at this load.
            return Verdict(
                INCONCLUSIVE,
                f"the latency was judged at {self.judged_before:.2f} x a stable server's load when the "
                f"servers up moved and each canary server took {self.load_ratio:.2f} x, where it is not "
                f"judged: its latency evidence was dropped and none judged since; `gpuplat serve guard` "
                f"again weighs the servers up now" + self._restarted(),
            )
        return Verdict(
            PROMOTE_READY,
            f"{asked} intervals passed: canary error rate {_rate(canary)}, stable {_rate(stable)}; "
            + (self.results[LATENCY][-1].detail if self.judges_latency else self._unjudged_latency())
            + self._restarted(),
        )

    def to_json(self) -> dict[str, Any]:
        """The intervals judged so far and the counts at the last one's end (the rules are not part of it)."""
        return {
            "results": {metric: [asdict(m) for m in measured] for metric, measured in self.results.items()},
            "at_boundary": [counts.to_json() for counts in self._at_boundary],
            "load_ratio": self.load_ratio,
            "latency_ratio": self.latency_ratio,
            "latency_from": self.latency_from,
            "latency_base": None
            if self.latency_base is None
            else [counts.to_json() for counts in self.latency_base],
            "restarts": self.restarts,
            "judged_before": self.judged_before,
        }

    @classmethod
    def from_json(cls, rules: Canary, data: dict[str, Any]) -> Analysis:
        stable, canary = (Counts.from_json(c) for c in data["at_boundary"])
        results = {
            metric: [Measurement(**m) for m in measured] for metric, measured in data["results"].items()
        }
        base = data.get("latency_base")
        latency_ratio = data.get("latency_ratio")
        judged_before = data.get("judged_before")
        return cls(
            rules,
            results,
            (stable, canary),
            float(data.get("load_ratio", 1.0)),
            None if latency_ratio is None else float(latency_ratio),
            int(data.get("latency_from", 0)),
            None if base is None else (Counts.from_json(base[0]), Counts.from_json(base[1])),
            list(data.get("restarts", [])),
            None if judged_before is None else float(judged_before),
        )

    def _close_interval(self, stable: Counts, canary: Counts) -> Verdict | None:
        rules = self.rules
        stable_then, canary_then = self._at_boundary
        self._at_boundary = (stable, canary)
        number = self.intervals_done + 1
        judged = self.judges_latency and number > self.latency_from
        for measure in MEASURES if judged else (measure_errors,):
            measurement = measure(stable.minus(stable_then), canary.minus(canary_then), rules)
            if measurement is not None:
                self.results.setdefault(measurement.metric, []).append(measurement)
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

    def __init__(
        self,
        rules: Canary,
        started_s: float,
        stable: Counts | Reading,
        canary: Counts | Reading,
        load_ratio: float = 1.0,
    ) -> None:
        self.analysis = Analysis(rules, load_ratio=load_ratio)
        self.started_s = started_s
        self.stable, self.canary = SinceStart(stable), SinceStart(canary)

    def to_json(self) -> dict[str, Any]:
        """Its whole state: `from_json` of it goes on with the same evidence (counts since the canary
        started, intervals judged), as if no look had been missed but the ones in between."""
        return {
            "started_s": self.started_s,
            "stable": self.stable.to_json(),
            "canary": self.canary.to_json(),
            "analysis": self.analysis.to_json(),
        }

    @classmethod
    def from_json(cls, rules: Canary, data: dict[str, Any]) -> Guard:
        guard = cls(rules, float(data["started_s"]), Counts(), Counts())
        guard.stable, guard.canary = (
            SinceStart.from_json(data["stable"]),
            SinceStart.from_json(data["canary"]),
        )
        guard.analysis = Analysis.from_json(rules, data["analysis"])
        return guard

    def look(
        self,
        now_s: float,
        stable: Counts | Reading,
        canary: Counts | Reading,
        load_ratio: float | None = None,
    ) -> Verdict:
        """The verdict on these readings; one that cannot be added (a ValueError: a version's histograms over
        different buckets) changes nothing. `load_ratio`: the load ratio at this look, from the servers up
        read again (None: as before); a move beyond load.same_load drops the latency evidence
        (`Analysis.reweigh`)."""
        delay = self.analysis.rules.initial_delay_s
        elapsed = now_s - self.started_s - delay
        if elapsed < 0:  # warming up: the counts start when initial_delay_s is over
            self.stable, self.canary = SinceStart(stable), SinceStart(canary)
            if load_ratio is not None:  # no evidence read yet: nothing to drop
                self.analysis.load_ratio, self.analysis.latency_ratio = load_ratio, None
            return Verdict(CONTINUE, f"initial_delay_s {delay}: the analysis starts in {-elapsed:.0f} s")
        # Each add replaces a SinceStart's attributes, never changes them: a copy is its state before.
        stable_since, canary_since = copy.copy(self.stable), copy.copy(self.canary)
        stable_total, canary_total = stable_since.add(stable), canary_since.add(canary)
        self.stable, self.canary = stable_since, canary_since
        if load_ratio is not None:
            # The servers moved at some time since the last look: the counts up to this one drop with the
            # evidence.
            self.analysis.reweigh(load_ratio, stable_total, canary_total)
        return self.analysis.look(elapsed, stable_total, canary_total)
