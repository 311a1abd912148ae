"""The canary's per-server load (issue 48, item 4; infra/serving/load.py): a canary server busier than a
stable one is not judged slower for its load, and a slower canary idler than them is still caught, because
the guard judges latency at the share that loads both versions' servers alike."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from infra.serving import carry, detach, guard_service
from infra.serving.analysis import PROMOTE_READY, ROLLBACK, Analysis, Guard
from infra.serving.carry import EQUAL_LOAD_STEP, PROMOTED, with_equal_load_step
from infra.serving.counts import Counts, Histogram
from infra.serving.detach import detach_guard
from infra.serving.load import (
    LOAD_TOLERANCE,
    SPARSE_FACTOR,
    describe,
    equal_load_percent,
    lengthened_interval_s,
    load_at,
    load_ratio,
)
from infra.serving.metrics_text import GatewayFigures
from infra.serving.release import CANARY_BACKEND, STABLE_BACKEND, Release
from infra.spec.models import Canary, CanaryStep
from tests.unit.test_canary_detached import CANARY, STABLE, DetachingRelease, Node, guard_of, started
from tests.unit.test_canary_detached import Clock as DetachedClock
from tests.unit.test_canary_detached import lock_folder as lock_folder  # autouse: the lock in tmp_path
from tests.unit.test_serving_release import BOUNDS, Clock, guarded, version

FAST = (20, 40, 20, 0)
"""80 answers of one look over BOUNDS (10 ms, 25 ms, 50 ms, +Inf): a median near 20 ms"""
SLOW = (0, 20, 40, 20)
"""80 answers one bucket slower: what queueing makes of FAST at a busier server (or a slower version)"""


def test_the_load_ratio_is_each_canary_servers_requests_over_each_stable_servers() -> None:
    # borrow on 8 replicas: 1 canary and 7 stable servers; on 2 replicas 1 and 1 (issue 48's figures).
    assert load_ratio(20, 1, 7) == pytest.approx(1.75)
    assert load_ratio(20, 1, 1) == pytest.approx(0.25)
    # spare on 2 nodes of 3 stable replicas: 2 canary slots, 6 stable servers.
    assert load_ratio(20, 2, 6) == pytest.approx(0.75)
    assert load_ratio(100, 1, 7) == math.inf and load_ratio(0, 1, 7) == 0.0
    assert describe(20, 1, 7) == (
        "at 20 % each of the 1 canary server(s) takes 20 % of the requests and each of the 7 stable "
        "server(s) 11.4 %: 1.75 x the load"
    )
    with pytest.raises(ValueError, match="at least one canary server"):
        load_ratio(20, 0, 7)


@pytest.mark.parametrize(
    ("canary", "stable", "equal"),
    [
        (1, 1, 50),
        (1, 2, 33),
        (1, 7, 12),
        (1, 12, 8),
        (2, 6, 25),
        (1, 15, 6),
        (1, 31, 3),
        (1, 14, 6),
        (1, 40, 2),
    ],
)
def test_the_equal_load_share_is_the_whole_percent_nearest_equal_load(
    canary: int, stable: int, equal: int | None
) -> None:
    """A share is a whole percent: on 1 canary and 7 stable servers 12 % loads the canary 0.955 x and 13 %
    1.046 x, both within the 5 % allowed, and the idler one is taken (a canary a little idler reads no
    slower for it); beside 12 stable servers 7 % is 0.90 x, so 8 % (1.043 x); on 40 stable servers per
    canary server 2 % loads it 0.82 x and 3 % 1.24 x: none within 5 %, so the idler, 2 %."""
    assert equal_load_percent(canary, stable) == equal


@pytest.mark.parametrize("stable", range(1, 100))
def test_every_borrow_pool_of_up_to_100_replicas_has_a_share_not_busier_to_judge_latency_at(
    stable: int,
) -> None:
    """Borrow on 15 replicas (1 canary, 14 stable): 6 % loads the canary 0.89 x and 7 % 1.05 x, neither
    within 5 %; so on 18, 19, 21 to 23, 27 to 31, 35 to 47 replicas and more. Without a share to judge
    latency at, a release whose steps all load the canary more (20 % loads it 3.5 x on 15 replicas) was
    promote-ready, or promoted at a 100 % step, its latency never judged: a slower version went through.
    The share nearest equal load at which the canary is not busier is judged instead."""
    share = equal_load_percent(1, stable)
    assert share is not None
    ratio = load_ratio(share, 1, stable)
    assert ratio <= 1 + LOAD_TOLERANCE
    assert (
        share == 99
        or load_ratio(share + 1, 1, stable) > 1 + LOAD_TOLERANCE
        or ratio >= 1 / (1 + LOAD_TOLERANCE)
    )


def test_a_slower_canary_on_a_pool_without_an_equal_share_is_judged_at_the_share_below() -> None:
    """1 canary beside 14 stable servers at 20 % (3.5 x the load): latency not judged there; at 6 % (0.89 x)
    a slower canary is still slower, and rolled back."""
    clock = Clock()
    release, done = _release_by_share([], 20, (1, 14), slower=1.5)
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == ROLLBACK and done[0] == "share 6", (verdict, done)
    assert ("analysing", 6) in release.__dict__["records"]


def _steps(*percents: int) -> list[tuple[int, CanaryStep]]:
    return [(number, CanaryStep(percent=p)) for number, p in enumerate(percents, 1)]


def test_the_equal_load_share_is_analysed_before_the_first_step_above_it() -> None:
    def shares(ahead: list[tuple[int, CanaryStep]]) -> list[tuple[int, int]]:
        return [(number, step.percent) for number, step in ahead]

    assert shares(with_equal_load_step(_steps(5, 20, 50, 100), 0, 13)) == [
        (1, 5),
        (EQUAL_LOAD_STEP, 13),
        (2, 20),
        (3, 50),
        (4, 100),
    ]
    # A canary already past it goes back to it after the step it is at; steps that stop below it end there.
    assert shares(with_equal_load_step(_steps(20, 100), 20, 13)) == [(1, 20), (EQUAL_LOAD_STEP, 13), (2, 100)]
    assert shares(with_equal_load_step(_steps(5, 20), 0, 50))[-1] == (EQUAL_LOAD_STEP, 50)
    # Without steps: the canary's own share's analysis, then the equal-load one.
    assert shares(with_equal_load_step([], 20, 13)) == [(EQUAL_LOAD_STEP, 20), (EQUAL_LOAD_STEP, 13)]
    # Nothing added where a step is at it, the canary's share is it, no share is, or the canary has none.
    assert shares(with_equal_load_step(_steps(13, 100), 0, 13)) == [(1, 13), (2, 100)]
    assert with_equal_load_step([], 13, 13) == []
    assert with_equal_load_step([], 20, None) == [] and with_equal_load_step([], 0, 13) == []


def _look(stable: tuple[int, ...], canary: tuple[int, ...], look: int, canary_errors: int = 0) -> Any:
    return (
        Counts(320 * look, 0, Histogram(BOUNDS, tuple(4 * c * look for c in stable), 6.4 * look)),
        Counts(
            80 * look,
            canary_errors * look,
            Histogram(BOUNDS, tuple(c * look for c in canary), (1.6 if canary == FAST else 3.2) * look),
        ),
    )


def test_a_busier_identical_canary_passes_on_its_errors_and_is_not_judged_on_latency() -> None:
    rules = Canary.model_validate({"interval_s": 10, "intervals": 2, "min_requests": 10})
    looks = [_look(FAST, SLOW, look) for look in range(0, 60, 5)]
    stable, canary = looks[0]
    busier = Guard(rules, 0.0, stable, canary, load_ratio=1.75)
    verdicts = [busier.look(5.0 * i, *looks[i]) for i in range(1, 6)]
    assert verdicts[-1].action == PROMOTE_READY
    assert "latency not judged: each canary server takes 1.75 x a stable server's load" in verdicts[-1].reason
    alike = Guard(rules, 0.0, *looks[0])  # the same counts at equal load: slower, rolled back
    assert [alike.look(5.0 * i, *looks[i]).action for i in range(1, 6)][-1] == ROLLBACK
    # The boundary: 5 % busier is judged (8 % beside 12 stable servers, 1.043 x), 6 % busier is not.
    for ratio, judged in ((1.043, True), (1.05, True), (1.06, False), (1.09, False)):
        guard = Guard(rules, 0.0, stable, canary, load_ratio=ratio)
        last = [guard.look(5.0 * i, *looks[i]) for i in range(1, 6)][-1]
        assert (last.action == ROLLBACK) is judged, (ratio, last)
    failing = [_look(FAST, SLOW, look, canary_errors=40) for look in range(0, 60, 5)]
    erring = Guard(rules, 0.0, failing[0][0], failing[0][1], load_ratio=1.75)
    assert ROLLBACK in [erring.look(5.0 * i, *failing[i]).action for i in range(1, 6)]


def test_the_load_ratio_survives_the_detached_guards_state() -> None:
    analysis = Analysis(Canary(), load_ratio=1.75)
    again = Analysis.from_json(Canary(), analysis.to_json())
    assert again.load_ratio == 1.75 and not again.judges_latency


def _release_by_share(
    steps: list[dict[str, Any]], share: int, servers: tuple[int, int], slower: float
) -> tuple[Release, list[str]]:
    """A release whose canary at `share` runs on `servers` (canary, stable) up, and answers SLOW where its
    servers are busier than a stable one (load ratio above 1.05), or where it is `slower` than 1 and not
    much idler than a stable server (ratio 0.85 or more: 1.5 x slower at 0.89 x the load reads 1.36 x
    slower in an M/M/1 queue busy half the time), FAST otherwise: latency as queueing makes it."""
    rules = Canary.model_validate({"interval_s": 10, "intervals": 2, "min_requests": 10, "steps": steps})
    release, _ = guarded([_look(FAST, FAST, 0)], rules)
    done: list[str] = []
    at = {"share": share, "look": 0}

    def read(latency: bool = True) -> Any:
        at["look"] += 1
        ratio = load_ratio(at["share"], *servers)
        canary = SLOW if ratio > 1.05 or (slower > 1 and ratio >= 0.85) else FAST
        return _look(FAST, canary, at["look"])

    def set_share(percent: int) -> None:
        done.append(f"share {percent}")
        at["share"] = percent

    up = {CANARY_BACKEND: servers[0], STABLE_BACKEND: servers[1]}
    release.readings = read  # type: ignore[method-assign]
    release.set_share = set_share  # type: ignore[method-assign]
    release.figures = lambda: GatewayFigures(at["share"], {}, {}, up)  # type: ignore[method-assign]
    release.promote = lambda model: done.append("promote") or version("/shared/models/x")  # type: ignore[method-assign,func-returns-value]
    release.rollback = lambda model, reason="": done.append(f"rollback: {reason}")  # type: ignore[method-assign,assignment,func-returns-value]
    return release, done


def test_an_identical_canary_busier_than_the_stable_servers_is_judged_at_equal_load() -> None:
    """borrow on 8 replicas at 20 %: the canary's one server takes 1.75 x a stable server's load and reads
    slower; the guard judges only its errors there, then its latency at 12 %, and puts it back at 20 %."""
    clock = Clock()
    release, done = _release_by_share([], 20, (1, 7), slower=1.0)
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == PROMOTE_READY, verdict.reason
    assert done == ["share 12", "share 20"]
    assert "canary mean latency" in verdict.reason and "latency not judged" not in verdict.reason


def test_a_slower_canary_idler_than_the_stable_server_is_caught_at_equal_load() -> None:
    """borrow on 2 replicas at 20 %: the canary takes a quarter of the stable server's load, which hides
    its slowness; at 50 % (equal load) it reads slower and is rolled back."""
    clock = Clock()
    release, done = _release_by_share([], 20, (1, 1), slower=1.5)
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == ROLLBACK and done[0] == "share 50", done
    assert done[-1].startswith("rollback: ") and "took longer than 0.025 s" in done[-1]


def test_a_stepped_release_adds_the_equal_load_step_and_promotes_an_identical_busier_canary() -> None:
    clock = Clock()
    steps = [{"percent": 5}, {"percent": 20}, {"percent": 40}, {"percent": 100}]
    release, done = _release_by_share(steps, 5, (1, 7), slower=1.0)
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == PROMOTED, verdict.reason
    assert done == ["share 12", "share 20", "share 40", "promote"]
    assert ("analysing", 12) in release.__dict__["records"]


def test_evidence_too_large_for_a_float_is_a_reason_not_an_overflow_error() -> None:
    """A canary failing 2000 of 2000 requests against a stable version failing none of 8000: the evidence
    is about e^3900, past a float's largest (exp overflows above about 709)."""
    rules = Canary()
    guard = Guard(rules, 0.0, Counts(), Counts())
    verdict = guard.look(5.0, Counts(8000, 0), Counts(2000, 2000))
    assert verdict.action == ROLLBACK
    assert "the sequential test's evidence e^" in verdict.reason


# The detached guard (infra/serving/detach.py hands the steps and the servers up to guard_service.py)


class BusyNode(Node):
    """A gateway's node whose canary, on 1 server beside 7 stable ones, answers as fast as the stable's
    where its server takes their load, and in 0.3 s instead of 0.05 s where it takes more: queueing."""

    def __init__(self, share: int) -> None:
        super().__init__(share=share, canary_fails=False)
        self.latency = True
        self.slow = 0
        self.up = {CANARY: 1, STABLE: 7}

    def traffic(self, requests: int) -> None:
        before = self.counts[CANARY][0]
        super().traffic(requests)
        if load_at(self.share, (self.up[CANARY], self.up[STABLE])) > 1.05:
            self.slow += self.counts[CANARY][0] - before

    def metrics(self) -> str:
        stable, canary = self.counts[STABLE][0], self.counts[CANARY][0]
        return "\n".join(
            [
                "# port 8000",
                f'h_bucket{{le="0.1"}} {stable}',
                f'h_bucket{{le="+Inf"}} {stable}',
                f"h_sum {0.05 * stable}",
                "# port 8100",
                f'h_bucket{{le="0.1"}} {canary - self.slow}',
                f'h_bucket{{le="+Inf"}} {canary}',
                f"h_sum {0.05 * (canary - self.slow) + 0.3 * self.slow}",
            ]
        )


def _detached(monkeypatch: pytest.MonkeyPatch, stable: int) -> tuple[DetachingRelease, dict[str, Any]]:
    """`deploy --detach` at 20 % on 1 canary server beside `stable`: the state it hands the guard."""
    release = DetachingRelease()
    release.figures = lambda: GatewayFigures(20, {}, {}, {CANARY_BACKEND: 1, STABLE_BACKEND: stable})  # type: ignore[method-assign]
    handed: list[dict[str, Any]] = []
    monkeypatch.setattr(
        detach, "initial_state", lambda **state: handed.append(state) or guard_service.initial_state(**state)
    )
    detach_guard(release, "embedder", "embedder@2", 20, 60)  # type: ignore[arg-type]
    (state,) = handed
    return release, state


def test_detach_hands_the_guard_the_equal_load_step_and_the_servers_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, state = _detached(monkeypatch, 7)
    assert [(n, s["percent"]) for n, s in state["steps"]] == [(EQUAL_LOAD_STEP, 20), (EQUAL_LOAD_STEP, 12)]
    assert state["load_servers"] == (1, 7) and state["return_share"] == 20
    assert state["guard"].analysis.load_ratio == pytest.approx(1.75)


def test_the_detached_guard_judges_a_busier_identical_canary_at_equal_load(tmp_path: Path) -> None:
    """No steps, the canary at 20 % on 1 server beside 7: the detached guard judges its errors at 20 %,
    its latency at 12 %, puts it back at 20 % and ends promote-ready (it rolled the canary back for its
    queue before)."""
    rules = Canary.model_validate({"min_requests": 4, "interval_s": 10, "intervals": 2})
    node = BusyNode(share=20)
    clock = DetachedClock(node)
    ahead = with_equal_load_step([], 20, equal_load_percent(1, 7))
    started(tmp_path, node, clock, rules, steps=ahead, load_servers=(1, 7), return_share=20)
    guard = guard_of(tmp_path, node, clock)
    guard.run()
    assert node.shares == [12, 20] and node.slow > 0
    assert guard.state["verdict"]["action"] == PROMOTE_READY, guard.state["verdict"]
    assert guard.state["share"] == 20


def test_the_added_analysis_below_the_stacks_smallest_share_has_longer_intervals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """borrow on 16 replicas (1 canary, 15 stable) at 20 %, 2 requests/s: the plan accepted 20 % (24
    requests per 60 s interval), but the equal-load share, 6 %, answers about 7 of the 10 an interval
    needs: every release of an identical canary ended inconclusive (100 of 100 simulated). Its intervals are
    lengthened by 20 / 6, so the canary answers as many requests per interval as at 20 %."""
    assert lengthened_interval_s(60, 6, 20) == 200
    assert lengthened_interval_s(60, 12, 5) == 60 and lengthened_interval_s(60, 1, 100) == 3600
    clock = Clock()
    release, done = _release_by_share([], 20, (1, 15), slower=1.0)
    began: list[float] = []
    analyse = carry.analyse

    def timed(*args: Any, **kwargs: Any) -> Any:
        began.append(clock.now)
        return analyse(*args, **kwargs)

    # The loop is carry.guard's (Release.guard delegates): each step's analysis is carry.analyse.
    monkeypatch.setattr(carry, "analyse", timed)
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == PROMOTE_READY, verdict.reason
    assert done == ["share 6", "share 20"]
    # rules: 2 intervals of 10 s; at 6 % 2 of 34 s.
    assert clock.now - began[1] >= 2 * 34


def test_the_detached_guard_lengthens_the_added_analysis_below_the_smallest_share(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    release = DetachingRelease()
    release.figures = lambda: GatewayFigures(20, {}, {}, {CANARY_BACKEND: 1, STABLE_BACKEND: 15})  # type: ignore[method-assign]
    handed: list[dict[str, Any]] = []
    monkeypatch.setattr(
        detach, "initial_state", lambda **state: handed.append(state) or guard_service.initial_state(**state)
    )
    detach_guard(release, "embedder", "embedder@2", 20, 60)  # type: ignore[arg-type]
    (state,) = handed
    interval_s = release.rules.interval_s
    assert [s.get("interval_s") for _, s in state["steps"]] == [
        None,
        lengthened_interval_s(interval_s, 6, 20),
    ]
    rules = Canary.model_validate({"min_requests": 4, "interval_s": 10, "intervals": 2})
    node = BusyNode(share=20)
    clock = DetachedClock(node)
    ahead = with_equal_load_step([], 20, equal_load_percent(1, 15))
    started(tmp_path, node, clock, rules, steps=ahead, load_servers=(1, 15), return_share=20)
    guard = guard_of(tmp_path, node, clock)
    guard.state["steps"][1]["interval_s"] = 34
    guard.state["step"] = 1
    assert guard.step_rules().interval_s == 34 and guard.step_rules().analysis_s == 68
    guard.state["step"] = 0
    assert guard.step_rules().interval_s == 10


def test_the_detached_guard_says_where_the_share_did_not_go_back(tmp_path: Path) -> None:
    """Without steps, both analyses passed, and putting the share back to 20 % fails on a gateway: the
    release ended promote-ready saying nothing, its state at 12 % whatever each gateway had. Now the state
    names the gateways not set and the verdict's next step says what to do."""
    rules = Canary.model_validate({"min_requests": 4, "interval_s": 10, "intervals": 2})
    node = BusyNode(share=20)
    clock = DetachedClock(node)
    ahead = with_equal_load_step([], 20, equal_load_percent(1, 7))
    started(tmp_path, node, clock, rules, steps=ahead, load_servers=(1, 7), return_share=20)
    guard = guard_of(tmp_path, node, clock)
    setting = guard.set_everywhere

    def failing_back(percent: int) -> list[str]:
        return ["head-1"] if percent == 20 else setting(percent)

    guard.set_everywhere = failing_back  # type: ignore[method-assign]
    guard.run()
    assert guard.state["verdict"]["action"] == PROMOTE_READY, guard.state["verdict"]
    assert guard.state["gateways_not_set"] == ["head-1"]
    assert "20 %" in guard.state["remains"] and "head-1" in guard.state["remains"], guard.state


def test_the_detached_guard_weighs_each_steps_load_at_that_steps_share(tmp_path: Path) -> None:
    """Steps 5, 20 % on 1 server beside 7, the equal-load analysis (12 %) between them: at 20 % the
    canary's server takes 1.75 x the load and reads slower; its latency is not judged there, so an
    identical canary passes (the detached guard through stack steps and the added one, untested before)."""
    rules = Canary.model_validate(
        {"min_requests": 4, "interval_s": 10, "intervals": 2, "steps": [{"percent": 5}, {"percent": 20}]}
    )
    node = BusyNode(share=5)
    clock = DetachedClock(node)
    ahead = with_equal_load_step(_steps(5, 20), 5, equal_load_percent(1, 7))
    assert [s.percent for _, s in ahead] == [5, 12, 20]
    started(tmp_path, node, clock, rules, steps=ahead, load_servers=(1, 7))
    guard = guard_of(tmp_path, node, clock)
    guard.run()
    assert node.shares == [12, 20] and node.slow > 0
    assert guard.state["verdict"]["action"] == PROMOTE_READY, guard.state["verdict"]


def test_the_detached_guard_moves_to_a_first_step_at_another_share_before_analysing_it(
    tmp_path: Path,
) -> None:
    """The canary deployed at 10 %, steps 20 and 40 % on 1 server beside 7: the equal-load analysis (12 %)
    is the first step ahead, at another share than the canary's, so the CLI's analysis is not carried on:
    the guard sets 12 % and analyses from there (a mutant keeping the CLI's analysis survived before)."""
    rules = Canary.model_validate(
        {"min_requests": 4, "interval_s": 10, "intervals": 2, "steps": [{"percent": 20}, {"percent": 40}]}
    )
    node = BusyNode(share=10)
    clock = DetachedClock(node)
    ahead = with_equal_load_step([(1, CanaryStep(percent=20)), (2, CanaryStep(percent=40))], 10, 12)
    assert [s.percent for _, s in ahead] == [12, 20, 40]
    started(tmp_path, node, clock, rules, steps=ahead, load_servers=(1, 7))
    assert json.loads(Path(guard_service.state_path("embedder", str(tmp_path))).read_text())["guard"] is None
    guard = guard_of(tmp_path, node, clock)
    guard.run()
    assert node.shares[:1] == [12], node.shares


def test_the_added_analysis_below_equal_load_that_whole_percents_leave_is_longer_still() -> None:
    """borrow on 21 replicas (1 canary, 20 stable) through steps 5, 20, 50 %: no whole percent is within
    LOAD_TOLERANCE of equal load (4 % loads the canary 0.83 x, 5 % 1.053 x), and the analysis added at 4 %
    had intervals of 60 x 5 / 4 = 75 s: a 1.5 x slower canary, reading about 1.28 x at that load, was caught
    in 91 of 100 releases at 10 requests/s (benchmarks/canary_load.py --pools). Its intervals are twice
    that now; where a share is within the tolerance (12 % beside 7) nothing changes."""
    rules = Canary.model_validate({"steps": [{"percent": 5}, {"percent": 20}, {"percent": 50}]})
    assert equal_load_percent(1, 20) == 4
    added = carry.step_rules(rules, EQUAL_LOAD_STEP, 4, 5, (1, 20))
    assert added.interval_s == 2 * 75 and added.analysis_s == 2 * 75 * rules.intervals
    # Above the smallest share too: 6 % beside 14 stable servers loads the canary 0.89 x.
    assert equal_load_percent(1, 14) == 6
    assert carry.step_rules(rules, EQUAL_LOAD_STEP, 6, 5, (1, 14)).interval_s == 2 * 60
    # Within the tolerance, or not the equal-load share, or the stack's own step: as before.
    assert carry.step_rules(rules, EQUAL_LOAD_STEP, 12, 20, (1, 7)).interval_s == 100
    assert carry.step_rules(rules, EQUAL_LOAD_STEP, 20, 20, (1, 20)) is rules
    assert carry.step_rules(rules, 1, 4, 5, (1, 20)) is rules
    assert carry.step_rules(rules, EQUAL_LOAD_STEP, 4, 5).interval_s == 75  # no servers counted
    ahead = carry.releases_steps(rules.steps, 0, 0, False, 4)
    assert carry.added_interval_s(rules, ahead, 0, (1, 20)) == 150


def test_detach_hands_the_guard_the_longer_intervals_below_equal_load_that_whole_percents_leave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1 canary beside 20 stable servers at 20 %: the detached guard's added analysis at 4 % carries
    intervals SPARSE_FACTOR times longer than 20 / 4 makes them, as the CLI's guard runs it."""
    release, state = _detached(monkeypatch, 20)
    added = {s["percent"]: s.get("interval_s") for n, s in state["steps"] if n == EQUAL_LOAD_STEP}
    interval_s = release.rules.interval_s
    assert added == {20: None, 4: SPARSE_FACTOR * lengthened_interval_s(interval_s, 4, 20)}, state["steps"]
