"""`gpuplat check` through the real entry point: exit 0 on the shipped stacks, 1 naming the rule."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.errors import SpecError
from tests.unit.test_cli import gpuplat, gpuplat_process


def test_check_all_shipped_stacks_pass() -> None:
    result = gpuplat("check", "--all", "--json")
    assert result.returncode == 0, result.stderr
    reports = json.loads(result.stdout)
    assert {r["stack"] for r in reports} >= {"local", "aws-prod", "onprem"}
    assert all(r["passed"] and r["verdicts"] == [] for r in reports)


def test_broken_variant_exits_1_naming_the_rule(write_stack: Callable[..., Path]) -> None:
    def untaint_and_overspend(spec: dict[str, Any]) -> None:
        spec["budget"]["max_gpus"] = 8
        next(p for p in spec["pools"] if p["name"] == "infer")["taints"] = []

    path = write_stack("onprem", untaint_and_overspend, name="broken")
    for command in ("check", "plan"):  # one verdict: a CI job gating on `plan` refuses what `check` does
        result = gpuplat(command, "--stack-file", str(path))
        assert result.returncode == 1, (command, result.stderr)
        assert "budget-gpus" in result.stdout and "isolation-inference-taint" in result.stdout
        assert "budget-gpus, isolation-inference-taint" in result.stderr and "Traceback" not in result.stderr


def test_plan_takes_the_policy_config_check_takes(write_stack: Callable[..., Path], tmp_path: Path) -> None:
    """Over the GPU budget: a mandatory violation by default; the config makes the rule advisory."""
    path = write_stack("onprem", lambda spec: spec["budget"].update(max_gpus=8), name="over")
    config = tmp_path / "policy.yaml"
    config.write_text("budget-gpus:\n  enforcementLevel: advisory\n")
    for command in ("check", "plan"):
        assert gpuplat(command, "--stack-file", str(path)).returncode == 1, command
        relaxed = gpuplat(command, "--stack-file", str(path), "--policy-config", str(config), "--json")
        assert relaxed.returncode == 0, (command, relaxed.stderr)
        assert "budget-gpus" in relaxed.stdout


def test_advisory_only_exits_0_and_plan_shows_verdicts(write_stack: Callable[..., Path]) -> None:
    def staging(spec: dict[str, Any]) -> None:
        spec["environment"] = "staging"
        next(p for p in spec["pools"] if p["name"] == "train-spot")["max"] = 1

    path = write_stack("aws-prod", staging, name="staging")
    result = gpuplat("check", "--stack-file", str(path), "--json")
    assert result.returncode == 0, result.stderr
    ((verdict,),) = [r["verdicts"] for r in json.loads(result.stdout)]
    assert verdict["rule"] == "spot-training-share" and verdict["severity"] == "advisory"
    plan = json.loads(gpuplat("plan", "--stack-file", str(path), "--json").stdout)
    assert [v["rule"] for v in plan["verdicts"]] == ["spot-training-share"]
    assert set(plan["verdicts"][0]) == {"rule", "severity", "resource", "message", "remediation"}


def test_no_event_loop_finalizer_noise_after_a_recorded_plan() -> None:
    """The Pulumi SDK leaves event loops behind; unclosed, their finalizers printed a traceback at exit
    in about one run of three. Several runs make the old behaviour show."""
    for _ in range(4):
        result = gpuplat_process("check", "--stack", "onprem")
        assert result.returncode == 0, result.stderr
        assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr


def test_leftover_event_loops_are_closed_before_exit(shipped_platforms: dict[str, Any]) -> None:
    """Deterministic half of the check above: after the SDK ran, a loop nobody closed is closed while its
    sockets live."""
    import asyncio

    from infra.plan.event_loops import release_event_loops
    from infra.plan.record import record

    record(shipped_platforms["onprem"], program=lambda platform: None)
    leftover = asyncio.new_event_loop()
    release_event_loops()
    assert leftover.is_closed()


def test_the_sweep_closes_unreachable_loops_without_collecting_the_heap(
    shipped_platforms: dict[str, Any],
) -> None:
    """A loop already garbage (its self-pipe in its cycle) is closed by the walk, and no full collection
    follows it: a closed loop's finalizer prints nothing, and a collection of the whole heap was four
    times the walk's cost in every command that planned."""
    import asyncio
    import gc
    import weakref

    from infra.plan.event_loops import release_event_loops
    from infra.plan.record import record

    record(shipped_platforms["onprem"], program=lambda platform: None)
    garbage = asyncio.new_event_loop()
    garbage.__dict__["cycle"] = garbage
    left = weakref.ref(garbage)
    del garbage
    full: list[dict[str, Any]] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(info)

    automatic = gc.isenabled()
    gc.disable()  # only a collection the sweep asks for is counted, none the allocator happened to start
    gc.callbacks.append(seen)
    try:
        release_event_loops()
    finally:
        gc.callbacks.remove(seen)
        if automatic:
            gc.enable()
    loop = left()
    assert loop is None or loop.is_closed()
    assert not full, "the sweep collected the whole heap"


def test_only_a_command_that_ran_the_sdk_sweeps_the_heap_for_its_loops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sweep walks every object and collects the heap whole: a command that never started the SDK
    (help, size) has no loop of the SDK's to close and skips it; one that planned sweeps once."""
    import gc

    sweeps: list[int] = []
    walk = gc.get_objects

    def counted(*args: Any) -> list[Any]:
        sweeps.append(1)
        return walk(*args)

    monkeypatch.setattr(gc, "get_objects", counted)
    assert gpuplat("plan", "--stack", "onprem").returncode == 0
    assert sweeps, "a recorded plan left its loops to the garbage collector"
    sweeps.clear()
    for command in (["--help"], ["plan", "--help"], ["size", "--params", "7e9"]):
        assert gpuplat(*command).returncode == 0, command
    assert not sweeps, "a command that never ran the SDK swept the heap"

    def refused(report: Any) -> None:
        raise SpecError("refused after the plan was recorded")

    monkeypatch.setattr("infra.cli.commands.plan.render_plan", refused)
    assert gpuplat("plan", "--stack", "onprem").returncode == 2
    assert sweeps, "a command that failed after the SDK ran left its loops to the garbage collector"


def test_a_program_that_fails_halfway_still_has_its_loops_swept(shipped_platforms: dict[str, Any]) -> None:
    """A stack whose program raises ends the command with an error paragraph; the loops the SDK made
    before the failure are as much left behind as after a plan that succeeded."""
    import asyncio

    from infra.plan.event_loops import release_event_loops
    from infra.plan.record import record

    def failing(platform: Any) -> None:
        raise RuntimeError("the program failed halfway")

    with pytest.raises(RuntimeError, match="halfway"):
        record(shipped_platforms["onprem"], program=failing)
    leftover = asyncio.new_event_loop()
    release_event_loops()
    assert leftover.is_closed()
