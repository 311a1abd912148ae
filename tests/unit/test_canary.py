"""The canary's gate (infra/serving/canary.py) and its analysis: counts since the canary started
(infra/serving/counts.py), the tests (infra/serving/statistics.py), intervals, the sequential test and the
verdicts (infra/serving/analysis.py), the settings the traffic cannot meet (infra/spec/models.py Canary)."""

from __future__ import annotations

import math

import pytest

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
from infra.serving.canary import gate
from infra.serving.counts import Counts, Histogram, SinceStart
from infra.serving.registry.mlflow import ModelVersion
from infra.serving.statistics import (
    error_rate_p,
    log_evidence_above,
    mann_whitney_u,
    rate_upper_bound,
    rollback_boundary,
    slower_p,
)
from infra.spec.models import Canary


def _version(number: int, **tags: str) -> ModelVersion:
    return ModelVersion(name="embedder", version=number, source="/shared/models/x", status="READY", tags=tags)


def test_a_metric_that_is_not_a_finite_number_never_passes_the_gate() -> None:
    """A tag anyone with the registry's API can set: inf would pass every gate and, promoted, block every
    later version; nan compares false both ways."""
    rules = Canary(gate_metric="accuracy")
    for value in ("inf", "nan", "-inf", "NaN", "1e400"):
        assert "carries no 'accuracy'" in str(gate(_version(2, accuracy=value), None, rules)), value
    assert gate(_version(2, accuracy="0.9"), _version(1, accuracy="inf"), rules) is None  # stable's ignored


def test_the_gate_asks_for_the_metric_its_minimum_and_no_worse_than_stable() -> None:
    rules = Canary(gate_metric="accuracy", gate_min=0.8)
    assert gate(_version(2, accuracy="0.91"), _version(1, accuracy="0.90"), rules) is None
    assert "carries no 'accuracy'" in str(gate(_version(2), None, rules))
    assert "asks at least 0.8" in str(gate(_version(2, accuracy="0.7"), None, rules))
    assert "worse than the stable embedder@1's 0.95" in str(
        gate(_version(2, accuracy="0.9"), _version(1, accuracy="0.95"), rules)
    )
    loss = Canary(gate_metric="loss", higher_is_better=False)
    assert gate(_version(2, loss="1.9"), _version(1, loss="2.0"), loss) is None
    assert gate(_version(2, loss="2.1"), _version(1, loss="2.0"), loss) is not None
    assert gate(_version(2), None, Canary()) is None


def test_gate_min_without_its_metric_is_refused() -> None:
    with pytest.raises(ValueError, match="gate_min needs gate_metric"):
        Canary(gate_min=0.5)


def test_the_gate_lets_a_candidate_equal_to_its_bar_through() -> None:
    """A candidate exactly at gate_min, or exactly as good as the stable version, passes: the bar is "at
    least" (higher is better) or "at most" (lower is better), never strictly better."""
    rules = Canary(gate_metric="accuracy", gate_min=0.8)
    assert gate(_version(2, accuracy="0.8"), _version(1, accuracy="0.8"), rules) is None
    assert gate(_version(2, accuracy="0.9"), None, rules) is None  # no stable version yet: nothing to beat
    assert gate(_version(2, accuracy="0.9"), _version(1), rules) is None  # a stable version without it
    loss = Canary(gate_metric="loss", gate_min=2.0, higher_is_better=False)
    assert gate(_version(2, loss="2.0"), _version(1, loss="2.0"), loss) is None
    assert (
        gate(_version(2, loss="2.5"), None, loss)
        == "embedder@2 has loss 2.5; serving.canary.gate_min asks at most 2"
    )
    assert gate(_version(2, loss="not-a-number"), None, loss) == (
        "embedder@2 carries no 'loss' (serving.canary.gate_metric): tag the version with its evaluation "
        "(`gpuplat models register ... --metric loss=VALUE`)"
    )


BOUNDS = (0.01, 0.025, 0.05, math.inf)


def latency(counts: tuple[int, ...], mean_s: float) -> Histogram:
    return Histogram(BOUNDS, counts, mean_s * sum(counts))


# Counts since the canary started


def test_the_analysis_counts_from_the_canarys_start_not_from_the_gateways() -> None:
    """HAProxy counts since the gateway started, the canary backend's earlier canaries included: 400 errors
    of an earlier canary are no evidence against this one, and its own 60 requests per interval are."""
    rules = Canary()
    guard = Guard(rules, 0.0, Counts(10_000, 100), Counts(500, 400))
    verdict = guard.look(0.0, Counts(10_000, 100), Counts(500, 400))
    for i in range(1, rules.intervals + 1):
        stable = Counts(10_000 + 240 * i, 100 + 2 * i, latency((40 * i, 120 * i, 80 * i, 0), 0.02))
        canary = Counts(500 + 60 * i, 400, latency((10 * i, 30 * i, 20 * i, 0), 0.02))
        verdict = guard.look(i * rules.interval_s, stable, canary)
    assert verdict.action == PROMOTE_READY, verdict
    assert guard.canary.total.requests == 60 * rules.intervals and guard.canary.total.errors == 0


def test_failures_since_the_start_never_outnumber_the_answers() -> None:
    """The serving scenario's guard read 30 failures of 29 canary requests since it started: the gateway
    counts a 5xx cut off under hrsp_5xx and srv_abrt both, capped at its requests only in its own total."""
    since = SinceStart(Counts(100, 0))
    assert since.add(Counts(129, 30)) == Counts(29, 29)
    assert since.add(Counts(130, 30)) == Counts(30, 29)


def test_a_counter_that_restarts_counts_from_zero() -> None:
    """A reload restarts HAProxy's counters, a restart the model server's histogram: what came after the
    restart is added, nothing is subtracted."""
    tally = SinceStart(Counts(900, 3, latency((5, 5, 0, 0), 0.01)))
    tally.add(Counts(950, 4, latency((10, 5, 0, 0), 0.01)))
    total = tally.add(Counts(40, 2, latency((1, 0, 0, 0), 0.005)))
    assert (total.requests, total.errors) == (90, 3)
    assert total.latency is not None and total.latency.counts == (6, 0, 0, 0)
    # A look without the histogram (Prometheus did not answer) keeps the last one.
    assert tally.add(Counts(41, 2)).latency == total.latency
    assert tally.add(Counts(42, 2, latency((2, 0, 0, 0), 0.005))).latency.counts == (7, 0, 0, 0)  # type: ignore[union-attr]


def test_cumulative_buckets_become_counts_per_bucket() -> None:
    histogram = Histogram.from_cumulative({0.05: 9.0, 0.01: 2.0, math.inf: 10.0, 0.025: 5.0}, 0.3)
    assert histogram == Histogram(BOUNDS, (2, 3, 4, 1), 0.3)
    assert histogram.mean_s == pytest.approx(0.03)


# The tests' p-values, against values worked by hand and the standard normal table


def test_the_error_test_is_an_exact_binomial_test_against_a_bound() -> None:
    """P(X >= k), X binomial(n, p0), by hand: 1 - 0.99^100 = 0.634 for one error in 100 at 1 %; three in 10
    at 10 %: 1 - (0.9^10 + 10 x 0.1 x 0.9^9 + 45 x 0.01 x 0.9^8) = 0.0702."""
    assert error_rate_p(1, 100, 0.01) == pytest.approx(1 - 0.99**100)
    by_hand = 1 - (0.9**10 + 10 * 0.1 * 0.9**9 + 45 * 0.01 * 0.9**8)
    assert error_rate_p(3, 10, 0.1) == pytest.approx(by_hand)
    assert error_rate_p(0, 0, 0.05) == 1.0  # no canary request: nothing known
    assert error_rate_p(0, 40, 0.0) == 1.0
    assert error_rate_p(5, 5, 1.0) == 1.0


def _pairs_u(canary: tuple[int, ...], stable: tuple[int, ...]) -> float:
    """U counted pair by pair over the expanded samples (a tie counts one half)."""
    xs = [i for i, c in enumerate(canary) for _ in range(c)]
    ys = [i for i, s in enumerate(stable) for _ in range(s)]
    return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in xs for y in ys)


def test_mann_whitney_on_bucket_counts_with_the_tie_correction() -> None:
    """Canary (0, 1, 2), stable (2, 1, 0): U = 1 x (2 + 1/2) + 2 x 3 = 8.5; N = 6, each bucket a tie of 2
    (t^3 - t = 6, thrice): variance 3 x 3 / 12 x (7 - 18 / 30) = 4.8; p = P(Z > (8.5 - 4.5 - 0.5) / sqrt 4.8)
    = P(Z > 1.597) = 0.0551."""
    assert mann_whitney_u((0, 1, 2), (2, 1, 0)) == (8.5, pytest.approx(4.8))
    assert slower_p((0, 1, 2), (2, 1, 0)) == pytest.approx(0.0551, abs=1e-4)
    for canary, stable in [
        ((3, 0, 5, 1), (2, 2, 2, 2)),
        ((0, 0, 7, 0), (1, 6, 0, 0)),
        ((4, 4, 0, 1), (0, 3, 3, 3)),
    ]:
        assert mann_whitney_u(canary, stable)[0] == _pairs_u(canary, stable)
    # No ties: the plain variance n1 n2 (N + 1) / 12.
    assert mann_whitney_u((0, 1, 0, 1), (1, 0, 1, 0))[1] == pytest.approx(2 * 2 * 5 / 12)
    assert slower_p((0, 0, 0), (0, 0, 0)) == 1.0
    with pytest.raises(ValueError, match="different buckets"):
        mann_whitney_u((1, 2), (1, 2, 3))


# The sequential test's boundary


def test_the_sequential_test_rolls_back_at_its_boundary() -> None:
    """1/sequential_alpha, in logs: the default 0.002 is log 500. A canary failing 4 of 4 against a stable
    failing 0 of 48, margin 5 %: the mixture's likelihood B(4.5, 0.5) B(0.5, 48.5) / B(0.5, 0.5)^2 over the
    null's largest, (x + 0.05)^4 (1 - x)^48 at x = 1.6 / 52 (where 4 / (x + 0.05) = 48 / (1 - x))."""
    assert rollback_boundary(0.002) == pytest.approx(math.log(500))

    def beta(a: float, b: float) -> float:
        return math.gamma(a) * math.gamma(b) / math.gamma(a + b)

    x = 1.6 / 52
    by_hand = beta(4.5, 0.5) * beta(0.5, 48.5) / beta(0.5, 0.5) ** 2 / ((x + 0.05) ** 4 * (1 - x) ** 48)
    assert log_evidence_above(4, 4, 0, 48, 0.05) == pytest.approx(math.log(by_hand))
    assert log_evidence_above(3, 3, 0, 48, 0.05) < rollback_boundary(0.002) < math.log(by_hand)
    assert log_evidence_above(0, 1000, 0, 1000, 0.05) < 0  # answers without errors only lower the evidence
    assert log_evidence_above(30, 30, 0, 0, 0.05) < 0  # no stable answers: nothing to be worse than


def _rolled_back(stable_rate: float, canary_rate: float, alpha: float, looks: int = 30) -> float:
    """The exact chance that the sequential test ever rolls back in `looks` looks of 1 canary and 4 stable
    requests each (a distribution over both error counts, a path removed once it crosses)."""
    alive = {(0, 0): 1.0}
    crossed = 0.0
    for look in range(1, looks + 1):
        after: dict[tuple[int, int], float] = {}
        for (canary_errors, stable_errors), weight in alive.items():
            for failed in (0, 1):
                canary_weight = canary_rate if failed else 1 - canary_rate
                for stable_failed in range(5):
                    stable_weight = (
                        math.comb(4, stable_failed)
                        * stable_rate**stable_failed
                        * (1 - stable_rate) ** (4 - stable_failed)
                    )
                    key = (canary_errors + failed, stable_errors + stable_failed)
                    after[key] = after.get(key, 0.0) + weight * canary_weight * stable_weight
        alive = {}
        for (canary_errors, stable_errors), weight in after.items():
            if log_evidence_above(canary_errors, look, stable_errors, 4 * look, 0.05) >= rollback_boundary(
                alpha
            ):
                crossed += weight
            else:
                alive[(canary_errors, stable_errors)] = weight
    return crossed


def test_the_sequential_test_rolls_an_acceptable_canary_back_at_most_alpha_of_the_time() -> None:
    """Ville's bound, summed exactly: a canary exactly max_error_rate_increase worse than the stable (the
    null hypothesis' worst case) is rolled back in at most alpha of its paths, looked at after every
    request; a canary failing half its requests (against 10 %) in most of 30 looks."""
    for stable_rate in (0.0, 0.1, 0.3):
        assert _rolled_back(stable_rate, stable_rate + 0.05, 0.05) <= 0.05
    assert _rolled_back(0.1, 0.5, 0.05) > 0.5


def test_a_canary_failing_every_request_at_one_request_per_second_is_rolled_back_within_a_minute() -> None:
    """Issue 48's goal: at 1 request/s and a 20 % share the canary answers Poisson(12) requests in its first
    60 s, fewer than 5 in 0.76 % of minutes; the stable about 48. 4 failures of 4 must roll back: the
    stable's confidence bound and a test against it, each at half of sequential_alpha, needed 6."""
    verdict = sequential_errors(Counts(48, 0), Counts(4, 4), Canary())
    assert verdict is not None and verdict.action == ROLLBACK
    assert sequential_errors(Counts(48, 1), Counts(5, 5), Canary()) is not None


def test_a_failing_canary_is_rolled_back_by_the_sequential_test_before_its_first_interval() -> None:
    rules = Canary()
    analysis = Analysis(rules)
    assert analysis.look(20, Counts(16, 0), Counts(4, 4)).action == CONTINUE
    verdict = analysis.look(40, Counts(32, 0), Counts(8, 8))
    assert verdict.action == ROLLBACK and verdict.reason.startswith("canary error rate 100.0% (8/8)")
    assert analysis.intervals_done == 0


# Intervals, failure and inconclusive limits, verdicts


def cumulative(intervals: list[tuple[Counts, Counts]]) -> list[tuple[Counts, Counts]]:
    """Counts of each interval summed as the guard's since-start counts."""
    stable, canary = Counts(), Counts()
    summed = []
    for s, c in intervals:
        stable, canary = stable.plus(s), canary.plus(c)
        summed.append((stable, canary))
    return summed


def run(rules: Canary, intervals: list[tuple[Counts, Counts]]) -> list[str]:
    """Feed an analysis interval by interval, until its verdict."""
    analysis = Analysis(rules)
    actions = []
    for number, (stable, canary) in enumerate(cumulative(intervals), start=1):
        actions.append(analysis.look(number * rules.interval_s, stable, canary).action)
        if actions[-1] != CONTINUE:
            break
    return actions


GOOD = (Counts(240, 2, latency((40, 120, 80, 0), 0.022)), Counts(60, 0, latency((10, 30, 20, 0), 0.022)))
SLOW = (GOOD[0], Counts(60, 0, latency((0, 0, 20, 40), 0.06)))
ERRING = (Counts(240, 2, GOOD[0].latency), Counts(60, 15, GOOD[1].latency))  # 25 % against 0.8 %
QUIET = (GOOD[0], Counts(5, 0, latency((1, 2, 2, 0), 0.022)))


INTERVALS_ONLY = 1e-300  # a sequential_alpha no evidence reaches


def test_one_failed_interval_is_allowed_the_second_rolls_back() -> None:
    """failure_limit 1: failed > 1 rolls back (Argo's `result.Failed > failureLimit`)."""
    rules = Canary(sequential_alpha=INTERVALS_ONLY)
    assert run(rules, [SLOW, GOOD, GOOD, GOOD, GOOD]) == [CONTINUE] * 4 + [PROMOTE_READY]
    slower = Analysis(rules)
    assert [
        slower.look(i * 60, *pair).action for i, pair in enumerate(cumulative([SLOW, GOOD, SLOW]), 1)
    ] == [
        CONTINUE,
        CONTINUE,
        ROLLBACK,
    ]
    assert run(Canary(failure_limit=0, sequential_alpha=INTERVALS_ONLY), [SLOW]) == [ROLLBACK]
    assert run(rules, [ERRING, ERRING]) == [CONTINUE, ROLLBACK]
    # With the sequential tests a plainly slower or erring canary goes at its first look.
    assert run(Canary(), [SLOW]) == [ROLLBACK]
    assert run(Canary(), [(GOOD[0], Counts(60, 30, GOOD[1].latency))]) == [ROLLBACK]
    assert run(Canary(), [ERRING]) == [CONTINUE]  # 9 of 60: significant in its interval, not yet sequentially


def test_the_sequential_latency_test_counts_answers_above_the_bucket_of_the_allowed_ratio() -> None:
    """Stable (40, 120, 80, 0) over (0.01, 0.025, 0.05, +Inf): its median, interpolated in (0.01, 0.025],
    is 0.01 + 0.015 x 80/120 = 0.02 s; max_latency_ratio 1.2 puts 0.024 s in that bucket, so answers
    above 0.025 s are slow: 80 of the stable's 240. A canary with 30 of 60 above it is within; one with 60
    of 60 is evidence."""
    rules = Canary()
    stable = GOOD[0]
    assert slow_bucket(stable.latency, 1.2) == 1  # type: ignore[arg-type]
    assert slow_bucket(stable.latency, 1.3) == 2  # type: ignore[arg-type]  # 0.026 s: the next bucket
    within = Counts(60, 0, latency((0, 30, 30, 0), 0.03))
    assert sequential_latency(stable, within, rules) is None
    slower = sequential_latency(stable, SLOW[1], rules)
    assert slower is not None and slower.reason.startswith(
        "60 of the canary's 60 answers since it started (100%) took longer than 0.025 s, the bucket holding "
        "max_latency_ratio 1.2 x the stable version's median, against 33% of the stable's 240"
    )
    assert sequential_latency(Counts(240, 0), SLOW[1], rules) is None  # no stable latencies: no bound
    # With a ratio of 1.3 the same canary's answers in (0.025, 0.05] are allowed: no evidence.
    assert sequential_latency(stable, SLOW[1], Canary(max_latency_ratio=1.3)) is not None
    assert (
        sequential_latency(stable, Counts(60, 0, latency((0, 0, 60, 0), 0.04)), Canary(max_latency_ratio=1.3))
        is None
    )


def test_the_sequential_latency_test_rolls_back_at_1_over_sequential_alpha_not_before() -> None:
    """Against the stable's 80 slow of 240 plus max_slow_share_increase 0.1, 26 slow of 30 is evidence 464,
    short of 1/0.002; 27 of 30 is 3789, past it."""
    rules = Canary()
    assert sequential_latency(GOOD[0], Counts(30, 0, latency((0, 4, 26, 0), 0.04)), rules) is None
    past = sequential_latency(GOOD[0], Counts(30, 0, latency((0, 3, 27, 0), 0.04)), rules)
    assert past is not None and "evidence 3.79e+03 passed 1/sequential_alpha (500)" in past.reason


def test_counts_that_already_meet_the_null_are_no_evidence_against_it() -> None:
    """Where the canary's observed rate is within the stable's plus the margin, the null's maximum is the
    likelihood's own: the mixture over it is at most 1, whatever the counts."""
    within = (
        ((6, 100), (2, 100)),
        ((600, 20000), (0, 20000)),
        ((1500, 20000), (600, 20000)),
        ((0, 5), (3, 50)),
    )
    for canary, stable in within:
        assert log_evidence_above(*canary, *stable, 0.05) <= 0.0


def test_the_sequential_error_test_allows_the_stables_own_rate() -> None:
    """A stable version failing 20 % of its requests: a canary failing as often is no evidence; against a
    bound of the margin alone (5 %) it would be."""
    rules = Canary()
    assert sequential_errors(Counts(1000, 200), Counts(250, 50), rules) is None
    assert log_evidence_above(50, 250, 0, 1000, 0.05) > rollback_boundary(rules.sequential_alpha)
    assert sequential_errors(Counts(1000, 200), Counts(250, 125), rules) is not None


def test_an_interval_is_judged_from_exactly_its_share_of_min_requests_at_level_alpha() -> None:
    """min_requests 50 over 5 intervals: 10 canary requests are judged, 9 are not. Against the stable's 2
    in 200 (its bound at alpha / 2) plus 5 %, the exact test at alpha / 2 fails 9 errors in 20, not 6."""
    rules = Canary()
    assert measure_errors(Counts(200, 2), Counts(10, 0), rules).outcome == "passed"
    assert measure_errors(Counts(200, 2), Counts(9, 0), rules).outcome == "inconclusive"
    assert measure_latency(GOOD[0], Counts(10, 0, latency((2, 5, 3, 0), 0.022)), rules).outcome == "passed"
    assert (
        measure_latency(GOOD[0], Counts(9, 0, latency((2, 4, 3, 0), 0.022)), rules).outcome == "inconclusive"
    )
    bound = error_bound(Counts(200, 2), rules, rules.alpha)
    assert bound == pytest.approx(rate_upper_bound(2, 200, rules.alpha / 2) + 0.05)
    for errors in range(21):
        p = error_rate_p(errors, 20, bound)
        outcome = measure_errors(Counts(200, 2), Counts(20, errors), rules).outcome
        assert outcome == ("failed" if p < rules.alpha / 2 else "passed")
    assert measure_errors(Counts(200, 2), Counts(20, 9), rules).outcome == "failed"
    assert measure_errors(Counts(200, 2), Counts(20, 6), rules).outcome == "passed"


def test_an_interval_with_too_few_stable_answers_to_compare_with_is_inconclusive() -> None:
    """A canary with nearly all the traffic (a 99 % step) leaves the stable 9 answers: the canary is not
    compared with them (promote-ready by default), the interval is not judged."""
    rules = Canary()
    canary = Counts(200, 30, latency((40, 100, 60, 0), 0.022))
    for measure in (measure_errors, measure_latency):
        few = measure(Counts(9, 0, latency((2, 4, 3, 0), 0.022)), canary, rules)
        assert few.outcome == "inconclusive" and "9 stable" in few.detail
        assert measure(Counts(10, 0, latency((2, 5, 3, 0), 0.022)), canary, rules).outcome != "inconclusive"


def test_too_little_traffic_ends_inconclusive_and_never_promote_ready() -> None:
    rules = Canary()
    assert run(rules, [QUIET, GOOD, QUIET]) == [CONTINUE, CONTINUE, INCONCLUSIVE]
    # Every interval judged, yet fewer than min_requests in all: inconclusive too.
    few = Canary(min_requests=400, intervals=2, inconclusive_limit=1, expected_requests_per_s=None)
    assert run(few, [GOOD, GOOD]) == [CONTINUE, INCONCLUSIVE]


def test_latency_fails_only_significantly_slower_and_beyond_the_ratio() -> None:
    rules = Canary()
    stable = GOOD[0]
    slower = measure_latency(stable, SLOW[1], rules)
    assert slower.outcome == "failed" and "2.73 x" in slower.detail
    # As slow by rank, yet a mean within max_latency_ratio: passes.
    within = Counts(60, 0, Histogram(BOUNDS, (0, 0, 20, 40), 0.022 * 1.2 * 60))
    assert measure_latency(stable, within, rules).outcome == "passed"
    assert measure_latency(stable, GOOD[1], rules).outcome == "passed"
    assert measure_latency(stable, Counts(60, 0), rules).outcome == "inconclusive"
    assert measure_latency(Counts(240, 0), GOOD[1], rules).outcome == "inconclusive"


# Settings the traffic cannot meet


def test_a_setting_the_traffic_cannot_meet_is_refused_with_the_arithmetic() -> None:
    with pytest.raises(ValueError) as refused:
        Canary(expected_requests_per_s=0.5)
    assert (
        "a canary at 20 % of 0.5 requests/s answers about 6.0 requests per 60 s interval, fewer than the 10 "
        "each interval needs (min_requests 50 / intervals 5): every interval would be inconclusive; give the "
        "canary at least 34 %"
    ) in str(refused.value)
    rules = Canary(expected_requests_per_s=2)
    assert str(rules.traffic_problem(8)).endswith(
        "about 9.6 requests per 60 s interval, fewer than the 10 "
        "each interval needs (min_requests 50 / intervals 5): every interval would be inconclusive; give the "
        "canary at least 9 %"
    )
    assert rules.traffic_problem(9) is None  # 2 x 9 % x 60 s = 10.8 >= 10
    # Exactly the requests an interval needs is enough: 1 x 20 % x 50 s = 10.
    assert Canary(expected_requests_per_s=1, interval_s=50).traffic_problem(20) is None
    # An interval needs min_requests / intervals rounded up: 51 / 5 asks 11.
    assert Canary(min_requests=51).interval_min_requests == 11
    with pytest.raises(ValueError, match="fewer than the 11 each interval needs"):
        Canary(min_requests=51, expected_requests_per_s=1, interval_s=50)
    tiny = Canary(expected_requests_per_s=0.1, min_requests=5)  # 1 a interval needed, 1.2 at 20 %
    assert tiny.traffic_problem(100) is None
    with pytest.raises(ValueError, match="no share can: lower min_requests or raise interval_s"):
        Canary(expected_requests_per_s=0.1, share_percent=99)
