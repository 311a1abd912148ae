"""What the canary analysis (infra/serving/analysis.py) says and where its boundaries lie: the text of each
measurement and verdict as the operator reads it in `serve status` and the guard's log, the median's bucket
at its edges, the last interval and the end of initial_delay_s. Each test here failed on a mutant of the
analysis that the suite let through (`make mutation`, docs/developing.md#mutation-score)."""

from __future__ import annotations

import math

from infra.serving.analysis import (
    CONTINUE,
    INCONCLUSIVE,
    PROMOTE_READY,
    ROLLBACK,
    Analysis,
    Guard,
    error_bound,
    measure_errors,
    measure_latency,
    sequential_errors,
    sequential_latency,
    slow_bucket,
)
from infra.serving.counts import Counts, Histogram
from infra.serving.statistics import rate_upper_bound
from infra.spec.models import Canary

BOUNDS = (0.01, 0.025, 0.05, math.inf)
INTERVALS_ONLY = 1e-300  # a sequential_alpha no evidence reaches: only the intervals decide
TOO_FEW = "at this share the stable version answers too few to compare the canary with"


def latency(counts: tuple[int, ...], mean_s: float, bounds: tuple[float, ...] = BOUNDS) -> Histogram:
    return Histogram(bounds, counts, mean_s * sum(counts))


STABLE = Counts(240, 2, latency((40, 120, 80, 0), 0.022))
CANARY = Counts(60, 0, latency((10, 30, 20, 0), 0.022))
SLOW = Counts(60, 0, latency((0, 0, 20, 40), 0.06))
ERRING = Counts(60, 15, CANARY.latency)


def feed(analysis: Analysis, intervals: list[tuple[Counts, Counts]], first: int = 1) -> list[str]:
    """Interval by interval, each pair the counts of that interval alone: the reasons of the looks."""
    stable, canary = Counts(), Counts()
    reasons = []
    for number, (s, c) in enumerate(intervals, start=first):
        stable, canary = stable.plus(s), canary.plus(c)
        verdict = analysis.look(number * analysis.rules.interval_s, stable, canary)
        reasons.append(f"{verdict.action}: {verdict.reason}")
    return reasons


# Each measurement names its metric and says why it judged nothing


def test_an_interval_too_thin_on_either_side_says_which_side_and_how_many() -> None:
    rules = Canary()
    few_canary = measure_errors(STABLE, Counts(9, 0), rules)
    assert (few_canary.metric, few_canary.outcome) == ("errors", INCONCLUSIVE)
    assert few_canary.detail == "9 canary requests, fewer than 10"
    few_stable = measure_errors(Counts(9, 0), Counts(200, 30), rules)
    assert (few_stable.metric, few_stable.outcome) == ("errors", INCONCLUSIVE)
    assert few_stable.detail == f"9 stable requests, fewer than 10: {TOO_FEW}"
    few_latencies = measure_latency(Counts(9, 0, latency((2, 4, 3, 0), 0.022)), CANARY, rules)
    assert (few_latencies.metric, few_latencies.outcome) == ("latency", INCONCLUSIVE)
    assert few_latencies.detail == f"9 stable latencies recorded, fewer than 10: {TOO_FEW}"


def test_a_canary_without_enough_latencies_says_how_many_it_recorded() -> None:
    rules = Canary()
    none = measure_latency(STABLE, Counts(60, 0), rules)
    assert none.detail == "0 canary latencies recorded, fewer than 10"
    five = measure_latency(STABLE, Counts(60, 0, latency((1, 2, 2, 0), 0.022)), rules)
    assert five.detail == "5 canary latencies recorded, fewer than 10"


def test_latency_inconclusive_for_the_stables_side_is_still_latencys() -> None:
    rules = Canary()
    none = measure_latency(Counts(240, 0), CANARY, rules)
    assert (none.metric, none.outcome) == ("latency", INCONCLUSIVE)
    assert none.detail == "no stable latencies recorded"
    other = Counts(60, 0, latency((10, 30, 20, 0), 0.022, (0.01, 0.02, 0.05, math.inf)))
    apart = measure_latency(STABLE, other, rules)
    assert (apart.metric, apart.outcome) == ("latency", INCONCLUSIVE)


# The judged measurements' text


def test_the_error_measurement_states_both_rates_the_stables_bound_and_the_test() -> None:
    rules = Canary()
    stable_bound = rate_upper_bound(2, 200, rules.alpha / 2)
    failed = measure_errors(Counts(200, 2), Counts(20, 9), rules)
    assert failed.outcome == "failed"
    assert failed.detail.startswith(
        "canary error rate 45.0% (9/20) against the stable version's 1.0% (2/200) "
        f"(at most {stable_bound:.1%}) plus max_error_rate_increase 5.0%: p = "
    )
    assert failed.detail.endswith(", alpha 0.01")


def test_the_error_bound_never_passes_one() -> None:
    """A stable version failing every request: the canary may fail every request too, no rate is above 1."""
    assert error_bound(Counts(20, 20), Canary(), 0.01) == 1.0


def test_the_latency_measurement_states_both_means_in_milliseconds_and_their_ratio() -> None:
    rules = Canary()
    slower = measure_latency(STABLE, SLOW, rules)
    assert slower.detail.startswith(
        "canary mean latency 60 ms is 2.73 x the stable version's 22 ms (max_latency_ratio 1.2); slower by "
        "rank: p = "
    )
    # Means of seconds, in milliseconds to the millisecond.
    seconds = (0.5, 1.0, 2.5, math.inf)
    stable_s = Counts(240, 0, latency((40, 120, 80, 0), 1.5, seconds))
    canary_s = Counts(60, 0, latency((0, 0, 20, 40), 3.0, seconds))
    assert measure_latency(stable_s, canary_s, rules).detail.startswith(
        "canary mean latency 3000 ms is 2.00 x the stable version's 1500 ms"
    )
    # A canary whose recorded sum is 0 (every answer under the clock's resolution) is 0 ms, 0 x.
    instant = measure_latency(STABLE, Counts(60, 0, Histogram(BOUNDS, (60, 0, 0, 0), 0.0)), rules)
    assert instant.outcome == "passed"
    assert instant.detail.startswith("canary mean latency 0 ms is 0.00 x the stable version's 22 ms")


# The sequential tests


def test_the_sequential_error_rollback_names_the_boundary_it_passed() -> None:
    verdict = sequential_errors(Counts(1000, 200), Counts(250, 125), Canary())
    assert verdict is not None and verdict.reason.endswith("passed 1/sequential_alpha (500)")


def test_the_sequential_latency_test_compares_only_histograms_over_the_same_buckets() -> None:
    """A canary all in the top buckets of a histogram over other bounds: its buckets are not the stable's,
    so counting its answers above the stable's slow bucket would count other latencies."""
    other = Counts(60, 0, latency((0, 0, 0, 60), 0.2, (0.01, 0.02, 0.04, math.inf)))
    assert sequential_latency(STABLE, other, Canary()) is None
    same = Counts(60, 0, latency((0, 0, 0, 60), 0.2))
    assert sequential_latency(STABLE, same, Canary()) is not None


# The bucket holding max_latency_ratio x the stable's median (histogram_quantile's interpolation)


def test_a_median_in_the_first_bucket_is_interpolated_from_zero() -> None:
    """(200, 40, 0, 0): the median, 120 of 200 into (0, 0.01], is 0.006 s; 1.2 x is 0.0072 s, bucket 0."""
    assert slow_bucket(Histogram(BOUNDS, (200, 40, 0, 0), 1.0), 1.2) == 0
    assert slow_bucket(Histogram(BOUNDS, (200, 40, 0, 0), 1.0), 1.7) == 1  # 0.0102 s


def test_a_limit_exactly_at_a_buckets_upper_bound_is_in_that_bucket() -> None:
    """(100, 0, 0, 0): median 0.005 s; 2 x is 0.01 s, the first bucket's `le`: not above it."""
    assert slow_bucket(Histogram(BOUNDS, (100, 0, 0, 0), 0.5), 2.0) == 0


def test_the_median_is_interpolated_from_the_answers_of_every_bucket_below_it() -> None:
    """(20, 20, 60, 0): 40 answers below (0.025, 0.05], the median 10 of its 60 into it, 0.02917 s; 1.5 x is
    0.04375 s, still in that bucket. (0, 100, 0, 0): median 0.0175 s, just past 0.025 s at 1.435 x."""
    assert slow_bucket(Histogram(BOUNDS, (20, 20, 60, 0), 3.0), 1.5) == 2
    assert slow_bucket(Histogram(BOUNDS, (0, 100, 0, 0), 1.75), 1.435) == 2
    assert slow_bucket(Histogram(BOUNDS, (0, 100, 0, 0), 1.75), 1.42) == 1


def test_a_median_at_a_buckets_edge_is_that_bucket_not_the_next_one_holding_answers() -> None:
    """(50, 0, 0, 50): half the answers by 0.01 s, half beyond the last finite bound. histogram_quantile's
    rank 50 falls in the first bucket (cumulative 50 >= 50): the median is 0.01 s, 1.2 x in bucket 1."""
    assert slow_bucket(Histogram(BOUNDS, (50, 0, 0, 50), 2.0), 1.2) == 1


def test_an_empty_histogram_puts_the_limit_in_the_last_bucket_above_which_nothing_is() -> None:
    assert slow_bucket(Histogram(BOUNDS, (0, 0, 0, 0), 0.0), 1.2) == len(BOUNDS) - 1


# Intervals and the verdicts' text


def test_a_continuing_analysis_says_how_far_it_is() -> None:
    (reason,) = feed(Analysis(Canary()), [(STABLE, CANARY)])
    assert reason == (
        "continue: 1 of 5 intervals of 60 s analysed; the canary answered 60 requests (0 errors) since it "
        "started"
    )


def test_a_rollback_for_failed_intervals_names_the_metric_the_count_and_the_last_failure() -> None:
    rules = Canary(sequential_alpha=INTERVALS_ONLY)
    erring_more = Counts(60, 18, CANARY.latency)
    reasons = feed(Analysis(rules), [(STABLE, ERRING), (STABLE, erring_more)])
    assert reasons[-1].startswith(
        "rollback: errors failed 2 of 2 intervals (failure_limit 1): canary error rate 30.0% (18/60) against"
    )


def test_too_many_unjudged_intervals_end_inconclusive_with_the_last_ones_reason_and_the_remedy() -> None:
    rules = Canary(inconclusive_limit=2, sequential_alpha=INTERVALS_ONLY)
    thin = [(STABLE, Counts(n, 0)) for n in (5, 6, 7)]
    reasons = feed(Analysis(rules), thin)
    assert reasons[-1] == (
        "inconclusive: errors could not be judged in 3 of 3 intervals (inconclusive_limit 2): 7 canary "
        "requests, fewer than 10; give the canary a larger share or longer intervals"
    )


def test_exactly_min_requests_over_the_analysis_is_enough() -> None:
    """min_requests 50 over 5 intervals of 10 canary requests each: every interval judged, and 50 answered
    is "at least min_requests"."""
    rules = Canary(sequential_alpha=INTERVALS_ONLY)
    ten = Counts(10, 0, latency((2, 5, 3, 0), 0.022))
    assert feed(Analysis(rules), [(STABLE, ten)] * 5)[-1].startswith("promote-ready: ")


def test_too_few_requests_at_the_end_says_how_many_and_what_to_change() -> None:
    """Four judged intervals of 10 canary requests and one of 5 (within inconclusive_limit 1): 45 answered
    of min_requests 50."""
    rules = Canary(sequential_alpha=INTERVALS_ONLY)
    ten = Counts(10, 0, latency((2, 5, 3, 0), 0.022))
    five = Counts(5, 0, latency((1, 2, 2, 0), 0.022))
    reasons = feed(Analysis(rules), [(STABLE, ten)] * 4 + [(STABLE, five)])
    assert reasons[-1] == (
        "inconclusive: the canary answered 45 requests in its 300 s analysis, fewer than min_requests 50: "
        "give it a larger share or a longer analysis"
    )


def test_promote_ready_reports_the_totals_and_the_last_intervals_latency() -> None:
    rules = Canary(sequential_alpha=INTERVALS_ONLY)
    intervals = [(STABLE, Counts(60, 0, latency((10, 30, 20, 0), (20 + i) / 1000))) for i in range(1, 6)]
    reasons = feed(Analysis(rules), intervals)
    assert reasons[-1].startswith(
        "promote-ready: 5 intervals passed: canary error rate 0.0% (0/300), stable 0.8% (10/1200); canary "
        "mean latency 25 ms is "
    )


def test_a_metric_never_judged_is_named_with_the_last_intervals_reason() -> None:
    """Limits the spec refuses (inconclusive_limit 5 of 5 intervals; the analysis refuses promote-ready on
    them anyway): a stable version answering 5 to 9 requests an interval leaves both metrics unjudged."""
    unchecked = Canary.model_construct(**{**Canary().model_dump(), "inconclusive_limit": 5})
    canary = Counts(100, 0, latency((20, 50, 30, 0), 0.022))
    intervals = [(Counts(n, 0), canary) for n in (5, 6, 7, 8, 9)]
    reasons = feed(Analysis(unchecked), intervals)
    assert reasons[-1] == (
        "inconclusive: errors and latency could not be judged in any of the 5 intervals: "
        f"9 stable requests, fewer than 10: {TOO_FEW}; no stable latencies recorded"
    )


def test_after_the_last_interval_nothing_more_is_judged() -> None:
    """One failed interval of five is allowed (failure_limit 1); a look after the analysis ended, on a
    canary that went on failing, does not judge a sixth interval: the verdict stands."""
    rules = Canary(sequential_alpha=INTERVALS_ONLY)
    analysis = Analysis(rules)
    intervals = [(STABLE, SLOW)] + [(STABLE, CANARY)] * 4 + [(STABLE, SLOW)]
    reasons = feed(analysis, intervals)
    assert [reason.split(":")[0] for reason in reasons] == [CONTINUE] * 4 + [PROMOTE_READY] * 2
    assert analysis.intervals_done == rules.intervals


# initial_delay_s


def test_the_analysis_starts_the_moment_initial_delay_s_is_over() -> None:
    """At exactly started + initial_delay_s the warm-up is over: the reading counts, from the last warm-up
    reading on; half a second later it still does."""
    rules = Canary(initial_delay_s=30)
    guard = Guard(rules, 0.0, Counts(0, 0), Counts(0, 0))
    warming = guard.look(20.0, Counts(100, 0), Counts(40, 0))
    assert warming.reason == "initial_delay_s 30: the analysis starts in 10 s"
    at_end = guard.look(30.0, Counts(150, 0), Counts(50, 0))
    assert at_end.action == CONTINUE
    assert at_end.reason.endswith("the canary answered 10 requests (0 errors) since it started")
    later = guard.look(30.5, Counts(200, 0), Counts(70, 0))
    assert later.reason.endswith("the canary answered 30 requests (0 errors) since it started")
    assert ROLLBACK not in (at_end.action, later.action)
