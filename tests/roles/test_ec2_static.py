"""keep-static: the static nodes of the elastic pools kept up, DOWN ones replaced, with back-off.

Same harness as test_ec2_nodes.py (moto server, recorder scontrol answering `show node` with the
states a test gives): the program runs as a subprocess, or in-process where a test sets the clock.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from gpuplat_ec2_nodes.exit_codes import EXIT_FAILED, EXIT_OK
from gpuplat_ec2_nodes.keep_static import keep_static, static_action
from gpuplat_ec2_nodes.slurm import NodeInfo, Slurm

from tests.roles import test_ec2_nodes as harness
from tests.roles.test_ec2_nodes import (
    PROGRAM,
    REGION,
    STACK,
    Cloud,
    SlurmRecorder,
    ec2_nodes,
    program_env,
    run_program,
    settings_for,
    show_node,
    write_config,
)

# The harness's fixtures: moto server, a stack tag per test, recorder scontrol/squeue/scancel.
moto_cloud, cloud, slurm = harness.moto_cloud, harness.cloud, harness.slurm

REPLACE = "reason=gpuplat keep-static: replacing a DOWN static node"
STATIC = ["train-0", "train-1", "train-2", "train-3", "train-4", "train-5", "train-6", "train-7"]


def scontrol_updates(slurm: SlurmRecorder) -> list[list[str]]:
    return [call[2:] for call in slurm.calls() if call[:2] == ["scontrol", "update"]]


def test_keep_static_powers_up_powered_down_and_replaces_down_static_nodes(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    down_instance = cloud.launch("train-3")
    drained_instance = cloud.launch("train-4")
    config = write_config(tmp_path, cloud, slurm, static_nodes=STATIC)
    slurm.nodes(
        show_node("train-0", "IDLE+CLOUD+POWERED_DOWN"),
        show_node("train-1", "IDLE+CLOUD+NOT_RESPONDING+POWERING_UP"),
        show_node("train-2", "MIXED+CLOUD"),
        show_node("train-3", "DOWN+CLOUD+NOT_RESPONDING", "Not responding"),
        show_node("train-4", "DOWN+CLOUD+DRAIN+NOT_RESPONDING", "maintenance"),
        show_node("train-5", "IDLE+CLOUD+POWER_UP+POWERED_DOWN"),
        show_node("train-6", "IDLE+CLOUD+POWERING_DOWN"),
        show_node("train-7", "DOWN+CLOUD+POWERED_DOWN", "ResumeTimeout reached"),
        show_node("train-8", "IDLE+CLOUD+POWERED_DOWN"),  # not static
    )
    result = run_program(config, cloud, "keep-static")
    assert result.returncode == 0, result.stderr
    assert slurm.calls() == [
        ["scontrol", "-o", "show", "node"],
        ["scontrol", "update", "nodename=train-3,train-7", "state=power_down_force", REPLACE],
        ["scontrol", "update", "nodename=train-0", "state=power_up"],
    ]
    assert cloud.state(down_instance) == "terminated"
    assert cloud.state(drained_instance) == "running", "drained by an operator: left to them"
    assert "train-4 is drained or failed" in result.stderr
    attempts = json.loads((tmp_path / "state" / "keep-static.json").read_text())["nodes"]
    assert sorted(attempts) == ["train-0", "train-3", "train-7"]


def test_a_replaced_static_node_is_powered_up_once_powered_down(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """Power down (the suspend takes SuspendTimeout), then power up: the name gets a new instance."""
    old = cloud.launch("train-0")
    config = write_config(tmp_path, cloud, slurm, {"static_backoff_base_s": 0}, static_nodes=["train-0"])
    slurm.nodes(show_node("train-0", "DOWN+CLOUD+NOT_RESPONDING", "Not responding"))
    assert run_program(config, cloud, "keep-static").returncode == 0
    slurm.nodes(show_node("train-0", "IDLE+CLOUD+POWERING_DOWN", "Not responding"))
    assert run_program(config, cloud, "keep-static").returncode == 0
    slurm.nodes(show_node("train-0", "IDLE+CLOUD+POWERED_DOWN", "Not responding"))
    assert run_program(config, cloud, "keep-static").returncode == 0
    assert cloud.state(old) == "terminated"
    assert scontrol_updates(slurm) == [
        ["nodename=train-0", "state=power_down_force", REPLACE],
        ["nodename=train-0", "state=power_up"],
    ]


def test_a_down_static_node_loses_its_instance_before_it_is_powered_down(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    instance = cloud.launch("train-0")
    assert keep_static_at(tmp_path, cloud, slurm, "DOWN+CLOUD+NOT_RESPONDING", 1_000_000.0)
    assert slurm.calls()[1:] == [
        ["ec2", "terminate_instances", instance],
        ["scontrol", "update", "nodename=train-0", "state=power_down_force", REPLACE],
    ]


def keep_static_at(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, state: str, now: float, **settings: Any
) -> list[list[str]]:
    """One keep-static round at `now` with train-0 (static) in `state`; the scontrol updates it made."""
    before = len(scontrol_updates(slurm))
    slurm.nodes(show_node("train-0", state))
    values = {"static_nodes": ["train-0"], "static_backoff_base_s": 60.0, "static_backoff_max_s": 600.0}
    config = settings_for(tmp_path, cloud, slurm, **{**values, **settings})
    status = keep_static(config, Slurm(slurm.scontrol), ec2_nodes(cloud, slurm), now=now)
    assert status == EXIT_OK
    return scontrol_updates(slurm)[before:]


def test_a_static_node_that_keeps_failing_is_retried_with_bounded_exponential_back_off(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """The launch keeps failing (capacity): resume powers the node down, it is powered down again."""
    rounds = [0, 30, 60, 100, 179, 180, 400, 420, 899, 900, 1499, 1500, 2099, 2100]
    powered_up = [
        t
        for t in rounds
        if keep_static_at(tmp_path, cloud, slurm, "IDLE+CLOUD+POWERED_DOWN", 1_000_000.0 + t)
    ]
    # Delays 60, 120, 240, 480, then the 600 s bound: not every minute.
    assert powered_up == [0, 60, 180, 420, 900, 1500, 2100]


def test_the_back_off_is_forgotten_once_the_node_has_stayed_up(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    start = 1_000_000.0
    for t in (0, 60, 180):
        assert keep_static_at(tmp_path, cloud, slurm, "IDLE+CLOUD+POWERED_DOWN", start + t)
    assert not keep_static_at(tmp_path, cloud, slurm, "IDLE+CLOUD", start + 300)  # up, 120 s after
    assert not keep_static_at(tmp_path, cloud, slurm, "DOWN+CLOUD", start + 320), "failed soon: backs off"
    assert keep_static_at(tmp_path, cloud, slurm, "DOWN+CLOUD", start + 420)
    assert not keep_static_at(tmp_path, cloud, slurm, "IDLE+CLOUD", start + 1020)  # up 600 s after
    assert keep_static_at(tmp_path, cloud, slurm, "DOWN+CLOUD", start + 1030), "a fresh failure: at once"


def test_an_unreadable_back_off_file_starts_afresh(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "keep-static.json").write_text("{not json")
    assert keep_static_at(tmp_path, cloud, slurm, "IDLE+CLOUD+POWERED_DOWN", 1_000_000.0)


def test_keep_static_reports_static_nodes_slurm_does_not_know(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    settings = settings_for(tmp_path, cloud, slurm, static_nodes=["train-0", "train-9"])
    slurm.nodes(show_node("train-0", "IDLE+CLOUD"))
    status = keep_static(settings, Slurm(slurm.scontrol), ec2_nodes(cloud, slurm))
    assert status == EXIT_FAILED
    assert slurm.calls() == [["scontrol", "-o", "show", "node"]]


def test_keep_static_does_nothing_when_scontrol_fails(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    instance = cloud.launch("train-0")
    slurm.fail("scontrol")
    settings = settings_for(tmp_path, cloud, slurm, static_nodes=["train-0"])
    status = keep_static(settings, Slurm(slurm.scontrol), ec2_nodes(cloud, slurm))
    assert status == EXIT_FAILED
    assert cloud.state(instance) == "running"


def test_keep_static_without_static_nodes_needs_no_slurm(tmp_path: Path, slurm: SlurmRecorder) -> None:
    config = {"stack": STACK, "region": REGION, "scontrol": slurm.scontrol, "pools": {}}
    path = tmp_path / "ec2-nodes.json"
    path.write_text(json.dumps(config))
    result = run_keep_static(path)
    assert result.returncode == 0, result.stderr
    assert slurm.calls() == []


def run_keep_static(config: Path) -> subprocess.CompletedProcess[str]:
    argv = [*PROGRAM, "--config", str(config), "keep-static"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=program_env(), check=False)


@pytest.mark.parametrize(
    ("state", "action"),
    [
        ("IDLE+CLOUD+POWERED_DOWN", "power-up"),
        ("DOWN+CLOUD+POWERED_DOWN", "replace"),
        ("DOWN+CLOUD+NOT_RESPONDING", "replace"),
        ("DOWN+CLOUD+DRAIN", "held"),
        ("IDLE+CLOUD+FAIL", "held"),
        ("IDLE+CLOUD+DRAIN+POWERED_DOWN", "held"),
        ("DOWN+CLOUD+POWERING_DOWN", "wait"),
        ("IDLE+CLOUD+POWER_DOWN", "wait"),
        ("ALLOCATED+CLOUD+POWERING_UP", "wait"),
        ("MIXED+CLOUD", "up"),
    ],
)
def test_static_node_states_and_what_they_need(state: str, action: str) -> None:
    node = NodeInfo("train-0", frozenset(state.split("+")))
    assert static_action(node) == action
