"""Issue 48's attack on the canary analysis (REVIEW questions 5, 7, 9, 12): its findings 1-8, each test
failing on the analysis before it."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from infra.errors import ExitCode, GpuPlatError
from infra.errors.problems import field_path, validation_problems
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
    sequential_latency,
)
from infra.serving.counts import Counts, Histogram, Reading, SinceStart
from infra.serving.metrics_text import GatewayFigures, parse_metrics, sample_labels
from infra.serving.release import (
    CANARY_BACKEND,
    STABLE_BACKEND,
    Release,
    ServingLayout,
)
from infra.serving.statistics import _log_pmf, binomial_sf, log_evidence_above, rate_upper_bound
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


# Finding 1: a missed scrape of one replica


BOUNDS = (0.01, 0.025, 0.05, math.inf)


def _at(count: int) -> Histogram:
    return Histogram(BOUNDS, (0, count, 0, 0), 0.02 * count)


def test_a_missed_scrape_of_one_replica_adds_nothing_and_its_return_nothing_more() -> None:
    """Two stable replicas with a million answers each before the canary, 10 more each per look; at look 2
    replica b's series is missing (stale). Summed before the guard saw them, the drop read as a restart and
    added a million, and again when b came back. Series by series the total is the true 20 per look (b's
    10 of look 2 counted at look 3)."""
    since = SinceStart(Reading(0, 0, {"a": _at(1_000_000), "b": _at(1_000_000)}))
    seen = []
    for look in range(1, 5):
        a, b = _at(1_000_000 + 10 * look), _at(1_000_000 + 10 * look)
        latency = {"a": a} if look == 2 else {"a": a, "b": b}
        total = since.add(Reading(0, 0, latency)).latency
        assert total is not None
        seen.append(total.count)
    assert seen == [20, 30, 60, 80]
    # A replica that restarted counts from zero; one that appears after the start counts from then.
    restarted = since.add(Reading(0, 0, {"a": _at(5), "b": _at(1_000_050), "c": _at(7)})).latency
    assert restarted is not None and restarted.count == 80 + 5 + 10


METRICS = """# port 8000
# HELP gpuplat_inference_request_duration_seconds Time to answer.
# TYPE gpuplat_inference_request_duration_seconds histogram
gpuplat_inference_request_duration_seconds_bucket{le="0.01",model="a"} 1.0
gpuplat_inference_request_duration_seconds_bucket{le="0.025",model="a"} 3.0
gpuplat_inference_request_duration_seconds_bucket{le="0.05",model="a"} 4.0
gpuplat_inference_request_duration_seconds_bucket{le="+Inf",model="a"} 4.0
gpuplat_inference_request_duration_seconds_sum{model="a"} 1.5
gpuplat_inference_request_duration_seconds_count{model="a"} 4.0
other_metric 7
# port 8100
gpuplat_inference_request_duration_seconds_bucket{model="b",le="+Inf"} 2.0
gpuplat_inference_request_duration_seconds_sum 0.25
"""


def test_both_versions_histograms_are_read_from_their_servers_at_one_instant_by_server() -> None:
    """Findings 1 and 4: each model server's /metrics, read at the look (not Prometheus' scrapes at their
    own phases), kept apart by node:port, with its _sum."""
    assert parse_metrics(METRICS, "gpuplat_inference_request_duration_seconds") == {
        8000: Histogram(BOUNDS, (1, 2, 1, 0), 1.5),
        8100: Histogram((math.inf,), (2,), 0.25),
    }

    class Nodes:
        def exec(self, node: str, *command: str, timeout: float = 120) -> str:
            if command[0] == "ls":
                return "replica-0.env version-canary.env"
            assert command[:2] == ("python3", "-c") and command[3:] == ("127.0.0.1", "8000", "8100")
            return METRICS

    release = object.__new__(Release)
    release.nodes = Nodes()
    release.layout = ServingLayout((), ("infer-0",), {"infer-0": "gp-infer-0"}, "cpu-reference", 1.0)
    found = release.latency_histograms()
    assert found[STABLE_BACKEND] == {"gp-infer-0:8000": Histogram(BOUNDS, (1, 2, 1, 0), 1.5)}
    assert found[CANARY_BACKEND] == {"gp-infer-0:8100": Histogram((math.inf,), (2,), 0.25)}


# Finding 6: a bad read does not end the guard


def test_histograms_over_different_buckets_leave_latency_inconclusive_and_say_why() -> None:
    rules = Canary()
    other = Histogram((0.01, 0.02, 0.05, math.inf), (10, 30, 20, 0), 1.2)
    stable = Counts(240, 0, Histogram(BOUNDS, (40, 120, 80, 0), 5.0))
    measured = measure_latency(stable, Counts(60, 0, other), rules)
    assert measured.outcome == INCONCLUSIVE and "different buckets" in measured.detail
    assert sequential_latency(stable, Counts(60, 0, other), rules) is None
    # Within one version, buckets that differ between two readings of the sum cannot be added: a
    # ValueError, and the guard's state is as before it.
    with pytest.raises(ValueError, match="different buckets"):
        _at(1).plus(other)


def _guard_reading(script: list[object]) -> tuple[Release, list[str]]:
    """A Release whose counters answer the script's items in turn: a reading pair, or an exception raised."""
    release = object.__new__(Release)
    release.rules = Canary()
    release.canary_start = None
    release.record = lambda model, phase, detail, percent=None: None  # type: ignore[method-assign]
    said: list[str] = []
    items = iter(script)
    item: object = None

    def read(latency: bool = True) -> tuple[Counts, Counts]:
        nonlocal item
        if latency or not isinstance(item, Exception):  # a gateway that failed fails without latency too
            item = next(items)
        if isinstance(item, Exception):
            raise item
        return item  # type: ignore[return-value]

    release.readings = read  # type: ignore[method-assign]
    release.aliased = lambda model, alias: object()  # type: ignore[method-assign,assignment,return-value]
    release.figures = lambda: GatewayFigures(20, {}, {}, {})  # type: ignore[method-assign]
    release.rollback = lambda model, reason="": None  # type: ignore[method-assign,assignment,return-value]
    release.say = said.append
    return release, said


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


QUIET = (Counts(0, 0), Counts(0, 0))


def test_the_guard_retries_a_failed_look_and_gives_up_with_exit_5_after_three() -> None:
    clock = _Clock()
    failing = GpuPlatError("podman exec on gateway-0 failed")
    release, said = _guard_reading([QUIET, failing, QUIET, failing, failing, QUIET])
    verdict = release.guard("embedder", duration_s=25, sleep=clock.sleep, clock=clock)
    failures = [line for line in said if line.startswith("look failed")]
    assert verdict.action == CONTINUE and len(failures) == 3
    assert failures[0] == "look failed (1 of 3 in a row allowed): podman exec on gateway-0 failed"
    assert failures[1:] == [
        f"look failed ({n} of 3 in a row allowed): podman exec on gateway-0 failed" for n in (1, 2)
    ]
    release, said = _guard_reading([QUIET, failing, ValueError("bad json"), KeyError("canary"), QUIET])
    with pytest.raises(GpuPlatError) as raised:
        release.guard("embedder", duration_s=60, sleep=clock.sleep, clock=clock)
    assert raised.value.exit_code == ExitCode.NO_VERDICT
    assert (
        "could not look at 'embedder''s canary 3 times in a row (KeyError: 'canary')" in raised.value.message
    )
    assert "`gpuplat serve rollback embedder`" in raised.value.message


# Mutants that survived (mutants.log)


def test_no_stable_latencies_or_an_empty_stable_histogram_is_inconclusive() -> None:
    """analysis #17: a stable histogram of no answers (or no _sum) is no baseline."""
    rules = Canary()
    canary = Counts(60, 0, Histogram(BOUNDS, (10, 30, 20, 0), 1.2))
    for stable in (Histogram(BOUNDS, (0, 0, 0, 0), 0.0), Histogram(BOUNDS, (40, 120, 80, 0), 0.0)):
        measured = measure_latency(Counts(240, 0, stable), canary, rules)
        assert (measured.outcome, measured.detail) == (INCONCLUSIVE, "no stable latencies recorded")


def test_the_sequential_evidence_at_rates_of_zero_and_one_is_finite() -> None:
    """A stable failing nothing and a canary failing everything (0 log 0 is 0, the likelihood's maximum on
    the null's boundary at its end): one error in one request against none in one with no margin is the
    mixture's B(1.5, 0.5) B(0.5, 1.5) / B(0.5, 0.5)^2 = 1/4 over the null's largest likelihood, 1/4 at
    x = 1/2: no evidence."""
    assert log_evidence_above(1, 1, 0, 1, 0.0) == pytest.approx(0.0, abs=1e-9)
    assert math.isfinite(log_evidence_above(20, 20, 0, 80, 0.05))
    assert math.isfinite(log_evidence_above(0, 20, 80, 80, 0.05))


def test_counters_without_prometheus_read_the_gateway_alone_and_say_so() -> None:
    """release #47: Prometheus' failure is said and the gateway's counters still read."""
    release = object.__new__(Release)
    said: list[str] = []
    release.say = said.append
    calls: list[bool] = []

    def read(latency: bool = True) -> tuple[Counts, Counts]:
        calls.append(latency)
        if latency:
            raise GpuPlatError("Prometheus at http://p did not answer")
        return QUIET

    release.readings = read  # type: ignore[method-assign]
    assert release.counters() == QUIET and calls == [True, False]
    assert said == ["no latencies this look: Prometheus at http://p did not answer"]


def test_a_canary_taken_out_by_someone_else_ends_the_guard() -> None:
    """release #48: no challenger alias any more: the guard ends, 'gone', without a look."""
    clock = _Clock()
    release, _ = _guard_reading([QUIET])
    release.aliased = lambda model, alias: None  # type: ignore[method-assign,assignment,return-value]
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == "gone" and clock.now == 5.0


# Finding 7: cold start


def test_initial_delay_leaves_the_canarys_warm_up_out_of_the_analysis() -> None:
    """A canary 3 x slower for its first 20 s: judged from the start it is rolled back at its first look;
    with initial_delay_s 30 the counts start at 30 s, and the same canary, now as fast, is not."""
    warm, cold = (0, 60, 0, 0), (0, 0, 0, 60)
    stable_step = (0, 240, 0, 0)

    def looks(rules: Canary) -> list[str]:
        guard = Guard(
            rules,
            0.0,
            Counts(0, 0, Histogram(BOUNDS, (0, 0, 0, 0))),
            Counts(0, 0, Histogram(BOUNDS, (0, 0, 0, 0))),
        )
        stable, canary = [0, 0, 0, 0], [0, 0, 0, 0]
        actions = []
        for second in range(10, 70, 10):
            stable = [a + b for a, b in zip(stable, stable_step, strict=True)]
            canary = [a + b for a, b in zip(canary, cold if second <= 20 else warm, strict=True)]
            reading = (
                Counts(sum(stable), 0, Histogram(BOUNDS, tuple(stable), 0.02 * sum(stable))),
                Counts(sum(canary), 0, Histogram(BOUNDS, tuple(canary), 0.02 * sum(canary))),
            )
            actions.append(guard.look(float(second), *reading).action)
            if actions[-1] != CONTINUE:
                break
        return actions

    assert looks(Canary())[-1] == ROLLBACK
    assert looks(Canary(initial_delay_s=30)) == [CONTINUE] * 6
    rules = Canary(initial_delay_s=30)
    guard = Guard(rules, 0.0, Counts(), Counts())
    assert guard.look(10.0, Counts(), Counts()).reason == "initial_delay_s 30: the analysis starts in 20 s"


def test_the_refusals_are_placed_at_their_fields_one_line_each() -> None:
    """Finding 5: what `gpuplat` prints for a stack file (infra/errors/problems.py): each problem at its
    field, the field and what is allowed, not pydantic's text."""
    with pytest.raises(ValidationError) as raised:
        Canary(failure_limit=5, inconclusive_limit=7, max_error_rate_increase=0.001)
    problems = validation_problems(raised.value, lambda loc: field_path("serving.canary", loc))
    assert [path for path, _ in problems] == [
        "serving.canary.max_error_rate_increase",
        "serving.canary.failure_limit",
        "serving.canary.inconclusive_limit",
    ]
    assert problems[1][1] == (
        "failure_limit 5 is not below intervals 5: the analysis could end promote-ready with every interval "
        "failed; set it to at most 4"
    )
    assert all("pydantic" not in message and "[type=" not in message for _, message in problems)


def test_a_reading_that_cannot_be_added_changes_nothing_and_the_next_one_counts() -> None:
    """Finding 6: two servers of one version over different buckets cannot be summed: a ValueError (the
    guard retries the look), and the guard's counts are as before it."""
    other = (0.01, 0.02, 0.05, math.inf)
    guard = Guard(Canary(), 0.0, Reading(0, 0, {"a": _at(0)}), Reading(0, 0, {"c": _at(0)}))
    guard.look(
        5.0, Reading(10, 0, {"a": _at(10), "b": Histogram(other, (0, 0, 0, 0))}), Reading(2, 0, {"c": _at(2)})
    )
    with pytest.raises(ValueError, match="different buckets"):
        guard.look(
            10.0,
            Reading(20, 0, {"a": _at(20), "b": Histogram(other, (0, 5, 0, 0))}),
            Reading(4, 0, {"c": _at(4)}),
        )
    assert guard.stable.total.requests == 10 and guard.canary.total.requests == 2
    guard.look(15.0, Reading(30, 0, {"a": _at(30)}), Reading(6, 0, {"c": _at(6)}))
    assert guard.stable.total.requests == 30 and guard.canary.total.requests == 6


def test_a_label_value_holding_commas_braces_quotes_and_escapes_is_one_value() -> None:
    """Prometheus' text format quotes label values (\\\\, \\" and \\n escaped): a model name such as
    `a,le="9"}` is the `model` label's value, not an `le`, and the sample after the braces keeps its
    number; a timestamp after the value is no part of it."""
    answer = (
        "# port 8000\n"
        'h_bucket{model="a,le=\\"9\\"}",le="0.1"} 3\n'
        'h_bucket{model="a,le=\\"9\\"}",le="+Inf"} 5 1700000000000\n'
        'h_sum{path="C:\\\\dir\\\\",model="x}\\ny"} 0.4\n'
    )
    assert parse_metrics(answer, "h") == {8000: Histogram((0.1, math.inf), (3, 2), 0.4)}
    assert sample_labels('model="a,le=\\"9\\"}",le="0.1"') == {"model": 'a,le="9"}', "le": "0.1"}
    assert sample_labels('path="C:\\\\dir\\\\",y="l\\nm"') == {"path": "C:\\dir\\", "y": "l\nm"}
