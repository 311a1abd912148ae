"""The pure parts of `gpuplat serve` (infra/serving/release.py): a version's file for a replica, the guard's
loop and its exit codes, the stacks it refuses. End to end against the serving scenario:
tests/serving/test_serve.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.errors import ExitCode, GpuPlatError, SpecError
from infra.platform.resolve import load_platform
from infra.serving.analysis import CONTINUE, INCONCLUSIVE, PROMOTE_READY, ROLLBACK, Verdict
from infra.serving.carry import GATED, PROMOTED
from infra.serving.counts import Counts, Histogram, SinceStart
from infra.serving.lock import LOCK_DIR, RENEW, TAKE_OVER, LockLost, LockRefused, ReleaseLock, here
from infra.serving.metrics_text import GatewayFigures
from infra.serving.registry.mlflow import ModelVersion, to_wire_source
from infra.serving.release import (
    STATE_DIR,
    Release,
    ReplicaServing,
    ServeRefused,
    ServingLayout,
    serving_layout,
    version_environment,
)
from infra.spec.models import Canary
from tests.unit.test_hostile_input import refused, run_cli


def version(location: str) -> ModelVersion:
    return ModelVersion("embedder", 2, to_wire_source(location), "READY")


def test_a_cpu_reference_replica_reads_the_versions_archive_and_labels_its_answers() -> None:
    text = version_environment(version("/shared/models/embedder/2/"), "cpu-reference")
    assert text.splitlines()[1] == (
        'GPUPLAT_MODEL_ARGS="--model-zip /shared/models/embedder/2/model.zip --model-version embedder@2"'
    )


def test_a_vllm_replica_serves_the_versions_folder() -> None:
    assert version_environment(version("/shared/models/embedder/2"), "vllm").splitlines()[1] == (
        "GPUPLAT_MODEL_PATH=/shared/models/embedder/2"
    )


@pytest.mark.parametrize(
    ("location", "why"),
    [
        ("s3://models/embedder/2", "read a version from the shared filesystem"),
        ("/shared/models/my model", "holds a space, quote or $"),
        ('/shared/models/x"; rm -rf /', "holds a space, quote or $"),
    ],
)
def test_a_location_a_replica_cannot_read_safely_is_refused(location: str, why: str) -> None:
    with pytest.raises(ServeRefused, match="embedder@2") as refused:
        version_environment(version(location), "cpu-reference")
    assert why in refused.value.message and refused.value.exit_code == ExitCode.POLICY_VIOLATION


BOUNDS = (0.01, 0.025, 0.05, float("inf"))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def guarded(readings: list[tuple[Counts, Counts]], rules: Canary) -> tuple[Release, list[str]]:
    """A Release whose gateway answers `readings` one look after another (the last one again after them)."""
    release = object.__new__(Release)
    release.rules = rules
    release.canary_start = None
    done: list[str] = []
    looks = iter(readings)
    last = readings[-1]

    def read(latency: bool = True) -> tuple[Counts, Counts]:
        nonlocal last
        last = next(looks, last)
        return last

    release.readings = read  # type: ignore[method-assign]
    # A share, and no server counted up: the guard weighs no load (infra/serving/load.py).
    release.figures = lambda: GatewayFigures(20, {}, {}, {})  # type: ignore[method-assign]
    release.aliased = lambda model, alias: version("/shared/models/x")  # type: ignore[method-assign]
    release.rollback = lambda model, reason="": done.append(reason)  # type: ignore[method-assign,assignment,func-returns-value]
    release.say = lambda line: None
    records: list[tuple[str, int | None]] = []
    release.__dict__["records"] = records
    release.record = lambda model, phase, detail, percent=None: records.append((phase, percent))  # type: ignore[method-assign]
    return release, done


def test_the_guard_rolls_back_a_failing_canary_at_once_and_says_why() -> None:
    clock = Clock()
    release, rolled = guarded(
        [(Counts(900, 3), Counts(300, 250)), (Counts(1060, 3), Counts(340, 290))], Canary()
    )
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == ROLLBACK and rolled == [verdict.reason]
    assert verdict.reason.startswith("canary error rate 100.0% (40/40) since it started")
    assert clock.now == 1005.0


def test_after_deploy_the_guard_counts_from_the_counters_read_before_the_share_was_set() -> None:
    """`deploy --guard-s` reads the counters before it gives the canary its share: the canary's first
    answers count, though they came before the guard's first look."""
    clock = Clock()
    release, rolled = guarded([(Counts(1060, 3), Counts(340, 288))], Canary())
    release.canary_start = (clock.now, Counts(900, 3), Counts(300, 248))
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == ROLLBACK and "(40/40)" in verdict.reason and rolled == [verdict.reason]
    assert clock.now == 1005.0
    # A guard of its own counts from its first look: the same reading is then its baseline, no evidence.
    alone, _ = guarded([(Counts(1060, 3), Counts(340, 288))], Canary())
    assert alone.guard("embedder", duration_s=10, sleep=clock.sleep, clock=clock).action == CONTINUE


def test_a_guard_cut_short_ends_without_a_verdict_and_rolls_nothing_back() -> None:
    clock = Clock()
    release, rolled = guarded([(Counts(900, 3), Counts(300, 1))], Canary())
    verdict = release.guard("embedder", duration_s=30, sleep=clock.sleep, clock=clock)
    assert verdict.action == CONTINUE and rolled == []
    # By default the guard lasts the whole analysis: no traffic at all ends it inconclusive.
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == INCONCLUSIVE and "could not be judged" in verdict.reason and rolled == []


def test_by_default_the_guard_lasts_the_whole_analysis() -> None:
    """5 intervals of 100 s: a healthy canary is promote-ready at 500 s, not cut short before."""
    clock = Clock()
    rules = Canary(interval_s=100)
    healthy = [
        (
            Counts(80 * look, 0, Histogram(BOUNDS, (20 * look, 40 * look, 20 * look, 0), 1.6 * look)),
            Counts(20 * look, 0, Histogram(BOUNDS, (5 * look, 10 * look, 5 * look, 0), 0.4 * look)),
        )
        for look in range(102)
    ]
    release, rolled = guarded(healthy, rules)
    verdict = release.guard("embedder", sleep=clock.sleep, clock=clock)
    assert verdict.action == PROMOTE_READY and clock.now == 1000.0 + 5 * 100 and rolled == []


def test_deploy_refuses_a_share_the_expected_traffic_cannot_judge() -> None:
    release = object.__new__(Release)
    release.rules = Canary(expected_requests_per_s=2)
    candidate = version("/shared/models/x")

    class Registry:
        def resolve(self, reference: str) -> ModelVersion:
            return candidate

    release.registry = Registry()  # type: ignore[assignment]
    release.aliased = lambda model, alias: None  # type: ignore[method-assign]
    with pytest.raises(ServeRefused, match=r"a canary at 5 % of 2 requests/s answers about 6\.0 requests"):
        release.deploy("embedder@2", 5)


class Verdicts:
    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict

    def guard(self, model: str, duration_s: float | None, past_gate: bool = False) -> Verdict:
        return self.verdict


@pytest.mark.parametrize(
    ("action", "code"),
    [
        (PROMOTE_READY, 0),
        (PROMOTED, 0),
        (GATED, 0),
        (ROLLBACK, 1),
        (INCONCLUSIVE, 5),
        (CONTINUE, 5),
        ("gone", 5),
    ],
)
def test_serve_guard_exits_0_only_on_a_passed_analysis(action: str, code: int) -> None:
    """promote-ready, promoted (a stepped release's last step), held at a manual gate: each a passed
    analysis; anything else is not 0."""
    import typer

    from infra.cli.commands.serve import _guard

    if code == 0:
        _guard(Verdicts(Verdict(action, "why")), "embedder", None)  # type: ignore[arg-type]
        return
    with pytest.raises(typer.Exit) as ended:
        _guard(Verdicts(Verdict(action, "why")), "embedder", None)  # type: ignore[arg-type]
    assert ended.value.exit_code == code


def test_serve_refuses_a_stack_it_cannot_drive(write_stack: Callable[..., Path]) -> None:
    def no_serving(platform: dict[str, Any]) -> None:
        del platform["serving"]

    with pytest.raises(SpecError, match="serves no model"):
        serving_layout(load_platform(write_stack("local", no_serving)))
    for kubernetes in ("aws-k8s", "onprem-k8s"):
        with pytest.raises(SpecError, match=r"runs on Kubernetes \(kueue\): its model servers"):
            serving_layout(load_platform(write_stack(kubernetes, lambda _: None)))


def test_the_local_stack_serves_from_its_infer_node_behind_its_head_node(
    shipped_platforms: dict[str, Any],
) -> None:
    layout = serving_layout(shipped_platforms["local"])
    assert (layout.gateways, layout.servers) == (("head-0",), ("infer-0",))
    assert layout.addresses == {"infer-0": "gpuplat-local-infer-0", "head-0": "gpuplat-local-head-0"}


def test_serve_refuses_a_model_name_before_reaching_the_registry(write_stack: Callable[..., Path]) -> None:
    def with_registry(platform: dict[str, Any]) -> None:
        platform["serving"]["registry"] = {}

    stack = str(write_stack("local", with_registry))
    unreachable = ["--stack-file", stack, "--registry-url", "http://127.0.0.1:9"]
    refused(run_cli("serve", "deploy", "Embedder@1", *unreachable), "model name 'Embedder'")
    refused(run_cli("serve", "deploy", "@champion", *unreachable), "model name ''")
    refused(run_cli("serve", "promote", "a_b", *unreachable), "model name 'a_b'")
    down = run_cli("serve", "deploy", "embedder@1", *unreachable)
    assert down.code == 4 and "did not answer" in down.err, down.err


def _show(canary_percent: int, stable: tuple[int, int, int], canary: tuple[int, int, int]) -> str:
    """A gateway's `gpuplat_gateway_canary.py show`: each backend's requests, 5xx and servers up."""
    backends = {
        name: {"requests": requests, "errors": errors, "errors_5xx": errors, "servers_up": up}
        for name, (requests, errors, up) in (("inference", stable), ("inference_canary", canary))
    }
    return json.dumps({"canary_percent": canary_percent, "backends": backends})


def test_the_guard_counts_every_gateway_each_through_its_own_reload() -> None:
    """Two gateways: gw-0's canary answered 30 more requests (3 errors) between two looks, gw-1 was reloaded
    (its counters from zero: 20 requests, 2 errors since) and did not answer one look in between. The
    canary's counts are both gateways', 50 requests and 5 errors, not the first gateway's alone."""
    answers = {
        "gw-0": iter([_show(20, (400, 0, 2), (100, 0, 1))] + [_show(20, (520, 0, 2), (130, 3, 1))] * 3),
        "gw-1": iter([_show(20, (2000, 4, 2), (500, 10, 1)), None] + [_show(20, (80, 0, 2), (20, 2, 0))] * 2),
    }

    class Nodes:
        def exec(self, node: str, *command: str, timeout: float = 120) -> str:
            assert command[-1] == "show"
            answer = next(answers[node])
            if answer is None:
                raise GpuPlatError(f"{node} did not answer")
            return answer

    said: list[str] = []
    release = object.__new__(Release)
    release.nodes = Nodes()
    release.say = said.append
    release.layout = ServingLayout(("gw-0", "gw-1"), (), {}, "cpu-reference", 1.0)
    _, canary = release.readings(latency=False)
    since = SinceStart(canary)
    _, missing_one = release.readings(latency=False)
    assert since.add(missing_one) == Counts(30, 3)
    assert said == ["left out of this look: gw-1: gw-1 did not answer"]
    _, canary = release.readings(latency=False)
    assert since.add(canary) == Counts(50, 5)
    figures = release.figures()  # the gateways' sums; servers up on every gateway: gw-1 counts none
    assert (figures.requests["inference_canary"], figures.servers_up["inference_canary"]) == (150, 0)


class RecordingNodes:
    """The nodes of a promotion: gateways that answer `show` with the share set so far, model-server nodes
    with `replicas` stable replicas; every command recorded, in order, as (node, command words)."""

    def __init__(self, replicas: int, share: int) -> None:
        self.replicas, self.share = replicas, share
        self.done: list[tuple[str, tuple[str, ...]]] = []

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        self.done.append((node, command))
        if command[:1] == ("ls",):
            return " ".join(f"replica-{i}.env" for i in range(self.replicas))
        if command[-2:-1] == ("share",):
            self.share = int(command[-1])
        if command[-1:] in (("show",), ("share",)) or command[-2:-1] == ("share",):
            return _show(self.share, (0, 0, self.replicas), (0, 0, 1))
        return ""

    def shares(self) -> list[int]:
        return [int(c[-1]) for n, c in self.done if c[-2:-1] == ("share",) and n == "gw-0"]


def promoted(
    replicas: int, share: int, nodes: RecordingNodes | None = None, lock: ReleaseLock | None = None
) -> RecordingNodes:
    nodes = nodes or RecordingNodes(replicas, share)
    release = object.__new__(Release)
    release.nodes = nodes
    if lock is not None:
        release.__dict__["_held"] = {"embedder": lock}
    release.rules = Canary()
    release.say = lambda line: None
    release.layout = ServingLayout(
        ("gw-0", "gw-1"), ("infer-0",), {"infer-0": "c-infer-0"}, "cpu-reference", 1.0
    )
    release.aliased = lambda model, alias: version("/shared/models/x")  # type: ignore[method-assign]
    release._wait_healthy = lambda node, port: None  # type: ignore[method-assign]

    class Registry:
        def set_alias(self, *arguments: object) -> None: ...

        def delete_alias(self, *arguments: object) -> None: ...

    release.registry = Registry()  # type: ignore[assignment]
    release.promote("embedder")
    return nodes


def _at(nodes: RecordingNodes, node: str, *words: str) -> list[int]:
    """Where in the recorded commands `node` ran a command holding each of `words`."""
    return [i for i, (n, c) in enumerate(nodes.done) if n == node and all(w in " ".join(c) for w in words)]


def test_promote_keeps_the_canarys_share_while_stable_replicas_roll_and_drains_it_before_it_stops() -> None:
    """Issue 48, findings 3 and 4: never every request to the one canary slot while R stable replicas
    restart; each stable replica drained on every gateway before its restart; then share 0 and the canary
    drained on every gateway before `systemctl stop`."""
    nodes = promoted(replicas=2, share=20)
    assert nodes.shares() == [0]  # the share kept at 20 until the canary goes
    for replica, port in ((0, 8000), (1, 8001)):
        restart = _at(nodes, "infer-0", "systemctl restart", f"@{replica}.service")[0]
        for gateway in ("gw-0", "gw-1"):
            drained = _at(nodes, gateway, "--backend inference drain", f"c-infer-0:{port}")
            assert drained and drained[0] < restart
    stop = _at(nodes, "infer-0", "systemctl stop", "@canary.service")[0]
    share_zero = _at(nodes, "gw-1", "share 0")[0]
    for gateway in ("gw-0", "gw-1"):
        drained = _at(nodes, gateway, "--backend inference_canary drain", "c-infer-0:8100")
        assert drained and share_zero < drained[0] < stop


class LosingNodes(RecordingNodes):
    """RecordingNodes on which the promote's lock is found lost (another command took it over) once the
    first stable replica restarted."""

    def __init__(self, lock: ReleaseLock) -> None:
        super().__init__(replicas=2, share=20)
        self.lock = lock

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        if command[:2] == ("systemctl", "restart"):
            self.lock.lost.set()
        return super().exec(node, *command, timeout=timeout)


def test_a_promote_that_lost_its_lock_stops_before_its_next_change() -> None:
    """A promote that went on after its lock was taken over interleaved with the new holder's release,
    replica by replica ("carry on and only report the loss"): it now stops before the next step, leaving
    the second replica, the canary and the registry to the lock's holder."""
    lock = ReleaseLock(RecordingNodes(0, 0), "gw-0", "embedder", "promote", lambda line: None)
    nodes = LosingNodes(lock)
    with pytest.raises(LockLost, match=r"stopped before (drain|ready) of c-infer-0:800[01]"):
        promoted(2, 20, nodes, lock)
    assert len(_at(nodes, "infer-0", "systemctl restart")) == 1
    assert not _at(nodes, "infer-0", "systemctl stop")
    assert not _at(nodes, "gw-0", "share")


def test_promote_gives_the_canary_every_request_only_while_the_last_stable_server_restarts() -> None:
    nodes = promoted(replicas=1, share=20)
    assert nodes.shares() == [100, 20, 0]
    restart = _at(nodes, "infer-0", "systemctl restart", "@0.service")[0]
    assert _at(nodes, "gw-1", "share 100")[0] < restart < _at(nodes, "gw-1", "share 20")[0]


class CutShortNodes(RecordingNodes):
    """A promote of embedder@3 cut short on a node of 3 replicas: replica 0 restarted on it, replica 1
    drained but not yet restarted (still on the champion, embedder@2), replica 2 not reached; the canary
    at 100 % (killed while the last stable server restarted). Version files kept as written."""

    def __init__(self) -> None:
        super().__init__(replicas=3, share=100)
        self.files = {
            f"version-{i}.env": version_environment(
                ModelVersion("embedder", v, to_wire_source("/m"), "READY"), "cpu-reference"
            )
            for i, v in ((0, 3), (1, 2), (2, 2), ("canary", 3))
        }

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        if command[:2] == ("sh", "-c") and command[-1].endswith(".env"):
            name = command[-1].rsplit("/", 1)[-1]
            if command[2].startswith("cat"):
                self.done.append((node, command))
                return self.files.get(name, "")
            self.files[name] = command[-2]
        if command[:2] == ("rm", "-f"):
            self.files.pop(command[-1].rsplit("/", 1)[-1], None)
        answer = super().exec(node, *command)
        if command[-1:] == ("show",):  # replica 1 is drained: the gateways count 2 stable servers up
            return _show(self.share, (0, 0, 2), (0, 0, 1))
        return answer


def test_a_rollback_after_a_promote_cut_short_puts_every_stable_replica_back_on_the_champion() -> None:
    """Issue 48 finding 5: a failed promote left some replicas on the new version; `rollback` stopped
    only the canary. Now the canary's share goes to 0 first, each replica not on the champion is drained,
    restarted on it and taken out of drain (the others untouched, a drained one taken out of drain), then
    the canary drained and stopped."""
    nodes = CutShortNodes()
    release = object.__new__(Release)
    release.nodes = nodes
    release.rules = Canary()
    release.say = lambda line: None
    release.layout = ServingLayout(("gw-0",), ("infer-0",), {"infer-0": "c-infer-0"}, "cpu-reference", 1.0)
    release._wait_healthy = lambda node, port: None  # type: ignore[method-assign]
    aliases = {
        "challenger": ModelVersion("embedder", 3, to_wire_source("/m"), "READY"),
        "champion": ModelVersion("embedder", 2, to_wire_source("/m"), "READY"),
    }
    release.aliased = lambda model, alias: aliases.get(alias)  # type: ignore[method-assign]

    class Registry:
        def delete_alias(self, model: str, alias: str) -> None:
            aliases.pop(alias)

    release.registry = Registry()  # type: ignore[assignment]
    assert release.rollback("embedder") == aliases["champion"]
    champion = version_environment(aliases["champion"], "cpu-reference")
    assert [nodes.files[f"version-{i}.env"] for i in range(3)] == [champion] * 3
    assert "version-canary.env" not in nodes.files
    restarted = [i for i in range(3) if _at(nodes, "infer-0", "systemctl restart", f"@{i}.service")]
    assert restarted == [0]
    assert nodes.shares()[0] == 0  # the bad version's share first
    restart = _at(nodes, "infer-0", "systemctl restart", "@0.service")[0]
    assert _at(nodes, "gw-0", "--backend inference drain", "c-infer-0:8000")[0] < restart
    assert _at(nodes, "gw-0", "--backend inference ready", "c-infer-0:8000")[0] > restart
    assert _at(nodes, "gw-0", "--backend inference ready", "c-infer-0:8001")  # left drained by the promote
    assert _at(nodes, "infer-0", "systemctl stop", "@canary.service")


def test_status_says_what_each_replica_serves_as_its_own_server_says() -> None:
    """Issue 48 finding 5: aliases say what should serve; each replica's /metrics what does. Replica 0
    serves embedder@2, replica 1 the stack's own model, the canary slot does not answer."""
    answer = (
        "# port 8000\n"
        'gpuplat_inference_model_version_info{version="embedder@2"} 1.0\n'
        "# port 8001\n"
        'gpuplat_inference_model_version_info{version=""} 1.0\n'
    )

    class Nodes:
        def exec(self, node: str, *command: str, timeout: float = 120) -> str:
            if command[0] == "ls":
                return "replica-0.env replica-1.env"
            if command[:2] == ("sh", "-c"):  # the canary's version file, where a loan would be recorded
                return ""
            assert command[3:] == ("127.0.0.1", "8000", "8001", "8100")
            return answer

    release = object.__new__(Release)
    release.nodes = Nodes()
    release.layout = ServingLayout(("gw-0",), ("infer-0",), {"infer-0": "c-infer-0"}, "cpu-reference", 1.0)
    assert release.replicas_serving() == [
        ReplicaServing("infer-0", "0", 8000, True, "embedder@2"),
        ReplicaServing("infer-0", "1", 8001, True, ""),
        ReplicaServing("infer-0", "canary", 8100, False, None),
    ]


class LockNode:
    """A gateway node whose lock folder is a local one: the lock script runs in a real `sh`."""

    def __init__(self, folder: Path) -> None:
        self.folder = str(folder)

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        words = [w.replace(LOCK_DIR, self.folder) for w in command]
        return subprocess.run(words, capture_output=True, text=True, check=True).stdout


def locking(folder: Path) -> Release:
    release = object.__new__(Release)
    release.nodes = LockNode(folder)
    release.say = lambda line: None
    release.layout = ServingLayout(("gw-0",), (), {}, "cpu-reference", 1.0)
    return release


def test_one_release_at_a_time_per_model_a_second_promote_meets_the_lock(tmp_path: Path) -> None:
    """Issue 48 finding 5: a CI guard and an operator's promote raced. The second is refused, saying who
    holds the lock; the holder's own nested steps (the guard's rollback) pass; another model is free;
    the lock goes with its holder."""
    guard, operator = locking(tmp_path), locking(tmp_path)
    with guard.exclusive("embedder", "guard"):
        with guard.exclusive("embedder", "rollback"):
            pass
        refusal = r"a release of 'embedder' is in progress \(guard by pid \d+ on "
        with pytest.raises(LockRefused, match=refusal), operator.exclusive("embedder", "promote"):
            pass
        with operator.exclusive("other-model", "promote"):
            pass
        assert (tmp_path / "embedder.lock").is_dir()
    assert not (tmp_path / "embedder.lock").exists()
    with operator.exclusive("embedder", "promote"):
        pass


def test_a_lock_left_by_a_process_of_this_host_that_is_gone_is_taken_over(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / "embedder.lock").mkdir()
    (tmp_path / "embedder.lock" / "owner").write_text(
        f"promote by pid {gone.pid} on {here()} since 07:00:00 UTC"
    )
    with locking(tmp_path).exclusive("embedder", "promote"):
        assert "promote by pid" in (tmp_path / "embedder.lock" / "owner").read_text()
    (tmp_path / "embedder.lock").mkdir()
    # A process of another host, though no process of this host has its pid: not known to be gone.
    (tmp_path / "embedder.lock" / "owner").write_text(
        f"promote by pid {gone.pid} on another-host since 07:00:00 UTC"
    )
    with (
        pytest.raises(LockRefused, match="another-host"),
        locking(tmp_path).exclusive("embedder", "promote"),
    ):
        pass


def test_a_lock_whose_lease_ended_is_taken_over_even_from_another_host(tmp_path: Path) -> None:
    """A CI runner killed on another host left its lock: once its lease ended (by the node's clock) the
    next release takes it over, saying so; before that it is refused, saying how long is left."""
    lock = tmp_path / "embedder.lock"
    lock.mkdir()
    (lock / "owner").write_text("guard by pid 4242 on ci-runner-7 since 07:00:00 UTC")
    (lock / "expires").write_text(f"{int(time.time()) - 5}\n")
    said: list[str] = []
    release = locking(tmp_path)
    release.say = said.append
    with release.exclusive("embedder", "promote"):
        assert (lock / "owner").read_text().startswith("promote by pid")
    assert any("lease ended" in line and "ci-runner-7" in line for line in said), said
    assert not lock.exists()
    lock.mkdir()
    (lock / "owner").write_text("guard by pid 4242 on ci-runner-7 since 07:00:00 UTC")
    (lock / "expires").write_text(f"{int(time.time()) + 30}\n")
    with (
        pytest.raises(LockRefused, match=r"ci-runner-7.*taken over once its lease ends"),
        locking(tmp_path).exclusive("embedder", "promote"),
    ):
        pass


def test_a_holder_that_renews_its_lease_keeps_the_lock_past_it(tmp_path: Path) -> None:
    """Never taken while its holder renews it; the mutex directory of the lock scripts before flock(1), left
    by one killed inside it, does not stop the next."""
    holder, other = locking(tmp_path), locking(tmp_path)
    holder.lease_s = other.lease_s = 1
    with holder.exclusive("embedder", "guard"):
        stale = tmp_path / "embedder.lock" / "taking-over"
        stale.mkdir()
        os.utime(stale, (time.time() - 60, time.time() - 60))
        time.sleep(2.5)
        assert int((tmp_path / "embedder.lock" / "expires").read_text()) >= int(time.time())  # renewed
        with pytest.raises(LockRefused, match=r"\(guard by pid"), other.exclusive("embedder", "promote"):
            pass
    assert not (tmp_path / "embedder.lock").exists()


def test_a_holder_that_lost_its_lock_leaves_the_new_holders_lock_alone(tmp_path: Path) -> None:
    """A holder stopped past its lease (SIGSTOP, a node out of reach) whose lock was taken over: its next
    renewal finds the lock another's, its guard stops, and its end removes nothing."""
    said: list[str] = []
    holder = locking(tmp_path)
    holder.lease_s = 1
    holder.say = said.append
    holder.rules = Canary()
    holder.canary_start = (time.monotonic(), Counts(0, 0), Counts(0, 0))
    with holder.exclusive("embedder", "guard"):
        (tmp_path / "embedder.lock" / "owner").write_text(
            "promote by pid 7 on ci-runner-8 since 08:00:00 UTC"
        )
        time.sleep(1)
        assert holder.lock_lost("embedder")
        with pytest.raises(GpuPlatError, match="lost its release lock") as stopped:
            holder.analyse("embedder", duration_s=10, sleep=lambda s: None)
        assert stopped.value.exit_code == ExitCode.NO_VERDICT
    assert (tmp_path / "embedder.lock" / "owner").read_text().startswith("promote by pid 7 on ci-runner-8")
    assert any("no longer this command's (promote by pid 7 on ci-runner-8" in line for line in said), said


class RacingNode(LockNode):
    """A gateway node on which another taker acts between this taker's first and second command."""

    def __init__(self, folder: Path, between: Callable[[], None]) -> None:
        super().__init__(folder)
        self.between, self.calls = between, 0

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        self.calls += 1
        if self.calls == 2:
            self.between()
        return super().exec(node, *command)


def test_of_two_takers_of_a_gone_holders_lock_one_takes_it(tmp_path: Path) -> None:
    """Two promotes both find the lock of a gone process; the first takes it over; the second, which read
    the gone holder a moment before, must not remove the first's lock and take it too."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / "embedder.lock").mkdir()
    (tmp_path / "embedder.lock" / "owner").write_text(
        f"promote by pid {gone.pid} on {here()} since 07:00:00 UTC"
    )
    first = locking(tmp_path).exclusive("embedder", "first promote")
    second = locking(tmp_path)
    second.nodes = RacingNode(tmp_path, first.__enter__)
    with pytest.raises(LockRefused, match=r"\(first promote by pid"), second.exclusive("embedder", "second"):
        pass
    assert "first promote" in (tmp_path / "embedder.lock" / "owner").read_text()
    first.__exit__(None, None, None)
    assert not (tmp_path / "embedder.lock").exists()


class StateNode(LockNode):
    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        words = [w.replace(STATE_DIR, self.folder) for w in command]
        return subprocess.run(words, capture_output=True, text=True, check=True).stdout


def test_the_guards_record_is_written_whole_on_the_node_and_read_back_by_status(tmp_path: Path) -> None:
    """The release's record outlives the guard's command: `serve status` reads what the guard last did."""
    release = object.__new__(Release)
    release.nodes = StateNode(tmp_path / "state")
    release.say = lambda line: None
    release.layout = ServingLayout(("gw-0",), (), {}, "cpu-reference", 1.0)
    release.rules = Canary.model_validate({"steps": [{"percent": 10}, {"percent": 100}]})
    assert release.recorded("embedder") is None
    release.record("embedder", "analysing", 'step 1 of 2 (10 %) "quoted"', 10)
    record = release.recorded("embedder")
    assert record is not None
    assert (record["phase"], record["detail"], record["canary_percent"], record["steps"]) == (
        "analysing",
        'step 1 of 2 (10 %) "quoted"',
        10,
        [10, 100],
    )
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["embedder.json"]  # no temporary left


class RecordingStateNodes(RecordingNodes):
    """RecordingNodes whose first gateway keeps the release's record in a real folder (its scripts run in a
    real `sh`)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(replicas=2, share=20)
        self.folder = str(folder)

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        if any(STATE_DIR in word for word in command):
            words = [w.replace(STATE_DIR, self.folder) for w in command]
            return subprocess.run(words, capture_output=True, text=True, check=True).stdout
        return super().exec(node, *command)


def test_promote_and_rollback_write_the_releases_record(tmp_path: Path) -> None:
    """`serve status` after a promote showed the guard's last record, "promote-ready at 20 %": promote and
    rollback now write their own, and status reads them."""
    nodes = RecordingStateNodes(tmp_path)
    release = object.__new__(Release)
    release.nodes = nodes
    release.rules = Canary()
    release.layout = ServingLayout(("gw-0",), (), {}, "cpu-reference", 1.0)
    release.record("embedder", PROMOTE_READY, "5 intervals passed", 20)
    promoted(2, 20, nodes)
    record = release.recorded("embedder")
    assert record is not None and record["phase"] == PROMOTED, record
    assert (record["detail"], record["canary_percent"]) == (
        "embedder@2 is the stable version on every replica",
        None,
    )

    release.say = lambda line: None
    release._wait_healthy = lambda node, port: None  # type: ignore[method-assign]
    aliases = {"challenger": version("/shared/models/x"), "champion": version("/shared/models/y")}
    release.aliased = lambda model, alias: aliases.get(alias)  # type: ignore[method-assign]

    class Registry:
        def delete_alias(self, model: str, alias: str) -> None:
            aliases.pop(alias)

    release.registry = Registry()  # type: ignore[assignment]
    release.rollback("embedder", "asked for")
    record = release.recorded("embedder")
    assert record is not None and (record["phase"], record["detail"]) == (
        "rolled back",
        "embedder@2 taken out: asked for",
    ), record


class FlakyLockNode(LockNode):
    """A gateway node whose lock scripts run in a real `sh`, but whose renewals fail (podman exec timing
    out: the node overloaded or out of reach) on the calls numbered in `failing`."""

    def __init__(self, folder: Path, failing: Callable[[int], bool]) -> None:
        super().__init__(folder)
        self.failing, self.renewals = failing, 0

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        if "renewed" in command[2]:
            self.renewals += 1
            if self.failing(self.renewals):
                raise subprocess.TimeoutExpired(list(command), timeout)
        return super().exec(node, *command, timeout=timeout)


def test_a_holder_whose_renewals_fail_past_its_lease_changes_nothing_more(tmp_path: Path) -> None:
    """A holder cut off from the node (or stopped, SIGSTOP) past its lease may have lost its lock to another
    command without any renewal having said so: it counts the lease on its own clock, and stops before its
    next change (here the canary's share) instead of carrying on beside the lock's new holder. Before, a
    renewal that timed out ended the renewing thread, and the holder went on for ever."""
    holder = locking(tmp_path)
    holder.lease_s = 1
    said: list[str] = []
    holder.say = said.append
    holder.nodes = FlakyLockNode(tmp_path, lambda number: True)
    with holder.exclusive("embedder", "promote"):
        time.sleep(1.5)
        assert holder.lock_lost("embedder")
        with pytest.raises(LockLost, match=r"lost the release lock of 'embedder'.*stopped before setting"):
            holder.set_share(100)
    assert any("not renewed within its 1 s lease" in line for line in said), said


def test_a_renewal_that_failed_once_is_tried_again(tmp_path: Path) -> None:
    """One renewal lost to a slow node does not end the renewals: the next ones keep the lock."""
    holder = locking(tmp_path)
    holder.lease_s = 3
    holder.nodes = FlakyLockNode(tmp_path, lambda number: number == 1)
    with holder.exclusive("embedder", "guard"):
        time.sleep(5)
        assert not holder.lock_lost("embedder")
        holder._fence("a step")  # no refusal


def test_a_renewal_between_the_look_and_the_take_over_keeps_the_lock(tmp_path: Path) -> None:
    """A taker read the lease as ended, and the holder renewed it before the taker's second script: that
    script reads the expiry again inside the mutex and refuses."""
    lock = tmp_path / "embedder.lock"
    lock.mkdir()
    (lock / "owner").write_text("guard by pid 4242 on ci-runner-7 since 07:00:00 UTC")
    (lock / "expires").write_text(f"{int(time.time()) - 5}\n")
    taker = locking(tmp_path)
    taker.nodes = RacingNode(tmp_path, lambda: (lock / "expires").write_text(f"{int(time.time()) + 30}\n"))
    with pytest.raises(LockRefused, match=r"ci-runner-7"), taker.exclusive("embedder", "promote"):
        pass
    assert (lock / "owner").read_text().startswith("guard by pid 4242 on ci-runner-7")


def test_a_holder_whose_lock_was_taken_since_its_last_renewal_removes_nothing_at_its_end(
    tmp_path: Path,
) -> None:
    """The lock changed hands after the holder's last renewal (it had not seen it yet): its end leaves the
    new holder's lock where it is."""
    holder = locking(tmp_path)
    with holder.exclusive("embedder", "guard"):
        (tmp_path / "embedder.lock" / "owner").write_text(
            "promote by pid 7 on ci-runner-8 since 08:00:00 UTC"
        )
    assert (tmp_path / "embedder.lock" / "owner").read_text().startswith("promote by pid 7 on ci-runner-8")


def test_a_lock_whose_expiry_is_empty_is_taken_over(tmp_path: Path) -> None:
    """A renewal killed while it wrote the expiry (before it was renamed into place) left an empty file,
    which no script read as a time: the lock was refused for ever. It now counts as ended."""
    lock = tmp_path / "embedder.lock"
    lock.mkdir()
    (lock / "owner").write_text("guard by pid 4242 on ci-runner-7 since 07:00:00 UTC")
    (lock / "expires").write_text("")
    with locking(tmp_path).exclusive("embedder", "promote"):
        assert (lock / "owner").read_text().startswith("promote by pid")


def test_a_renewal_slow_inside_the_mutex_is_not_overtaken_by_a_take_over(tmp_path: Path) -> None:
    """A renewal whose node is slow (here its `mv` takes 14 s) stays inside the mutex past the 10 s after
    which the mkdir mutex was judged left by a killed script and removed: a take-over of the lease that
    had ended went in beside it, and both commands then held the lock (the renewal answered "renewed", the
    take-over "taken"). A mutex the kernel drops when its script ends cannot be judged stale."""
    lock = tmp_path / "embedder.lock"
    lock.mkdir()
    holder = "guard by pid 4242 on ci-runner-7 since 07:00:00 UTC"
    (lock / "owner").write_text(holder)
    (lock / "expires").write_text(f"{int(time.time()) - 5}\n")
    slow = tmp_path / "slow-bin"
    slow.mkdir()
    (slow / "mv").write_text('#!/bin/sh\nsleep 14; exec /bin/mv "$@"\n')
    (slow / "mv").chmod(0o755)
    scripts = [str(tmp_path), "embedder"]
    environment = {**os.environ, "PATH": f"{slow}:{os.environ['PATH']}"}
    renewal = subprocess.Popen(
        ["sh", "-c", RENEW, "lock", *scripts, holder, "60"],
        env=environment,
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(10.5)
    take_over = ["sh", "-c", TAKE_OVER, "lock", *scripts, "promote by pid 7 on ci-runner-8", "60", holder]
    taken = subprocess.run([*take_over, "expired"], capture_output=True, text=True, check=True).stdout
    renewed = renewal.communicate(timeout=30)[0]
    assert not (renewed.strip() == "renewed" and taken.strip() == "taken"), (renewed, taken)
    assert (lock / "owner").read_text() == holder


def test_no_other_user_of_the_node_reaches_the_lock_folder(tmp_path: Path) -> None:
    """The folder (made 0755 before, under the default umask) and the mutex file (0644): any user of the
    gateway's node could open the mutex and hold its flock for ever, so that no renewal or take-over could
    go on. Only root reaches them now, an older folder's mode included."""
    folder = tmp_path / "locks"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    release = locking(folder)
    with release.exclusive("embedder", "guard"):
        release.__dict__["_held"]["embedder"]._run(RENEW)
        assert folder.stat().st_mode & 0o777 == 0o700
        assert all(p.stat().st_mode & 0o077 == 0 for p in folder.iterdir()), [
            (p.name, oct(p.stat().st_mode)) for p in folder.iterdir()
        ]


def test_a_dead_pid_of_another_pid_namespace_on_the_same_host_name_is_not_gone(tmp_path: Path) -> None:
    """Two containers sharing the host's name but not its PID namespace: the other's live holder has a pid
    this process cannot see. It was taken over at once, as gone, while it renewed; now only its lease's end
    frees it."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock = tmp_path / "embedder.lock"
    lock.mkdir()
    holder = f"guard by pid {dead.pid} on {socket.gethostname()} in pid:[1] since 07:00:00 UTC"
    (lock / "owner").write_text(holder)
    (lock / "expires").write_text(f"{int(time.time()) + 30}\n")
    with pytest.raises(LockRefused, match=r"pid:\[1\]"), locking(tmp_path).exclusive("embedder", "promote"):
        pass
    assert (lock / "owner").read_text() == holder


class HangingLockNode(LockNode):
    """A gateway node whose first renewal hangs until its timeout (podman exec on a loaded node)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.renewals = 0

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        if "renewed" in command[2]:
            self.renewals += 1
            if self.renewals == 1:
                time.sleep(timeout)
                raise subprocess.TimeoutExpired(list(command), timeout)
        return super().exec(node, *command, timeout=timeout)


def test_one_renewal_that_hangs_to_its_timeout_does_not_cost_the_lock(tmp_path: Path) -> None:
    """A renewal that hung for its whole timeout was tried again only a third of the lease later, past the
    margin the holder keeps: one slow `podman exec` stopped a promote half-way. It is tried again at once."""
    holder = locking(tmp_path)
    holder.lease_s = 6
    holder.nodes = HangingLockNode(tmp_path)
    with holder.exclusive("embedder", "promote"):
        time.sleep(6.5)
        assert not holder.lock_lost("embedder")
        assert holder.nodes.renewals >= 2


class SlowLockNode(LockNode):
    """A gateway node on a loaded machine: every renewal answers after `answer_s` (podman exec at load
    15 took longer than a quarter of the 60 s lease), or times out if it is given less."""

    def __init__(self, folder: Path, answer_s: float) -> None:
        super().__init__(folder)
        self.answer_s = answer_s

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        if "renewed" in command[2]:
            time.sleep(min(self.answer_s, timeout))
            if timeout < self.answer_s:
                raise subprocess.TimeoutExpired(list(command), timeout)
        return super().exec(node, *command, timeout=timeout)


def test_renewals_that_answer_slowly_but_within_the_lease_keep_the_lock(tmp_path: Path) -> None:
    """Each renewal answering after 30 % of the lease (18 s of 60): every one was given up after a quarter
    of it (15 s) and the holder lost its lock though the node renewed nothing late; they are now waited for
    while the lease's margin lasts."""
    holder = locking(tmp_path)
    holder.lease_s = 6
    holder.nodes = SlowLockNode(tmp_path, answer_s=1.8)
    with holder.exclusive("embedder", "promote"):
        time.sleep(8)
        assert not holder.lock_lost("embedder")


def test_a_renewal_that_finds_the_lock_anothers_stops_the_holder_at_once(tmp_path: Path) -> None:
    """Not only once its own count of the lease runs out: the first renewal that finds another owner ends
    what the holder may do."""
    holder = locking(tmp_path)
    holder.lease_s = 6
    with holder.exclusive("embedder", "guard"):
        (tmp_path / "embedder.lock" / "owner").write_text(
            "promote by pid 7 on ci-runner-8 since 08:00:00 UTC"
        )
        time.sleep(2.6)  # one renewal (every 2 s), well inside the 5 s the holder counts on its own
        with pytest.raises(LockLost, match="stopped before setting"):
            holder.set_share(0)


def test_a_lock_from_before_leases_ends_its_lease_after_its_owner_was_written(tmp_path: Path) -> None:
    """A lock of the version before leases (an owner, no expiry, never renewed) counts as ending a lease
    after its owner was written: refused before, taken over after."""
    lock = tmp_path / "embedder.lock"
    lock.mkdir()
    (lock / "owner").write_text("guard by pid 4242 on ci-runner-7 since 07:00:00 UTC")
    with pytest.raises(LockRefused, match="ci-runner-7"), locking(tmp_path).exclusive("embedder", "promote"):
        pass
    os.utime(lock / "owner", (time.time() - 120, time.time() - 120))
    with locking(tmp_path).exclusive("embedder", "promote"):
        assert (lock / "owner").read_text().startswith("promote by pid")
