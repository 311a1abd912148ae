"""Stepped releases in the stack file (infra/spec/models.py CanaryStep, Canary.steps): shares that rise, the
promotion last, each step's share judgeable by the traffic; refused in one paragraph, exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.serving.analysis import ROLLBACK
from infra.serving.carry import GATED, PROMOTED
from infra.serving.counts import Counts, Histogram
from infra.serving.release import GatewayFigures, Release
from infra.spec.models import Canary, CanaryStep
from tests.unit.test_canary import BOUNDS
from tests.unit.test_hostile_input import refused, run_cli, write_variant
from tests.unit.test_serving_release import Clock, guarded, version


def test_steps_that_rise_to_a_promotion_are_accepted_and_may_name_a_manual_gate() -> None:
    rules = Canary.model_validate(
        {"steps": [{"percent": 5}, {"percent": 20}, {"percent": 50, "manual_gate": True}, {"percent": 100}]}
    )
    assert [(s.percent, s.manual_gate) for s in rules.steps] == [
        (5, False),
        (20, False),
        (50, True),
        (100, False),
    ]
    assert Canary().steps == []
    assert Canary(steps=[CanaryStep(percent=10), CanaryStep(percent=30)]).steps[-1].percent == 30


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        (
            [{"percent": 20}, {"percent": 20}],
            "serving.canary.steps[1].percent: step 2 gives the canary 20 %, not more than step 1's 20 %",
        ),
        (
            [{"percent": 50}, {"percent": 100}, {"percent": 100}],
            "step 3 gives the canary 100 %, not more than step 2's 100 %",
        ),
        ([{"percent": 0}], "serving.canary.steps[0].percent"),
        ([{"percent": 101}], "serving.canary.steps[0].percent"),
        (
            [{"percent": 20, "gate": "manual"}],
            "serving.canary.steps[0].gate: unknown key; allowed: percent, manual_gate",
        ),
        ([{"percent": 5 + i} for i in range(11)], "serving.canary.steps"),
    ],
)
def test_steps_that_do_not_rise_or_fall_outside_1_to_100_are_refused_with_exit_2(
    tmp_path: Path, steps: list[dict[str, Any]], expected: str
) -> None:
    def stepped(platform: dict[str, Any]) -> None:
        platform["serving"]["canary"] = {"steps": steps}

    path = write_variant(tmp_path, "local", stepped)
    refused(run_cli("plan", "--stack-file", str(path)), str(path), expected)


def test_a_step_the_traffic_cannot_judge_is_refused_with_the_arithmetic(tmp_path: Path) -> None:
    """At 2 requests/s a 5 % step answers 6 requests per 60 s interval, fewer than the 10 each needs."""

    def stepped(platform: dict[str, Any]) -> None:
        platform["serving"]["canary"] = {
            "expected_requests_per_s": 2,
            "steps": [{"percent": 5}, {"percent": 50}, {"percent": 100}],
        }

    path = write_variant(tmp_path, "local", stepped)
    refused(
        run_cli("plan", "--stack-file", str(path)),
        "serving.canary.steps[0].percent: step 1: a canary at 5 % of 2 requests/s answers about 6.0 requests",
        "give the canary at least 9 %",
    )


def test_a_step_that_leaves_the_stable_version_too_few_requests_is_refused_with_the_arithmetic(
    tmp_path: Path,
) -> None:
    """At 10 requests/s a 99 % step leaves the stable version 6 requests per 60 s interval to compare the
    canary with, fewer than the 10 each needs: a 1.5 x slower canary was promoted in 36 of 100 simulated
    runs at that share."""

    def stepped(platform: dict[str, Any]) -> None:
        platform["serving"]["canary"] = {
            "expected_requests_per_s": 10,
            "steps": [{"percent": 20}, {"percent": 99}, {"percent": 100}],
        }

    path = write_variant(tmp_path, "local", stepped)
    refused(
        run_cli("plan", "--stack-file", str(path)),
        "serving.canary.steps[1].percent: step 2: a canary at 99 % of 10 requests/s leaves the stable "
        "version about 6.0 requests",
        "give the canary at most 98 %",
    )


def test_a_promotion_before_the_last_step_is_refused() -> None:
    with pytest.raises(ValueError, match=r"step 1 gives the canary 100 % .* but 1 step\(s\) follow it"):
        Canary.model_validate({"steps": [{"percent": 100}, {"percent": 50}]})


# The guard through the steps (infra/serving/release.py Release.guard)


def stepped(steps: list[dict[str, Any]], share: int, canary_errors: int = 0) -> tuple[Release, list[str]]:
    """A release at `share` whose gateway answers healthy counts (the canary failing `canary_errors` of
    every 20 requests), recording each share set and each promotion in `done`."""
    rules = Canary.model_validate({"interval_s": 10, "intervals": 2, "min_requests": 10, "steps": steps})
    looks = [
        (
            Counts(80 * look, 0, Histogram(BOUNDS, (20 * look, 40 * look, 20 * look, 0), 1.6 * look)),
            Counts(
                20 * look,
                canary_errors * look,
                Histogram(BOUNDS, (5 * look, 10 * look, 5 * look, 0), 0.4 * look),
            ),
        )
        for look in range(200)
    ]
    release, _ = guarded(looks, rules)
    done: list[str] = []
    at = {"share": share}

    def set_share(percent: int) -> None:
        done.append(f"share {percent}")
        at["share"] = percent

    release.set_share = set_share  # type: ignore[method-assign]
    release.figures = lambda: GatewayFigures(at["share"], {}, {}, {})  # type: ignore[method-assign]
    release.promote = lambda model: done.append("promote") or version("/shared/models/x")  # type: ignore[method-assign,func-returns-value]
    release.rollback = lambda model, reason="": done.append("rollback")  # type: ignore[method-assign,assignment,func-returns-value]
    return release, done


def test_the_guard_holds_each_step_for_an_analysis_and_promotes_at_the_last() -> None:
    clock = Clock()
    release, done = stepped([{"percent": 5}, {"percent": 20}, {"percent": 50}, {"percent": 100}], share=5)
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == PROMOTED and verdict.reason == "3 step(s) passed: embedder@2 promoted"
    assert done == ["share 20", "share 50", "promote"]  # 5 % was the deploy's share
    assert release.__dict__["records"] == [
        ("analysing", 5),
        ("analysing", 20),
        ("analysing", 50),
        ("promoting", 50),
        ("promoted", 100),
    ]
    assert clock.now == 1000.0 + 3 * 20  # three analyses of 2 x 10 s


def test_a_manual_gate_holds_the_release_until_an_operator_goes_past_it() -> None:
    clock = Clock()
    steps = [{"percent": 5}, {"percent": 20, "manual_gate": True}, {"percent": 100}]
    release, done = stepped(steps, share=0)
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == GATED and done == ["share 5", "share 20"]
    assert "step 2 of 3 (20 %) passed and its manual gate holds the release at 20 %" in verdict.reason
    assert "`gpuplat serve guard embedder --past-gate` goes on to step 3 (100 %)" in verdict.reason
    again = release.guard("embedder", sleep=clock.sleep, clock=clock, past_gate=True)
    assert again.action == PROMOTED and done == ["share 5", "share 20", "promote"]


def test_a_step_that_fails_rolls_the_canary_back_and_goes_no_further() -> None:
    clock = Clock()
    release, done = stepped([{"percent": 5}, {"percent": 50}, {"percent": 100}], share=5, canary_errors=20)
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == ROLLBACK and done == ["rollback"]


def test_a_stepped_guard_without_a_canary_moves_no_share() -> None:
    release, done = stepped([{"percent": 5}, {"percent": 100}], share=0)
    release.aliased = lambda model, alias: None  # type: ignore[method-assign]
    verdict = release.guard("embedder")
    assert (verdict.action, done) == ("gone", [])
