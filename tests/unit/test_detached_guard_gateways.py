"""The detached guard on a stack with several gateways (infra/serving/guard_peers.py, guard_follower.py): the
guard on the first gateway sets the canary's share on every gateway through the followers and counts every
gateway's requests; a step one gateway does not take is set back everywhere and tried again, never left
half-applied; a rollback takes the share to 0 on every gateway it reaches and names the ones it could not.

The followers here are the real Follower, its report handed to the guard's board in this process (the HTTP
between them is tested on its own below, on the loopback); each gateway a Node of test_canary_detached.py.
Not modelled: the network between two gateway nodes (a partition shows here as a follower that stops
reporting), systemd starting the units."""

from __future__ import annotations

import fcntl
import json
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from infra.errors import GpuPlatError
from infra.serving import detach, guard_follower, guard_peers, guard_service, guard_state, lock
from infra.serving.analysis import Guard, RulesRead
from infra.serving.counts import Counts, Reading
from infra.serving.detach import detach_guard
from infra.serving.guard_follower import Follower, follower_unit
from infra.serving.guard_peers import Board, ask_leader, serve_board
from infra.serving.guard_service import DONE, DetachedGuard, initial_state, record_path, unit_name
from infra.serving.release import ServeRefused, ServingLayout
from infra.spec.models import Canary
from tests.unit.test_canary_detached import CANARY, MODEL, STABLE, DetachingRelease, Node

LEADER, FOLLOWER = "gateway-0", "gateway-1"


@pytest.fixture(autouse=True)
def lock_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The release locks the guards take, in the test's own folder (not the machine's /run/gpuplat-serve)."""
    monkeypatch.setattr(lock, "LOCK_DIR", str(tmp_path / "locks"))


class Stack:
    """Two gateways, each with its own clients (10 requests a second each), the guard on the first and a
    follower on the second; every sleep of the guard is time in which both gateways' requests flow and the
    follower reports once."""

    def __init__(self, folder: Path, rules: Canary, share: int, canary_fails_on: tuple[str, ...]) -> None:
        self.gateways = {name: Node(share, name in canary_fails_on) for name in (LEADER, FOLLOWER)}
        for node in self.gateways.values():
            node.latency = True
        self.now = 1_000_000.0
        self.folders = {name: folder / name for name in self.gateways}
        self.follower_answers = True
        baseline = Guard(rules, 0.0, *self.counts())
        state = initial_state(
            model=MODEL,
            candidate=f"{MODEL}@2",
            rules=RulesRead.of(rules),
            guard=baseline,
            started_ago_s=0,
            share=share,
            steps=[(n, s.model_dump()) for n, s in enumerate(rules.steps, 1)],
            steps_in_all=len(rules.steps),
            gateway=LEADER,
            gateway_programs="/usr/local/lib/gpuplat",
            backends={"stable": STABLE, "canary": CANARY},
            servers={"infer-0": {"stable": [8000], "canary": 8100}},
            histogram="h",
            look_s=5,
            duration_s=400,
            addresses={LEADER: "127.0.0.1", FOLLOWER: "127.0.0.1"},
            peer_port=0,
        )
        for name in self.gateways:
            guard_service.init(
                MODEL, json.dumps({**state, "gateway": name}), str(self.folders[name]), self.clock
            )
        leader, follower = self.gateways[LEADER], self.gateways[FOLLOWER]
        self.guard = DetachedGuard(MODEL, str(self.folders[LEADER]), leader, self.clock, self.sleep)  # type: ignore[arg-type]
        self.follower = Follower(MODEL, str(self.folders[FOLLOWER]), follower, self.ask, lambda _: None)  # type: ignore[arg-type]

    def clock(self) -> float:
        return self.now

    def counts(self) -> tuple[Reading, Reading]:
        stable, canary = (
            Reading.of_gateways(
                {
                    name: Counts(node.counts[backend][0], node.counts[backend][1])
                    for name, node in self.gateways.items()
                },
                None,
            )
            for backend in (STABLE, CANARY)
        )
        return stable, canary

    def ask(self, url: str, gateway: str, figures: dict[str, Any]) -> dict[str, Any]:
        if not self.follower_answers or self.guard.board is None:
            raise OSError("connection refused")
        assert url.endswith(f":0/{MODEL}")
        return self.guard.board.report(gateway, figures)

    def sleep(self, seconds: float) -> None:
        assert self.now < 1_000_000 + 2000, "the guard never ends"
        self.now += seconds
        for node in self.gateways.values():
            node.traffic(int(10 * seconds))
        if self.follower_answers:
            self.follower.once()


def stepped(*percents: int) -> Canary:
    return Canary.model_validate(
        {"min_requests": 4, "interval_s": 10, "intervals": 2, "steps": [{"percent": p} for p in percents]}
    )


def test_the_guard_carries_every_gateway_through_the_steps_and_counts_every_gateways_requests(
    tmp_path: Path,
) -> None:
    """The guard set the share on its own gateway only: the second gateway kept 5 % while the first went to
    20 and 50, and its requests were not in the analysis."""
    stack = Stack(tmp_path, stepped(5, 20, 50), 5, ())
    stack.guard.run()
    assert stack.gateways[LEADER].shares == [20, 50] == stack.gateways[FOLLOWER].shares
    assert stack.guard.state["phase"] == DONE and stack.guard.state["verdict"]["action"] == "promote-ready"
    counted = stack.guard.state["guard"]["canary"]["gateways"]
    assert set(counted) == {LEADER, FOLLOWER}, counted
    # The follower heard the release ended, keeps a copy of the evidence naming itself, and stops.
    copy = guard_state.read_whole(guard_service.state_path(MODEL, str(stack.folders[FOLLOWER])))
    assert copy is not None and copy["phase"] == DONE and copy["gateway"] == FOLLOWER
    assert copy["guard"] == stack.guard.state["guard"]
    stack.follower.run()  # ends at once: the guard's answer says the release ended
    assert ("disable", follower_unit(MODEL)) in stack.gateways[FOLLOWER].systemctl


def test_a_canary_failing_on_the_second_gateway_only_is_rolled_back_on_both(tmp_path: Path) -> None:
    stack = Stack(tmp_path, Canary(min_requests=10, interval_s=30, intervals=2), 20, (FOLLOWER,))
    stack.guard.run()
    assert stack.guard.state["verdict"]["action"] == "rollback", stack.guard.state["verdict"]
    assert stack.gateways[LEADER].share == 0 == stack.gateways[FOLLOWER].share
    assert stack.guard.state["gateways_not_set"] == []


def test_a_step_one_gateway_does_not_take_is_set_back_everywhere_then_ends_at_the_last_share_all_had(
    tmp_path: Path,
) -> None:
    """As Argo Rollouts, a traffic router's error neither advances the step nor aborts the release; unlike
    it, no gateway is left at the new share while another has the old one."""
    stack = Stack(tmp_path, stepped(5, 20, 50), 5, ())
    refusing = stack.gateways[FOLLOWER]
    answers = refusing.exec

    def no_share(node: str, *command: str, timeout: float = 120) -> str:
        if command[-2:-1] == ("share",):
            raise GpuPlatError("python3 on this node exited 1: HAProxy's runtime API: connection refused")
        return answers(node, *command, timeout=timeout)

    refusing.exec = no_share  # type: ignore[method-assign]
    stack.guard.run()
    state = stack.guard.state
    assert stack.gateways[LEADER].shares == [20, 5] * guard_service.STEP_TRIES
    assert stack.gateways[LEADER].share == 5 == refusing.share
    assert state["phase"] == DONE and state["gateways_not_set"] == [FOLLOWER]
    assert "could not be set on gateway-1 in 3 tries" in state["verdict"]["reason"]
    record = guard_state.read_whole(record_path(MODEL, str(stack.folders[LEADER])))
    assert record is not None and "the canary keeps 5 %" in record["detail"], record


def test_a_rollback_sets_0_on_every_gateway_it_reaches_and_names_the_one_it_could_not(tmp_path: Path) -> None:
    stack = Stack(tmp_path, Canary(min_requests=10, interval_s=30, intervals=2), 20, (LEADER,))
    ahead = stack.guard.look

    def look() -> None:
        if stack.guard.state["looks"] >= 1:
            stack.follower_answers = False  # the second gateway's node is cut off
        ahead()

    stack.guard.look = look  # type: ignore[method-assign]
    stack.guard.run()
    state = stack.guard.state
    assert state["verdict"]["action"] == "rollback" and stack.gateways[LEADER].share == 0
    assert stack.gateways[FOLLOWER].share == 20 and state["gateways_not_set"] == [FOLLOWER]
    record = guard_state.read_whole(record_path(MODEL, str(stack.folders[LEADER])))
    assert record is not None and record["guard"]["gateways_not_set"] == [FOLLOWER]
    assert "could not be set to 0 on gateway-1" in record["detail"], record


def test_a_follower_whose_guard_does_not_answer_keeps_its_share(tmp_path: Path) -> None:
    stack = Stack(tmp_path, stepped(5, 20), 5, ())
    stack.follower.step()  # the guard has not started: no board
    assert stack.gateways[FOLLOWER].shares == [] and stack.gateways[FOLLOWER].share == 5


SHOWN = {"canary_percent": 5, "backends": {STABLE: {"requests": 3, "errors": 0, "servers_up": 1}}}
"""a gateway's `show`"""


def test_the_guards_board_answers_only_its_followers_at_their_addresses() -> None:
    board = Board(20, {"phase": "running"})
    server = serve_board(board, MODEL, {FOLLOWER: "127.0.0.1", "gateway-2": "127.0.0.2"}, port=0)
    try:
        port = server.server_address[1]
        url = f"http://127.0.0.1:{port}/{MODEL}"
        answer = ask_leader(url, FOLLOWER, SHOWN)
        assert answer == {"share": 20, "state": {"phase": "running"}}
        assert board.fresh(FOLLOWER, 0) == SHOWN
        for gateway, where in (
            ("gateway-2", url),
            ("someone", url),
            (FOLLOWER, url.replace(MODEL, "ranker")),
        ):
            with pytest.raises(OSError, match="not a follower of this guard"):
                ask_leader(where, gateway, {**SHOWN, "canary_percent": 100})
        assert board.fresh("gateway-2", 0) is None and board.fresh("someone", 0) is None
    finally:
        server.shutdown()
        server.server_close()


class TwoGatewayRelease(DetachingRelease):
    def __init__(self, addresses: dict[str, str]) -> None:
        super().__init__()
        self.layout = ServingLayout(
            (LEADER, FOLLOWER), ("infer-0",), {"infer-0": "10.0.0.5", **addresses}, "cpu", 600
        )
        self.inits: dict[str, dict[str, Any]] = {}
        self.nodes = SimpleNamespace(exec=self.on)

    def on(self, node: str, *command: str, timeout: float = 120) -> str:
        if command[2:3] == ("init",):
            self.inits[node] = json.loads(command[4])
        self.steps.append(f"{node}: {' '.join(command[:3])}")
        return "8406\n" if command[:2] == ("python3", "-c") else ""


def test_detach_on_two_gateways_starts_the_guard_on_the_first_and_a_follower_on_the_other() -> None:
    release = TwoGatewayRelease({LEADER: "10.0.0.1", FOLLOWER: "10.0.0.2"})
    detach_guard(release, MODEL, f"{MODEL}@2", 20, 60)  # type: ignore[arg-type]
    assert {node: state["gateway"] for node, state in release.inits.items()} == {
        LEADER: LEADER,
        FOLLOWER: FOLLOWER,
    }
    assert all(state["leader"] == LEADER for state in release.inits.values())
    assert release.inits[LEADER]["addresses"] == {LEADER: "10.0.0.1", FOLLOWER: "10.0.0.2"}
    restarts = [step for step in release.steps if "systemctl restart" in step]
    assert restarts == [
        f"{FOLLOWER}: systemctl restart {follower_unit(MODEL)}",
        f"{LEADER}: systemctl restart {unit_name(MODEL)}",
    ], restarts
    assert "follow %i" in detach.FOLLOWER_UNIT and "follow" not in detach.UNIT


def test_detach_on_two_gateways_without_an_address_is_refused_before_anything_runs() -> None:
    release = TwoGatewayRelease({LEADER: "10.0.0.1"})
    with pytest.raises(ServeRefused, match="no address for gateway-1"):
        detach_guard(release, MODEL, f"{MODEL}@2", 20, 60)  # type: ignore[arg-type]
    assert release.steps == []


def test_a_guard_resumed_after_its_canary_was_taken_out_gives_the_followers_no_share_back(
    tmp_path: Path,
) -> None:
    """Its board published the state's share at start: a guard stopped, its canary taken to 0 everywhere by
    `serve rollback`, then started again (the node's boot) gave the canary 20 % again on every follower
    before its first look found its own gateway at 0."""
    stack = Stack(tmp_path, Canary(min_requests=10, interval_s=30, intervals=2), 20, ())
    for node in stack.gateways.values():
        node.share = 0  # `gpuplat serve rollback` on every gateway while the guard was stopped
    stack.guard.run()
    assert stack.guard.state["verdict"]["action"] == "gone"
    assert stack.gateways[FOLLOWER].share == 0 and stack.gateways[FOLLOWER].shares == []


def test_each_models_guard_on_a_node_answers_its_followers_on_a_port_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every guard bound port 8406: the second model's guard leading on the same node could not bind it and
    failed at every start, its canary unwatched. (The script runs for real, on this machine's python3.)"""
    folder = tmp_path / "state"
    monkeypatch.setattr(detach, "STATE_DIR", str(folder))
    release = SimpleNamespace(nodes=guard_service.LocalNodes())

    def other(model: str, phase: str, gateway: str, port: int) -> None:
        state = {"model": model, "phase": phase, "gateway": gateway, "leader": LEADER, "peer_port": port}
        guard_state.write_whole(
            guard_service.state_path(model, str(folder)), {**state, "addresses": {"a": "b"}}
        )

    assert detach.peer_port(release, LEADER, MODEL) == 8406  # type: ignore[arg-type]
    other("ranker", "running", LEADER, 8406)
    other("reranker", "running", LEADER, 8407)
    other("old", DONE, LEADER, 8408)  # ended: its port is free again
    other("follows", "running", FOLLOWER, 8409)  # a follower on this node binds nothing
    other(MODEL, "running", LEADER, 8410)  # this model's own earlier release: this one replaces it
    assert detach.peer_port(release, LEADER, MODEL) == 8408  # type: ignore[arg-type]


def test_a_guard_whose_port_is_taken_says_which_and_why() -> None:
    holder = serve_board(Board(0, {}), "ranker", {}, port=0)
    try:
        with pytest.raises(GpuPlatError, match=f"port {holder.server_address[1]} of this node"):
            serve_board(Board(0, {}), MODEL, {}, port=holder.server_address[1])
    finally:
        holder.shutdown()
        holder.server_close()


def test_a_guards_board_stops_at_once_after_its_last_report() -> None:
    """A stopped guard (`systemctl stop` included) waited for the board's loop to look again: half a
    second after every report, the default poll of socketserver's serve_forever."""
    server = serve_board(Board(0, {}), MODEL, {FOLLOWER: "127.0.0.1"}, port=0)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{MODEL}"
        with pytest.raises(OSError, match="not a follower"):  # an answered report, its last
            ask_leader(url, "gateway-9", {})
    finally:
        started = time.monotonic()
        server.shutdown()
        stopping_s = time.monotonic() - started
        server.server_close()
    assert stopping_s < 0.3, stopping_s


def test_a_connection_to_the_guards_board_that_sends_nothing_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a read timeout each silent connection (anyone on an AWS stack's training nodes reaches the
    gateways' every port) held one of the board's threads for ever."""
    monkeypatch.setattr(guard_peers, "READ_TIMEOUT_S", 0.5)
    server = serve_board(Board(0, {}), MODEL, {FOLLOWER: "127.0.0.1"}, port=0)  # from a follower's address
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as silent:
            silent.settimeout(5)
            assert silent.recv(1) == b""  # closed by the board, not still waiting after 5 s
    finally:
        server.shutdown()
        server.server_close()


def test_a_follower_writes_its_copy_of_the_state_when_it_changed_not_at_every_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = Stack(tmp_path, stepped(5, 20), 5, ())
    stack.guard.run()
    writes: list[str] = []
    monkeypatch.setattr(guard_follower, "write_whole", lambda path, data: writes.append(path))
    for _ in range(3):
        stack.follower.once()  # the same answer each time: the release's end
    assert writes == []


def test_over_http_a_canary_failing_behind_the_follower_is_rolled_back_on_both_gateways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard and a follower as the units run them (real time, the guard's board on the loopback, the
    follower's reports over HTTP every 50 ms): the canary fails only behind the second gateway, so the guard
    sees the errors only through the reports, rolls back, and the follower takes the share to 0 and ends."""
    monkeypatch.setattr(guard_service, "REPORT_EVERY_S", 0.05)
    monkeypatch.setattr(guard_follower, "REPORT_EVERY_S", 0.05)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rules = Canary(min_requests=10, interval_s=30, intervals=2)
    leader, follower = Node(20, canary_fails=False), Node(20, canary_fails=True)
    stable, canary = (
        Reading.of_gateways({name: Counts(0, 0) for name in (LEADER, FOLLOWER)}, None) for _ in range(2)
    )
    state = initial_state(
        model=MODEL,
        candidate=f"{MODEL}@2",
        rules=RulesRead.of(rules),
        guard=Guard(rules, 0.0, stable, canary),
        started_ago_s=0,
        share=20,
        steps=[],
        steps_in_all=0,
        gateway=LEADER,
        gateway_programs="/usr/local/lib/gpuplat",
        backends={"stable": STABLE, "canary": CANARY},
        servers={},
        histogram="h",
        look_s=0.2,
        duration_s=60,
        addresses={LEADER: "127.0.0.1", FOLLOWER: "127.0.0.1"},
        peer_port=port,
    )
    for name in (LEADER, FOLLOWER):
        guard_service.init(MODEL, json.dumps({**state, "gateway": name}), str(tmp_path / name))
    flowing = threading.Event()
    flowing.set()

    def clients() -> None:
        while flowing.is_set():
            leader.traffic(10)
            follower.traffic(10)
            time.sleep(0.02)

    following = Follower(MODEL, str(tmp_path / FOLLOWER), follower)  # type: ignore[arg-type]
    threads = [
        threading.Thread(target=clients, daemon=True),
        threading.Thread(target=following.run, daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        guard = DetachedGuard(MODEL, str(tmp_path / LEADER), leader)  # type: ignore[arg-type]
        guard.run()
        threads[1].join(timeout=20)
    finally:
        following.stopping = True
        flowing.clear()
    assert guard.state["verdict"]["action"] == "rollback", guard.state["verdict"]
    assert set(guard.state["guard"]["canary"]["gateways"]) == {LEADER, FOLLOWER}
    assert leader.share == 0 == follower.share and guard.state["gateways_not_set"] == []
    assert not threads[1].is_alive() and ("disable", follower_unit(MODEL)) in follower.systemctl
    copy = guard_state.read_whole(guard_service.state_path(MODEL, str(tmp_path / FOLLOWER)))
    assert copy is not None and copy["phase"] == DONE and copy["gateway"] == FOLLOWER


def test_a_follower_report_the_guard_cannot_read_is_refused_and_the_other_gateways_are_still_judged(
    tmp_path: Path,
) -> None:
    """A follower's figures without the canary's backend (a gateway on an older haproxy.cfg, or a compromised
    follower) were taken: every look then failed reading them, and a canary failing every request behind the
    first gateway was never rolled back ("no verdict" once its time was up)."""
    stack = Stack(tmp_path, Canary(min_requests=10, interval_s=30, intervals=2), 20, (LEADER,))
    odd = stack.gateways[FOLLOWER]
    answers = odd.exec

    def without_canary(node: str, *command: str, timeout: float = 120) -> str:
        found = answers(node, *command, timeout=timeout)
        if command[-1:] == ("show",):
            figures = json.loads(found)
            del figures["backends"][CANARY]
            return json.dumps(figures)
        return found

    odd.exec = without_canary  # type: ignore[method-assign]
    stack.guard.run()
    state = stack.guard.state
    assert state["verdict"]["action"] == "rollback", state["verdict"]
    assert stack.gateways[LEADER].share == 0 and state["gateways_not_set"] == [FOLLOWER]
    assert FOLLOWER not in state["guard"]["canary"]["gateways"] or state["guard"]["canary"]["gateways"][
        FOLLOWER
    ] == {"requests": 0, "errors": 0, "latency": None, "itl": None}


@pytest.mark.parametrize(
    "figures",
    [
        {"canary_percent": "x", "backends": {}},
        {
            "canary_percent": 120,
            "backends": {
                STABLE: {"requests": 5, "errors": 0, "servers_up": 1},
                CANARY: {"requests": 1, "errors": 0, "servers_up": 1},
            },
        },
        {"canary_percent": 20, "backends": {STABLE: {"requests": 1, "errors": 0, "servers_up": 1}}},
        {
            "canary_percent": 20,
            "backends": {
                STABLE: {"requests": 5, "errors": 0, "servers_up": 1},
                CANARY: {"requests": -1_000_000, "errors": 0, "servers_up": 1},
            },
        },
        {"canary_percent": 20},
    ],
)
def test_the_board_refuses_figures_it_cannot_count(figures: dict[str, Any]) -> None:
    """A report of `canary_percent: "x"` was taken and raised in the guard's check that a share was applied
    (out of its loop: the guard died at every start); a negative count went into the sums since the start."""
    board = Board(20, {"backends": {"stable": STABLE, "canary": CANARY}})
    with pytest.raises(ValueError, match="figures"):
        board.report(FOLLOWER, figures)
    assert board.fresh(FOLLOWER, 0) is None and not board.applied(FOLLOWER, 20, 0)


def test_the_board_closes_a_connection_from_an_address_that_is_no_followers_before_reading_it() -> None:
    """The board read each request before looking at its sender: anyone reaching the port (an AWS stack's
    training nodes) held a thread per connection for up to 10 s per byte, and a `Content-Length: -1` body
    was read to its end, however long, into the gateway node's memory."""
    server = serve_board(Board(0, {}), MODEL, {FOLLOWER: "127.0.0.2"}, port=0)
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as stranger:
            stranger.settimeout(2)
            stranger.sendall(b"POST /m HTTP/1.1\r\nContent-Length: -1\r\n\r\n" + b"x" * 65536)
            assert stranger.recv(1) == b""  # closed at once, nothing answered
    finally:
        server.shutdown()
        server.server_close()


def test_a_follower_request_with_a_length_that_is_no_length_is_answered_400_at_once() -> None:
    server = serve_board(Board(0, {}), MODEL, {FOLLOWER: "127.0.0.1"}, port=0)
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as follower:
            follower.settimeout(2)
            follower.sendall(f"POST /{MODEL} HTTP/1.1\r\nContent-Length: -1\r\n\r\n{{".encode())
            assert follower.recv(12).startswith(b"HTTP/1.0 400")
    finally:
        server.shutdown()
        server.server_close()


def test_a_rollback_under_way_when_the_guard_is_stopped_still_waits_for_the_followers(tmp_path: Path) -> None:
    """ "A rollback begun is finished even when stopping", but its wait for the followers ended at the stop
    (`systemctl stop`, the node's shutdown): the guard ended the release with the canary's share still on
    every other gateway, and its followers heard nothing more."""
    stack = Stack(tmp_path, Canary(min_requests=10, interval_s=30, intervals=2), 20, (LEADER,))
    ahead = stack.guard.set_everywhere

    def stopped_then(percent: int) -> list[str]:
        stack.guard.stop()  # SIGTERM as the rollback begins
        return ahead(percent)

    stack.guard.set_everywhere = stopped_then  # type: ignore[method-assign]
    stack.guard.run()
    state = stack.guard.state
    assert state["verdict"]["action"] == "rollback", state["verdict"]
    assert stack.gateways[LEADER].share == 0 == stack.gateways[FOLLOWER].share
    assert state["gateways_not_set"] == []


def test_a_stopped_guards_wait_for_its_followers_in_a_rollback_sleeps(tmp_path: Path) -> None:
    """The wait's sleep (time.sleep in slices) returned at once once stopped: a busy loop for 20 s."""
    stack = Stack(tmp_path, Canary(min_requests=10, interval_s=30, intervals=2), 20, ())
    guard = DetachedGuard(MODEL, str(stack.folders[LEADER]), stack.gateways[LEADER], stack.clock)  # type: ignore[arg-type]
    guard.stop()
    guard.finishing = True
    began = time.monotonic()
    guard.sleep(0.3)
    assert time.monotonic() - began >= 0.25


def test_a_canary_taken_out_on_the_guards_gateway_alone_is_taken_out_on_every_gateway(tmp_path: Path) -> None:
    """The guard ended its release ("gone") when its own gateway had the canary at 0 (the gateway program run
    by hand there, HAProxy started without its state file), leaving the canary its share on the other
    gateways, whose followers heard that the release ended and stopped: the canary served there unwatched."""
    stack = Stack(tmp_path, Canary(min_requests=10, interval_s=30, intervals=2), 20, ())
    ahead = stack.guard.look

    def look() -> None:
        if stack.guard.state["looks"] == 1:
            stack.gateways[LEADER].share = 0
        ahead()

    stack.guard.look = look  # type: ignore[method-assign]
    stack.guard.run()
    state = stack.guard.state
    assert state["verdict"]["action"] == "gone", state["verdict"]
    assert stack.gateways[FOLLOWER].share == 0 and state["gateways_not_set"] == []


def test_two_models_detached_at_once_on_one_node_get_two_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each `deploy --detach` chose its port from the states on the node, and wrote its own a few commands
    later: two models deployed at once both chose 8406, and the second guard could not bind it at any start.
    A port chosen is held (PORT_HELD_S) until that state names it. (The script runs on this machine.)"""
    monkeypatch.setattr(detach, "STATE_DIR", str(tmp_path / "state"))
    release = SimpleNamespace(nodes=guard_service.LocalNodes())
    first = detach.peer_port(release, LEADER, "ranker")  # type: ignore[arg-type]
    second = detach.peer_port(release, LEADER, MODEL)  # type: ignore[arg-type]
    assert (first, second) == (8406, 8407)
    assert detach.peer_port(release, LEADER, MODEL) == 8407  # its own choice again, not a third port
    monkeypatch.setattr(detach, "PORT_HELD_S", 0)  # held no longer: free again
    assert detach.peer_port(release, LEADER, MODEL) == 8406


def test_a_guard_unit_left_enabled_on_a_node_that_now_follows_does_not_lead_a_second_release(
    tmp_path: Path,
) -> None:
    """A guard stopped on a gateway (enabled: its next boot resumes it) that a later `deploy --detach` made a
    follower (another gateway first in the inventory) read the follower's state at that boot and ran as a
    second guard: its own release lock, its own analysis, its own share on that gateway, against the
    follower's."""
    stack = Stack(tmp_path, Canary(min_requests=10, interval_s=30, intervals=2), 20, (FOLLOWER,))
    node = stack.gateways[FOLLOWER]
    second = DetachedGuard(MODEL, str(stack.folders[FOLLOWER]), node, stack.clock, stack.sleep)  # type: ignore[arg-type]
    second.run()
    assert node.shares == [] and second.board is None
    assert ("disable", unit_name(MODEL)) in node.systemctl
    copy = guard_state.read_whole(guard_service.state_path(MODEL, str(stack.folders[FOLLOWER])))
    assert copy is not None and copy["phase"] != DONE  # the follower's copy is left as it was


def test_a_follower_unit_left_enabled_on_the_node_that_now_leads_stops(tmp_path: Path) -> None:
    """The other way round: a follower on the leader's node asked its own node's guard, for ever."""
    stack = Stack(tmp_path, Canary(min_requests=10, interval_s=30, intervals=2), 20, ())
    node = stack.gateways[LEADER]
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        assert len(naps) < 5, "the follower on the leader's node never stops"

    Follower(MODEL, str(stack.folders[LEADER]), node, stack.ask, nap).run()  # type: ignore[arg-type]
    assert node.shares == [] and ("disable", follower_unit(MODEL)) in node.systemctl


def test_a_report_from_before_a_share_was_published_does_not_say_it_applied() -> None:
    """The guard's waits (a share applied, the release's end heard) count only reports that came at or after
    they began: an earlier one showing the same share says nothing of the answer the follower had since."""
    now = [100.0]
    board = Board(5, {}, lambda: now[0])
    board.report(FOLLOWER, SHOWN)  # 5 %, at 100
    assert board.fresh(FOLLOWER, 100.0) == SHOWN and board.applied(FOLLOWER, 5, 100.0)
    assert board.fresh(FOLLOWER, 100.5) is None and not board.applied(FOLLOWER, 5, 100.5)
    now[0] = 101.0
    board.report(FOLLOWER, SHOWN)
    assert board.applied(FOLLOWER, 5, 100.5)


def test_a_stop_during_a_steps_wait_is_not_a_failed_try_of_the_step(tmp_path: Path) -> None:
    """A stop (`systemctl stop`, a reboot) while the guard waited for the followers to take a step cut the
    wait short; the step then counted as not set on the followers (named in the record as gateways not set),
    one of its three tries spent: three such stops ended a release no gateway had refused."""
    stack = Stack(tmp_path, stepped(5, 20, 50), 5, ())
    guard, ahead, calls = stack.guard, stack.guard.set_everywhere, [0]

    def stopped_at_the_second_step(percent: int) -> list[str]:
        calls[0] += 1
        if calls[0] == 2:
            guard.stop()
        return ahead(percent)

    guard.set_everywhere = stopped_at_the_second_step  # type: ignore[method-assign]
    guard.run()
    assert guard.state.get("step_tries", 0) == 0 and guard.state.get("gateways_not_set") == []
    assert stack.gateways[LEADER].share == 20 == guard.state["share"]
    resumed = DetachedGuard(
        MODEL, str(stack.folders[LEADER]), stack.gateways[LEADER], stack.clock, stack.sleep
    )  # type: ignore[arg-type]
    stack.guard = resumed
    resumed.run()
    assert resumed.state["verdict"]["action"] == "promote-ready"
    assert stack.gateways[LEADER].share == 50 == stack.gateways[FOLLOWER].share


def test_a_port_is_chosen_under_the_nodes_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The choice waits for another `deploy --detach` choosing on the same node (the lock held here)."""
    monkeypatch.setattr(detach, "STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state" / "guard").mkdir(parents=True)
    release = SimpleNamespace(nodes=guard_service.LocalNodes())
    chosen: list[int] = []
    with open(tmp_path / "state" / "guard" / ".ports.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        choosing = threading.Thread(target=lambda: chosen.append(detach.peer_port(release, LEADER, MODEL)))  # type: ignore[arg-type]
        choosing.start()
        choosing.join(timeout=1.0)
        assert choosing.is_alive() and chosen == []
        fcntl.flock(held, fcntl.LOCK_UN)
    choosing.join(timeout=30)
    assert chosen == [8406]
