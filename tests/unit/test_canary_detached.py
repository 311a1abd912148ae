"""The detached guard (infra/serving/guard_service.py): its state written whole or not at all, whatever
write a kill lands between; a guard killed after any write and started again resumes with its evidence (the
counts since the canary started, the baseline before it), never from zero; a rollback takes the canary's
share to 0 on its gateway and says what remains; the release lock held while it runs; the bundle runs on a
bare Python."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from infra.cli.commands import serve as serve_command
from infra.errors import ExitCode, GpuPlatError
from infra.serving import detach, guard_service, guard_state, lock
from infra.serving.analysis import PROMOTE_READY, ROLLBACK, Guard, RulesRead
from infra.serving.carry import Step
from infra.serving.counts import Counts, Reading
from infra.serving.detach import UNIT, bundle, bundle_path, detach_guard, unit_name
from infra.serving.guard_service import DONE, DetachedGuard, initial_state, record_path, state_path
from infra.serving.load import load_at
from infra.serving.lock import LockLost, LockRefused, ReleaseLock
from infra.serving.metrics_text import GatewayFigures
from infra.serving.release import ServingLayout
from infra.spec.models import Canary

MODEL = "embedder"
STABLE, CANARY = "inference", "inference_canary"


class Killed(BaseException):
    """A kill of the guard's process at some write (BaseException: nothing of the guard catches it)."""


class Node:
    """The gateway's node: its gateway's share and counters (stable answers every request, the canary
    fails `canary_fails` of them), the model servers answering no /metrics, every other command run for
    real (the lock's scripts, in a folder of the test's)."""

    def __init__(self, share: int, canary_fails: bool) -> None:
        self.share, self.canary_fails = share, canary_fails
        self.counts = {STABLE: [0, 0], CANARY: [0, 0]}
        self.shares: list[int] = []
        self.systemctl: list[tuple[str, ...]] = []
        self.latency = False
        self.up = {STABLE: 1, CANARY: 1}
        """each backend's servers up, as the gateway counts them"""

    def metrics(self) -> str:
        """Both versions' servers' /metrics: every answer under 0.1 s, 0.05 s on average."""
        lines = []
        for port, backend in ((8000, STABLE), (8100, CANARY)):
            answered = self.counts[backend][0]
            lines += [
                f"# port {port}",
                f'h_bucket{{le="0.1"}} {answered}',
                f'h_bucket{{le="+Inf"}} {answered}',
                f"h_sum {0.05 * answered}",
            ]
        return "\n".join(lines)

    def traffic(self, requests: int) -> None:
        canary = requests * self.share // 100
        self.counts[STABLE][0] += requests - canary
        self.counts[CANARY][0] += canary
        if self.canary_fails:
            self.counts[CANARY][1] += canary

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        if command[0] == "python3" and command[1].endswith("gpuplat_gateway_canary.py"):
            if command[2] == "share":
                self.share = int(command[3])
                self.shares.append(self.share)
                return "{}"
            backends = {
                name: {"requests": r, "errors": e, "servers_up": self.up[name]}
                for name, (r, e) in self.counts.items()
            }
            return json.dumps({"canary_percent": self.share, "backends": backends})
        if command[:2] == ("python3", "-c"):
            return self.metrics() if self.latency else ""  # none: the analysis judges the errors alone
        if command[0] == "systemctl":
            self.systemctl.append(command[1:])
            return ""
        return guard_service.LocalNodes().exec(node, *command, timeout=timeout)


class Clock:
    """The node's clock; each sleep is the time the client's requests flow (10 a second)."""

    def __init__(self, node: Node) -> None:
        self.now, self.node = 1_000_000.0, node

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.node.traffic(int(10 * seconds))


@pytest.fixture(autouse=True)
def lock_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock, "LOCK_DIR", str(tmp_path / "locks"))


def started(
    folder: Path,
    node: Node,
    clock: Clock,
    rules: Canary,
    duration_s: float = 400,
    steps: Sequence[tuple[int, Step]] | None = None,
    load_servers: tuple[int, int] | None = None,
    return_share: int | None = None,
) -> None:
    """The state `deploy --detach` hands over: the counters just before the canary got its share (the
    steps ahead: the stack's unless given)."""
    stable, canary = _counts(node)
    baseline = Guard(rules, 0.0, stable, canary, load_ratio=load_at(node.share, load_servers))
    state = initial_state(
        model=MODEL,
        candidate=f"{MODEL}@2",
        rules=RulesRead.of(rules),
        guard=baseline,
        started_ago_s=0,
        share=node.share,
        steps=[
            (n, {"percent": s.percent, "manual_gate": s.manual_gate})
            for n, s in (enumerate(rules.steps, 1) if steps is None else steps)
        ],
        steps_in_all=len(rules.steps),
        gateway="head-0",
        gateway_programs="/usr/local/lib/gpuplat",
        backends={"stable": STABLE, "canary": CANARY},
        servers={"infer-0": {"stable": [8000], "canary": 8100}},
        histogram="h",
        look_s=5,
        duration_s=duration_s,
        load_servers=load_servers,
        return_share=return_share,
    )
    guard_service.init(MODEL, json.dumps(state), str(folder), clock)


def started_by_a_locked_deploy(folder: Path) -> tuple[Node, Clock, ReleaseLock]:
    """A failing canary started as `deploy --detach` leaves it, its deploy still holding the release lock."""
    node = Node(share=20, canary_fails=True)
    clock = Clock(node)
    started(folder, node, clock, Canary(min_requests=10, interval_s=30, intervals=2))
    deploy = ReleaseLock(node, "head-0", MODEL, "deploy embedder@2", lambda _: None)
    deploy.take()
    return node, clock, deploy


def _counts(node: Node) -> tuple[Reading, Reading]:
    """The counters as the CLI reads them: by gateway (its node's name), as the guard reads its own."""
    return (
        Reading.of_gateways({"head-0": Counts(node.counts[STABLE][0], node.counts[STABLE][1])}, None),
        Reading.of_gateways({"head-0": Counts(node.counts[CANARY][0], node.counts[CANARY][1])}, None),
    )


def guard_of(folder: Path, node: Node, clock: Clock) -> DetachedGuard:
    return DetachedGuard(MODEL, str(folder), node, clock, clock.sleep)  # type: ignore[arg-type]


class Kill:
    """The guard's process killed at its n-th write step (any os call write_whole makes: open, write, fsync,
    close, replace), counted from `arm`."""

    def __init__(self) -> None:
        self.at: int | None = None
        self.calls = 0

    def arm(self, at: int | None) -> None:
        self.at, self.calls = at, 0

    def step(self) -> None:
        self.calls += 1
        if self.at is not None and self.calls == self.at:
            self.at = None
            raise Killed


@pytest.fixture
def kill(monkeypatch: pytest.MonkeyPatch) -> Kill:
    killing = Kill()
    for name in ("open", "write", "fsync", "close", "replace"):
        real = getattr(os, name)

        def counted(*arguments: Any, _real: Any = real) -> Any:
            killing.step()
            return _real(*arguments)

        monkeypatch.setattr(os, name, counted)
    return killing


def test_a_state_written_whole_or_not_at_all_whatever_step_the_writer_is_killed_at(
    tmp_path: Path, kill: Kill
) -> None:
    path = str(tmp_path / "guard" / "m.json")
    old, new = {"looks": 1, "evidence": [1] * 50}, {"looks": 2, "evidence": [2] * 5000}
    steps = 0
    while True:
        guard_state.write_whole(path, old)
        kill.arm(steps + 1)
        try:
            guard_state.write_whole(path, new)
        except Killed:
            assert guard_state.read_whole(path) in (old, new)
            steps += 1
            continue
        break
    kill.arm(None)
    assert steps >= 8  # open, write, fsync, close, replace, the folder's open, fsync, close: each one tried
    assert guard_state.read_whole(path) == new
    guard_state.write_whole(path, old)  # a temporary a killed writer left is replaced, never read
    assert guard_state.read_whole(path) == old


def test_a_guard_killed_after_any_write_resumes_with_its_evidence_and_rolls_the_failing_canary_back(
    tmp_path: Path, kill: Kill, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A canary failing every request, the guard killed at its k-th write step and started again (its
    service restarted) for k = 1, 2, ...: every run rolls it back on the evidence of one that ran
    uninterrupted, the counts since the canary started never reset, the share 0 on the gateway."""
    rules = Canary(min_requests=10, interval_s=30, intervals=2)
    # The killed guard's process is gone: its successor takes its lock over (lock.gone, on the node).
    monkeypatch.setattr(lock, "gone", lambda holder: holder.startswith("the detached guard"))

    def carried(kill_at: int | None) -> tuple[DetachedGuard, Node, int]:
        folder = tmp_path / f"run-{kill_at}"
        node = Node(share=20, canary_fails=True)
        clock = Clock(node)
        started(folder, node, clock, rules)
        node.traffic(30)  # answered before the guard's first look: evidence it must keep
        restarts = 0
        kill.arm(kill_at)
        while True:
            try:
                guard = guard_of(folder, node, clock)
                guard.run()
                return guard, node, restarts
            except Killed:
                restarts += 1
                saved = guard_state.read_whole(state_path(MODEL, str(folder)))
                assert saved is not None and saved["guard"]["canary"]["total"]["requests"] >= 0

    uninterrupted, _, _ = carried(None)
    assert uninterrupted.state["verdict"]["action"] == ROLLBACK
    looks = uninterrupted.state["looks"]
    evidence = uninterrupted.state["guard"]["canary"]["total"]
    for kill_at in range(1, 40):
        guard, node, restarts = carried(kill_at)
        assert restarts == 1
        assert guard.state["phase"] == DONE and guard.state["verdict"]["action"] == ROLLBACK, guard.state
        assert node.share == 0 and node.shares[-1] == 0
        # The same evidence as without the kill: the look it cut short repeated at most once.
        assert guard.state["looks"] in (looks, looks + 1)
        assert guard.state["guard"]["canary"]["total"]["requests"] >= evidence["requests"]
        assert guard.state["guard"]["canary"]["total"]["errors"] >= evidence["errors"]
    record = guard_state.read_whole(record_path(MODEL, str(tmp_path / "run-None")))
    assert record is not None and record["phase"] == "rolled back" and record["canary_percent"] is None
    assert "`gpuplat serve rollback embedder` stops its slot" in record["detail"]
    assert record["guard"]["state"] == DONE


def test_a_restarted_guard_keeps_the_evidence_a_fresh_one_would_lose(tmp_path: Path) -> None:
    """What today's `serve guard` does when started again (counts from its own first look) against the
    detached guard resumed from its state: the canary failed 6 requests before the restart; the resumed
    guard still counts them, a fresh one does not."""
    rules = Canary(min_requests=10, interval_s=30, intervals=2)
    node = Node(share=20, canary_fails=True)
    clock = Clock(node)
    started(tmp_path, node, clock, rules)
    node.traffic(30)
    guard = guard_of(tmp_path, node, clock)
    guard.look()
    before = guard.state["guard"]["canary"]["total"]
    assert before["errors"] == 16  # 6 before the first look, 10 in its 5 s
    resumed = guard_of(tmp_path, node, clock)
    assert resumed.state["guard"]["canary"]["total"] == before
    fresh = Guard(rules, clock(), *_counts(node))
    assert fresh.canary.total.errors == 0


def test_the_guard_waits_for_the_lock_its_starter_holds_and_a_second_release_meets_it(tmp_path: Path) -> None:
    node, clock, deploy = started_by_a_locked_deploy(tmp_path)
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:
            deploy.release()  # the deploy command exits
        clock.sleep(seconds)

    guard = DetachedGuard(MODEL, str(tmp_path), node, clock, sleep)  # type: ignore[arg-type]
    seen: list[str] = []

    def look() -> None:
        if not seen:
            second = ReleaseLock(node, "head-0", MODEL, "promote", lambda _: None)
            with pytest.raises(LockRefused, match="the detached guard by pid"):
                second.take()
            seen.append("refused")
        DetachedGuard.look(guard)

    guard.look = look  # type: ignore[method-assign]
    guard.run()
    assert waits[:2] == [2, 2] and seen == ["refused"]
    assert guard.state["verdict"]["action"] == ROLLBACK


def test_the_lock_handed_to_the_guard_is_never_free_in_between_and_the_guard_takes_it_at_once(
    tmp_path: Path,
) -> None:
    """`deploy --detach` hands its lock to the service and exits before the service runs: a promote started
    in that window is refused (before the hand-over, the lock was free from the deploy's exit to the
    guard's next try, two seconds later), and the guard takes the lock without waiting."""
    node, clock, deploy = started_by_a_locked_deploy(tmp_path)
    deploy.hand_over(guard_service.lock_heir(MODEL))
    deploy.release()  # the deploy command exits: the lock stays, held for the guard
    promote = ReleaseLock(node, "head-0", MODEL, "promote", lambda _: None)
    with pytest.raises(LockRefused, match="handed over to the detached guard of embedder"):
        promote.take()
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.sleep(seconds)

    guard = DetachedGuard(MODEL, str(tmp_path), node, clock, sleep)  # type: ignore[arg-type]
    guard.run()
    assert 2 not in waits and guard.state["verdict"]["action"] == ROLLBACK
    promote.take()  # the guard, ended, let it go
    # Only a lock held under the heir's name is taken at once: the promote's own is not.
    with pytest.raises(LockRefused, match="by pid"):
        ReleaseLock(node, "head-0", MODEL, "the detached guard", lambda _: None).take(
            handed_by=guard_service.lock_heir(MODEL)
        )
    promote.release()


def test_a_lock_no_longer_its_holders_is_not_handed_over(tmp_path: Path) -> None:
    node = Node(share=20, canary_fails=False)
    deploy = ReleaseLock(node, "head-0", MODEL, "deploy embedder@2", lambda _: None)
    deploy.take()
    (tmp_path / "locks" / f"{MODEL}.lock" / "owner").write_text("promote by pid 1 on elsewhere")
    with pytest.raises(LockLost, match="could not be handed over: lost: promote by pid 1"):
        deploy.hand_over(guard_service.lock_heir(MODEL))
    deploy.release()
    assert (tmp_path / "locks" / f"{MODEL}.lock" / "owner").read_text() == "promote by pid 1 on elsewhere"


def test_the_guard_carries_the_steps_below_100_and_stops_at_a_manual_gate(tmp_path: Path) -> None:
    """Steps 5, 20 (manual gate) and 100 with a canary as good as the stable version: the guard holds 5 %
    for its analysis, moves its gateway to 20 %, holds that for an analysis of its own, and stops at the
    gate, leaving the next step to an operator."""
    rules = Canary.model_validate(
        {
            "min_requests": 4,
            "interval_s": 10,
            "intervals": 2,
            "steps": [{"percent": 5}, {"percent": 20, "manual_gate": True}, {"percent": 100}],
        }
    )
    node = Node(share=5, canary_fails=False)
    node.latency = True
    clock = Clock(node)
    started(tmp_path, node, clock, rules)
    guard = guard_of(tmp_path, node, clock)
    guard.run()
    assert node.shares == [20]
    assert guard.state["verdict"]["action"] == "gated", guard.state["verdict"]
    record = guard_state.read_whole(record_path(MODEL, str(tmp_path)))
    assert record is not None and record["phase"] == "gated" and record["canary_percent"] == 20
    assert "step 2 of 3 (20 %)" in record["detail"] and "--past-gate` goes on" in record["detail"]


def test_a_guard_whose_state_is_missing_says_so(tmp_path: Path) -> None:
    with pytest.raises(GpuPlatError, match="no detached guard of 'embedder'"):
        DetachedGuard(MODEL, str(tmp_path))


def test_the_bundle_runs_on_a_python_without_the_clis_dependencies(tmp_path: Path) -> None:
    """The node has Debian's python3 and nothing else: the bundle imports no module outside itself and
    the standard library (-I: no site-packages, no user folder)."""
    archive = tmp_path / "guard.pyz"
    archive.write_bytes(bundle())
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(archive), "init", MODEL, "{}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    # It got as far as reading the state it was given ("{}" has no guard: a KeyError, not an ImportError).
    assert "ModuleNotFoundError" not in done.stderr and "ImportError" not in done.stderr, done.stderr
    usage = subprocess.run(
        [sys.executable, "-I", "-S", str(archive)], capture_output=True, text=True, check=False
    )
    assert usage.returncode == 2 and "usage: guard.pyz MODEL" in usage.stderr


def test_detach_without_a_canary_is_refused_with_exit_2() -> None:
    from tests.unit.test_hostile_input import run_cli

    run = run_cli("serve", "deploy", "embedder@2", "--detach")
    assert run.code == 2 and "--detach hands a canary's guard to the gateway's node" in run.err, run.err
    assert "Traceback" not in run.err


def test_detach_on_two_gateways_one_without_an_address_is_refused_before_the_canary_gets_a_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused after `deploy` had given the canary its share, the command left a canary with no guard. (Two
    gateways were refused outright before the guard's followers: test_detached_guard_gateways.py.)"""
    touched: list[str] = []

    class TwoGateways:
        layout = SimpleNamespace(gateways=["gateway-0", "gateway-1"], addresses={"gateway-0": "10.0.0.1"})
        platform = SimpleNamespace(name="two")
        registry = SimpleNamespace(resolve=lambda reference: touched.append("resolve"))

        def exclusive(self, model: str, what: str) -> Any:
            touched.append("lock")
            return contextlib.nullcontext()

        def deploy(self, reference: str, canary: int | None) -> None:
            touched.append("deploy")

    from tests.unit.test_hostile_input import run_cli

    monkeypatch.setattr(serve_command, "_release", lambda *_: TwoGateways())
    # The stack is loaded (offline) before _release: a Kueue stack goes another way.
    run = run_cli("serve", "deploy", "embedder@2", "--canary", "20", "--detach", "--stack", "local")
    assert run.code == ExitCode.POLICY_VIOLATION, run.err
    assert "has 2 gateways and no address for gateway-1: --detach runs the guard on gateway-0" in run.err, (
        run.err
    )
    assert touched == []


def test_a_guard_whose_looks_all_fail_ends_at_its_duration_and_lets_the_lock_go(tmp_path: Path) -> None:
    """Its gateway's program failing at every look (removed, or HAProxy's socket gone): the guard went on
    looking, and holding the release lock, for ever, so `serve rollback` met the lock."""
    rules = Canary(min_requests=10, interval_s=30, intervals=2)
    node = Node(share=20, canary_fails=True)
    clock = Clock(node)
    started(tmp_path, node, clock, rules, duration_s=60)
    answers = node.exec

    def failing(name: str, *command: str, timeout: float = 120) -> str:
        if command[0] == "python3" and command[1].endswith("gpuplat_gateway_canary.py"):
            raise GpuPlatError("python3 on this node exited 2: No such file or directory")
        return answers(name, *command, timeout=timeout)

    node.exec = failing  # type: ignore[method-assign]

    def sleep(seconds: float) -> None:
        assert clock.now < 1_000_000 + 600, "the guard still looks 10 minutes past its 60 s"
        clock.sleep(seconds)

    guard = DetachedGuard(MODEL, str(tmp_path), node, clock, sleep)  # type: ignore[arg-type]
    guard.run()
    assert guard.state["phase"] == DONE and "the last look failed" in guard.state["verdict"]["reason"]
    promote = ReleaseLock(node, "head-0", MODEL, "rollback", lambda _: None)
    promote.take()
    promote.release()


class DetachingRelease:
    """What `detach_guard` reads of a Release on a one-gateway stack, the node's commands recorded."""

    def __init__(self) -> None:
        self.layout = ServingLayout(("head-0",), ("infer-0",), {"infer-0": "10.0.0.5"}, "cpu", 600)
        self.platform = SimpleNamespace(name="local")
        self.rules = Canary()
        self.canary_start = (0.0, Counts(0, 0), Counts(0, 0))
        self.steps: list[str] = []
        self.nodes = SimpleNamespace(exec=self.exec)

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        if command[0] != "sh":
            self.steps.append(" ".join(command[:6]))
        else:
            self.steps.append(f"{'write' if command[2] == detach.WRITE else command[2]} {command[4]}")
        return ""

    def latency_histogram_name(self) -> str:
        return "h"

    def figures(self) -> GatewayFigures:
        """The canary at 20 %; no server counted up: no load to weigh (tests/unit/test_canary_load.py)."""
        return GatewayFigures(20, {}, {}, {})

    def stable_replicas(self, node: str) -> list[int]:
        return [0]

    def record(self, *_: Any) -> None:
        pass

    def hand_over(self, model: str, to: str) -> None:
        self.steps.append(f"hand over to {to}")


def test_each_detached_guard_restarts_with_its_own_bundle_and_gets_the_lock_before_it_starts() -> None:
    """The bundle was one file per node: a detach of model B by a newer CLI replaced the code model A's
    running guard restarts with, reading a state written for the older one."""
    first, second = DetachingRelease(), DetachingRelease()
    detach_guard(first, "embedder", "embedder@2", 20, 60)  # type: ignore[arg-type]
    detach_guard(second, "ranker", "ranker@7", 20, 60)  # type: ignore[arg-type]
    for release, model in ((first, "embedder"), (second, "ranker")):
        execs = [line for line in UNIT.splitlines() if line.startswith("ExecStart=")]
        assert execs == [f"ExecStart=/usr/bin/python3 {bundle_path('%i')} %i"]
        started_with = execs[0].replace("%i", model).split()[1]
        assert (
            f"write {started_with}" in release.steps
            and f"python3 {started_with} init {model}" in " | ".join(release.steps)
        )
        assert release.steps.index(f"hand over to {guard_service.lock_heir(model)}") < release.steps.index(
            f"systemctl restart {unit_name(model)}"
        )
    assert bundle_path("embedder") != bundle_path("ranker")


def test_a_guard_that_waited_for_the_lock_carries_the_state_written_meanwhile(tmp_path: Path) -> None:
    """A guard restarting (Restart=on-failure) while a new `deploy --detach` of its model held the lock read
    the old release's state, took the lock the deploy handed over, and saved that state over the new one
    before its restart came."""
    rules = Canary(min_requests=10, interval_s=30, intervals=2)
    node = Node(share=20, canary_fails=True)
    clock = Clock(node)
    started(tmp_path, node, clock, rules)
    deploy = ReleaseLock(node, "head-0", MODEL, "deploy embedder@3", lambda _: None)
    deploy.take()
    restarted = guard_of(tmp_path, node, clock)  # the old release's state
    state = guard_state.read_whole(state_path(MODEL, str(tmp_path)))
    assert state is not None
    state.update(candidate=f"{MODEL}@3", phase=DONE, verdict={"action": "gated", "reason": "new"})
    guard_state.write_whole(state_path(MODEL, str(tmp_path)), state)  # the new deploy's `init`
    deploy.hand_over(guard_service.lock_heir(MODEL))
    deploy.release()
    restarted.run()
    found = guard_state.read_whole(state_path(MODEL, str(tmp_path)))
    assert found is not None and found["candidate"] == f"{MODEL}@3" and found["looks"] == 0


def test_a_guard_that_could_not_be_started_says_the_canary_is_unwatched() -> None:
    """The node's `init` failing (no python3 there): the error said only that, and the canary kept its
    share with nothing watching it."""
    release = DetachingRelease()
    plain = release.exec

    def no_python(node: str, *command: str, timeout: float = 120) -> str:
        if command[0] == "python3":
            raise GpuPlatError("python3 on head-0 exited 127: not found", exit_code=ExitCode.NO_VERDICT)
        return plain(node, *command, timeout=timeout)

    release.nodes = SimpleNamespace(exec=no_python)
    with pytest.raises(
        GpuPlatError, match=r"exited 127: not found\. The detached guard of 'embedder' did not"
    ) as error:
        detach_guard(release, "embedder", "embedder@2", 20, 60)  # type: ignore[arg-type]
    assert "its canary has 20 % of the requests and nothing watches it" in error.value.message
    assert error.value.exit_code == ExitCode.NO_VERDICT


def test_the_start_handed_to_the_node_counts_the_time_the_copies_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The canary got its share at 0 s on the CLI's clock; copying the bundle and the unit took 20 s on a
    loaded machine. The state said "started 0 s ago" to a node reading it 20 s later: the guard's analysis
    (its initial delay, its --guard-s) began 20 s after the canary had."""
    now = [0.0]
    monkeypatch.setattr(detach.time, "monotonic", lambda: now[0])
    release = DetachingRelease()
    inits: list[dict[str, Any]] = []
    plain = release.exec

    def slow_copies(node: str, *command: str, timeout: float = 120) -> str:
        if command[0] == "sh":
            now[0] += 10
        if "init" in command:
            inits.append(json.loads(command[-1]))
        return plain(node, *command, timeout=timeout)

    release.nodes = SimpleNamespace(exec=slow_copies)
    detach_guard(release, "embedder", "embedder@2", 20, 60)  # type: ignore[arg-type]
    assert inits[0]["guard"]["started_s"] == -20


def test_a_canary_taken_out_by_another_command_ends_the_guard_without_a_rollback(tmp_path: Path) -> None:
    rules = Canary(min_requests=10, interval_s=30, intervals=2)
    node = Node(share=20, canary_fails=True)
    clock = Clock(node)
    started(tmp_path, node, clock, rules)
    node.share = 0  # `serve rollback` (after `systemctl stop`) took it out
    guard = guard_of(tmp_path, node, clock)
    guard.run()
    assert guard.state["verdict"]["action"] == "gone" and node.shares == []


def test_the_guard_stops_at_the_100_step_and_leaves_the_promotion_to_the_operator(tmp_path: Path) -> None:
    rules = Canary.model_validate(
        {"min_requests": 4, "interval_s": 10, "intervals": 2, "steps": [{"percent": 5}, {"percent": 100}]}
    )
    node = Node(share=5, canary_fails=False)
    node.latency = True
    clock = Clock(node)
    started(tmp_path, node, clock, rules)
    guard = guard_of(tmp_path, node, clock)
    guard.run()
    assert node.shares == [] and guard.state["verdict"]["action"] == PROMOTE_READY
    assert "step 2 of 2 (100 %) is the promotion" in guard.state["verdict"]["reason"]


def test_no_verdict_within_its_duration_ends_the_guard_and_leaves_the_canary(tmp_path: Path) -> None:
    rules = Canary(min_requests=10_000, interval_s=30, intervals=4)
    node = Node(share=20, canary_fails=False)
    clock = Clock(node)
    started(tmp_path, node, clock, rules, duration_s=40)
    guard = guard_of(tmp_path, node, clock)
    guard.run()
    assert (
        guard.state["verdict"]["action"] == "continue"
        and "no verdict within 40 s" in (guard.state["verdict"]["reason"])
    )
    assert clock.now - 1_000_000 < 60 and guard.state["looks"] == 8 and node.shares == []


def test_the_start_given_as_seconds_ago_is_placed_on_the_nodes_clock(tmp_path: Path) -> None:
    rules = Canary(min_requests=10, interval_s=30, intervals=2)
    node = Node(share=20, canary_fails=False)
    clock = Clock(node)
    state = initial_state(
        model=MODEL,
        candidate=f"{MODEL}@2",
        rules=RulesRead.of(rules),
        guard=Guard(rules, 0.0, *_counts(node)),
        started_ago_s=30,
        share=20,
        steps=[],
        steps_in_all=0,
        gateway="head-0",
        gateway_programs="/usr/local/lib/gpuplat",
        backends={"stable": STABLE, "canary": CANARY},
        servers={},
        histogram="h",
        look_s=5,
        duration_s=60,
    )
    guard_service.init(MODEL, json.dumps(state), str(tmp_path), clock)
    assert guard_of(tmp_path, node, clock).state["guard"]["started_s"] == clock.now - 30


def test_a_stopped_guard_lets_the_lock_go_at_once_saves_its_state_and_resumes_when_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (`systemctl stop`, a shutdown) in the middle of the analysis: the default action killed the
    guard where it stood, and its release lock stayed for its lease (60 s) in which `serve rollback` and
    `promote` met it. Now the look under way ends, the state is saved, the lock is free at once, the record
    says nobody watches the canary, and a start resumes with the evidence."""
    rules = Canary(min_requests=10_000, interval_s=30, intervals=4)
    node = Node(share=20, canary_fails=False)
    clock = Clock(node)
    started(tmp_path, node, clock, rules)
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:  # in the wait before the third look
            os.kill(os.getpid(), signal.SIGTERM)
        clock.sleep(seconds)

    def killed(number: int, frame: Any) -> None:
        raise Killed  # SIGTERM's default action, where the guard installs no handler of its own

    previous = signal.signal(signal.SIGTERM, killed)
    try:
        guard = DetachedGuard(MODEL, str(tmp_path), node, clock, sleep)  # type: ignore[arg-type]
        guard_service.serve_until_stopped(guard)
        assert signal.getsignal(signal.SIGTERM) is killed  # its handler is the guard's only while it runs
    finally:
        signal.signal(signal.SIGTERM, previous)
    saved = guard_state.read_whole(state_path(MODEL, str(tmp_path)))
    assert saved is not None and saved["phase"] == guard_service.RUNNING and saved["looks"] == 2, saved
    record = guard_state.read_whole(record_path(MODEL, str(tmp_path)))
    assert record is not None and record["phase"] == "stopped" and record["guard"]["state"] == "stopped"
    assert (
        "nothing watches the canary: `systemctl start gpuplat-serve-guard@embedder.service`"
        in (record["detail"])
    )
    promote = ReleaseLock(node, "head-0", MODEL, "promote", lambda _: None)
    promote.take()  # free at once, not after the lease
    promote.release()
    assert node.systemctl == [] and node.shares == []  # still enabled: a boot resumes it
    evidence = saved["guard"]["canary"]["total"]["requests"]

    resumed = guard_of(tmp_path, node, clock)
    resumed.look()
    assert resumed.state["looks"] == 3
    assert resumed.state["guard"]["canary"]["total"]["requests"] > evidence > 0
    assert guard_state.read_whole(record_path(MODEL, str(tmp_path)))["phase"] == "analysing"  # type: ignore[index]


def test_a_guard_stopped_while_it_waits_for_the_lock_ends_without_it(tmp_path: Path) -> None:
    node, clock, deploy = started_by_a_locked_deploy(tmp_path)

    def stopped(seconds: float) -> None:
        guard.stop()  # SIGTERM in its first wait
        clock.sleep(seconds)

    guard = DetachedGuard(MODEL, str(tmp_path), node, clock, stopped)  # type: ignore[arg-type]
    guard.run()
    assert guard.state["looks"] == 0 and node.shares == [] and node.systemctl == []
    with pytest.raises(LockRefused, match="deploy embedder@2"):  # the deploy's lock, untouched
        ReleaseLock(node, "head-0", MODEL, "promote", lambda _: None).take()
    deploy.release()


def test_a_guard_whose_release_ended_disables_its_unit_even_after_a_kill_in_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unit stayed enabled after its verdict: every boot of the node started a guard that found its
    state done. Disabled once the release ends; killed between its last save and the disable, the guard
    disables it when it starts again."""
    node, clock, deploy = started_by_a_locked_deploy(tmp_path)
    deploy.release()
    guard = guard_of(tmp_path, node, clock)
    monkeypatch.setattr(DetachedGuard, "disable", lambda self: (_ for _ in ()).throw(Killed()))
    with pytest.raises(Killed):
        guard.run()
    assert guard.state["phase"] == DONE and node.systemctl == []
    monkeypatch.undo()
    guard_of(tmp_path, node, clock).run()  # started again at boot: its state says done
    assert node.systemctl == [("disable", "gpuplat-serve-guard@embedder.service")]


def test_an_inconclusive_analysis_ends_the_guard_at_once_and_leaves_the_decision(tmp_path: Path) -> None:
    """Too few canary requests in an interval (min_requests 10000): the analysis says inconclusive after its
    first two intervals, and the guard ends there (lock free, unit disabled, the canary's share kept), not at
    its duration, 400 s later, with "no verdict"."""
    rules = Canary(min_requests=10_000, interval_s=10, intervals=4)
    node = Node(share=20, canary_fails=False)
    clock = Clock(node)
    started(tmp_path, node, clock, rules, duration_s=400)
    guard = guard_of(tmp_path, node, clock)
    guard.run()
    verdict = guard.state["verdict"]
    assert (
        verdict["action"] == "inconclusive" and "could not be judged in 2 of 2 intervals" in verdict["reason"]
    )
    assert guard.state["phase"] == DONE and guard.state["remains"] == guard_service._decide(MODEL)
    assert clock.now - 1_000_000 == 20 and guard.state["looks"] == 4
    assert node.shares == [] and node.systemctl == [("disable", "gpuplat-serve-guard@embedder.service")]
    record = guard_state.read_whole(record_path(MODEL, str(tmp_path)))
    assert record is not None and record["phase"] == "inconclusive" and record["canary_percent"] == 20
    ReleaseLock(node, "head-0", MODEL, "promote", lambda _: None).take()


def test_a_guard_that_lost_its_lock_stops_before_its_next_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard's process stopped past its lease (SIGSTOP, a node frozen) between two looks: by its own
    clock no renewal was confirmed within the lease, so another command may hold the lock now. It stops
    before looking again: no share set, no verdict acted on."""
    node = Node(share=20, canary_fails=False)
    clock = Clock(node)
    started(tmp_path, node, clock, Canary(min_requests=10_000, interval_s=30, intervals=2))
    frozen = [0.0]
    monkeypatch.setattr(
        lock, "time", SimpleNamespace(monotonic=lambda: time.monotonic() + frozen[0], strftime=time.strftime)
    )
    guard = guard_of(tmp_path, node, clock)
    real_look = guard.look

    def look() -> None:
        real_look()
        frozen[0] = lock.LEASE_S  # the process stood still for a lease after its first look

    guard.look = look  # type: ignore[method-assign]
    with pytest.raises(
        GpuPlatError, match="the detached guard of 'embedder' lost its release lock: it stops"
    ):
        guard.run()
    assert guard.state["looks"] == 1 and node.shares == [] and guard.state["phase"] == guard_service.RUNNING
    assert guard.state["verdict"]["action"] == "continue"  # looks more would end it inconclusive


def test_a_steps_baseline_is_read_before_its_share_is_set(tmp_path: Path) -> None:
    """Requests go on flowing while the gateway takes the next step's share: those answered at the new
    share after the command (the canary's first ones there) belong to that step's evidence. Read after the
    share was set, the baseline swallowed them."""
    rules = Canary.model_validate(
        {
            "min_requests": 4,
            "interval_s": 10,
            "intervals": 2,
            "steps": [{"percent": 5}, {"percent": 20, "manual_gate": True}, {"percent": 100}],
        }
    )

    class Busy(Node):
        """Fifty requests answered at each new share while the share command returns."""

        before_share: tuple[int, int] = (0, 0)

        def exec(self, node: str, *command: str, timeout: float = 120) -> str:
            answer = super().exec(node, *command, timeout=timeout)
            if command[0] == "python3" and command[1:3] and command[2] == "share":
                self.before_share = (self.counts[CANARY][0], self.counts[CANARY][1])
                self.traffic(50)
            return answer

    node = Busy(share=5, canary_fails=False)
    node.latency = True
    clock = Clock(node)
    started(tmp_path, node, clock, rules)
    guard = guard_of(tmp_path, node, clock)
    guard.run()
    assert node.shares == [20] and guard.state["verdict"]["action"] == "gated"
    since_step = node.counts[CANARY][0] - node.before_share[0]
    assert guard.state["guard"]["canary"]["total"]["requests"] == since_step, (
        guard.state["guard"],
        since_step,
    )


def unit_seconds(text: str) -> float:
    """A systemd time span as the unit writes them (systemd.time(5): "30min", "5", "10s")."""
    number, unit = re.fullmatch(r"(\d+)(min|s|)", text).groups()  # type: ignore[union-attr]
    return float(number) * (60 if unit == "min" else 1)


def test_a_guard_failing_at_every_start_is_not_restarted_for_ever() -> None:
    """Restart=on-failure every 5 s under the manager's default start limit (5 starts in 10 s,
    systemd-system.conf(5) of systemd 252) never hit it: a guard failing at each start ran every 5 s for
    ever. The unit's own limit, in [Unit] where systemd 252 reads it, stops such a loop; `deploy --detach`
    flushes the count before it starts a new release's guard; a stop signals the guard alone."""
    sections: dict[str, dict[str, str]] = {}
    for line in UNIT.splitlines():
        if line.startswith("["):
            section = sections.setdefault(line.strip("[]"), {})
        elif "=" in line:
            key, _, value = line.partition("=")
            section[key] = value
    unit, service = sections["Unit"], sections["Service"]
    assert "StartLimitBurst" not in service and "StartLimitIntervalSec" not in service
    burst, interval = int(unit["StartLimitBurst"]), unit_seconds(unit["StartLimitIntervalSec"])
    every = unit_seconds(service["RestartSec"])
    assert service["Restart"] == "on-failure" and interval / every > burst  # a crash loop hits the limit
    # as does one that fails after waiting its whole time for the lock: more than `burst` such starts fit
    assert interval / (guard_service.TAKE_LOCK_S + every) > burst
    assert service["KillMode"] == "mixed"
    release = DetachingRelease()
    detach_guard(release, "embedder", "embedder@2", 20, 60)  # type: ignore[arg-type]
    unit = unit_name("embedder")
    assert release.steps[-3:] == [
        f"systemctl enable {unit}",
        f"{detach.FLUSH_STARTS} {unit}",
        f"systemctl restart {unit}",
    ]


# systemctl as Debian 12's systemd 252 answered on the serving scenario's node (2026-12-06): reset-failed of
# a unit that is not loaded exits 1 ("Unit ... not loaded"), is-failed exits 0 only for a failed unit.
FAKE_SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$SYSTEMCTL_LOG"
case "$1" in
  reset-failed) [ "$#" -eq 2 ] && [ "$2" != "$NOT_LOADED" ] && [ "$2" != "$STUCK" ] && exit 0; exit 1;;
  is-failed) [ "$3" = "$STUCK" ] && exit 0; exit 1;;
esac
exit 1
"""


@pytest.mark.parametrize(
    ("unit_state", "flushed"), [("loaded", True), ("not loaded", True), ("failed, not reset", False)]
)
def test_the_start_count_flushed_is_the_guards_own(tmp_path: Path, unit_state: str, flushed: bool) -> None:
    """`deploy --detach` flushes its guard's start count, and no other unit's: `systemctl reset-failed` with
    no unit resets every failed unit of the node (another model's guard stopped by its own start limit
    among them). A unit not loaded has no count to flush; one that stays failed is an error."""
    (tmp_path / "systemctl").write_text(FAKE_SYSTEMCTL)
    (tmp_path / "systemctl").chmod(0o755)
    unit = unit_name("embedder")
    log = tmp_path / "log"
    done = subprocess.run(
        ["sh", "-c", detach.FLUSH_STARTS, "sh", unit],
        env={
            **os.environ,
            "PATH": f"{tmp_path}:{os.environ['PATH']}",
            "SYSTEMCTL_LOG": str(log),
            "NOT_LOADED": unit if unit_state == "not loaded" else "",
            "STUCK": unit if unit_state.startswith("failed") else "",
        },
        capture_output=True,
        check=False,
    )
    assert (done.returncode == 0) is flushed, done
    assert all(line.split()[-1] == unit for line in log.read_text().splitlines()), log.read_text()


def test_a_guard_stopped_with_a_rollback_begun_finishes_it_first(tmp_path: Path) -> None:
    rules = Canary(min_requests=10, interval_s=30, intervals=2)
    node = Node(share=20, canary_fails=True)
    clock = Clock(node)
    started(tmp_path, node, clock, rules)
    state = guard_state.read_whole(state_path(MODEL, str(tmp_path)))
    assert state is not None
    state.update(phase=guard_service.ROLLING_BACK, verdict={"action": ROLLBACK, "reason": "errors"})
    guard_state.write_whole(state_path(MODEL, str(tmp_path)), state)  # saved before a kill, then a stop
    guard = guard_of(tmp_path, node, clock)
    guard.stop()
    guard.run()
    assert node.shares == [0] and guard.state["phase"] == DONE
    record = guard_state.read_whole(record_path(MODEL, str(tmp_path)))
    assert record is not None and record["phase"] == "rolled back", record  # not "stopped": it ended
    assert "nothing watches" not in record["detail"] and record["guard"]["state"] == DONE


def test_a_stop_ends_the_guards_own_wait_between_looks_at_once(tmp_path: Path) -> None:
    """The guard's own wait (no sleep given) between looks, SIGTERM half a second into a 60 s one: Python
    resumes a sleep whose signal handler returned (PEP 475), so one time.sleep of the whole wait held a stop
    for up to a look (systemd's TimeoutStopSec, 90 s by default, then SIGKILL, the lock left to its lease).
    It ends within a slice of the signal."""
    node = Node(share=20, canary_fails=False)
    clock = Clock(node)
    started(tmp_path, node, clock, Canary(min_requests=10_000, interval_s=30, intervals=4))
    state = guard_state.read_whole(state_path(MODEL, str(tmp_path)))
    assert state is not None
    state["look_s"] = 60.0
    guard_state.write_whole(state_path(MODEL, str(tmp_path)), state)

    def killed(number: int, frame: Any) -> None:
        raise Killed  # the signal's default action, should it come outside the guard's run

    previous = signal.signal(signal.SIGTERM, killed)
    stop = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    began = time.monotonic()
    try:
        guard = DetachedGuard(MODEL, str(tmp_path), node, clock)  # type: ignore[arg-type]
        stop.start()
        guard_service.serve_until_stopped(guard)
    finally:
        stop.cancel()
        signal.signal(signal.SIGTERM, previous)
    assert time.monotonic() - began < 10  # not the look's 60 s
    assert guard.state["looks"] == 0 and node.shares == []
    record = guard_state.read_whole(record_path(MODEL, str(tmp_path)))
    assert record is not None and record["phase"] == "stopped"
    ReleaseLock(node, "head-0", MODEL, "promote", lambda _: None).take()  # free at once


def test_a_guard_whose_disable_fails_still_ends_cleanly(tmp_path: Path) -> None:
    """`systemctl disable` failing after the verdict (the bus busy, a unit file gone) is said, not raised: an
    exit 1 there would have Restart=on-failure start the guard again and again (each start finding its
    release ended and failing the same way) until the start limit."""
    node, clock, deploy = started_by_a_locked_deploy(tmp_path)
    deploy.release()

    class Refusing(Node):
        def exec(self, name: str, *command: str, timeout: float = 120) -> str:
            if command[:2] == ("systemctl", "disable"):
                raise GpuPlatError("systemctl on this node exited 1: Failed to disable unit")
            return super().exec(name, *command, timeout=timeout)

    refusing = Refusing(share=20, canary_fails=True)
    refusing.counts, refusing.shares = node.counts, node.shares
    guard = DetachedGuard(MODEL, str(tmp_path), refusing, clock, clock.sleep)  # type: ignore[arg-type]
    guard.run()
    assert guard.state["phase"] == DONE and refusing.shares == [0]
    DetachedGuard(MODEL, str(tmp_path), refusing, clock, clock.sleep).run()  # type: ignore[arg-type]
    ReleaseLock(node, "head-0", MODEL, "promote", lambda _: None).take()


def test_a_stopped_guard_saves_before_it_lets_the_lock_go(tmp_path: Path) -> None:
    """The stopped guard's last save (the state and the record saying it stopped) is made under the lock: a
    save after it let go could overwrite the record of a promote or rollback that took the lock meanwhile."""
    node = Node(share=20, canary_fails=False)
    clock = Clock(node)
    started(tmp_path, node, clock, Canary(min_requests=10_000, interval_s=30, intervals=4))
    guard = guard_of(tmp_path, node, clock)
    real_save = guard.save
    held_at_save: list[bool] = []

    def save() -> None:
        try:
            ReleaseLock(node, "head-0", MODEL, "promote", lambda _: None).take()
        except LockRefused:
            held_at_save.append(True)
        else:
            held_at_save.append(False)
        real_save()

    def sleep(seconds: float) -> None:
        guard.stop()
        clock.sleep(seconds)

    guard.save, guard.sleep = save, sleep  # type: ignore[method-assign]
    guard.run()
    assert held_at_save and all(held_at_save), held_at_save
