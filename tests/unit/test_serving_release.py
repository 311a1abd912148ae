"""The pure parts of `gpuplat serve` (infra/serving/release.py): a version's file for a replica, the guard's
window over the gateway's counters, the stacks it refuses. End to end against the serving scenario:
tests/serving/test_serve.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.errors import ExitCode, SpecError
from infra.platform.resolve import load_platform
from infra.serving.canary import VersionStats
from infra.serving.registry.mlflow import ModelVersion, to_wire_source
from infra.serving.release import (
    GatewayFigures,
    ServeRefused,
    serving_layout,
    version_environment,
    window_stats,
)
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


def figures(stable: tuple[int, int], canary: tuple[int, int]) -> GatewayFigures:
    return GatewayFigures.from_show(
        {
            "canary_percent": 20,
            "backends": {
                "inference": {"requests": stable[0], "errors_5xx": stable[1], "servers_up": 2},
                "inference_canary": {"requests": canary[0], "errors_5xx": canary[1], "servers_up": 1},
            },
        }
    )


def test_the_guard_judges_what_happened_between_two_looks() -> None:
    assert window_stats(figures((100, 1), (20, 0)), figures((180, 1), (45, 9))) == (
        VersionStats(80, 0, None),
        VersionStats(25, 9, None),
    )


def test_counters_restarted_by_a_reload_count_from_zero() -> None:
    stable, canary = window_stats(figures((900, 3), (200, 1)), figures((40, 0), (12, 2)))
    assert (stable.requests, canary.requests, canary.errors) == (40, 12, 2)


def test_serve_refuses_a_stack_it_cannot_drive(write_stack: Callable[..., Path]) -> None:
    def no_serving(platform: dict[str, Any]) -> None:
        del platform["serving"]

    with pytest.raises(SpecError, match="serves no model"):
        serving_layout(load_platform(write_stack("local", no_serving)))
    with pytest.raises(
        SpecError, match="is on aws: `gpuplat serve` drives the model servers of local stacks"
    ):
        serving_layout(load_platform(write_stack("aws-prod", lambda _: None)))


def test_the_local_stack_serves_from_its_infer_node_behind_its_head_node(
    shipped_platforms: dict[str, Any],
) -> None:
    layout = serving_layout(shipped_platforms["local"])
    assert (layout.gateways, layout.servers) == (("head-0",), ("infer-0",))
    assert layout.addresses == {"infer-0": "gpuplat-local-infer-0"}


def test_a_canary_needs_a_gpu_the_stable_replicas_leave_free(write_stack: Callable[..., Path]) -> None:
    def vllm(platform: dict[str, Any]) -> None:
        platform["serving"].update(engine="vllm", model="/shared/models/llama-3.1-8b")

    with pytest.raises(ServeRefused, match="pool 'infer' has no GPU left for a canary"):
        serving_layout(load_platform(write_stack("local", vllm)))


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
