"""The canary's load ratio kept true while the servers up move during a release (issue 48; carry.ServersUp,
analysis.Analysis.reweigh): a replica down or autoscaling changes each canary server's load at a fixed
share, and latencies read at one load are not pooled with those read at another."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from infra.errors import GpuPlatError
from infra.serving import carry
from infra.serving.analysis import (
    ERRORS,
    INCONCLUSIVE,
    ITL,
    LATENCY,
    PROMOTE_READY,
    ROLLBACK,
    Analysis,
    Guard,
    Measurement,
)
from infra.serving.counts import Counts, Histogram
from infra.serving.guard_job import JobCarried
from infra.serving.guard_job_objects import deadline_s
from infra.serving.load import load_ratio, same_load
from infra.serving.metrics_text import GatewayFigures
from infra.serving.release import CANARY_BACKEND, STABLE_BACKEND, Release
from infra.spec.models import Canary
from tests.unit.test_canary_detached import CANARY, STABLE, guard_of, started
from tests.unit.test_canary_detached import Clock as DetachedClock
from tests.unit.test_canary_detached import lock_folder as lock_folder  # autouse: the lock in tmp_path
from tests.unit.test_canary_load import FAST, SLOW, BusyNode
from tests.unit.test_serving_release import BOUNDS, Clock, guarded

RULES = {"interval_s": 10, "intervals": 2, "min_requests": 10}


class Pool:
    """A gateway whose servers up change at a given look, and whose canary answers as queueing makes it:
    SLOW where its server is busier than a stable one (ratio above 1.05), FAST otherwise (an identical
    canary). Its counters are cumulative, one look's answers added at each read."""

    def __init__(self, share: int, servers: list[tuple[int, tuple[int, int]]]) -> None:
        self.share = share
        self.moves = servers
        self.look = 0
        self.stable = [0, 0, 0, 0]
        self.canary = [0, 0, 0, 0]
        self.sums = [0.0, 0.0]
        self.shares: list[int] = []
        self.failing: set[int] = set()
        """the reads of the servers up (counted from 1) that fail"""
        self.reads = 0
        self.refused: set[int] = set()
        """shares that cannot be set (a guard Job's plan renders only some)"""

    def up(self) -> tuple[int, int]:
        self.reads += 1
        if self.reads in self.failing:
            raise GpuPlatError("the gateway's admin socket did not answer")
        return self.up_now()

    def read(self, latency: bool = True) -> tuple[Counts, Counts]:
        self.look += 1
        canary = SLOW if load_ratio(self.share, *self.up_now()) > 1.05 else FAST
        self.stable = [total + 4 * c for total, c in zip(self.stable, FAST, strict=True)]
        self.canary = [total + c for total, c in zip(self.canary, canary, strict=True)]
        self.sums[0] += 6.4
        self.sums[1] += 1.6 if canary == FAST else 3.2
        stable_requests, canary_requests = sum(self.stable), sum(self.canary)
        return (
            Counts(stable_requests, 0, Histogram(BOUNDS, tuple(self.stable), self.sums[0])),
            Counts(canary_requests, 0, Histogram(BOUNDS, tuple(self.canary), self.sums[1])),
        )

    def up_now(self) -> tuple[int, int]:
        return [servers for at, servers in self.moves if at <= self.look][-1]

    def release(self, rules: dict[str, Any]) -> tuple[Release, list[str], list[str]]:
        release, rolled = guarded([(Counts(), Counts())], Canary.model_validate(rules))
        said: list[str] = []
        release.say = said.append  # type: ignore[method-assign]
        release.readings = self.read  # type: ignore[method-assign]

        def figures() -> GatewayFigures:
            canary, stable = self.up()
            return GatewayFigures(self.share, {}, {}, {CANARY_BACKEND: canary, STABLE_BACKEND: stable})

        def set_share(percent: int) -> None:
            if percent in self.refused:
                raise GpuPlatError(f"the guard's plan has no objects for a share of {percent} %")
            self.shares.append(percent)
            self.share = percent

        release.figures = figures  # type: ignore[method-assign]
        release.set_share = set_share  # type: ignore[method-assign]
        return release, rolled, said


def test_servers_up_moving_mid_analysis_drop_the_latency_read_at_the_other_load() -> None:
    """12 % beside 7 stable servers loads the canary 0.955 x; the stable grows to 9 at the fourth look and
    12 % loads it 1.23 x: an identical canary reads slower for its queue. Read once at the start (main),
    the analysis judged those latencies at 0.955 x and rolled the canary back; read at each look, the latency
    evidence is dropped when the load moves and not judged at 1.23 x."""
    pool = Pool(12, [(0, (1, 7)), (4, (1, 9))])
    release, rolled, said = pool.release({**RULES, "failure_limit": 0})
    clock = Clock()
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    # Not promote-ready on its errors alone (adversarial review): its latency was judged at 0.955 x.
    assert verdict.action == INCONCLUSIVE, verdict.reason
    assert rolled == []
    assert "each canary server took 1.23 x, where it is not judged" in verdict.reason
    assert "the latency analysis started again" in verdict.reason
    assert any("moved from 0.95 x a stable server's to 1.23 x" in line for line in said), said


def test_the_equal_load_analysis_follows_the_servers_to_the_share_that_loads_them_alike() -> None:
    """No steps, 20 % beside 7 stable servers: the guard adds the equal-load analysis at 12 %. The stable
    grows to 9 during it: 12 % loads the canary 1.23 x, 10 % 1.00 x. The share moves to 10 %, the latency
    evidence read at 12 % is dropped, the analysis asks its intervals again from there, and the identical
    canary passes; the share goes back to 20 % after."""
    pool = Pool(20, [(0, (1, 7)), (9, (1, 9))])
    release, rolled, said = pool.release(RULES)
    clock = Clock()
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == PROMOTE_READY, (verdict.reason, said)
    assert pool.shares == [12, 10, 20] and rolled == []
    assert any("the canary takes 10 % now, 1.00 x" in line for line in said), said
    assert ("analysing", 10) in release.__dict__["records"]


def test_a_share_the_guard_cannot_set_is_said_and_kept_its_latency_unjudged_where_busier() -> None:
    """The guard Job sets only the shares its plan rendered: where the servers moved to a share it has no
    objects for, it says so and keeps its share, whose latency at 1.23 x is not judged."""
    pool = Pool(20, [(0, (1, 7)), (9, (1, 9))])
    pool.refused = {10}
    release, rolled, said = pool.release({**RULES, "failure_limit": 0})
    clock = Clock()
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    # The equal-load analysis, the one meant to judge latency, cannot promote on errors alone.
    assert verdict.action == INCONCLUSIVE and rolled == [], verdict.reason
    assert pool.shares == [12]
    assert any("the share stays at 12 % (the guard's plan has no objects" in line for line in said), said


def test_a_move_within_the_tolerance_keeps_the_evidence() -> None:
    """0.955 x and 1.00 x are within LOAD_TOLERANCE of each other: the latencies pool."""
    assert same_load(0.955, 1.0) and same_load(1.0, 1.0) and not same_load(0.955, 1.23)
    assert not same_load(0.0, 1.0) and same_load(0.0, 0.0)
    analysis = Analysis(Canary.model_validate(RULES), load_ratio=0.955)
    assert analysis.reweigh(1.0, Counts(), Counts()) is None
    assert analysis.load_ratio == 1.0 and analysis.latency_from == 0 and analysis.latency_ratio == 0.955
    # Drifting by steps within the tolerance each is measured against the ratio the evidence was read at.
    assert analysis.reweigh(0.99, Counts(), Counts()) is None
    assert analysis.reweigh(0.92, Counts(), Counts()) is None
    assert analysis.reweigh(1.01, Counts(), Counts()) is not None  # 1.06 x 0.955, though 1.1 x 0.92
    assert analysis.latency_ratio == 1.01 and analysis.latency_from == 1


def test_a_slower_canary_is_caught_on_the_latencies_read_after_the_move() -> None:
    """The evidence is dropped, not the judgement: a canary slower at the new equal load is still rolled
    back, by the intervals (or the sequential test) that count from the move on."""
    rules = Canary.model_validate(RULES)
    stable_h = [0, 0, 0, 0]
    canary_h = [0, 0, 0, 0]

    def at(look: int, slow: bool) -> tuple[Counts, Counts]:
        for index, count in enumerate(FAST):
            stable_h[index] += 4 * count
        for index, count in enumerate(SLOW if slow else FAST):
            canary_h[index] += count
        return (
            Counts(sum(stable_h), 0, Histogram(BOUNDS, tuple(stable_h), 6.4 * look)),
            Counts(sum(canary_h), 0, Histogram(BOUNDS, tuple(canary_h), 3.2 * look)),
        )

    guard = Guard(rules, 0.0, Counts(), Counts(), load_ratio=1.75)
    verdicts = [guard.look(5.0 * look, *at(look, True), load_ratio=1.75) for look in range(1, 4)]
    assert all(v.action != ROLLBACK for v in verdicts)
    verdicts = [guard.look(5.0 * look, *at(look, True), load_ratio=1.0) for look in range(4, 12)]
    assert verdicts[-1].action == ROLLBACK or ROLLBACK in [v.action for v in verdicts], verdicts


def test_the_restart_survives_the_state_a_guard_keeps() -> None:
    analysis = Analysis(Canary.model_validate(RULES), load_ratio=0.955)
    analysis.reweigh(1.23, Counts(10, 0), Counts(3, 0))
    again = Analysis.from_json(analysis.rules, analysis.to_json())
    assert (again.load_ratio, again.latency_ratio, again.latency_from) == (1.23, 1.23, 1)
    assert again.latency_base == (Counts(10, 0), Counts(3, 0)) and again.restarts == analysis.restarts
    assert again.judged_before == 0.955  # a resumed guard does not promote on errors alone either
    old = analysis.to_json()
    del old["judged_before"]  # a record written before it
    assert Analysis.from_json(analysis.rules, old).judged_before is None


def test_one_failed_read_of_the_servers_up_keeps_the_last_count_two_fail_the_look() -> None:
    said: list[str] = []

    class Flaky:
        def __init__(self) -> None:
            self.answers: list[Any] = [
                (1, 9),
                GpuPlatError("no answer"),
                (1, 8),
                GpuPlatError("no"),
                KeyError("x"),
            ]

        def say(self, line: str) -> None:
            said.append(line)

        def servers_up(self) -> tuple[int, int]:
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer  # type: ignore[no-any-return]

    up = carry.ServersUp(Flaky(), (1, 7))  # type: ignore[arg-type]
    assert up.read() == (1, 9)
    assert up.read() == (1, 9)
    assert "the load weighed by the last count, 1 canary and 9 stable" in said[-1]
    assert up.read() == (1, 8)
    assert up.read() == (1, 8)
    with pytest.raises(KeyError):
        up.read()


def test_two_failed_reads_of_the_servers_up_in_a_row_are_a_failed_look_not_a_guess() -> None:
    pool = Pool(12, [(0, (1, 7))])
    pool.failing = {3, 5, 6}
    release, _, said = pool.release(RULES)
    clock = Clock()
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == PROMOTE_READY, verdict.reason
    assert any(line.startswith("the servers up not read this look") for line in said), said
    assert any(line.startswith("look failed (1 of 3 in a row allowed)") for line in said), said


class GrowingNode(BusyNode):
    """BusyNode whose stable version goes from 7 servers up to `to` (9: autoscaling) once `at` requests
    came."""

    def __init__(self, share: int, at: int, to: int = 9) -> None:
        super().__init__(share)
        self.at, self.to = at, to

    def traffic(self, requests: int) -> None:
        if self.counts[STABLE][0] + self.counts[CANARY][0] >= self.at:
            self.up[STABLE] = self.to
        super().traffic(requests)


def test_the_detached_guard_reads_the_servers_up_at_each_look(tmp_path: Path) -> None:
    """The detached guard (its own loop, on the gateway's node) at a step of 12 % beside 7 stable servers;
    the stable grows to 9 after the first interval and the identical canary reads slower for its load
    (1.23 x). It judged that at the ratio it was started with and rolled the canary back; now it reads the
    servers up from its gateways at each look and leaves latency unjudged at 1.23 x."""
    rules = Canary.model_validate(
        {"min_requests": 4, "interval_s": 10, "intervals": 2, "failure_limit": 0, "steps": [{"percent": 12}]}
    )
    node = GrowingNode(share=12, at=150)
    clock = DetachedClock(node)
    started(tmp_path, node, clock, rules, load_servers=(1, 7))
    guard = guard_of(tmp_path, node, clock)
    guard.run()
    assert node.slow > 0
    verdict = guard.state["verdict"]
    assert verdict["action"] == INCONCLUSIVE, verdict  # its latency judged at 0.955 x, not after
    assert "the latency analysis started again" in verdict["reason"]
    assert guard.state["load_servers"] == [1, 9]


def test_the_guard_job_reads_the_servers_up_from_the_gateway_pods_after_its_start() -> None:
    """The guard Job weighed the load by the servers its plan rendered, for the whole release; now the
    plan's count only at its start (the equal-load share it adds must be one the plan renders), then the
    gateway pods' at each look."""
    counted: list[str] = []

    class Pods:
        def servers_up(self, namespace: str, say: Any) -> tuple[int, int]:
            counted.append(namespace)
            return (1, 9)

    plan = SimpleNamespace(servers=(1, 7), namespace="serving")
    job = JobCarried(api=None, plan=plan, lock=None, say=lambda line: None)  # type: ignore[arg-type]
    job._pod_counters = Pods  # type: ignore[assignment,method-assign]
    assert job.servers_up() == (1, 7) and counted == []
    assert job.servers_up() == (1, 9) and counted == ["serving"]
    unread = JobCarried(api=None, plan=SimpleNamespace(servers=(0, 0), namespace="serving"), lock=None)  # type: ignore[arg-type]
    unread._pod_counters = Pods  # type: ignore[assignment,method-assign]
    assert unread.servers_up() == unread.servers_up() == (0, 0) and counted == ["serving"]


class _Looks(Clock):
    """A Clock that fails the test where the guard looks more than `limit` times (an analysis that never
    ends would hang the suite instead)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.looks, self.limit = 0, limit

    def sleep(self, seconds: float) -> None:
        self.looks += 1
        if self.looks > self.limit:
            raise AssertionError(f"no verdict after {self.limit} looks ({self.now - 1000:.0f} s)")
        super().sleep(seconds)


def test_servers_up_moving_at_every_look_end_the_analysis_inconclusive_not_never() -> None:
    """A replica bouncing up and down (1 canary beside 7 stable servers, then 6, at every look): 12 % loads
    the canary 0.955 x, then 1.09 x, each beyond the tolerance of the other, so each look drops the latency
    evidence and asks its intervals again. Unbounded (adversarial review, issue 48), the guard looked for
    ever without a verdict, holding the release's lock; the analysis asks at most its own intervals again,
    then ends inconclusive, which blocks promotion and exits non-zero."""
    pool = Pool(12, [(look, (1, 7) if look % 2 == 0 else (1, 6)) for look in range(400)])
    release, rolled, _ = pool.release(RULES)
    clock = _Looks(200)
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == INCONCLUSIVE, verdict.reason
    assert "the servers up moved" in verdict.reason and rolled == []
    # At most the analysis' own length again (2 intervals of 10 s), and one interval for the one running.
    assert clock.now - 1000 <= 2 * 2 * 10 + 10 + 5


class _VersionPool(Pool):
    """A Pool whose canary answers `answers` (SLOW: a slower version; FAST: an identical one) at any load."""

    answers = SLOW

    def read(self, latency: bool = True) -> tuple[Counts, Counts]:
        self.look += 1
        self.stable = [total + 4 * c for total, c in zip(self.stable, FAST, strict=True)]
        self.canary = [total + c for total, c in zip(self.canary, self.answers, strict=True)]
        self.sums[0] += 6.4
        self.sums[1] += 3.2 if self.answers == SLOW else 1.6
        return (
            Counts(sum(self.stable), 0, Histogram(BOUNDS, tuple(self.stable), self.sums[0])),
            Counts(sum(self.canary), 0, Histogram(BOUNDS, tuple(self.canary), self.sums[1])),
        )


def test_a_slower_canary_whose_servers_turn_busier_is_not_promote_ready_unjudged() -> None:
    """12 % beside 7 stable servers loads the canary 0.955 x: the guard plans no other analysis, this one
    judges the latency. A stable replica comes up before the first look (9 stable: 1.23 x), the latency
    evidence is dropped and not judged at 1.23 x. A slower canary ended promote-ready on its errors alone
    (adversarial review, issue 48); read once at the start (main) it was rolled back. An analysis that
    started judging latency and ends where it cannot is inconclusive: `serve guard` again weighs the new
    servers (an equal-load analysis at their share)."""
    pool = _VersionPool(12, [(0, (1, 7)), (1, (1, 9))])
    release, rolled, _ = pool.release(RULES)
    clock = Clock()
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == INCONCLUSIVE and rolled == [], verdict.reason
    assert "latency was judged at 0.95 x" in verdict.reason, verdict.reason


class _SteadyPool(_VersionPool):
    """A Pool whose canary answers as the stable at any load (an identical version)."""

    answers = FAST


def test_a_version_with_no_server_up_at_one_look_is_no_load_to_weigh() -> None:
    """50 % beside 7 stable servers loads the canary 7 x: its analysis judges errors only (the guard adds the
    one at 12 % for latency). The canary's server restarts and is counted down at one look: load.load_at
    reads 1.00 x where a version has none up, which is no load at all. Weighed as a move (adversarial review,
    issue 48), it dropped the evidence twice, and the analysis that never judged latency read as one that
    had, then stopped: inconclusive; a count with a version at 0 keeps the ratio."""
    pool = _SteadyPool(50, [(0, (1, 7)), (3, (0, 7)), (4, (1, 7))])
    release, rolled, said = pool.release(RULES)
    clock = Clock()
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == PROMOTE_READY and rolled == [], (verdict.reason, said)
    assert not any("started again" in line for line in said), said


class _BlinkingNode(BusyNode):
    """BusyNode whose canary server is counted down while the requests so far are in `down` (it restarts)."""

    def __init__(self, share: int, down: range) -> None:
        super().__init__(share)
        self.down = down

    def traffic(self, requests: int) -> None:
        self.up[CANARY] = 0 if self.counts[STABLE][0] + self.counts[CANARY][0] in self.down else 1
        super().traffic(requests)


def test_the_detached_guard_weighs_no_load_where_a_version_has_no_server_up(tmp_path: Path) -> None:
    """The detached guard's own loop at a step of 50 % beside 7 stable servers (7 x: errors judged only);
    the canary's server is counted down at one look. Weighed as 1.00 x (adversarial review, issue 48), the
    step ended inconclusive as if its latency had been judged; the ratio stays."""
    rules = Canary.model_validate(
        {"min_requests": 4, "interval_s": 10, "intervals": 2, "failure_limit": 0, "steps": [{"percent": 50}]}
    )
    node = _BlinkingNode(share=50, down=range(100, 130))
    clock = DetachedClock(node)
    started(tmp_path, node, clock, rules, load_servers=(1, 7))
    guard = guard_of(tmp_path, node, clock)
    guard.run()
    verdict = guard.state["verdict"]
    assert verdict["action"] == PROMOTE_READY, verdict
    assert "started again" not in verdict["reason"], verdict


def _looked(fast: int, slow: int, looks: int) -> tuple[Counts, Counts]:
    """Cumulative counts after `looks` looks: the stable 4 x FAST each look, the canary FAST `fast` looks
    then SLOW `slow` looks (in that order; 0 requests errored)."""
    stable = [4 * c * looks for c in FAST]
    canary = [f * fast + s * slow for f, s in zip(FAST, SLOW, strict=True)]
    return (
        Counts(sum(stable), 0, Histogram(BOUNDS, tuple(stable), 6.4 * looks)),
        Counts(sum(canary), 0, Histogram(BOUNDS, tuple(canary), 1.6 * fast + 3.2 * slow)),
    )


def test_latency_read_before_a_move_counts_in_neither_the_interval_it_closes_nor_sequential_test() -> None:
    """1 canary beside 9 stable servers at 12 % (1.23 x: latency not judged) answers SLOW for its queue;
    two stable servers go down just before the second look (7 stable: 0.955 x; the servers up are read
    before the counters) and it answers FAST after. Interval 1, closed at that look, holds the slow
    answers: it is not judged on latency (Analysis.latency_from), and the sequential test counts from the
    move (latency_base); either one judging them would roll an identical canary back (failure_limit 0)."""
    rules = Canary.model_validate({**RULES, "failure_limit": 0})
    guard = Guard(rules, 0.0, Counts(), Counts(), load_ratio=1.23)
    verdict = None
    for look in range(1, 9):
        slow = min(look, 2)
        ratio = 1.23 if look == 1 else 0.955
        verdict = guard.look(5.0 * look, *_looked(look - slow, slow, look), load_ratio=ratio)
        assert verdict.action != ROLLBACK, (look, verdict.reason)
    assert verdict is not None and verdict.action == PROMOTE_READY, verdict.reason
    assert "3 intervals passed" in verdict.reason


def test_a_move_drops_the_latency_and_inter_token_results_read_before_it() -> None:
    """A latency failure read at 0.955 x is no evidence at 0.83 x: it does not count towards failure_limit
    after the move (nor do inter-token latency results)."""
    analysis = Analysis(Canary.model_validate(RULES), load_ratio=0.955)
    failed = Measurement(LATENCY, "failed", "slower")
    analysis.results[LATENCY] = [failed]
    analysis.results[ITL] = [Measurement(ITL, "failed", "slower")]
    analysis.results[ERRORS] = [Measurement(ERRORS, "passed", "alike")]
    analysis.reweigh(0.83, Counts(10, 0), Counts(3, 0))
    assert analysis.results[LATENCY] == [] and analysis.results[ITL] == []
    assert analysis.results[ERRORS] == [Measurement(ERRORS, "passed", "alike")]


def test_the_guard_waits_out_the_intervals_a_move_asks_again() -> None:
    """12 % beside 7 stable servers (0.955 x), then 6 at the second look (0.82 x): both judged, the latency
    evidence dropped, the analysis asks interval 1 again (3 of 10 s). Its time without --guard-s counts
    them (carry._added_s): an identical canary is promote-ready, not 'continue' at the 25 s it first had."""
    pool = _SteadyPool(12, [(0, (1, 7)), (2, (1, 6))])
    release, rolled, said = pool.release(RULES)
    clock = Clock()
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == PROMOTE_READY and rolled == [], (verdict.reason, said)
    assert "3 intervals passed" in verdict.reason


def test_the_guard_jobs_deadline_counts_the_intervals_a_move_asks_again() -> None:
    """The Job's activeDeadlineSeconds (guard_job_objects.deadline_s) counted each analysis once: 5
    intervals of 60 s, the servers up moving in the last one (0.955 x to 0.82 x, both judged) asks them
    again, 600 s in all, past the 320 s it allowed beside its rollouts' (adversarial review, issue 48), and
    Kubernetes would stop the guard before its verdict where the rollouts did not leave that much."""
    rules = {"interval_s": 60, "intervals": 5, "min_requests": 10}
    pool = _SteadyPool(12, [(0, (1, 7)), (58, (1, 6))])
    release, rolled, _ = pool.release(rules)
    clock = Clock()
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == PROMOTE_READY and rolled == [], verdict.reason
    plan = SimpleNamespace(
        rules=release.rules, duration_s=None, look_s=5.0, added_interval_s=None, rollout_s=0
    )
    assert clock.now - 1000 <= deadline_s(plan)  # type: ignore[arg-type]


def test_the_detached_guard_waits_out_the_intervals_a_move_asks_again(tmp_path: Path) -> None:
    """The detached guard's own loop at a step of 12 % beside 7 stable servers (0.955 x), one down after the
    first interval (0.82 x, judged too): the latency evidence is dropped and the intervals asked again,
    past the 25 s the CLI handed it (`--detach`: the analysis and a look); its time counts them
    (Analysis.added_s), and the identical canary is promote-ready, not 'no verdict within 25 s'."""
    rules = Canary.model_validate(
        {"min_requests": 4, "interval_s": 10, "intervals": 2, "failure_limit": 0, "steps": [{"percent": 12}]}
    )
    node = GrowingNode(share=12, at=150, to=6)
    clock = DetachedClock(node)
    started(tmp_path, node, clock, rules, duration_s=25, load_servers=(1, 7))
    guard = guard_of(tmp_path, node, clock)
    guard.run()
    verdict = guard.state["verdict"]
    assert verdict["action"] == PROMOTE_READY, verdict
    assert "the latency analysis started again" in verdict["reason"]


def test_a_version_counted_down_at_a_steps_last_look_does_not_start_the_next_at_equal_load() -> None:
    """Steps 12 % (0.955 x) and 50 % (7 x: errors only) beside 7 stable servers; the canary's server is
    counted down at the first step's last look. The next step's analysis began at load.load_at's 1.00 x
    for that count, read 7 x at its first look as a move from a judged load, and ended inconclusive
    (adversarial review, issue 48); the count before it goes on."""
    rules = {**RULES, "steps": [{"percent": 12}, {"percent": 50}]}
    pool = _SteadyPool(12, [(0, (1, 7)), (4, (0, 7)), (5, (1, 7))])
    release, rolled, said = pool.release(rules)
    release.has_canary = lambda _model: True  # type: ignore[method-assign]
    clock = Clock()
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == PROMOTE_READY and rolled == [], (verdict.reason, said)
    assert not any("started again" in line for line in said), said
