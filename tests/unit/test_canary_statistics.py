"""The canary analysis' statistics and counters (infra/serving/statistics.py, counts.py) against
computations of their own: exact binomial tails from math.comb in fractions, Mann-Whitney U from the
pairs it counts, the documented mixture of likelihood ratios, and counter readings through restarts.
Written for the survivors of `make mutation` (issue 46): each test fails if the behaviour it names breaks."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from infra.serving.counts import Counts, Histogram, Reading, SinceStart
from infra.serving.statistics import (
    binomial_sf,
    error_rate_p,
    log_evidence_below,
    mann_whitney_u,
    rate_upper_bound,
    rollback_boundary,
    slower_p,
)


def _exact_sf(events: int, trials: int, p: Fraction) -> float:
    """P(X >= events), X binomial(trials, p), summed exactly."""
    return float(
        sum(math.comb(trials, k) * p**k * (1 - p) ** (trials - k) for k in range(events, trials + 1))
    )


@pytest.mark.parametrize(
    ("events", "trials", "p"),
    [
        (1, 1, Fraction(1, 100)),
        (5, 5, Fraction(1, 2)),  # every trial: p^n
        (3, 20, Fraction(1, 10)),  # below the mean: the lower tail, complemented
        (1, 50, Fraction(1, 20)),
        (3, 40, Fraction(1, 10)),  # the lower tail over several terms
        (10, 200, Fraction(1, 10)),
        (7, 30, Fraction(1, 10)),
        (50, 100, Fraction(1, 10)),  # far in the upper tail: about 1.5e-20, exact in relative terms
        (29, 30, Fraction(1, 3)),
    ],
)
def test_binomial_tails_match_the_exact_sum(events: int, trials: int, p: Fraction) -> None:
    assert binomial_sf(events, trials, float(p)) == pytest.approx(
        _exact_sf(events, trials, p), rel=1e-9, abs=0
    )


def test_binomial_tails_at_their_edges() -> None:
    assert binomial_sf(0, 10, 0.3) == 1.0 and binomial_sf(3, 10, 1.0) == 1.0
    assert binomial_sf(1, 10, 0.0) == 0.0  # a rate of 0 never errs
    assert binomial_sf(11, 10, 0.5) == 0.0  # more events than trials: impossible


def test_the_error_rate_p_value_of_one_request() -> None:
    """One request, one error, against a rate of 1 %: P = 0.01 (not "too few to tell")."""
    assert error_rate_p(1, 1, 0.01) == pytest.approx(0.01)
    assert error_rate_p(0, 0, 0.01) == 1.0


def _u_from_pairs(canary: list[int], stable: list[int]) -> float:
    """U counted pair by pair: each (canary, stable) observation pair where the stable one is faster
    scores 1, a tie in one bucket 1/2."""
    canary_values = [b for b, n in enumerate(canary) for _ in range(n)]
    stable_values = [b for b, n in enumerate(stable) for _ in range(n)]
    return sum(1.0 if s < c else 0.5 if s == c else 0.0 for c in canary_values for s in stable_values)


@pytest.mark.parametrize(
    ("canary", "stable"),
    [([1, 0], [0, 1]), ([0, 1], [1, 0]), ([3, 2, 1], [1, 2, 3]), ([0, 4, 1], [2, 2, 0]), ([1, 1], [1, 1])],
)
def test_u_is_the_count_of_pairs_and_its_variance_has_the_tie_correction(
    canary: list[int], stable: list[int]
) -> None:
    u, variance = mann_whitney_u(canary, stable)
    assert u == pytest.approx(_u_from_pairs(canary, stable))
    n1, n2 = sum(canary), sum(stable)
    n = n1 + n2
    ties = sum((c + s) ** 3 - (c + s) for c, s in zip(canary, stable, strict=True))
    assert variance == pytest.approx(n1 * n2 / 12 * (n + 1 - ties / (n * (n - 1))))


def test_one_observation_each_is_enough_for_a_variance() -> None:
    """Two observations in all in two buckets: variance 1/4 (one each; no ties); the canary one bucket
    slower has U = 1 and a p-value of 1/2 after the continuity correction."""
    assert mann_whitney_u([1, 0], [0, 1]) == (0.0, pytest.approx(0.25))
    assert slower_p([0, 1], [1, 0]) == pytest.approx(0.5)
    assert mann_whitney_u([1, 0], [0, 0]) == (0.0, 0.0)  # one observation: no variance


def _mixture_below(events: int, trials: int, p: Fraction) -> float:
    """log of the mean, over q = p*k/9 (k = 1..8), of P(count | q) / P(count | p), exactly."""
    ratios = [
        (q / p) ** events * ((1 - q) / (1 - p)) ** (trials - events) for q in (p * k / 9 for k in range(1, 9))
    ]
    return math.log(sum(ratios) / len(ratios))


@pytest.mark.parametrize(
    ("events", "trials", "p"), [(0, 10, Fraction(1, 5)), (2, 40, Fraction(1, 4)), (5, 5, Fraction(1, 2))]
)
def test_the_evidence_below_is_the_documented_mixture(events: int, trials: int, p: Fraction) -> None:
    assert log_evidence_below(events, trials, float(p)) == pytest.approx(
        _mixture_below(events, trials, p), rel=1e-9
    )


def test_the_evidence_below_at_rates_0_and_1() -> None:
    """No evidence that a rate is below 0; below 1, certain unless every trial was an event."""
    assert log_evidence_below(0, 10, 0.0) == -math.inf
    assert log_evidence_below(3, 10, 1.0) == math.inf
    assert log_evidence_below(10, 10, 1.0) == -math.inf


def test_the_upper_bound_of_a_rate() -> None:
    """At most 1; below 1 from a single trial without an event, where the evidence reaches the boundary
    just at the bound and not below it."""
    assert rate_upper_bound(0, 0, 0.05) == 1.0 and rate_upper_bound(4, 4, 0.05) == 1.0
    bound = rate_upper_bound(0, 1, 0.05)
    assert 0.0 < bound < 1.0
    boundary = rollback_boundary(0.05)
    assert log_evidence_below(0, 1, bound) >= boundary > log_evidence_below(0, 1, bound * 0.999)


# --- counters -------------------------------------------------------------------------------------------

BOUNDS = (0.1, 0.5, math.inf)


def _h(*counts: int, sum_s: float = 0.0, bounds: tuple[float, ...] = BOUNDS) -> Histogram:
    return Histogram(bounds, counts, sum_s)


def test_histograms_add_and_subtract_their_counts_and_sums() -> None:
    assert _h(1, 2, 3, sum_s=1.5).plus(_h(1, 0, 1, sum_s=0.5)) == _h(2, 2, 4, sum_s=2.0)
    assert _h(4, 2, 3, sum_s=2.5).minus(_h(1, 0, 1, sum_s=0.5)) == _h(3, 2, 2, sum_s=2.0)
    assert Counts(10, 4).minus(Counts(3, 1)) == Counts(7, 3)


def test_a_counter_that_went_down_restarted_whichever_it_was() -> None:
    """The requests counter alone went down (a reload that kept no 5xx yet): both count from zero."""
    assert Counts(5, 3).increase(Counts(100, 2)) == Counts(5, 3)
    assert Counts(105, 1).increase(Counts(100, 2)) == Counts(105, 1)
    assert Counts(1, 0, _h(1, 0, 0)).increase(Counts()) == Counts(1, 0, _h(1, 0, 0))  # no histogram before


def test_latency_since_start_sums_every_series_after_a_new_one() -> None:
    """Series by series: a series new since the last reading counts from its next one; the others'
    increases are summed, whichever comes first in the reading."""
    since = SinceStart(Reading(0, 0, {"a": _h(1, 0, 0), "b": _h(0, 1, 0)}))
    total = since.add(Reading(10, 1, {"new": _h(5, 5, 5), "a": _h(3, 0, 0), "b": _h(0, 4, 0)}))
    assert total == Counts(10, 1, _h(2, 3, 0))


def test_series_restarted_with_other_buckets_count_from_zero_each() -> None:
    """Model servers restarted with other buckets (a new version's histogram): each series counts from
    zero, and both are summed."""
    other = (0.2, math.inf)
    since = SinceStart(Reading(0, 0, {"c": _h(0, 0, 1), "d": _h(1, 0, 0)}))
    total = since.add(Reading(0, 0, {"c": Histogram(other, (2, 1)), "d": Histogram(other, (1, 1))}))
    assert total.latency == Histogram(other, (3, 2))
