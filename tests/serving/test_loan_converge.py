"""A converge of the serving scenario (the real roles, molecule converge) while a canary borrows a replica's
GPUs (serving.canary.gpus borrow; issue 48's vLLM canary on its own GPUs): the loan made and ended by
release.py's own steps on the scenario's infer node (two CPU replicas: the loan's record, drain, runtime
mask and stop are the same whatever the engine; the canary slot itself is not started, no GPU to run on).

- A `gpuplat up` reaching the node during the loan converges, leaving the lent replica stopped, masked and
  drained on the gateway (before: the replicas' start task failed on the masked unit).
- A layout of fewer replicas during the loan is refused, saying which loan and how to end it, with nothing
  changed; once the loan ended it applies, and the replica past the layout is drained, stopped and disabled
  and its files removed (before: it kept running on GPUs the layout now gives the canary).

scripts/test-serving.sh runs these between the scenario's verify and its destroy (GPUPLAT_SERVING_SCENARIO
set); elsewhere they skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.errors import GpuPlatError
from infra.serving.registry.mlflow import ModelVersion, to_wire_source
from infra.serving.release import KEEP, Release, ServingLayout
from tests.serving.load import HEAD, INFER

ROOT = Path(__file__).resolve().parents[2]
UNIT = "gpuplat-inference@1.service"
# The roles a `gpuplat up` would apply to these nodes (the scenario's others are not in question).
TAGS = ("--tags", "inference_server,inference_gateway")
ONE_REPLICA = ("-e", json.dumps({"inference_replicas_per_node": 1, "inference_replica_gpus": [""]}))

pytestmark = pytest.mark.skipif(
    not os.environ.get("GPUPLAT_SERVING_SCENARIO"),
    reason="needs the converged serving scenario: scripts/test-serving.sh runs these",
)


class ScenarioNodes:
    """release.py's Nodes on the scenario's containers (podman exec)."""

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        done = subprocess.run(
            ["podman", "exec", node, *command], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise GpuPlatError(f"{node}: {' '.join(command)[:80]} exited {done.returncode}: {done.stderr}")
        return done.stdout


def release() -> Release:
    """release.py's steps on the scenario's nodes, as a borrowing stack's `gpuplat serve` takes them."""
    driver = object.__new__(Release)
    driver.nodes = ScenarioNodes()
    driver.say = print
    driver.layout = ServingLayout(
        (HEAD,), (INFER,), {INFER: INFER, HEAD: HEAD}, "cpu-reference", 120.0, 40.0, canary_gpus="borrow"
    )
    return driver


def borrow() -> None:
    """The loan of replica 1, recorded, drained, masked and stopped (release.py `_borrow`)."""
    version = ModelVersion("embedder-loan", 3, to_wire_source("/shared/models/embedder-loan/3"), "READY")
    release()._borrow(version, (INFER, 1, ""))


def give_back() -> None:
    """The loan ended as a rollback ends it (release.py `stop_canary`: the replica back on its own version,
    in service, then the record removed)."""
    release().stop_canary(KEEP)


def on(node: str, *command: str) -> str:
    return ScenarioNodes().exec(node, *command).strip()


def state(unit: str = UNIT) -> tuple[str, str]:
    """(is-active, is-enabled) of a unit on the infer node (both exit non-zero for most answers)."""
    answers = (
        subprocess.run(["podman", "exec", INFER, "systemctl", verb, unit], capture_output=True, text=True)
        for verb in ("is-active", "is-enabled")
    )
    active, enabled = (answer.stdout.strip() for answer in answers)
    return active, enabled


SERVERS = """import sys
sys.path.insert(0, "/usr/local/lib/gpuplat")
from gpuplat_gateway_targets import RuntimeApi
for slot in RuntimeApi("/run/haproxy/admin.sock").slots("inference"):
    print(slot.address, slot.port, int(slot.draining))
"""


def gateway_servers() -> dict[int, bool]:
    """The gateway's stable backend, as HAProxy holds it: the infer node's port -> whether it is in drain."""
    lines = on(HEAD, "python3", "-c", SERVERS).splitlines()
    return {int(port): flag == "1" for _, port, flag in (line.split() for line in lines if line.strip())}


def converge(*extra: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run(
        ["molecule", "converge", "-s", "serving", "--", *TAGS, *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.monotonic() - started
    print(f"molecule converge {' '.join(extra)}: exit {done.returncode} in {took:.0f} s")
    return done


@pytest.fixture
def loan() -> Iterator[None]:
    """Replica 1 lent for the test; given back whatever the test found."""
    borrow()
    assert state() == ("inactive", "masked-runtime") and gateway_servers()[8001]
    try:
        yield
    finally:
        if on(INFER, "sh", "-c", "cat /etc/gpuplat-inference/version-canary.env 2>/dev/null || true"):
            give_back()


def test_a_converge_during_a_loan_leaves_the_lent_replica_stopped_masked_and_drained(loan: None) -> None:
    done = converge()
    assert done.returncode == 0, done.stdout[-4000:]
    assert "is lent to a canary" in done.stdout
    assert state() == ("inactive", "masked-runtime"), "the converge started the lent replica"
    assert gateway_servers() == {8000: False, 8001: True}, "the converge put the lent replica back in service"
    assert state("gpuplat-inference@0.service") == ("active", "enabled")
    give_back()
    assert state() == ("active", "enabled") and gateway_servers() == {8000: False, 8001: False}


def test_fewer_replicas_during_a_loan_is_refused_and_applies_once_the_loan_ended(loan: None) -> None:
    refused = converge(*ONE_REPLICA)
    assert refused.returncode != 0
    assert "runs the canary embedder-loan@3" in refused.stdout, refused.stdout[-4000:]
    assert "`gpuplat serve rollback embedder-loan`" in refused.stdout
    assert state() == ("inactive", "masked-runtime")
    assert on(INFER, "ls", "/etc/gpuplat-inference").split().count("replica-1.env") == 1
    give_back()
    try:
        done = converge(*ONE_REPLICA)
        assert done.returncode == 0, done.stdout[-4000:]
        assert state() == ("inactive", "disabled"), "the replica past the layout kept running"
        assert "replica-1.env" not in on(INFER, "ls", "/etc/gpuplat-inference").split()
        assert gateway_servers() == {8000: False}
    finally:
        restored = converge()
    assert restored.returncode == 0, restored.stdout[-4000:]
    assert state() == ("active", "enabled") and gateway_servers() == {8000: False, 8001: False}
