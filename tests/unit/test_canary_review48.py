"""Issue 48's attack on the canary analysis (REVIEW 13): each test fails on the analysis before it."""

from __future__ import annotations

import math

import pytest

from infra.serving.analysis import INCONCLUSIVE, PROMOTE_READY, Analysis, error_bound, measure_errors
from infra.serving.counts import Counts
from infra.serving.statistics import _log_pmf, binomial_sf, rate_upper_bound
from infra.spec.models import Canary


def _pmf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 1.0 if k == 0 else 0.0
    return math.exp(_log_pmf(k, n, p))


def exact_size(canary_n: int, stable_n: int, stable_rate: float, rules: Canary) -> float:
    """P(an interval's error test fails) with the canary's rate exactly the stable's plus the margin (the
    null's boundary), summed over every stable count and every canary count."""
    canary_rate = min(1.0, stable_rate + rules.max_error_rate_increase)
    size = 0.0
    for stable_errors in range(stable_n + 1):
        weight = _pmf(stable_errors, stable_n, stable_rate)
        if weight < 1e-13:
            continue
        stable = Counts(stable_n, stable_errors)
        # The test fails from some canary count on (its p-value falls with the count): find that count.
        failing = next(
            (
                k
                for k in range(canary_n + 1)
                if measure_errors(stable, Counts(canary_n, k), rules).outcome == "failed"
            ),
            canary_n + 1,
        )
        size += weight * binomial_sf(failing, canary_n, canary_rate)
    return size


@pytest.mark.parametrize("margin", [0.01, 0.05])
@pytest.mark.parametrize("stable_rate", [0.0, 0.005, 0.02, 0.1])
@pytest.mark.parametrize("canary_n", [10, 40, 200])
def test_the_interval_error_test_has_size_at_most_alpha_at_the_boundary(
    canary_n: int, stable_rate: float, margin: float
) -> None:
    """Finding 2: the z test's size was 1.15-2.5 % at margin 0.05 and 5.7-7.5 % at margin 0 (alpha 1 %);
    with the stable's bound and the exact test it is at most alpha at every count of this grid."""
    rules = Canary(max_error_rate_increase=margin)
    assert exact_size(canary_n, 4 * canary_n, stable_rate, rules) <= rules.alpha


def test_no_stable_error_and_one_canary_error_is_no_evidence() -> None:
    """Finding 2: with margin 0 and no stable errors one canary error gave p = 0. The stable's bound is
    above 0 however many requests it answered without error."""
    rules = Canary(max_error_rate_increase=0.01)
    assert measure_errors(Counts(400, 0), Counts(100, 1), rules).outcome == "passed"
    assert error_bound(Counts(400, 0), rules, rules.alpha) > 0.01


def test_the_stables_bound_covers_its_rate_at_every_look_at_once() -> None:
    """The bound the sequential tests use is a confidence sequence: at the true rate, the probability that
    any look's bound falls below it is at most alpha. Exactly, over 200 looks of one request each at 5 %:
    the bound below 5 % means the evidence against "at least 5 %" reached 1/alpha; summed over paths by
    dynamic programming over the error count."""
    alpha, rate, looks = 0.01, 0.05, 200
    alive = {0: 1.0}  # error count -> probability of reaching it with every bound so far covering the rate
    for trials in range(1, looks + 1):
        step: dict[int, float] = {}
        for errors, weight in alive.items():
            for new, chance in ((errors + 1, rate), (errors, 1 - rate)):
                step[new] = step.get(new, 0.0) + weight * chance
        alive = {e: w for e, w in step.items() if rate_upper_bound(e, trials, alpha) >= rate}
    assert 1 - sum(alive.values()) <= alpha


def test_limits_that_allow_every_interval_failed_or_unjudged_are_refused_in_one_paragraph() -> None:
    """Finding 5: failure_limit or inconclusive_limit >= intervals let a canary be promote-ready with no
    interval passed; a share of 100 leaves no stable version to compare with; a margin below the floor."""
    with pytest.raises(ValueError, match="failure_limit 5 is not below intervals 5"):
        Canary(failure_limit=5)
    with pytest.raises(ValueError, match=r"inconclusive_limit 5 is not below intervals 5.*at most 4"):
        Canary(inconclusive_limit=5)
    with pytest.raises(ValueError, match=r"max_error_rate_increase 0 is below 0\.01"):
        Canary(max_error_rate_increase=0)
    with pytest.raises(ValueError, match="less than or equal to 99"):
        Canary(share_percent=100)
    Canary(failure_limit=4, inconclusive_limit=4, max_error_rate_increase=0.01, share_percent=99)


def test_promote_ready_needs_every_metric_judged_at_least_once() -> None:
    """Finding 5: with Prometheus down latency is never judged; with inconclusive_limit 5 the analysis was
    promote-ready on its errors alone. At the most the spec allows (4) it ends inconclusive, saying so."""
    rules = Canary(inconclusive_limit=4)
    analysis = Analysis(rules)
    for i in range(1, rules.intervals + 1):
        verdict = analysis.look(i * rules.interval_s, Counts(400 * i, 0), Counts(100 * i, 0))
    assert verdict.action == INCONCLUSIVE
    assert verdict.reason.startswith("latency could not be judged in 5 of 5 intervals (inconclusive_limit 4)")
    # And the analysis itself refuses promote-ready with a metric never judged, whatever rules it is given.
    unchecked = Canary.model_construct(**{**Canary().model_dump(), "inconclusive_limit": 5})
    analysis = Analysis(unchecked)
    for i in range(1, rules.intervals + 1):
        verdict = analysis.look(i * rules.interval_s, Counts(400 * i, 0), Counts(100 * i, 0))
    assert verdict.action == INCONCLUSIVE != PROMOTE_READY
    assert verdict.reason.startswith("latency could not be judged in any of the 5 intervals")
