"""spot-watch's answer when one of its Slurm queries alone fails (gpuplat_ec2_nodes/spot_watch.py): the
recorder of test_ec2_nodes.py fails a command for all its queries, so these stand a query in by a Slurm
whose one method answers None, as the method does when its command could not run. Each test failed on a
mutant the suite let through (`make mutation`, docs/developing.md#mutation-score)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from gpuplat_ec2_nodes import spot_watch as spot_watch_module
from gpuplat_ec2_nodes.exit_codes import EXIT_FAILED, EXIT_UNKNOWN_NODE
from gpuplat_ec2_nodes.resume import resume_fail
from gpuplat_ec2_nodes.slurm import Slurm
from gpuplat_ec2_nodes.spot_watch import SpotWatch, handle_spot_notice, spot_watch

from tests.roles import test_ec2_nodes as harness
from tests.roles.test_ec2_nodes import (
    NOTICE,
    SPOT_REASON,
    Cloud,
    FakeImds,
    SlurmRecorder,
    StopWatching,
    ec2_nodes,
    settings_for,
)

moto_cloud, cloud, slurm, imds = harness.moto_cloud, harness.cloud, harness.slurm, harness.imds

# What spot-watch asks of Slurm for its node whatever else failed: powered down, the notice as the reason.
POWER_DOWN_AFTER_THE_GRACE = [
    "scontrol",
    "update",
    "nodename=train-spot-1",
    "state=power_down_force",
    SPOT_REASON,
]


class WithoutListpids(Slurm):
    """`scontrol listpids` could not run (not found, timed out)."""

    def batch_step_children(self, job_ids: Sequence[str]) -> list[int] | None:
        return None


class WithoutJobStates(Slurm):
    """squeue's job-state query could not run, after its job list did."""

    def job_states(self, job_ids: Sequence[str]) -> dict[str, str] | None:
        return None


WATCH = SpotWatch("train-spot-1", "http://127.0.0.1:9", grace_s=1.0, interval_s=5.0)


def test_a_notice_whose_batch_processes_cannot_be_listed_fails_yet_powers_the_node_down(
    slurm: SlurmRecorder,
) -> None:
    """What the batch scripts started got no SIGTERM (nothing listed them): spot-watch fails, so its unit
    shows the notice half handled, and still powers the node down so its jobs requeue."""
    slurm.jobs((101, 1, 1))
    slurm.states((101, "PENDING"))
    killed: list[int] = []
    status = handle_spot_notice(
        WATCH, WithoutListpids(slurm.scontrol), NOTICE, lambda _: None, lambda pid, _: killed.append(pid)
    )
    assert status == EXIT_FAILED
    assert killed == []
    assert POWER_DOWN_AFTER_THE_GRACE in slurm.calls()


def test_a_notice_whose_job_states_cannot_be_read_fails_and_requeues_nothing(slurm: SlurmRecorder) -> None:
    """Without the states, spot-watch cannot tell a job that ended in the grace (to requeue) from one still
    running (requeued twice, 22.05 leaks its GPU): it requeues none and fails."""
    slurm.jobs((101, 1, 1))
    status = handle_spot_notice(
        WATCH, WithoutJobStates(slurm.scontrol), NOTICE, lambda _: None, lambda *_: None
    )
    assert status == EXIT_FAILED
    assert not [call for call in slurm.calls() if call[:2] == ["scontrol", "requeue"]]
    assert POWER_DOWN_AFTER_THE_GRACE in slurm.calls()


def test_resume_fail_says_what_it_does_and_names_the_names_of_no_pool_as_its_own(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    cloud.launch("train-spot-2", "train-spot")
    with caplog.at_level(logging.INFO):
        status = resume_fail(
            settings_for(tmp_path, cloud, slurm),
            ec2_nodes(cloud, slurm),
            Slurm(slurm.scontrol),
            ["train-spot-2", "infer-0"],
        )
    assert status == EXIT_UNKNOWN_NODE
    lines = [record.getMessage() for record in caplog.records]
    assert "resume-fail: train-spot-2,infer-0 did not register in time; terminating their instances" in lines
    assert "resume-fail: returning train-spot-2 to power saving (POWER_DOWN_FORCE)" in lines
    assert any(
        line.startswith("resume-fail: infer-0 belong to no configured pool (pools: ") for line in lines
    ), lines


@pytest.mark.parametrize("stalled", ["PUT", "GET"])
def test_an_imds_that_does_not_answer_is_given_up_on_after_the_timeout_and_polled_again(
    imds: FakeImds,
    slurm: SlurmRecorder,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    stalled: str,
) -> None:
    """A metadata service that takes the token request (PUT) or the notice's (GET) and never answers is
    unreachable once the timeout has passed: spot-watch logs it and polls again, rather than waiting on
    that request for ever and missing the notice."""
    monkeypatch.setattr(spot_watch_module, "IMDS_TIMEOUT_S", 0.2)
    imds.stalled = {stalled}
    sleeps: list[float] = []
    ended: list[BaseException] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        raise StopWatching

    def watch() -> None:
        try:
            spot_watch(
                SpotWatch("train-spot-1", imds.url, grace_s=1.0, interval_s=5.0), Slurm(slurm.scontrol), sleep
            )
        except StopWatching as stopped:
            ended.append(stopped)

    watching = threading.Thread(target=watch, daemon=True)
    started = time.monotonic()
    watching.start()
    watching.join(timeout=10)
    waited = time.monotonic() - started
    imds.released.set()  # a watch still waiting gets its answer and ends
    watching.join(timeout=10)
    assert waited < 10 and ended and sleeps == [5.0], f"spot-watch still waited on IMDS after {waited:.0f} s"
    assert "spot-watch: instance metadata unreachable: " in caplog.text
    assert slurm.calls() == []
