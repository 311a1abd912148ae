"""A vLLM canary on GPUs of its own (issue 48 item 7): the stack's choice (serving.canary.gpus) checked in
the plan, the spare GPU group in each node's canary env file, and a canary that borrows one stable replica's
GPUs as a rolling update with maxSurge 0 does: the replica drained on every gateway and stopped first, the
canary on exactly its GPUs, the replica back in service when the canary goes (rollback: on the champion;
promote: on the new version, the last replica the promote rolls)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from infra.errors import GpuPlatError, SpecError
from infra.nodes.inventory import platform_vars
from infra.platform.resolve import load_platform
from infra.serving import stopped_mark
from infra.serving.registry.mlflow import ModelVersion, to_wire_source
from infra.serving.release import (
    Release,
    ServeRefused,
    ServingLayout,
    serving_layout,
    version_environment,
)

GATEWAYS = ("gw-0", "gw-1")
SERVERS = ("infer-0", "infer-1")
UNIT = "gpuplat-inference"


def embedder(number: int) -> ModelVersion:
    return ModelVersion("embedder", number, to_wire_source(f"/shared/models/embedder/{number}"), "READY")


def vllm_stack(write_stack: Callable[..., Path], gpus: str | None = None) -> Path:
    """The shipped on-premises stack (one 8-GPU HGX H100 host, an 8B model: 8 replicas of 1 GPU)."""

    def edit(platform: dict[str, Any]) -> None:
        if gpus is not None:
            platform["serving"]["canary"] = {"gpus": gpus}
        platform["serving"].update(model_params_b=8)

    return write_stack("onprem", edit)


def test_a_vllm_canary_borrows_a_replica_by_default_and_serve_drives_the_stack(
    write_stack: Callable[..., Path],
) -> None:
    """Before: `serve` refused every vLLM stack whose replicas take every GPU (all of them: the layout gives
    each node GPUs / tensor-parallel replicas), `status` and `rollback` included."""
    platform = load_platform(vllm_stack(write_stack))
    assert platform.serving_layout is not None and platform.serving_layout.replicas == 8
    assert serving_layout(platform).canary_gpus == "borrow"
    assert platform_vars(platform)["inference_canary_gpus"] == ""


def test_a_spare_canary_keeps_one_gpu_group_of_each_node_and_the_role_names_it(
    write_stack: Callable[..., Path],
) -> None:
    platform = load_platform(vllm_stack(write_stack, gpus="spare"))
    layout = platform.serving_layout
    assert layout is not None
    assert (layout.replicas, layout.devices[-1], layout.canary_devices) == (7, "6", "7")
    assert serving_layout(platform).canary_gpus == "spare"
    values = platform_vars(platform)
    assert (values["inference_replicas_per_node"], values["inference_canary_gpus"]) == (7, "7")


@pytest.mark.parametrize("gpus", ["spare", "borrow"])
def test_a_canary_choice_that_leaves_the_stable_version_no_replica_is_refused_in_the_plan(
    write_stack: Callable[..., Path], gpus: str
) -> None:
    """One host whose 8 GPUs make one replica (tensor parallel 8): spare leaves it no stable replica,
    borrow would take its only one."""

    def edit(platform: dict[str, Any]) -> None:
        platform["serving"].update(model_params_b=8, tensor_parallel=8, canary={"gpus": gpus})

    with pytest.raises(SpecError) as refused:
        load_platform(write_stack("onprem", edit))
    text = refused.value.message
    assert "serving.canary.gpus" in text and "neither choice fits" in text, text


def test_spare_on_one_group_per_node_points_at_borrow_where_the_pool_has_two_nodes(
    write_stack: Callable[..., Path],
) -> None:
    """aws-prod's g6e.xlarge (one L4 each), two nodes at least: spare cannot fit, borrow can, and the
    refusal says so."""

    def edit(platform: dict[str, Any]) -> None:
        platform["serving"]["canary"] = {"gpus": "spare"}

    with pytest.raises(SpecError, match=r"set serving.canary.gpus to borrow"):
        load_platform(write_stack("aws-prod", edit))
    assert load_platform(write_stack("aws-prod", lambda _: None)).serving_layout.canary == "borrow"  # type: ignore[union-attr]


class Killed(BaseException):
    """SIGKILL of the command between two of its steps (no handler of the command runs)."""


class GpuNodes:
    """Two gateways and two 2-replica vLLM nodes (replica i on GPU i), as systemd and HAProxy would hold
    them: each unit running or not (a masked unit refuses to start), each gateway's drained servers, the
    files under /etc/gpuplat-inference. Every command is recorded in order."""

    def __init__(self, share: int = 0, servers: tuple[str, ...] = SERVERS) -> None:
        self.share = share
        self.servers = servers
        self.done: list[tuple[str, tuple[str, ...]]] = []
        self.files: dict[tuple[str, str], str] = {}
        self.running: set[tuple[str, str]] = set()
        self.masked: set[tuple[str, str]] = set()
        self.drained: set[str] = set()
        self.marks: set[tuple[str, str]] = set()
        """the replicas each node's textfile collector directory marks stopped on purpose"""
        self.serving: dict[tuple[str, str], str] = {}
        """what each running unit serves: its version file's first line when it (re)started"""
        self.kill_before: int | None = None
        """the command (counted from 0) before which the command driving these nodes is killed"""
        for node in servers:
            for replica in (0, 1):
                self.files[(node, f"replica-{replica}.env")] = (
                    f"GPUPLAT_INFERENCE_PORT={8000 + replica}\nCUDA_VISIBLE_DEVICES={replica}\n"
                )
                self.files[(node, f"version-{replica}.env")] = version_environment(embedder(2), "vllm")
                self._start(node, str(replica))
            self.files[(node, "replica-canary.env")] = "GPUPLAT_INFERENCE_PORT=8100\n"

    def gpus(self, node: str, slot: str) -> set[str]:
        """The unit's CUDA_VISIBLE_DEVICES as systemd gives it: its version file's over its replica file's."""
        found = ""
        for name in (f"replica-{slot}.env", f"version-{slot}.env"):
            for line in self.files.get((node, name), "").splitlines():
                if line.startswith("CUDA_VISIBLE_DEVICES="):
                    found = line.partition("=")[2]
        return set(found.split(",")) - {""}

    def _start(self, node: str, slot: str) -> None:
        """A vLLM server takes gpu_memory_fraction of each of its GPUs: one beside another fails to start."""
        for other_node, other in self.running:
            if other_node == node and other != slot and self.gpus(node, other) & self.gpus(node, slot):
                raise GpuPlatError(f"{node} {slot}: CUDA out of memory (GPUs held by {other})")
        self.running.add((node, slot))
        self.serving[(node, slot)] = self.files.get((node, f"version-{slot}.env"), "").partition("\n")[0]

    def reboot(self, node: str) -> None:
        """The node restarts: runtime masks are gone, the enabled replicas start (the canary slot is not
        enabled: `gpuplat serve` starts it), the gateways keep their state."""
        self.masked = {unit for unit in self.masked if unit[0] != node}
        self.running = {unit for unit in self.running if unit[0] != node}
        # The role's tmpfiles.d line removes the marks at boot (run in tests/roles/test_serving_templates.py).
        self.marks = {unit for unit in self.marks if unit[0] != node}
        for replica in ("0", "1"):
            self._start(node, replica)

    def up(self, backend: str) -> int:
        slots = ["canary"] if backend == "inference_canary" else ["0", "1"]
        return sum(
            (node, slot) in self.running
            and f"{backend}:c-{node}:{8100 if slot == 'canary' else 8000 + int(slot)}" not in self.drained
            for node in self.servers
            for slot in slots
        )

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        if self.kill_before is not None and len(self.done) >= self.kill_before:
            raise Killed(f"killed before {node}: {' '.join(command)[:80]}")
        self.done.append((node, command))
        words = list(command)
        if words[0] == "ls":
            return " ".join(name for (n, name) in self.files if n == node)
        if words[:2] == ["sh", "-c"] and words[-1].startswith("/etc/"):
            name = words[-1].rsplit("/", 1)[-1]
            if words[2].startswith("cat"):
                return self.files.get((node, name), "")
            self.files[(node, name)] = words[-2]
            return ""
        if words[:3] in (["sh", "-c", stopped_mark.WRITE], ["sh", "-c", stopped_mark.REMOVE]):
            assert words[4] == stopped_mark.RECORD, words  # the directory the role recorded on the node
            replica = next(str(n) for n in range(2) if words[5] == stopped_mark.mark_file(n))
            (self.marks.add if words[2] == stopped_mark.WRITE else self.marks.discard)((node, replica))
            return ""
        if words[:2] == ["rm", "-f"]:
            self.files.pop((node, words[-1].rsplit("/", 1)[-1]), None)
            return ""
        if words[0] == "systemctl":
            slot = words[-1].removeprefix(f"{UNIT}@").removesuffix(".service")
            unit = (node, slot)
            if words[1] in ("start", "restart"):
                if unit in self.masked:
                    raise GpuPlatError(f"Failed to start {words[-1]}: Unit {words[-1]} is masked.")
                if words[1] == "restart" or unit not in self.running:  # start: a no-op on a running unit
                    self.running.discard(unit)
                    self._start(node, slot)
            elif words[1] == "stop":
                self.running.discard(unit)
            elif words[1] == "mask":
                self.masked.add(unit)
            elif words[1] == "unmask" and "--runtime" in words:
                # A plain unmask removes masks in /etc only: the runtime mask stays (systemd 240 and later).
                self.masked.discard(unit)
            return ""
        if words[:2] == ["python3", "-c"] and len(words) == 5:  # the golden probe (path, port): no golden set
            return json.dumps({"absent": True})
        if words[-1] == "show" or "share" in words:
            if "share" in words:
                self.share = int(words[-1])
            backends = {
                name: {"requests": 0, "errors": 0, "errors_5xx": 0, "servers_up": self.up(name)}
                for name in ("inference", "inference_canary")
            }
            return json.dumps({"canary_percent": self.share, "backends": backends})
        if "--backend" in words:
            backend, action, target = words[words.index("--backend") + 1 : words.index("--backend") + 4]
            if action == "drain":
                self.drained.add(f"{backend}:{target}")
            else:
                self.drained.discard(f"{backend}:{target}")
            return ""
        return ""

    def at(self, node: str, *words: str) -> list[int]:
        return [i for i, (n, c) in enumerate(self.done) if n == node and all(w in " ".join(c) for w in words)]


def borrowing(nodes: GpuNodes, aliases: dict[str, ModelVersion]) -> Release:
    release = object.__new__(Release)
    release.nodes = nodes
    release.say = lambda line: None
    release.layout = ServingLayout(
        GATEWAYS,
        nodes.servers,
        {node: f"c-{node}" for node in nodes.servers},
        "vllm",
        1.0,
        canary_gpus="borrow",
    )

    def healthy(node: str, port: int) -> None:
        slot = "canary" if port == 8100 else str(port - 8000)
        assert (node, slot) in nodes.running, f"{node} {slot} waited for while stopped"
        nodes.done.append((node, ("/health", str(port))))

    release._wait_healthy = healthy  # type: ignore[method-assign]
    release.aliased = lambda model, alias: aliases.get(alias)  # type: ignore[method-assign]
    release.record = lambda *arguments, **named: None  # type: ignore[method-assign]

    class Registry:
        def set_alias(self, model: str, alias: str, number: int) -> None:
            aliases[alias] = embedder(number)

        def delete_alias(self, model: str, alias: str) -> None:
            aliases.pop(alias, None)

    release.registry = Registry()  # type: ignore[assignment]
    return release


def test_a_borrowing_canary_runs_on_one_drained_and_stopped_replicas_gpus() -> None:
    """The last replica of the last node (the one a promote reaches last): drained on every gateway before
    it stops, masked so that a converge cannot start it on the canary's GPUs, and the canary started there
    alone with that replica's CUDA_VISIBLE_DEVICES; the other node starts no canary (its GPUs are busy)."""
    nodes = GpuNodes()
    release = borrowing(nodes, {"champion": embedder(2)})
    release.start_canary(embedder(3))
    stop = nodes.at("infer-1", "systemctl stop", f"{UNIT}@1.service")[0]
    # Marked stopped on purpose for the alerts (no InferenceServerDown page) once it stopped, not before:
    # a kill in between would leave a running replica marked (test_a_mark_silences_only_a_stopped_replica...).
    marked = nodes.at("infer-1", stopped_mark.RECORD, stopped_mark.mark(1, "loan"))
    for gateway in GATEWAYS:
        assert nodes.at(gateway, "--backend inference drain", "c-infer-1:8001")[0] < stop < marked[0]
    assert nodes.marks == {("infer-1", "1")}
    assert ("infer-1", "1") in nodes.masked and ("infer-1", "1") not in nodes.running
    canary = nodes.files[("infer-1", "version-canary.env")].splitlines()
    assert canary[0] == "# gpuplat serve: embedder@3"
    assert "# gpuplat borrows replica: 1" in canary and canary[-1] == "CUDA_VISIBLE_DEVICES=1"
    assert stop < nodes.at("infer-1", "systemctl restart", "@canary.service")[0]
    assert not nodes.at("infer-0", "@canary.service") and ("infer-0", "version-canary.env") not in nodes.files
    assert nodes.up("inference") == 3 and nodes.up("inference_canary") == 1


def test_a_rollback_stops_the_borrowing_canary_then_gives_the_replica_back_on_the_champion() -> None:
    nodes = GpuNodes()
    aliases = {"champion": embedder(2)}
    release = borrowing(nodes, aliases)
    release.start_canary(embedder(3))
    aliases["challenger"] = embedder(3)
    release.set_share(20)
    nodes.done.clear()
    assert release.rollback("embedder") == embedder(2)
    share_zero = nodes.at("gw-0", "share 0")[0]
    canary_drained = nodes.at("gw-1", "--backend inference_canary drain", "c-infer-1:8100")[0]
    canary_stop = nodes.at("infer-1", "systemctl stop", "@canary.service")[0]
    start = nodes.at("infer-1", "systemctl restart", f"{UNIT}@1.service")[0]
    assert share_zero < canary_drained < canary_stop < nodes.at("infer-1", "systemctl unmask")[0] < start
    healthy = nodes.at("infer-1", "/health 8001")[0]
    unmarked = nodes.at("infer-1", "rm -f", stopped_mark.RECORD, stopped_mark.mark_file(1))
    for gateway in GATEWAYS:
        ready = nodes.at(gateway, "--backend inference ready", "c-infer-1:8001")[0]
        assert ready > unmarked[0] > healthy > start  # pages again if it dies, once it answers
    assert nodes.files[("infer-1", "version-1.env")].startswith("# gpuplat serve: embedder@2")
    assert ("infer-1", "version-canary.env") not in nodes.files
    assert nodes.up("inference") == 4 and nodes.up("inference_canary") == 0 and not nodes.masked
    # Only the borrowed replica restarted: the others kept serving the champion.
    restarted = [(n, c[-1]) for n, c in nodes.done if c[:2] == ("systemctl", "restart")]
    assert restarted == [("infer-1", f"{UNIT}@1.service")]


def test_a_promote_rolls_the_other_replicas_then_hands_the_canarys_gpus_back_on_the_new_version() -> None:
    nodes = GpuNodes()
    aliases = {"champion": embedder(2)}
    release = borrowing(nodes, aliases)
    release.start_canary(embedder(3))
    aliases["challenger"] = embedder(3)
    release.set_share(20)
    nodes.done.clear()
    release.promote("embedder")
    rolled = [
        (n, c[-1]) for n, c in nodes.done if c[:2] in (("systemctl", "restart"), ("systemctl", "start"))
    ]
    assert rolled == [
        ("infer-0", f"{UNIT}@0.service"),
        ("infer-0", f"{UNIT}@1.service"),
        ("infer-1", f"{UNIT}@0.service"),
        ("infer-1", f"{UNIT}@1.service"),  # the borrowed one, last: started once the canary stopped
    ]
    assert (
        nodes.at("infer-1", "systemctl stop", "@canary.service")[0] < nodes.at("infer-1", "start", "@1.")[0]
    )
    for node in SERVERS:
        for replica in (0, 1):
            assert nodes.files[(node, f"version-{replica}.env")].startswith("# gpuplat serve: embedder@3")
    assert nodes.share == 0 and nodes.up("inference") == 4 and aliases["champion"] == embedder(3)


def test_a_canary_that_does_not_come_up_gives_the_borrowed_replica_back() -> None:
    nodes = GpuNodes()
    release = borrowing(nodes, {"champion": embedder(2)})

    def never(node: str, port: int) -> None:
        if port == 8100:
            raise GpuPlatError("the model server on infer-1:8100 did not answer /health")

    release._wait_healthy = never  # type: ignore[method-assign]
    with pytest.raises(GpuPlatError, match="did not answer"):
        release.start_canary(embedder(3))
    assert ("infer-1", "1") in nodes.running and not nodes.masked
    assert nodes.files[("infer-1", "version-1.env")].startswith("# gpuplat serve: embedder@2")
    assert ("infer-1", "version-canary.env") not in nodes.files and nodes.up("inference") == 4


def test_borrowing_the_last_stable_server_up_is_refused_before_any_change() -> None:
    nodes = GpuNodes()
    for unit in [("infer-0", "0"), ("infer-0", "1"), ("infer-1", "0")]:
        nodes.running.discard(unit)
    release = borrowing(nodes, {"champion": embedder(2)})
    with pytest.raises(ServeRefused, match=r"count 1 stable server\(s\) up: borrowing replica 1 on infer-1"):
        release.start_canary(embedder(3))
    assert not [c for _, c in nodes.done if c[0] == "systemctl" or "drain" in c]


def test_the_golden_set_is_asked_of_the_borrowing_canary_alone() -> None:
    """The other node runs no canary: asking its canary slot would fail the deploy of a good version."""
    nodes = GpuNodes()
    release = borrowing(nodes, {"champion": embedder(2)})
    release.start_canary(embedder(3))
    nodes.done.clear()
    release.probe_golden(embedder(3))  # no golden set: said, and passed
    asked = {n for n, c in nodes.done if c[:2] == ("python3", "-c")}
    assert asked == {"infer-1"}


def test_serving_canary_gpus_on_a_kubernetes_stack_is_refused(write_stack: Callable[..., Path]) -> None:
    def edit(platform: dict[str, Any]) -> None:
        platform["serving"]["canary"] = {"gpus": "spare"}

    with pytest.raises(SpecError, match=r"on Kubernetes a canary is a workload of its own"):
        load_platform(write_stack("aws-k8s", edit))


def test_status_says_which_replica_lent_its_gpus_to_the_canary() -> None:
    nodes = GpuNodes()
    release = borrowing(nodes, {"champion": embedder(2)})
    release.start_canary(embedder(3))
    lent = [(r.node, r.slot) for r in release.replicas_serving() if r.lent]
    assert lent == [("infer-1", "1")]


def _steps_of_a_borrow(servers: tuple[str, ...]) -> int:
    """How many commands a borrowing canary's start sends (each a step a kill may come before)."""
    nodes = GpuNodes(servers=servers)
    borrowing(nodes, {"champion": embedder(2)}).start_canary(embedder(3))
    return len(nodes.done)


@pytest.mark.parametrize("servers", [SERVERS, ("infer-1",)], ids=["2 nodes", "1 node of 2 replicas"])
def test_a_deploy_killed_at_any_step_of_a_borrow_leaves_a_record_and_the_next_deploy_and_rollback_finish_it(
    servers: tuple[str, ...],
) -> None:
    """SIGKILL before each command of a borrowing canary's start. Whatever the kill left (the replica
    drained, stopped or masked), the canary's version file names the loan, so `status` shows it and the
    next deploy takes the same replica again (the pool's other replica alone up does not refuse it), runs
    the canary on its GPUs alone, and a rollback gives it back. Before: the loan was recorded only after
    the replica was drained, stopped and masked; a kill in between left it out of service until the
    node's next boot, unseen by `status` and `rollback`, and where the pool had 2 replicas every later
    deploy was refused (1 stable server up)."""
    for kill in range(_steps_of_a_borrow(servers)):
        nodes = GpuNodes(servers=servers)
        aliases = {"champion": embedder(2)}
        nodes.kill_before = kill
        with pytest.raises(Killed):
            borrowing(nodes, aliases).start_canary(embedder(3))
        nodes.kill_before = None
        release = borrowing(nodes, aliases)
        lent = ("infer-1", "1")
        out = lent not in nodes.running or lent in nodes.masked or "inference:c-infer-1:8001" in nodes.drained
        assert not out or release.borrowed_replicas() == {"infer-1": 1}, f"kill before command {kill}"
        release.start_canary(embedder(3))  # the deploy again
        assert ("infer-1", "1") not in nodes.running and ("infer-1", "1") in nodes.masked, kill
        assert nodes.gpus("infer-1", "canary") == {"1"} and ("infer-1", "canary") in nodes.running, kill
        aliases["challenger"] = embedder(3)
        release.rollback("embedder")
        assert nodes.up("inference") == 2 * len(servers) and not nodes.masked, f"kill before command {kill}"
        assert ("infer-1", "version-canary.env") not in nodes.files


@pytest.mark.parametrize("servers", [SERVERS, ("infer-1",)], ids=["2 nodes", "1 node of 2 replicas"])
def test_a_mark_silences_only_a_stopped_replica_whatever_step_a_borrow_is_killed_before(
    servers: tuple[str, ...],
) -> None:
    """InferenceServerDown does not page for a replica its node marks stopped on purpose: a replica that
    runs must never have the mark, or it is not paged for when it dies. SIGKILL before each command of a
    borrowing canary's start; then the node's reboot (the runtime mask gone, the replica started at boot).
    Before: the mark was written before the drain and the stop, so a borrow killed in between left the
    running replica marked until a rollback or deploy; and the mark, on disk, outlived a reboot."""
    for kill in range(_steps_of_a_borrow(servers) + 1):
        nodes = GpuNodes(servers=servers)
        nodes.kill_before = kill
        with contextlib.suppress(Killed):
            borrowing(nodes, {"champion": embedder(2)}).start_canary(embedder(3))
        assert not nodes.marks & nodes.running, f"kill before command {kill}: {nodes.marks} run"
        nodes.kill_before = None
        nodes.reboot("infer-1")
        assert ("infer-1", "1") in nodes.running and not nodes.marks, f"kill before command {kill}"
        # The next deploy takes the replica again, and marks it once stopped.
        borrowing(nodes, {"champion": embedder(2)}).start_canary(embedder(3))
        assert nodes.marks == {("infer-1", "1")} and ("infer-1", "1") not in nodes.running, kill


def test_a_give_back_killed_at_any_step_or_failing_its_health_leaves_no_running_replica_marked() -> None:
    """The mark goes once the given-back replica answers, before the gateways' ready, and where it never
    answers: a replica that runs, or is meant to, pages if it dies. Before: the mark went after the
    gateways' ready, so a give-back killed in between, or one whose replica failed its health wait, left a
    running replica silenced until the next deploy or rollback."""
    aliases = {"champion": embedder(2)}
    probe = GpuNodes()
    borrowing(probe, aliases).start_canary(embedder(3))
    probe.done.clear()
    borrowing(probe, aliases).rollback("embedder")
    for kill in range(len(probe.done) + 1):
        nodes = GpuNodes()
        borrowing(nodes, aliases).start_canary(embedder(3))
        nodes.done.clear()
        nodes.kill_before = kill
        with contextlib.suppress(Killed):
            borrowing(nodes, aliases).rollback("embedder")
        healthy = nodes.at("infer-1", "/health 8001")
        if healthy and len(nodes.done) > healthy[0] + 1:
            assert not nodes.marks & nodes.running, f"kill before command {kill}: {nodes.marks} run"
    sick = GpuNodes()
    borrowing(sick, aliases).start_canary(embedder(3))
    giving_back = borrowing(sick, aliases)

    def never_healthy(node: str, port: int) -> None:
        raise GpuPlatError(f"{node}: the replica on port {port} never answered /health")

    giving_back._wait_healthy = never_healthy  # type: ignore[method-assign]
    with pytest.raises(GpuPlatError, match="never answered"):
        giving_back.rollback("embedder")
    assert ("infer-1", "1") in sick.running and not sick.marks


def test_a_node_rebooted_while_its_replica_is_lent_never_runs_the_canary_beside_it() -> None:
    """The runtime mask is gone after a reboot and the enabled replica starts on its GPUs again (the
    canary slot does not start at boot). A deploy that finds the loan's record takes the replica out
    again before the canary starts on its GPUs. Before: it reused the record as it was and started the
    canary on GPUs the replica held (vLLM: out of memory), failing the deploy."""
    nodes = GpuNodes()
    aliases = {"champion": embedder(2)}
    borrowing(nodes, aliases).start_canary(embedder(3))
    nodes.reboot("infer-1")
    assert ("infer-1", "1") in nodes.running and ("infer-1", "canary") not in nodes.running
    release = borrowing(nodes, aliases)
    release.start_canary(embedder(4))  # a deploy of the next version: the record names the loan
    assert ("infer-1", "1") not in nodes.running and ("infer-1", "1") in nodes.masked
    assert nodes.serving[("infer-1", "canary")] == "# gpuplat serve: embedder@4"


def _in_canary(nodes: GpuNodes, aliases: dict[str, ModelVersion]) -> Release:
    """embedder@3 in canary at 20 % on replica 1 of infer-1's GPUs, champion embedder@2."""
    release = borrowing(nodes, aliases)
    release.start_canary(embedder(3))
    aliases["challenger"] = embedder(3)
    release.set_share(20)
    return release


@pytest.mark.parametrize("cut", ["reboot", "killed promote"])
def test_the_replica_given_back_serves_the_version_its_file_names_where_it_runs_already(cut: str) -> None:
    """A replica found running when the canary gives its GPUs back (its node rebooted; a promote killed
    after it restarted the replica on the new version but before the loan's record was removed) is
    restarted on the version the give-back writes, not left on what it ran: `systemctl start` of a running
    unit does nothing. Before: a promote after the reboot reported every replica on the new version while
    the lent one served the old; a rollback after the killed promote left it on the rolled-back version."""
    nodes, aliases = GpuNodes(), {"champion": embedder(2)}
    release = _in_canary(nodes, aliases)
    if cut == "reboot":
        nodes.reboot("infer-1")
        nodes.drained.discard("inference:c-infer-1:8001")  # and a gateway's reload put it back in service
        before = len(nodes.done)
        borrowing(nodes, aliases).promote("embedder")
        restart = nodes.at("infer-1", "systemctl restart", f"{UNIT}@1.service")[-1]
        for gateway in GATEWAYS:  # its requests in flight answered before the restart
            assert before < nodes.at(gateway, "--backend inference drain", "c-infer-1:8001")[-1] < restart
        wanted = "# gpuplat serve: embedder@3"
    else:
        twin, twin_aliases = GpuNodes(), {"champion": embedder(2)}
        twin_release = _in_canary(twin, twin_aliases)
        before = len(twin.done)
        twin_release.promote("embedder")
        record_removed = next(
            i
            for i, (node, command) in enumerate(twin.done)
            if i >= before and node == "infer-1" and command[:2] == ("rm", "-f") and "canary" in command[-1]
        )
        nodes.kill_before = record_removed
        with pytest.raises(Killed):
            release.promote("embedder")
        nodes.kill_before = None
        assert nodes.serving[("infer-1", "1")] == "# gpuplat serve: embedder@3"
        assert borrowing(nodes, aliases).borrowed_replicas() == {"infer-1": 1}
        borrowing(nodes, aliases).rollback("embedder")
        wanted = "# gpuplat serve: embedder@2"
    for node in SERVERS:
        for replica in ("0", "1"):
            assert nodes.files[(node, f"version-{replica}.env")].startswith(wanted)
            assert nodes.serving[(node, replica)] == wanted, (node, replica)
    assert nodes.up("inference") == 4 and not nodes.masked


def test_a_loan_record_an_editor_left_trailing_blanks_or_a_carriage_return_on_is_still_read() -> None:
    """An operator who opened the canary's version file (a Windows editor's CRLF, a trailing space) must
    not hide the loan: a rollback would remove the record and leave the replica stopped and masked until
    the next boot. Before: the line's number had to be digits to its end."""
    nodes = GpuNodes()
    aliases = {"champion": embedder(2)}
    borrowing(nodes, aliases).start_canary(embedder(3))
    path = ("infer-1", "version-canary.env")
    nodes.files[path] = nodes.files[path].replace("replica: 1\n", "replica: 1 \r\n")
    aliases["challenger"] = embedder(3)
    borrowing(nodes, aliases).rollback("embedder")
    assert nodes.up("inference") == 4 and not nodes.masked


def _switched_to_spare(nodes: GpuNodes, aliases: dict[str, ModelVersion]) -> Release:
    """The stack file edited from borrow to spare while a borrowing canary runs (the role refuses to apply
    that layout until the loan ends: tests/roles/test_replica_loan.py): `gpuplat serve` reads the new file."""
    release = borrowing(nodes, aliases)
    release.layout = replace(release.layout, canary_gpus="spare")
    return release


def test_a_rollback_gives_the_lent_replica_back_after_the_stack_switched_to_spare() -> None:
    """The refusal of the switch says `gpuplat serve rollback`: it must end the loan under the new stack
    file. Before: the loan was read only where the stack said borrow; the rollback removed the record and
    left the replica masked and stopped until the node's next boot."""
    nodes, aliases = GpuNodes(), {"champion": embedder(2)}
    _in_canary(nodes, aliases)
    release = _switched_to_spare(nodes, aliases)
    assert release.borrowed_replicas() == {"infer-1": 1}
    release.rollback("embedder")
    assert ("infer-1", "1") in nodes.running and not nodes.masked and nodes.up("inference") == 4
    assert nodes.serving[("infer-1", "1")] == "# gpuplat serve: embedder@2"
    assert ("infer-1", "version-canary.env") not in nodes.files


def test_a_canary_on_every_node_is_refused_while_a_loan_is_recorded() -> None:
    """A deploy under the spare stack file while the borrow's record stands (its golden set refused, a
    command killed): before, it wrote a canary version file on every node over the record (the replica left
    masked and stopped, nothing left to give it back) and started canaries beside the replicas."""
    nodes, aliases = GpuNodes(), {"champion": embedder(2)}
    borrowing(nodes, aliases).start_canary(embedder(3))
    files = dict(nodes.files)
    nodes.done.clear()
    with pytest.raises(ServeRefused) as refused:
        _switched_to_spare(nodes, aliases).start_canary(embedder(4))
    text = refused.value.message
    assert "replica 1 on infer-1 is lent to a canary" in text and "`gpuplat serve rollback embedder`" in text
    assert nodes.files == files and not [c for _, c in nodes.done if c[0] != "sh"]  # read, nothing written


@pytest.mark.parametrize("switched", [False, True], ids=["borrow", "switched to spare"])
def test_a_rollback_ends_a_loan_a_deploy_killed_before_its_alias_left(switched: bool) -> None:
    """A deploy killed after the borrow but before the registry's challenger alias moved (during the golden
    probe, the wait for the gateways' checks: minutes) leaves the loan's record and no canary alias. The
    refusal of a deploy under the spare stack file, and the role's refusal of the new layout, both say
    `gpuplat serve rollback`: it ends the loan, the stable version as it was. Before: the rollback took the
    no-canary path, refused 'no canary and no previous version' (and, with a previous version, rolled every
    stable replica back to it, or under spare refused again with the same advice): the loan stood."""
    nodes, aliases = GpuNodes(), {"champion": embedder(2)}
    borrowing(nodes, aliases).start_canary(embedder(3))  # killed here: no challenger alias
    release = _switched_to_spare(nodes, aliases) if switched else borrowing(nodes, aliases)
    assert release.rollback("embedder") == embedder(2)
    assert ("infer-1", "1") in nodes.running and not nodes.masked and nodes.up("inference") == 4
    assert ("infer-1", "version-canary.env") not in nodes.files and ("infer-1", "canary") not in nodes.running
    assert {nodes.serving[(node, r)] for node in SERVERS for r in "01"} == {"# gpuplat serve: embedder@2"}
    assert aliases == {"champion": embedder(2)}


def test_a_rollback_after_a_killed_deploy_does_not_roll_the_stable_back_to_the_previous_version() -> None:
    nodes, aliases = GpuNodes(), {"champion": embedder(2), "previous": embedder(1)}
    borrowing(nodes, aliases).start_canary(embedder(3))
    borrowing(nodes, aliases).rollback("embedder")
    assert {nodes.serving[(node, r)] for node in SERVERS for r in "01"} == {"# gpuplat serve: embedder@2"}
    assert aliases["champion"] == embedder(2) and not nodes.masked


def test_a_rollback_of_another_model_leaves_a_loan_a_killed_deploy_left() -> None:
    nodes, aliases = GpuNodes(), {"champion": embedder(2)}
    borrowing(nodes, aliases).start_canary(embedder(3))
    with pytest.raises(ServeRefused):
        borrowing(nodes, aliases).rollback("reranker")
    assert ("infer-1", "1") in nodes.masked and ("infer-1", "version-canary.env") in nodes.files


def test_the_refusal_of_a_canary_on_every_node_names_the_model_whose_canary_holds_the_loan() -> None:
    nodes, aliases = GpuNodes(), {"champion": embedder(2)}
    borrowing(nodes, aliases).start_canary(embedder(3))
    other = ModelVersion("reranker", 1, to_wire_source("/shared/models/reranker/1"), "READY")
    with pytest.raises(ServeRefused) as refused:
        _switched_to_spare(nodes, aliases).start_canary(other)
    assert "`gpuplat serve rollback embedder`" in refused.value.message, refused.value.message


def test_the_stopped_mark_is_written_whole_under_a_name_node_exporter_does_not_read(tmp_path: Path) -> None:
    """node_exporter's textfile collector reads every *.prom at each scrape (collector/textfile.go): the
    mark is written under another name and renamed, so that no scrape reads half of it. `mv` is replaced by
    one that records the *.prom files present when it is called. The directory is the one the role recorded
    on the node (node_exporter's), not a default of release.py's: before, a stack that set
    node_exporter_textfile_dir alone had its loans marked where node_exporter does not read."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "seen"
    (bin_dir / "mv").write_text(
        f'#!/bin/sh\nls "$(dirname "$2")" | grep "\\.prom$" > {seen}\nexec /bin/mv "$@"\n'
    )
    (bin_dir / "mv").chmod(0o755)
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    record = tmp_path / "textfile-dir"
    record.write_text(f"{textfile}\n")
    command = list(stopped_mark.write_command(1, "loan"))
    command[4] = str(record)
    environment = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(command, check=True, env=environment)
    assert seen.read_text() == "", "a *.prom file existed before the rename"
    assert (textfile / stopped_mark.mark_file(1)).read_text() == stopped_mark.mark(1, "loan")
    assert [p.name for p in textfile.iterdir()] == [stopped_mark.mark_file(1)]
    subprocess.run([*stopped_mark.remove_command(1)[:4], str(record), stopped_mark.mark_file(1)], check=True)
    assert list(textfile.iterdir()) == []
    # No record (a node without node_exporter, or not converged since): nothing written, no failure.
    record.unlink()
    subprocess.run(command, check=True, env=environment)
    assert list(textfile.iterdir()) == [] and list(tmp_path.glob("*.prom")) == []
