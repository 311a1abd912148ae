"""Adversary scenarios (s60-loan-day2): the roles converged during a loan in check mode, twice, with a change
that rolls the other replicas and reloads the gateway, after a borrow killed between its record and its
drain, and after a reboot lifted the runtime mask."""

from __future__ import annotations

import re

import pytest

from infra.serving.registry.mlflow import ModelVersion, to_wire_source
from infra.serving.release import CANARY_SLOT
from tests.serving.load import INFER
from tests.serving.test_loan_converge import (
    borrow,
    converge,
    gateway_servers,
    give_back,
    loan,  # noqa: F401  (the fixture)
    on,
    pytestmark,  # noqa: F401  (skipped outside the scenario)
    release,
    state,
)

INFLIGHT = ("-e", "inference_max_inflight_per_replica=5")


def recap(stdout: str) -> dict[str, int]:
    found = re.finditer(r"^(\S+)\s*:\s*ok=\d+\s+changed=(\d+)", stdout, re.M)
    return {m.group(1): int(m.group(2)) for m in found}


@pytest.mark.usefixtures("loan")
def test_check_mode_during_a_loan() -> None:
    done = converge("--check")
    assert done.returncode == 0, done.stdout[-4000:]
    assert state() == ("inactive", "masked-runtime")
    assert gateway_servers() == {8000: False, 8001: True}


@pytest.mark.usefixtures("loan")
def test_a_second_converge_during_a_loan_changes_nothing() -> None:
    first = converge()
    assert first.returncode == 0, first.stdout[-4000:]
    second = converge()
    assert second.returncode == 0, second.stdout[-4000:]
    print("recap first", recap(first.stdout), "second", recap(second.stdout))
    assert recap(second.stdout).get(INFER) == 0, second.stdout[-6000:]
    assert state() == ("inactive", "masked-runtime")


@pytest.mark.usefixtures("loan")
def test_a_change_that_rolls_the_replicas_and_reloads_the_gateway_during_a_loan() -> None:
    try:
        done = converge(*INFLIGHT)
        assert done.returncode == 0, done.stdout[-4000:]
        print(done.stdout[-3000:])
        assert state() == ("inactive", "masked-runtime"), "the roll started the lent replica"
        assert gateway_servers() == {8000: False, 8001: True}, "the reload put it back"
        assert state("gpuplat-inference@0.service") == ("active", "enabled")
    finally:
        restored = converge()
    assert restored.returncode == 0, restored.stdout[-4000:]


def test_a_borrow_killed_after_its_record_then_a_converge_then_a_rollback() -> None:
    version = ModelVersion("embedder-loan", 3, to_wire_source("/shared/models/embedder-loan/3"), "READY")
    release()._write_version(INFER, CANARY_SLOT, version, (INFER, 1, ""))
    try:
        done = converge()
        assert done.returncode == 0, done.stdout[-4000:]
        assert state() == ("active", "enabled")
    finally:
        give_back()
    assert state() == ("active", "enabled") and gateway_servers() == {8000: False, 8001: False}


@pytest.mark.usefixtures("loan")
def test_a_reboot_during_a_loan_then_deploy_takes_it_again() -> None:
    # A reboot: /run emptied (the runtime mask gone), the enabled replica started at boot.
    on(INFER, "systemctl", "unmask", "--runtime", "gpuplat-inference@1.service")
    on(INFER, "systemctl", "start", "gpuplat-inference@1.service")
    assert state()[0] == "active"
    done = converge()
    assert done.returncode == 0, done.stdout[-4000:]
    assert state()[0] == "active"  # left alone, as docs/serving.md says
    borrow()
    assert state() == ("inactive", "masked-runtime") and gateway_servers()[8001]
