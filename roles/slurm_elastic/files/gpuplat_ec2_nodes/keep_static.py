"""keep-static (a systemd timer on the controller): the pools' static nodes kept up, with back-off."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .ec2 import Ec2Nodes, terminate_named
from .exit_codes import EXIT_FAILED, EXIT_OK
from .logs import LOG
from .settings import Settings
from .slurm import HELD, POWER_TRANSITIONS, NodeInfo, Slurm
from .state import number, read_state, write_state

REASON_REPLACE = "gpuplat keep-static: replacing a DOWN static node"


def static_action(node: NodeInfo | None) -> str:
    """What a static node needs: undefined, held, wait, replace, power-up or nothing (up)."""
    if node is None:
        return "undefined"
    if node.flags & HELD:
        return "held"
    if node.flags & POWER_TRANSITIONS:
        return "wait"
    if "DOWN" in node.flags:
        return "replace"
    if "POWERED_DOWN" in node.flags:
        return "power-up"
    return "up"


@dataclass
class Backoff:
    """Consecutive keep-static actions per static node and when the last one was.

    After n actions the next one waits min(base * 2**(n-1), max) seconds. The count is forgotten
    once the node has been seen up at least max seconds after the last action, so a node that fails
    again soon after coming up keeps backing off.
    """

    base_s: float
    max_s: float
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)

    @classmethod
    def from_state(cls, data: dict[str, Any], base_s: float, max_s: float) -> Backoff:
        raw = data.get("nodes")
        nodes = {
            str(name): {"attempts": number(entry.get("attempts"), 0), "last": number(entry.get("last"), 0)}
            for name, entry in (raw.items() if isinstance(raw, dict) else [])
            if isinstance(entry, dict)
        }
        return cls(base_s, max_s, nodes)

    def delay(self, name: str) -> float:
        attempts = self.nodes.get(name, {}).get("attempts", 0)
        return 0.0 if attempts < 1 else min(self.base_s * 2 ** (attempts - 1), self.max_s)

    def next_time(self, name: str) -> float:
        return self.nodes.get(name, {}).get("last", 0.0) + self.delay(name)

    def record(self, name: str, now: float) -> None:
        attempts = self.nodes.get(name, {}).get("attempts", 0) + 1
        self.nodes[name] = {"attempts": attempts, "last": now}

    def settle(self, name: str, now: float) -> None:
        if name in self.nodes and now - self.nodes[name]["last"] >= self.max_s:
            LOG.info("keep-static: %s has stayed up; forgetting its %d attempts", name, self.attempts(name))
            del self.nodes[name]

    def attempts(self, name: str) -> int:
        return int(self.nodes.get(name, {}).get("attempts", 0))

    def state(self) -> dict[str, Any]:
        return {"nodes": self.nodes}


def keep_static(settings: Settings, slurm: Slurm, ec2: Ec2Nodes, now: float | None = None) -> int:
    static = settings.static_nodes
    if not static:
        return EXIT_OK
    nodes = slurm.nodes()
    if nodes is None:
        return EXIT_FAILED
    now = time.time() if now is None else now
    plan: dict[str, list[str]] = {}
    for name in static:
        plan.setdefault(static_action(nodes.get(name)), []).append(name)
    report_static(plan)
    path = settings.state_dir / "keep-static.json"
    backoff = Backoff.from_state(
        read_state(path), settings.static_backoff_base_s, settings.static_backoff_max_s
    )
    for name in plan.get("up", []):
        backoff.settle(name, now)
    replace = due(backoff, plan.get("replace", []), now)
    power_up = due(backoff, plan.get("power-up", []), now)
    for name in replace + power_up:
        backoff.record(name, now)
    saved = write_state(path, backoff.state())
    replaced = replace_static(ec2, slurm, replace) if replace else True
    if power_up:
        LOG.info("keep-static: powering up %s", ",".join(power_up))
    powered = slurm.power_up(power_up) if power_up else True
    return EXIT_OK if saved and replaced and powered and not plan.get("undefined") else EXIT_FAILED


def report_static(plan: dict[str, list[str]]) -> None:
    for name in plan.get("undefined", []):
        LOG.error("keep-static: static node %s is not defined in Slurm", name)
    for name in plan.get("held", []):
        LOG.warning("keep-static: static node %s is drained or failed; leaving it as it is", name)


def due(backoff: Backoff, names: list[str], now: float) -> list[str]:
    """The names whose back-off has passed; the others are logged."""
    ready = []
    for name in names:
        if now >= backoff.next_time(name):
            ready.append(name)
        else:
            LOG.warning(
                "keep-static: %s needed %d attempts already; next one in %.0f s (back-off)",
                name,
                backoff.attempts(name),
                backoff.next_time(name) - now,
            )
    return ready


def replace_static(ec2: Ec2Nodes, slurm: Slurm, names: list[str]) -> bool:
    """A DOWN static node: terminate its instance, POWER_DOWN_FORCE it; a later round powers it up."""
    LOG.warning("keep-static: static nodes %s are DOWN; replacing their instances", ",".join(names))
    terminated = terminate_named(ec2, names, "keep-static")
    return slurm.power_down_force(names, REASON_REPLACE) and terminated
