"""A vLLM canary on GPUs of its own (issue 48 item 7): the stack's choice (serving.canary.gpus) checked in
the plan, the spare GPU group in each node's canary env file, and a canary that borrows one stable replica's
GPUs as a rolling update with maxSurge 0 does: the replica drained on every gateway and stopped first, the
canary on exactly its GPUs, the replica back in service when the canary goes (rollback: on the champion;
promote: on the new version, the last replica the promote rolls)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.errors import GpuPlatError, SpecError
from infra.nodes.inventory import platform_vars
from infra.platform.resolve import load_platform
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


class GpuNodes:
    """Two gateways and two 2-replica vLLM nodes (replica i on GPU i), as systemd and HAProxy would hold
    them: each unit running or not (a masked unit refuses to start), each gateway's drained servers, the
    files under /etc/gpuplat-inference. Every command is recorded in order."""

    def __init__(self, share: int = 0) -> None:
        self.share = share
        self.done: list[tuple[str, tuple[str, ...]]] = []
        self.files: dict[tuple[str, str], str] = {}
        self.running: set[tuple[str, str]] = set()
        self.masked: set[tuple[str, str]] = set()
        self.drained: set[str] = set()
        for node in SERVERS:
            for replica in (0, 1):
                self.files[(node, f"replica-{replica}.env")] = (
                    f"GPUPLAT_INFERENCE_PORT={8000 + replica}\nCUDA_VISIBLE_DEVICES={replica}\n"
                )
                self.files[(node, f"version-{replica}.env")] = version_environment(embedder(2), "vllm")
                self.running.add((node, str(replica)))
            self.files[(node, "replica-canary.env")] = "GPUPLAT_INFERENCE_PORT=8100\n"

    def up(self, backend: str) -> int:
        slots = ["canary"] if backend == "inference_canary" else ["0", "1"]
        return sum(
            (node, slot) in self.running
            and f"{backend}:c-{node}:{8100 if slot == 'canary' else 8000 + int(slot)}" not in self.drained
            for node in SERVERS
            for slot in slots
        )

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
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
        if words[:2] == ["rm", "-f"]:
            self.files.pop((node, words[-1].rsplit("/", 1)[-1]), None)
            return ""
        if words[0] == "systemctl":
            slot = words[-1].removeprefix(f"{UNIT}@").removesuffix(".service")
            unit = (node, slot)
            if words[1] in ("start", "restart"):
                if unit in self.masked:
                    raise GpuPlatError(f"Failed to start {words[-1]}: Unit {words[-1]} is masked.")
                self.running.add(unit)
            elif words[1] == "stop":
                self.running.discard(unit)
            elif words[1] == "mask":
                self.masked.add(unit)
            elif words[1] == "unmask":
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
        GATEWAYS, SERVERS, {node: f"c-{node}" for node in SERVERS}, "vllm", 1.0, canary_gpus="borrow"
    )

    def healthy(node: str, port: int) -> None:
        slot = "canary" if port == 8100 else str(port - 8000)
        assert (node, slot) in nodes.running, f"{node} {slot} waited for while stopped"

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
    for gateway in GATEWAYS:
        assert nodes.at(gateway, "--backend inference drain", "c-infer-1:8001")[0] < stop
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
    start = nodes.at("infer-1", "systemctl start", f"{UNIT}@1.service")[0]
    assert share_zero < canary_drained < canary_stop < nodes.at("infer-1", "systemctl unmask")[0] < start
    for gateway in GATEWAYS:
        assert nodes.at(gateway, "--backend inference ready", "c-infer-1:8001")[0] > start
    assert nodes.files[("infer-1", "version-1.env")].startswith("# gpuplat serve: embedder@2")
    assert ("infer-1", "version-canary.env") not in nodes.files
    assert nodes.up("inference") == 4 and nodes.up("inference_canary") == 0 and not nodes.masked
    # Only the borrowed replica restarted: the others kept serving the champion.
    assert not [c for _, c in nodes.done if c[:2] == ("systemctl", "restart")]


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
