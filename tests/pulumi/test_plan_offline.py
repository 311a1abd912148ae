"""The real Pulumi program under the SDK's mocks, for every shipped stack."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from infra.plan.record import record
from infra.plan.report import build_report
from infra.platform.resolve import ResolvedPlatform


@pytest.mark.parametrize("stack", ["local", "onprem"])
def test_host_backends_declare_one_component_per_pool(
    stack: str, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    platform = shipped_platforms[stack]
    recording = record(platform)
    pools = recording.of_type(f"gpu-platform:{stack}:HostPool")
    assert sorted(r.name for r in pools) == sorted(p.name for p in platform.pools)
    assert recording.outputs["backend"] == stack
    assert set(recording.outputs["hosts"]["train"]) == set(platform.pool("train").node_names())


def test_recording_twice_in_one_process_is_identical(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    first = record(shipped_platforms["aws-prod"])
    second = record(shipped_platforms["aws-prod"])
    assert [(r.type, r.name, r.inputs) for r in first.resources] == [
        (r.type, r.name, r.inputs) for r in second.resources
    ]
    assert first.outputs == second.outputs


@pytest.mark.parametrize("enabled", [True, False])
def test_recording_leaves_the_garbage_collector_as_it_found_it(
    enabled: bool, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    """record() pauses cyclic collection while the program runs (infra/plan/record.py), and gives it back
    as it was, also when the program fails."""

    def failing(platform: ResolvedPlatform) -> dict[str, Any]:
        assert not gc.isenabled(), "no collection while the program runs"
        raise RuntimeError("the program failed")

    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        record(shipped_platforms["local"])
        assert gc.isenabled() is enabled
        with pytest.raises(Exception, match="the program failed"):
            record(shipped_platforms["local"], failing)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_recording_skips_the_sdks_stack_walk_and_gives_it_back(
    shipped_platforms: dict[str, ResolvedPlatform], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK walks the whole Python stack at each resource it registers, for a source position the
    recording never reads (a third of a plan's CPU under the CLI's or a test's stack): record() does not
    walk it, and the SDK has its walk back after a run that failed as after one that passed."""
    from pulumi.runtime import resource as sdk_resource

    walks: list[int] = []
    walk = sdk_resource._get_stack_trace

    def counted() -> Any:
        walks.append(1)
        return walk()

    monkeypatch.setattr(sdk_resource, "_get_stack_trace", counted)
    recording = record(shipped_platforms["aws-prod"])
    assert len(recording.resources) > 100 and not walks

    def failing(platform: ResolvedPlatform) -> None:
        raise RuntimeError("failed halfway")

    with pytest.raises(RuntimeError, match="failed halfway"):
        record(shipped_platforms["local"], failing)
    assert sdk_resource._get_stack_trace is counted


def test_recording_runs_on_an_sdk_without_the_stack_walk(
    shipped_platforms: dict[str, ResolvedPlatform], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later SDK may name its walk otherwise (pyproject allows any 3.x from 3.200): the plan still runs,
    and leaves the SDK, the collector and the event loop as it found them."""
    from pulumi.runtime import resource as sdk_resource

    from infra.plan import record as recording

    monkeypatch.setattr(recording, "_STACK_TRACE", "_a_name_this_sdk_does_not_have")
    assert gc.isenabled()
    assert len(record(shipped_platforms["aws-prod"]).resources) > 100
    assert not hasattr(sdk_resource, "_a_name_this_sdk_does_not_have")
    assert gc.isenabled()


def test_report_costs_spot_below_on_demand(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    report = build_report(shipped_platforms["aws-prod"])
    spot = next(p for p in report.pools if p.name == "train-spot")
    assert spot.usd_per_hour < spot.on_demand_usd_per_hour
    assert report.storage.meets_demand is True
    assert report.storage.demand_gbps == pytest.approx(64 * 0.5)


def test_secrets_never_reach_the_recording(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    recording = record(shipped_platforms["aws-prod"])
    assert recording.named("aws-prod-munge-key").inputs["value"] == "[secret]"
