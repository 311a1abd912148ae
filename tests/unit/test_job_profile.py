"""`gpuplat job-profile`: the phases of a training job's steps, summed from its own timing lines, and the
phase to fix first (data, then communication, then checkpoints)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli.app import app
from infra.errors import SpecError
from infra.validate.job_profile import ADVICE, PHASES, job_profile
from tests.unit.test_hostile_input import refused, run_cli

# Output of examples/train_dist/train.py on the local platform: 2 nodes x 2 processes, gloo.
REAL_LOG = Path(__file__).resolve().parents[1] / "data" / "train_dist" / "slurm-2x2-gloo.out"


def _line(data: float, compute: float, comm: float, checkpoint: float, steps: int = 10) -> str:
    return (
        f"step {steps} loss 0.1 timing data_s={data:.6f} compute_s={compute:.6f} comm_s={comm:.6f} "
        f"checkpoint_s={checkpoint:.6f} steps={steps}\n"
    )


def test_a_real_run_on_the_local_platform_is_communication_bound() -> None:
    """gloo over the containers' network on a loaded machine: the all-reduce outweighs a tiny model."""
    profile = job_profile(REAL_LOG.read_text(), str(REAL_LOG))
    assert profile.steps == 100
    assert profile.dominant == "comm"
    assert profile.share("comm") > profile.share("compute") > profile.share("data")


@pytest.mark.parametrize(
    ("phases", "dominant"),
    [
        ((0.030, 0.100, 0.010, 0.0), "data"),  # 21% waiting for data
        ((0.005, 0.100, 0.060, 0.0), "comm"),  # 36% all-reduce
        ((0.005, 0.100, 0.020, 0.010), "checkpoint"),  # 7% blocked on saves
        ((0.005, 0.100, 0.020, 0.002), "compute"),
        ((0.030, 0.050, 0.080, 0.0), "data"),  # data is suspected before communication
    ],
)
def test_the_first_phase_over_its_limit_is_named(phases: tuple[float, ...], dominant: str) -> None:
    assert job_profile(_line(*phases), "log").dominant == dominant


def test_windows_are_weighted_by_their_steps() -> None:
    profile = job_profile(_line(0.0, 0.1, 0.0, 0.0, steps=30) + _line(0.4, 0.1, 0.0, 0.0, steps=10), "log")
    assert profile.steps == 40
    assert profile.seconds_per_step["data"] == pytest.approx(0.1)


def test_a_log_without_timing_lines_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no `timing` lines"):
        job_profile("start host=a\ndone step=3\n", "slurm-1.out")
    log = tmp_path / "slurm-1.out"
    log.write_text("nothing here\n")
    refused(run_cli("job-profile", str(log)), "slurm-1.out", "no `timing` lines")
    refused(run_cli("job-profile", str(tmp_path / "missing.out")), "cannot read the log")


def test_the_command_prints_the_phases_and_the_advice() -> None:
    result = CliRunner().invoke(app, ["job-profile", str(REAL_LOG)], env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "communication-bound" in result.output and "nccl-report" in result.output
    as_json = CliRunner().invoke(app, ["job-profile", str(REAL_LOG), "--json"], env={"NO_COLOR": "1"})
    assert json.loads(as_json.output)["dominant"] == "comm"


@pytest.mark.parametrize(
    ("phases", "dominant"),
    [
        ((0.10, 0.90, 0.0, 0.0), "compute"),  # data at exactly its 10 %: not over it
        ((0.12, 0.88, 0.0, 0.0), "data"),
        ((0.0, 0.70, 0.30, 0.0), "compute"),  # communication at exactly 30 %
        ((0.0, 0.68, 0.32, 0.0), "comm"),
        ((0.0, 0.95, 0.0, 0.05), "compute"),  # checkpoints at exactly 5 %
        ((0.0, 0.94, 0.0, 0.06), "checkpoint"),
    ],
)
def test_the_limits_are_10_30_and_5_percent_of_the_step(phases: tuple[float, ...], dominant: str) -> None:
    """A phase is named once it takes more than its share of the step: data 10 %, communication 30 %,
    checkpoints 5 % (the checkpoint budget of `gpuplat validate`)."""
    assert job_profile(_line(*phases), "log").dominant == dominant


def test_every_window_counts_by_its_steps() -> None:
    profile = job_profile(_line(0.2, 0.1, 0.0, 0.0, steps=30) + _line(0.4, 0.1, 0.0, 0.0, steps=10), "log")
    assert profile.seconds_per_step["data"] == pytest.approx((0.2 * 30 + 0.4 * 10) / 40)
    assert profile.share("data") == pytest.approx(0.25 / 0.35)


def test_a_log_of_idle_steps_is_compute_and_shares_nothing() -> None:
    profile = job_profile(_line(0.0, 0.0, 0.0, 0.0), "log")
    assert profile.dominant == "compute" and profile.step_s == 0.0
    assert [profile.share(p) for p in PHASES] == [0.0, 0.0, 0.0, 0.0]


def test_the_json_has_each_phase_its_share_and_the_advice() -> None:
    profile = job_profile(_line(0.0, 0.6, 0.4, 0.0, steps=5), "log")
    assert profile.to_json() == {
        "steps": 5,
        "step_s": pytest.approx(1.0),
        "phases": {
            "data": {"seconds": 0.0, "share": 0.0},
            "compute": {"seconds": pytest.approx(0.6), "share": pytest.approx(0.6)},
            "comm": {"seconds": pytest.approx(0.4), "share": pytest.approx(0.4)},
            "checkpoint": {"seconds": 0.0, "share": 0.0},
        },
        "dominant": "comm",
        "advice": ADVICE["comm"],
    }


def test_bad_input_says_which_job_reports_timing_lines() -> None:
    with pytest.raises(SpecError) as refused_log:
        job_profile("nothing\n", "slurm-1.out")
    assert refused_log.value.message.endswith(
        "give the output of a job that reports them, such as examples/train_dist/train.py"
    )
