"""A follower of the detached guard: on each gateway but the guard's (the leader), a service
(gpuplat-serve-follow@MODEL) that reports its own gateway's figures to the leader and applies the share the
leader answers with (infra/serving/guard_peers.py says who reaches what).

A leader that does not answer leaves this gateway at the last share it applied (the last share the leader
had every gateway take): nothing here moves the share by itself. Each answer's guard state is kept on this
node as well (STATE_DIR/guard/MODEL.json, naming this gateway as its own), so the evidence outlives the
leader's node. Standard library only, like the guard.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from infra.errors import GpuPlatError
from infra.serving import guard_service
from infra.serving.guard_peers import REPORT_EVERY_S, ask_leader
from infra.serving.guard_service import DONE, STATE_DIR, LocalNodes, say, state_path
from infra.serving.guard_state import read_whole, write_whole

FOLLOWER = "gpuplat-serve-follow"


def follower_unit(model: str) -> str:
    return f"{FOLLOWER}@{model}.service"


class Follower:
    """One gateway's follower of one model's guard."""

    def __init__(
        self,
        model: str,
        folder: str = STATE_DIR,
        nodes: LocalNodes | None = None,
        ask: Callable[[str, str, dict[str, Any]], dict[str, Any]] = ask_leader,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.model, self.folder = model, folder
        self.nodes, self.ask, self.sleep = nodes or LocalNodes(), ask, sleep
        found = read_whole(state_path(model, folder))
        if found is None:
            raise GpuPlatError(f"no follower of '{model}': {state_path(model, folder)} does not exist")
        self.gateway, self.leader = str(found["gateway"]), str(found["leader"])
        self.program = f"{found['gateway_programs']}/gpuplat_gateway_canary.py"
        self.url = f"http://{found['addresses'][self.leader]}:{found['peer_port']}/{model}"
        self.stopping = False
        self.copy: dict[str, Any] = found

    def _gateway(self, *arguments: str) -> str:
        return self.nodes.exec(self.gateway, "python3", self.program, *arguments, timeout=30)

    def step(self) -> bool:
        """One report and the share answered applied; True once the leader says the release ended."""
        figures = json.loads(self._gateway("show"))
        try:
            answer = self.ask(self.url, self.gateway, figures)
        except (OSError, ValueError) as error:
            say(
                f"the guard's leader {self.leader} did not answer ({error}): this gateway keeps the canary's "
                f"{figures.get('canary_percent')} %"
            )
            return False
        if int(answer["share"]) != int(figures["canary_percent"]):
            self._gateway("share", str(int(answer["share"])))
            say(f"{self.gateway}: the canary's share set to {answer['share']} % (the guard on {self.leader})")
        state = answer.get("state")
        if not isinstance(state, dict):
            return False
        copy = {**state, "gateway": self.gateway}
        if copy != self.copy:  # written (and flushed to the disk) when it changed, not at every report
            write_whole(state_path(self.model, self.folder), copy)
            self.copy = copy
        return state.get("phase") == DONE

    def once(self) -> bool:
        """`step`, a gateway program that fails said and tried again at the next (the guard sees no report
        of the share applied, and sets the last share every gateway had back)."""
        try:
            return self.step()
        except (GpuPlatError, ValueError, KeyError) as error:
            reason = error.message if isinstance(error, GpuPlatError) else f"{type(error).__name__}: {error}"
            say(f"{self.gateway}'s program did not answer: {reason}")
            return False

    def run(self) -> None:
        if self.gateway == self.leader:
            # A follower unit left enabled here by an earlier release, on the node a later one made leader.
            say(f"this gateway leads the release of '{self.model}': no follower here")
            self.nodes.exec(self.gateway, "systemctl", "disable", follower_unit(self.model), timeout=30)
            return
        while not self.stopping:
            if self.once():
                say(f"the release of '{self.model}' ended: this follower stops")
                self.nodes.exec(self.gateway, "systemctl", "disable", follower_unit(self.model), timeout=30)
                return
            self.sleep(REPORT_EVERY_S)


def main(arguments: list[str] | None = None) -> int:
    """The bundle's entry: `follow MODEL` runs a follower; anything else is guard_service.main's."""
    arguments = sys.argv[1:] if arguments is None else arguments
    if len(arguments) != 2 or arguments[0] != "follow":
        return guard_service.main(arguments)
    try:
        follower = Follower(arguments[1])
        previous = signal.signal(signal.SIGTERM, lambda number, frame: setattr(follower, "stopping", True))
        try:
            follower.run()
        finally:
            signal.signal(signal.SIGTERM, previous)
    except GpuPlatError as error:
        say(error.message)
        return 1
    return 0
