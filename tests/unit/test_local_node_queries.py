"""The host's questions to the local platform's nodes around the playbooks of `gpuplat up` (machines before,
status after): each node asked once, the nodes at once. Every `podman exec` costs about 0.2 s on a shared
2-core machine: asked one service or one node at a time, they made about 5 s of a no-change
`up --reconfigure` (docs/local-platform.md, Measured). podman is faked here; the local-platform tier runs
both against the real nodes."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from infra.backends.local import cluster
from infra.backends.local.cluster import LocalCluster, NodeState
from infra.backends.local.scale import with_running_sizes
from infra.backends.local.status import collect_status, expected_services
from infra.errors import GpuPlatError
from infra.nodes import podman as podman_module
from infra.nodes.at_once import MOST_AT_ONCE, at_once
from infra.platform.resolve import ResolvedPlatform


@pytest.fixture
def local(shipped_platforms: dict[str, ResolvedPlatform]) -> LocalCluster:
    return LocalCluster(with_running_sizes(shipped_platforms["local"]))


def fake_nodes(
    monkeypatch: pytest.MonkeyPatch, nodes: LocalCluster, answers: dict[str, str], stopped: set[str]
) -> list[tuple[str, ...]]:
    """Each node answers `systemctl is-active` with answers[node]; sinfo with one healthy partition."""
    asked: list[tuple[str, ...]] = []
    lock = threading.Lock()

    def exec_unchecked(self: LocalCluster, node: str, *command: str, timeout: float = 60) -> str:
        with lock:
            asked.append((node, *command))
        return "train|up|2|gpu:h100:8|idle\n" if command[0] == "sinfo" else answers.get(node, "")

    states = [NodeState(n, "exited" if n.name in stopped else "running", n.address) for n in nodes.nodes]
    monkeypatch.setattr(LocalCluster, "states", lambda self: states)
    monkeypatch.setattr(LocalCluster, "exec_unchecked", exec_unchecked)
    return asked


def test_status_asks_each_running_node_once_for_all_its_services(
    monkeypatch: pytest.MonkeyPatch, local: LocalCluster
) -> None:
    # head-0 runs Slurm's controller, the gateway, Prometheus and the registry; infer-0 is stopped.
    head = [*expected_services("service", True), "gpuplat-registry"]
    answers = {"head-0": "active\n" * (len(head) - 1) + "failed\n", "train-0": "active\nactivating\n"}
    asked = fake_nodes(monkeypatch, local, answers, stopped={"infer-0"})
    status = collect_status(local)
    service_queries = sorted(q for q in asked if q[1] == "systemctl")
    assert service_queries == [
        ("head-0", "systemctl", "is-active", *head),
        ("train-0", "systemctl", "is-active", *expected_services("train", True)),
        ("train-1", "systemctl", "is-active", *expected_services("train", True)),
    ]
    states = {(line.node, line.service): line.state for line in status.services}
    # Read in the order asked; a line not printed (a node gone meanwhile) reads unknown, not a missing row.
    assert states[("head-0", "munge")] == "active"
    assert states[("head-0", "gpuplat-registry")] == "failed"
    assert [states[("train-0", s)] for s in expected_services("train", True)] == [
        "active",
        "activating",
        "unknown",
    ]
    assert {states[("train-1", s)] for s in expected_services("train", True)} == {"unknown"}
    assert not any(line.node == "infer-0" for line in status.services)
    assert [p.name for p in status.partitions] == ["train"]


def test_machines_settle_the_nodes_at_once(monkeypatch: pytest.MonkeyPatch, local: LocalCluster) -> None:
    """Each node's boot wait, GPU files and CA bundle run beside the other nodes': every node's wait here
    returns only once all four are waiting (one at a time, the first would wait alone and time out)."""
    nodes = local.nodes
    together = threading.Barrier(len(nodes), timeout=10)

    def wait_systemd(container: str, timeout_s: float, stop: threading.Event) -> None:
        together.wait()

    monkeypatch.setattr(cluster, "wait_systemd", wait_systemd)
    monkeypatch.setattr(cluster, "simulate_gpus", lambda container, gpus: container.endswith("train-1"))
    monkeypatch.setattr(cluster, "share_host_ca", lambda container: container.endswith("infer-0"))
    monkeypatch.setattr(cluster, "exists", lambda kind, name: True)
    running = {"State": {"Running": True}, "subnets": str(local.subnet)}
    monkeypatch.setattr(cluster, "inspect", lambda kind, name: running)
    monkeypatch.setattr(cluster, "ensure_wheelhouse", lambda platform: None)
    monkeypatch.setattr(cluster, "podman", lambda *args, **_: subprocess.CompletedProcess(args, 0, "", ""))
    assert local.ensure({}) == ["simulated GPUs on train-1", "host CA bundle on infer-0"]


def test_a_node_that_does_not_boot_fails_the_machines_phase_at_once(
    monkeypatch: pytest.MonkeyPatch, local: LocalCluster
) -> None:
    """The failure is raised as it happens, not once the slowest node has booted (or timed out), and the
    other nodes' waits that had started are told to give up (those not started yet are dropped)."""
    started_waits: list[str] = []
    told_to_stop: list[str] = []
    lock = threading.Lock()

    def wait_systemd(container: str, timeout_s: float, stop: threading.Event) -> None:
        with lock:
            started_waits.append(container)
        if container.endswith("train-0"):
            raise GpuPlatError(f"{container} stopped while booting: exit code 1")
        if stop.wait(20):
            with lock:
                told_to_stop.append(container)

    monkeypatch.setattr(cluster, "wait_systemd", wait_systemd)
    monkeypatch.setattr(cluster, "simulate_gpus", lambda container, gpus: False)
    monkeypatch.setattr(cluster, "share_host_ca", lambda container: False)
    monkeypatch.setattr(cluster, "exists", lambda kind, name: True)
    running = {"State": {"Running": True}, "subnets": str(local.subnet)}
    monkeypatch.setattr(cluster, "inspect", lambda kind, name: running)
    monkeypatch.setattr(cluster, "ensure_wheelhouse", lambda platform: None)
    started = time.monotonic()
    with pytest.raises(GpuPlatError, match="train-0 stopped while booting"):
        local.ensure({})
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 5
    while len(told_to_stop) < len(started_waits) - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(told_to_stop) == sorted(c for c in started_waits if not c.endswith("train-0"))


def test_status_asks_the_nodes_at_once(monkeypatch: pytest.MonkeyPatch, local: LocalCluster) -> None:
    """Each running node's question returns only once all three are asked (one at a time, the first would
    wait alone and time out)."""
    together = threading.Barrier(3, timeout=10)
    fake_nodes(monkeypatch, local, {}, stopped={"infer-0"})
    asked_alone = LocalCluster.exec_unchecked

    def exec_unchecked(self: LocalCluster, node: str, *command: str, timeout: float = 60) -> str:
        if command[0] == "systemctl":
            together.wait()
        return asked_alone(self, node, *command, timeout=timeout)

    monkeypatch.setattr(LocalCluster, "exec_unchecked", exec_unchecked)
    status = collect_status(local)
    assert {line.node for line in status.services} == {"head-0", "train-0", "train-1"}


def test_at_most_a_few_at_once_and_results_in_order() -> None:
    running, most = 0, 0
    lock = threading.Lock()

    def work(item: int, stop: threading.Event) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        return item * 10

    assert at_once(work, list(range(20))) == [i * 10 for i in range(20)]
    assert most == MOST_AT_ONCE


def test_an_interrupt_in_one_piece_is_raised_at_once_and_the_others_told_to_stop() -> None:
    """Pieces still waiting are told to stop; pieces not started yet are dropped."""
    started_pieces: list[int] = []
    told_to_stop: list[int] = []
    lock = threading.Lock()

    def work(item: int, stop: threading.Event) -> int:
        with lock:
            started_pieces.append(item)
        if item == 3:
            raise KeyboardInterrupt
        if stop.wait(20):
            with lock:
                told_to_stop.append(item)
        return item

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        at_once(work, list(range(12)))
    assert time.monotonic() - started < 5
    deadline = time.monotonic() + 5
    while len(told_to_stop) < len(started_pieces) - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert 3 in started_pieces
    assert sorted(told_to_stop) == sorted(p for p in started_pieces if p != 3)
    assert len(started_pieces) <= MOST_AT_ONCE + 1


def test_a_boot_wait_gives_up_once_told_to_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    booting = subprocess.CompletedProcess(["podman"], 1, "starting\n", "")
    monkeypatch.setattr(podman_module, "podman", lambda *args, **_: booting)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(GpuPlatError, match="gave up waiting for its boot"):
        podman_module.wait_systemd("gpuplat-local-head-0", 90, stop)
    assert time.monotonic() - started < 3
