"""Taints of an existing cluster's nodes: the pool's, merged with what other managers set on the live node.

A Node's `spec.taints` is one atomic list under server-side apply: the patch must carry every taint it
wants to keep, so it is built from the live node at deploy time (read under the mocks here)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.k8s.nodes import MANAGED_TAINTS_ANNOTATION, PATCH_FORCE_ANNOTATION, merged_taints
from infra.plan import record as record_module
from infra.plan.record import record
from infra.platform.resolve import ResolvedPlatform

CONTROL_PLANE = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}
OPERATOR = {"key": "nvidia.com/gpu-driver-upgrade", "value": "pending", "effect": "NoSchedule"}
INFERENCE = {"key": "gpuplat/inference", "value": "true", "effect": "NoSchedule"}
TRAINING = {"key": "gpuplat/training", "value": "true", "effect": "NoSchedule"}
RETIRED = {"key": "gpuplat/retired", "value": "true", "effect": "NoSchedule"}


def test_other_managers_taints_stay_and_the_platforms_old_ones_go() -> None:
    live = [CONTROL_PLANE, NOT_READY, OPERATOR, RETIRED, INFERENCE]
    previous = {
        MANAGED_TAINTS_ANNOTATION: json.dumps(["gpuplat/inference:NoSchedule", "gpuplat/retired:NoSchedule"])
    }
    assert merged_taints(live, previous, [INFERENCE]) == [CONTROL_PLANE, OPERATOR, INFERENCE]


def test_a_node_the_platform_never_patched_keeps_all_but_transient_taints() -> None:
    assert merged_taints([CONTROL_PLANE, NOT_READY], {}, []) == [CONTROL_PLANE]


def test_the_patch_carries_the_live_nodes_taints(
    shipped_platforms: dict[str, ResolvedPlatform], monkeypatch: pytest.MonkeyPatch
) -> None:
    """onprem-k8s: gpu-21 (inference pool) carries an operator's taint and the node controller's; the
    patch keeps the operator's, adds the pool's, forces ownership of the list and records its own."""
    answer = record_module._Mocks.new_resource

    def live(self: Any, args: Any) -> tuple[str | None, dict[str, Any]]:
        if args.typ == "kubernetes:core/v1:Node" and args.resource_id:
            return args.resource_id, {
                "metadata": {"name": args.resource_id},
                "spec": {"taints": [OPERATOR, NOT_READY]},
            }
        return answer(self, args)

    monkeypatch.setattr(record_module._Mocks, "new_resource", live)
    recording = record(shipped_platforms["onprem-k8s"])
    patches = {p.name: p.inputs for p in recording.of_type("kubernetes:core/v1:NodePatch")}
    gpu = patches["node-gpu-21"]
    assert gpu["spec"]["taints"] == [OPERATOR, INFERENCE]
    assert gpu["metadata"]["annotations"][PATCH_FORCE_ANNOTATION] == "true"
    assert json.loads(gpu["metadata"]["annotations"][MANAGED_TAINTS_ANNOTATION]) == [
        "gpuplat/inference:NoSchedule"
    ]
    assert patches["node-gpu-01"]["spec"]["taints"] == [OPERATOR, TRAINING]
