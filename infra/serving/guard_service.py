"""The detached guard: a canary's analysis carried on by a systemd service on the gateway's node, after the
command that started it (`gpuplat serve deploy ... --canary P --detach`) ended.

It runs `python3 /usr/local/lib/gpuplat-serve/guard@MODEL.pyz MODEL` as gpuplat-serve-guard@MODEL.service (the
bundle holds the package's own modules, infra/serving/detach.py), with the node's Python and nothing else.
What it reaches, and only that: its own gateway (the share and the counters, through the gateway's programs
and local admin socket) and the model servers' /metrics over the network the gateway already routes to. It
holds the model's release lock while it runs (a second deploy, promote or guard meets it), and keeps its
whole state in STATE_DIR/guard/MODEL.json, rewritten whole after every look (guard_state.write_whole): the
counts since the canary started, the intervals judged, the step it is at and when that began. A restart (of
the service, of the node) resumes from there: the evidence is neither lost nor started afresh.

Its verdicts: a rollback takes the canary's share to 0 on its gateway at once; stopping the canary slot on the
model servers and the registry's aliases are left to `gpuplat serve rollback MODEL` (a service that could
restart inference servers would give the gateway node the inference pool). Steps below 100 % are carried
(each share set on its gateway, each held for an analysis); it stops at a manual gate, at the promotion step
or at promote-ready, leaving `gpuplat serve promote MODEL` (the replicas' restarts) to the operator. The
release record (STATE_DIR/MODEL.json, what `serve status` shows) says each time what remains.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

from infra.errors import GpuPlatError
from infra.serving.analysis import CONTINUE, INCONCLUSIVE, PROMOTE_READY, ROLLBACK, Guard, RulesRead, Verdict
from infra.serving.counts import Counts, Reading
from infra.serving.guard_peers import CONFIRM_S, PEER_PORT, REPORT_EVERY_S, Board, serve_board
from infra.serving.guard_state import read_whole, write_whole
from infra.serving.load import both_serving, equal, load_at
from infra.serving.lock import LEASE_S, LockRefused, ReleaseLock
from infra.serving.metrics_text import METRICS_READ, GatewayFigures, parse_metrics

STATE_DIR = "/var/lib/gpuplat-serve"
RUNNING, DONE = "running", "done"
GATED, ROLLING_BACK = "gated", "rolling back"
STOPPED = "stopped"
"""the record's phase while a guard stopped before its verdict (SIGTERM: `systemctl stop`, a shutdown)"""
SERVICE = "gpuplat-serve-guard"
PAUSE_SLICE_S = 0.5
"""a stopped guard's wait ends within this (the signal handler only sets a flag: it runs between bytecodes
of the main thread, which may hold any lock then)"""
STEP_TRIES = 3
"""tries of a step whose share some gateway did not take, before the guard ends"""
TAKE_LOCK_S = 3 * LEASE_S
"""how long a starting guard waits for the release lock (its starter holds it until it exits)"""


def lock_heir(model: str) -> str:
    """The name the release lock is held under between `deploy --detach` handing it over and the guard
    taking it (it names no pid: nobody takes it over as gone, only once its lease ended)."""
    return f"handed over to the detached guard of {model}"


def unit_name(model: str) -> str:
    return f"{SERVICE}@{model}.service"


def state_path(model: str, folder: str = STATE_DIR) -> str:
    return f"{folder}/guard/{model}.json"


def record_path(model: str, folder: str = STATE_DIR) -> str:
    return f"{folder}/{model}.json"


class LocalNodes:
    """The Nodes of infra/serving/lock.py on the guard's own node: every command runs here."""

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise GpuPlatError(f"{command[0]} on this node: {error}") from None
        if done.returncode != 0:
            raise GpuPlatError(f"{command[0]} on this node exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class DetachedGuard:
    """One model's release, as its state file holds it; `run` carries it to its end."""

    def __init__(
        self,
        model: str,
        folder: str = STATE_DIR,
        nodes: LocalNodes | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.model, self.folder = model, folder
        self.nodes = nodes or LocalNodes()
        self.clock, self.sleep = clock, sleep or self._pause
        self.stopping = False
        self.finishing = False
        """a rollback under way: a stop does not cut its waits short (it is finished even when stopping)"""
        self.board: Board | None = None
        self.state = self._read_state()

    def stop(self) -> None:
        """SIGTERM's handler: the look under way ends, then the guard saves its state and lets the lock go
        (a stop left the lock to its lease: a minute in which `serve rollback` and `promote` met it)."""
        self.stopping = True

    def _pause(self, seconds: float) -> None:
        """time.sleep in slices: a signal handler that returns resumes a sleep where it was (PEP 475)."""
        deadline = time.monotonic() + seconds
        while (not self.stopping or self.finishing) and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, PAUSE_SLICE_S))

    def _read_state(self) -> dict[str, Any]:
        found = read_whole(state_path(self.model, self.folder))
        if found is None:
            raise GpuPlatError(
                f"no detached guard of '{self.model}': {state_path(self.model, self.folder)} does not exist"
            )
        self.rules = RulesRead(**found["rules"])
        return found

    # What it reaches

    def _gateway_program(self, *arguments: str) -> str:
        program = f"{self.state['gateway_programs']}/gpuplat_gateway_canary.py"
        return self.nodes.exec(self.state["gateway"], "python3", program, *arguments, timeout=30)

    def share(self) -> int:
        return GatewayFigures.from_show(json.loads(self._gateway_program("show"))).canary_percent

    def followers(self) -> dict[str, str]:
        """The stack's other gateways (name -> address), each running a follower (guard_peers.py)."""
        addresses: dict[str, str] = self.state.get("addresses") or {}
        return {name: address for name, address in addresses.items() if name != self.state["gateway"]}

    def set_everywhere(self, percent: int) -> list[str]:
        """The share on this gateway, then published to the followers and waited for until each reports it
        applied (CONFIRM_S at most); the gateways where it is not set."""
        unset = []
        try:
            self._gateway_program("share", str(percent))
        except GpuPlatError as error:
            say(f"the share {percent} % not set on {self.state['gateway']}: {error.message}")
            unset.append(self.state["gateway"])
        if self.board is None:
            return unset
        asked = self.clock()
        self.board.publish(percent, self.state)
        waiting = list(self.followers())
        while waiting and self.clock() - asked < CONFIRM_S and (not self.stopping or self.finishing):
            self.sleep(REPORT_EVERY_S)
            waiting = [gateway for gateway in waiting if not self.board.applied(gateway, percent, asked)]
        if waiting:
            say(
                f"the share {percent} % not reported applied by {', '.join(waiting)} within {CONFIRM_S:.0f} s"
            )
        return unset + waiting

    def gateway_counts(self) -> dict[str, GatewayFigures]:
        """Every gateway's figures this look: its own, and each follower's last report since the previous
        look (one that has not reported is left out of this look and counted at its next)."""
        found = {self.state["gateway"]: GatewayFigures.from_show(json.loads(self._gateway_program("show")))}
        if self.board is not None:
            since = self.clock() - max(2 * self.state["look_s"], 3 * REPORT_EVERY_S)
            for gateway in self.followers():
                figures = self.board.fresh(gateway, since)
                if figures is None:
                    say(f"no report from the gateway {gateway} this look: left out of it")
                else:
                    found[gateway] = GatewayFigures.from_show(figures)
        return found

    def readings(self) -> tuple[Reading, Reading]:
        """Every gateway's counters and every model server's latency histograms (by address:port, as the CLI
        names them: the evidence the CLI began is carried on)."""
        by_gateway = self.gateway_counts()
        backends, servers = self.state["backends"], self.state["servers"]
        if self.state.get("load_servers"):
            # The servers up as the CLI counted them (Release.figures: the least any gateway counts), again
            # at each look: the load ratio follows a replica down or autoscaling (carry.ServersUp).
            self.state["load_servers"] = [
                min(figures.servers_up.get(backends[role], 0) for figures in by_gateway.values())
                for role in ("canary", "stable")
            ]
        found: dict[str, dict[str, Any]] = {"stable": {}, "canary": {}}
        for address, ports in servers.items():
            role_of = {port: "stable" for port in ports["stable"]} | {ports["canary"]: "canary"}
            try:
                answer = self.nodes.exec(
                    self.state["gateway"],
                    "python3",
                    "-c",
                    METRICS_READ,
                    address,
                    *map(str, role_of),
                    timeout=30,
                )
            except GpuPlatError as error:
                say(f"no latencies from {address} this look: {error.message}")
                continue
            for port, histogram in parse_metrics(answer, self.state["histogram"]).items():
                if port in role_of:
                    found[role_of[port]][f"{address}:{port}"] = histogram
        stable, canary = (
            Reading.of_gateways(
                {
                    gateway: Counts(figures.requests[backends[role]], figures.errors[backends[role]])
                    for gateway, figures in by_gateway.items()
                },
                found[role] or None,
            )
            for role in ("stable", "canary")
        )
        return stable, canary

    # Its state

    def save(self) -> None:
        """The state, then the record `serve status` reads: killed between the two, the record is one look
        behind, the evidence whole."""
        write_whole(state_path(self.model, self.folder), self.state)
        write_whole(record_path(self.model, self.folder), self.record())
        if self.board is not None:
            self.board.publish(self.board.share, self.state)  # the followers' copy

    def step_label(self) -> str:
        steps = self.state["steps"]
        if not steps:
            return "the canary's analysis"
        at = min(self.state["step"], len(steps) - 1)
        number, in_all = self.state["step_numbers"][at], self.state["steps_in_all"]
        percent = steps[at]["percent"]
        if number == 0:  # added by the CLI (infra/serving/carry.py with_equal_load_step)
            return (
                f"the equal-load analysis ({percent} %)"
                if equal(self.load(percent))
                else f"the analysis at {percent} %"
            )
        return f"step {number} of {in_all} ({percent} %)"

    def step_rules(self) -> RulesRead:
        """The rules of this step's analysis: the stack's, with the longer intervals the CLI gave an analysis
        it added below the stack's smallest share (infra/serving/load.py lengthened_interval_s)."""
        steps = self.state["steps"]
        step = steps[min(self.state["step"], len(steps) - 1)] if steps else None
        if step is None or not step.get("interval_s"):
            return self.rules
        return self.rules.with_interval(int(step["interval_s"]))

    def load(self, percent: int) -> float:
        """Each canary server's load over each stable server's at `percent` (infra/serving/load.py)."""
        servers = self.state.get("load_servers")
        return load_at(percent, (int(servers[0]), int(servers[1])) if servers else None)

    def record(self) -> dict[str, Any]:
        state = self.state
        verdict = state.get("verdict") or {"action": CONTINUE, "reason": "no look yet"}
        phase = {ROLLBACK: "rolled back"}.get(verdict["action"], verdict["action"])
        guard_phase = state["phase"]
        if guard_phase == RUNNING:
            phase = "analysing"
        detail = f"{self.step_label()}: {verdict['reason']}"
        if state.get("remains"):
            detail += f". Left to the operator: {state['remains']}"
        if self.stopping and guard_phase != DONE:
            phase = guard_phase = STOPPED
            detail += (
                f". The detached guard was stopped before its verdict and nothing watches the canary: "
                f"`systemctl start {unit_name(self.model)}` on this node resumes it from its state, "
                f"`gpuplat serve rollback {self.model}` takes the canary out"
            )
        return {
            "phase": phase,
            "detail": detail,
            "canary_percent": None if phase == "rolled back" else state["share"],
            "steps": [step["percent"] for step in state["steps"]],
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.clock())),
            "by": f"the detached guard (gpuplat-serve-guard@{self.model} on {socket.gethostname()})",
            "guard": {
                "state": guard_phase,
                "step": self.step_label(),
                "verdict": verdict,
                "looks": state["looks"],
                "last_look": state.get("last_look"),
                "remains": state.get("remains"),
                "gateways_not_set": state.get("gateways_not_set") or [],
            },
        }

    def finish(self, verdict: Verdict, remains: str) -> None:
        self.state.update(phase=DONE, verdict=vars(verdict), remains=remains)
        self.save()

    # Its work

    def run(self) -> None:
        if self.state.get("leader", self.state["gateway"]) != self.state["gateway"]:
            # A guard unit left enabled here by an earlier release, on a node a later one made a follower:
            # its state is the follower's copy, and the release's guard runs on the leader.
            say(
                f"this gateway follows the guard of '{self.model}' on {self.state['leader']}: "
                "nothing to run here"
            )
            self.disable()
            return
        if self.state["phase"] == DONE:
            say(f"the release of '{self.model}' ended before: {self.state['verdict']['reason']}")
            self.disable()
            return
        lock = ReleaseLock(self.nodes, self.state["gateway"], self.model, "the detached guard", say)
        waited_until = self.clock() + TAKE_LOCK_S
        while True:
            try:
                lock.take(handed_by=lock_heir(self.model))
                break
            except LockRefused as refused:
                if self.clock() > waited_until:
                    raise
                say(f"waiting for the release lock: {refused.message}")
                self.sleep(2)
                if self.stopping:
                    say(f"stopped while waiting for the release lock of '{self.model}'")
                    return
        server_of: list[ThreadingHTTPServer] = []
        try:
            # Read again under the lock: while this process waited for it, a `deploy --detach` of the model
            # may have written a new release's state (its guard's restart comes after), which a save of the
            # state read before would overwrite.
            self.state = self._read_state()
            if self.followers():
                # What its own gateway has now, not the state's share: a canary taken out while this guard
                # was stopped (`serve rollback`) must not get its share back on the followers.
                self.board = Board(self.share(), self.state, self.clock)
                server = serve_board(self.board, self.model, self.followers(), self.state["peer_port"])
                server_of.append(server)
            # A rollback begun is finished even when stopping: one command, and the canary is out.
            while self.state["phase"] != DONE and (not self.stopping or self.state["phase"] == ROLLING_BACK):
                if not lock.held():
                    raise GpuPlatError(
                        f"the detached guard of '{self.model}' lost its release lock: it stops"
                    )
                self.look()
            if self.stopping and self.state["phase"] != DONE:
                self.save()  # the record says it stopped; the state, whole, is what a start resumes from
                say(
                    f"stopped: the release of '{self.model}' resumes from its state at the guard's next start"
                )
            if self.state["phase"] == DONE and self.board is not None:
                self.followers_told()
        finally:
            for server in server_of:
                server.shutdown()
                server.server_close()
            lock.release()
        if self.state["phase"] == DONE:
            self.disable()

    def followers_told(self) -> None:
        """Wait (CONFIRM_S at most) until every follower has had the release's end, so that it stops too."""
        assert self.board is not None
        ended = self.clock()
        waiting = list(self.followers())
        while waiting and self.clock() - ended < CONFIRM_S and not self.stopping:
            self.sleep(REPORT_EVERY_S)
            waiting = [gateway for gateway in waiting if self.board.fresh(gateway, ended) is None]
        if waiting:
            say(f"{', '.join(waiting)} did not hear that the release ended: stop its follower there")

    def disable(self) -> None:
        """A guard whose release ended is not started again at the node's next boot (it would only find its
        state done and exit)."""
        try:
            self.nodes.exec(self.state["gateway"], "systemctl", "disable", unit_name(self.model), timeout=30)
        except GpuPlatError as error:
            say(f"{unit_name(self.model)} stays enabled: {error.message}")

    def look(self) -> None:
        """One step of the release: a rollback begun finished, a step begun, or one look at the analysis."""
        state = self.state
        if state["phase"] == ROLLING_BACK:
            self.finishing = True
            unset = self.set_everywhere(0)
            state.update(share=0, gateways_not_set=unset)
            remains = (
                f"the canary has no share; `gpuplat serve rollback {self.model}` stops its slot on the model "
                "servers and takes the registry's challenger alias away"
            )
            self.finish(Verdict(**state["verdict"]), _not_set_remains(self.model, unset) or remains)
            return
        if state["guard"] is None:
            self.begin_step()
            return
        self.sleep(state["look_s"])
        if self.stopping:
            return
        now = self.clock()
        rules = self.step_rules()
        duration_s = state["duration_s"] + rules.analysis_s - self.rules.analysis_s
        guard = Guard.from_json(rules, state["guard"])
        try:
            if self.share() == 0:
                # Out on this gateway: out on every other one too, before the followers hear the end.
                self.finishing = True
                state.update(share=0, gateways_not_set=self.set_everywhere(0) if self.board else [])
                self.finish(
                    Verdict("gone", "the canary has no share any more (taken out by another command)"),
                    _not_set_remains(self.model, state["gateways_not_set"]),
                )
                return
            readings = self.readings()
            dropped = len(guard.analysis.restarts)
            up = state.get("load_servers")
            # A version with no server up takes no load (carry._weigh): the ratio stays as it was.
            ratio = self.load(state["share"]) if up and both_serving((int(up[0]), int(up[1]))) else None
            verdict = guard.look(now, *readings, load_ratio=ratio)
            if len(guard.analysis.restarts) > dropped:
                say(guard.analysis.restarts[-1])
        except (GpuPlatError, ValueError, KeyError) as error:
            reason = error.message if isinstance(error, GpuPlatError) else f"{type(error).__name__}: {error}"
            say(f"look failed: {reason}")
            # The intervals a move of the servers up added (Analysis.reweigh) count in its time.
            duration_s += guard.analysis.added_s
            if now - guard.started_s >= duration_s:
                # Looks that fail for good (the gateway's program gone) must not hold the lock for ever:
                # `serve rollback` and `promote` would meet it.
                self.finish(
                    Verdict(
                        CONTINUE,
                        f"no verdict within {duration_s:.0f} s: the last look failed: {reason}",
                    ),
                    _decide(self.model),
                )
            return
        state.update(guard=guard.to_json(), looks=state["looks"] + 1, verdict=vars(verdict))
        state["last_look"] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now))
        if verdict.action == ROLLBACK:
            state["phase"] = ROLLING_BACK  # saved first: a restart finishes the rollback
            self.save()
            self.look()
            return
        if verdict.action == PROMOTE_READY:
            self.step_passed(verdict)
        elif verdict.action == INCONCLUSIVE:
            self.finish(verdict, _decide(self.model))
        elif now - guard.started_s >= duration_s + guard.analysis.added_s:
            self.finish(
                Verdict(
                    CONTINUE,
                    f"no verdict within {duration_s + guard.analysis.added_s:.0f} s: {verdict.reason}",
                ),
                _decide(self.model),
            )
        else:
            self.save()

    def begin_step(self) -> None:
        """The step's share on its gateway, and its analysis from the counters now (the first step's
        baseline, from just before `deploy` gave the canary its share, came with the state)."""
        state = self.state
        step = state["steps"][state["step"]] if state["steps"] else None
        if step is not None and step["percent"] == 100:
            self.finish(
                Verdict(PROMOTE_READY, f"{self.step_label()} is the promotion"),
                f"`gpuplat serve promote {self.model}` restarts the stable replicas on the canary's version",
            )
            return
        if step is not None and step["percent"] != state["share"]:
            baseline = self.readings()
            unset = self.set_everywhere(step["percent"])
            if unset and self.stopping:
                # The stop cut the wait short, no gateway refused: back to the last share every gateway had,
                # and the step is begun again at the next start (not a try spent).
                self.set_everywhere(state["share"])
                return
            if unset:
                self.step_not_set(step["percent"], unset)
                return
            state.update(share=step["percent"], step_tries=0, gateways_not_set=[])
            say(f"{self.step_label()}: the canary takes {step['percent']} % of the requests")
            load = self.load(step["percent"])
            state["guard"] = Guard(self.step_rules(), self.clock(), *baseline, load_ratio=load).to_json()
        else:
            load = self.load(state["share"])
            rules = self.step_rules()
            state["guard"] = Guard(rules, self.clock(), *self.readings(), load_ratio=load).to_json()
        self.save()

    def step_not_set(self, percent: int, unset: list[str]) -> None:
        """A step whose share could not be set on every gateway: the last share every gateway had is set again
        everywhere (no gateway is left at the new one), and the step is tried again at the next look; at the
        third try in a row the guard ends, the canary at that share (as Argo Rollouts, which neither advances
        nor aborts on a traffic router's error: docs/serving.md, The detached guard)."""
        state = self.state
        back = self.set_everywhere(state["share"])
        tries = state.get("step_tries", 0) + 1
        state.update(step_tries=tries, gateways_not_set=sorted(set(unset) | set(back)))
        say(
            f"{self.step_label()}: {percent} % not set on {', '.join(unset)}; "
            f"every gateway back at {state['share']} %"
        )
        if tries < STEP_TRIES:
            self.save()
            self.sleep(state["look_s"])
            return
        kept = f"the canary keeps {state['share']} %"
        if back:
            kept += f" (not set back on {', '.join(back)}, which may give it {percent} %)"
        self.finish(
            Verdict(CONTINUE, f"{self.step_label()} could not be set on {', '.join(unset)} in {tries} tries"),
            f"{kept}: `gpuplat serve rollback {self.model}` or `gpuplat serve guard {self.model}` once every "
            "gateway answers",
        )

    def step_passed(self, verdict: Verdict) -> None:
        state = self.state
        step = state["steps"][state["step"]] if state["steps"] else None
        if step is None or state["step"] + 1 >= len(state["steps"]):
            back = state.get("return_share")
            remains = f"`gpuplat serve promote {self.model}`, or `gpuplat serve rollback {self.model}`"
            if back is not None and back != state["share"]:
                # Without steps the release ends at the share it was deployed with (the CLI added the
                # equal-load analysis after it: infra/serving/carry.py with_equal_load_step).
                unset = self.set_everywhere(back)
                if state["gateway"] not in unset:
                    state["share"] = back
                state["gateways_not_set"] = unset
                if unset:
                    say(f"both analyses passed; the share {back} % not set on {', '.join(unset)}")
                    remains = (
                        f"the canary's share could not be put back to {back} % on {', '.join(unset)} (it may "
                        f"keep {state['steps'][state['step']]['percent']} % there): " + remains
                    )
                else:
                    say(f"both analyses passed: the canary's share goes back to {back} %")
            self.finish(verdict, remains)
            return
        if step["manual_gate"]:
            self.finish(
                Verdict(GATED, f"{self.step_label()} passed; its manual gate holds the release"),
                f"`gpuplat serve guard {self.model} --past-gate` goes on, "
                f"`gpuplat serve rollback {self.model}` takes the canary out",
            )
            return
        say(f"{self.step_label()} passed: {verdict.reason}")
        state.update(step=state["step"] + 1, guard=None)
        self.save()


def _decide(model: str) -> str:
    return f"the canary keeps its share: `gpuplat serve rollback {model}` or `gpuplat serve promote {model}`"


def initial_state(
    model: str,
    candidate: str,
    rules: RulesRead,
    guard: Guard,
    started_ago_s: float,
    share: int,
    steps: list[tuple[int, dict[str, Any]]],
    steps_in_all: int,
    gateway: str,
    gateway_programs: str,
    backends: dict[str, str],
    servers: dict[str, dict[str, Any]],
    histogram: str,
    look_s: float,
    duration_s: float,
    addresses: dict[str, str] | None = None,
    peer_port: int = PEER_PORT,
    load_servers: tuple[int, int] | None = None,
    return_share: int | None = None,
) -> dict[str, Any]:
    """The state a detached guard starts from (`init` writes it on the node): the analysis the CLI began,
    its start given as seconds ago (the node's clock, not the CLI's, counts from there), and the steps ahead
    (number, step). `addresses`: every gateway's, on a stack with several (the first, `gateway`, the guard's;
    each other one a follower's, guard_follower.py). `load_servers`: the canary's servers and the stable's up
    when the CLI looked, which each step's analysis weighs the load by (infra/serving/load.py); where the
    first step is at another share than `share`, `guard` is left for that step's own analysis.
    `return_share`: the share the release ends at once its last step passed (None: that step's)."""
    guard_state: dict[str, Any] | None = {**guard.to_json(), "started_s": -started_ago_s}
    if steps and steps[0][1]["percent"] != share:
        # The first step moves the share (the equal-load analysis the CLI added, infra/serving/load.py): its
        # analysis begins when it is set, on counts from then (begin_step).
        guard_state = None
    return {
        "model": model,
        "candidate": candidate,
        "rules": rules.to_json(),
        "phase": RUNNING,
        "guard": guard_state,
        "started_relative": True,
        "share": share,
        "steps": [step for _, step in steps],
        "step_numbers": [number for number, _ in steps],
        "steps_in_all": steps_in_all,
        "load_servers": list(load_servers) if load_servers else None,
        "return_share": return_share,
        "step": 0,
        "gateway": gateway,
        "leader": gateway,
        "addresses": addresses or {},
        "peer_port": peer_port,
        "gateway_programs": gateway_programs,
        "backends": backends,
        "servers": servers,
        "histogram": histogram,
        "look_s": look_s,
        "duration_s": duration_s,
        "looks": 0,
        "verdict": None,
        "remains": None,
        "last_look": None,
    }


def _not_set_remains(model: str, unset: list[str]) -> str:
    """What is left to the operator when gateways did not report the canary's share 0 ("" where none)."""
    if not unset:
        return ""
    return (
        f"the canary's share could not be set to 0 on {', '.join(unset)} (it keeps its share there); "
        f"`gpuplat serve rollback {model}` sets it on every gateway, stops its slot on the model servers and "
        "takes the registry's challenger alias away"
    )


def init(model: str, text: str, folder: str = STATE_DIR, clock: Callable[[], float] = time.time) -> None:
    """Write a starting state (from the CLI) on this node: its start, given relative, on this node's clock."""
    state = json.loads(text)
    if state.pop("started_relative", False) and state["guard"] is not None:
        state["guard"]["started_s"] += clock()
    write_whole(state_path(model, folder), state)


def serve_until_stopped(guard: DetachedGuard) -> None:
    """Run the guard with SIGTERM asking it to stop (systemd's stop signal: the unit's KillMode=mixed sends
    it to this process alone); the handler before is back once it returns."""
    previous = signal.signal(signal.SIGTERM, lambda number, frame: guard.stop())
    try:
        guard.run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(arguments: list[str] | None = None) -> int:
    """`guard.pyz MODEL` runs the guard; `guard.pyz init MODEL STATE` writes its starting state."""
    arguments = sys.argv[1:] if arguments is None else arguments
    try:
        if len(arguments) == 3 and arguments[0] == "init":
            init(arguments[1], arguments[2])
            return 0
        if len(arguments) != 1:
            say("usage: guard.pyz MODEL | guard.pyz init MODEL STATE_JSON")
            return 2
        serve_until_stopped(DetachedGuard(arguments[0]))
    except GpuPlatError as error:
        say(error.message)
        return 1
    return 0
