"""`gpuplat job-profile`: the phases of a training job's steps, summed from its own timing lines, and the
phase to fix first (data, then communication, then checkpoints)."""

from __future__ import annotations

import json
import random
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


# --- every rank, every run (issue 47) ---------------------------------------------------------------------

# A requeued job on the local platform (1 node x 2 processes, gloo): run 1 lost its node (SIGKILL to
# torchrun and its workers) after step 50, run 2 resumed from the checkpoint of step 40; both runs'
# output appended to one file, as `#SBATCH --open-mode=append` does.
REQUEUED_LOG = REAL_LOG.parent / "slurm-requeued-1x2-gloo.out"


def _rank_line(step: int, rank: int, phases: tuple[float, ...], steps: int = 10, host: str = "") -> str:
    data, compute, comm, checkpoint = phases
    return (
        f"step {step} loss 0.1 timing rank={rank} host={host or f'train-{rank // 2}'} data_s={data:.6f} "
        f"compute_s={compute:.6f} comm_s={comm:.6f} checkpoint_s={checkpoint:.6f} steps={steps}\n"
    )


def _straggler_log(windows: int = 10) -> str:
    """4 ranks on 2 nodes; rank 2's GPU computes at about half speed (a throttled GPU): it takes 60 ms
    where the others take 30, and they wait for it in the all-reduce (their comm is 5 ms of transfer
    plus 30 of waiting). Lines of the ranks interleaved, some with srun --label prefixes."""
    text = "start host=train-0 world=4 resumed_from=0 restart=0\n"
    for window in range(1, windows + 1):
        lines = [
            _rank_line(
                window * 10, rank, (0.001, 0.060, 0.005, 0.0) if rank == 2 else (0.001, 0.030, 0.035, 0.0)
            )
            for rank in (3, 0, 2, 1)
        ]
        text += "".join(
            f"{rank}: {line}" if window % 2 else line for rank, line in zip((3, 0, 2, 1), lines, strict=True)
        )
    return text


def test_a_straggler_is_named_not_read_as_communication() -> None:
    log = _straggler_log()
    rank0_only = "".join(
        line for line in log.splitlines(keepends=True) if "rank=" not in line or "rank=0" in line
    )
    assert job_profile(rank0_only, "log").dominant == "comm"  # what rank 0 alone suggests
    profile = job_profile(log, "log")
    assert profile.dominant == "straggler"
    straggler = profile.straggler
    assert straggler is not None and straggler.rank == 2 and straggler.host == "train-1"
    assert straggler.phase == "compute"
    assert straggler.excess_s == pytest.approx(0.030) and straggler.others_wait_s == pytest.approx(0.030)
    run = profile.runs[0]
    assert run.spread("compute") == ((0, pytest.approx(0.030)), (2, pytest.approx(0.060)))
    assert run.spread("comm") == ((2, pytest.approx(0.005)), (0, pytest.approx(0.035)))
    as_json = _cli_json(log)
    assert as_json["dominant"] == "straggler" and as_json["straggler"]["rank"] == 2  # type: ignore[index]
    assert as_json["runs"][0]["phases"]["compute"]["max"] == {"rank": 2, "seconds": pytest.approx(0.060)}  # type: ignore[index]


def _cli_json(text: str) -> dict[str, object]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".out") as handle:
        handle.write(text)
        handle.flush()
        done = CliRunner().invoke(app, ["job-profile", handle.name, "--json"], env={"NO_COLOR": "1"})
        assert done.exit_code == 0, done.output
        document: dict[str, object] = json.loads(done.output)
        return document


def test_the_command_names_the_straggler(tmp_path: Path) -> None:
    log = tmp_path / "slurm-7.out"
    log.write_text(_straggler_log())
    result = CliRunner().invoke(app, ["job-profile", str(log)], env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "straggler: rank 2 on train-1" in result.output and "straggler-bound" in result.output
    assert "communication-bound" not in result.output


def test_ranks_that_agree_name_no_straggler_and_few_steps_name_none() -> None:
    even = "".join(_rank_line(w * 10, r, (0.001, 0.030, 0.015, 0.0)) for w in range(1, 11) for r in range(4))
    assert job_profile(even, "log").dominant == "comm" and job_profile(even, "log").straggler is None
    short = job_profile(_straggler_log(windows=4), "log")  # 40 steps a rank
    assert short.straggler is None and short.dominant == "comm"
    assert any("too few to tell a straggler" in note for note in short.runs[0].notes)


def _simulated_log(rng: random.Random, ranks: int, steps: int, slow: int | None, sigma: float) -> str:
    """Synchronous data parallelism step by step: each rank's work (data + compute) varies per step
    (lognormal, sigma); the all-reduce ends after the slowest rank's work plus the transfer; each rank's
    comm is its wait for the slowest plus the transfer. Reported in windows of 10 steps, as train.py does."""
    text = ""
    totals = [[0.0] * 4 for _ in range(ranks)]
    for step in range(1, steps + 1):
        work = [
            0.010 * rng.lognormvariate(0, sigma) * (1.3 if rank == slow else 1.0) for rank in range(ranks)
        ]
        data = [0.0005 * rng.lognormvariate(0, sigma) for _ in range(ranks)]
        end = max(w + d for w, d in zip(work, data, strict=True))
        for rank in range(ranks):
            transfer = 0.004 * rng.lognormvariate(0, sigma)
            for index, value in enumerate(
                (data[rank], work[rank], end - work[rank] - data[rank] + transfer, 0.0)
            ):
                totals[rank][index] += value
        if step % 10 == 0:
            for rank in range(ranks):
                text += _rank_line(step, rank, tuple(v / 10 for v in totals[rank]))
                totals[rank] = [0.0] * 4
    return text


def test_the_straggler_verdict_on_noise_and_on_a_real_straggler() -> None:
    """Per-step noise of 30%, 4 ranks, 100 steps, the real parsing and decision code: identical ranks are
    named a straggler in under 2% of 300 runs; a rank 30% slower is found in over 90%."""
    rng = random.Random(47)
    trials = 300
    alarms = sum(
        job_profile(_simulated_log(rng, 4, 100, None, 0.3), "log").straggler is not None
        for _ in range(trials)
    )
    found = 0
    for _ in range(trials):
        straggler = job_profile(_simulated_log(rng, 4, 100, 1, 0.3), "log").straggler
        found += straggler is not None and straggler.rank == 1
    assert alarms / trials < 0.02, alarms
    assert found / trials > 0.90, found


def test_a_requeued_jobs_runs_are_profiled_apart_and_redone_steps_counted_once_each() -> None:
    """The appended log of a real requeued run: two runs, each its own steps; run 1's lines after its
    last checkpoint (steps 41-50) were run again by run 2 and are not merged with them."""
    profile = job_profile(REQUEUED_LOG.read_text(), str(REQUEUED_LOG))
    first, second = profile.runs
    assert (first.resumed_from, first.restart, second.resumed_from, second.restart) == (0, 0, 40, 1)
    assert first.steps == 50 and second.steps == 60 and profile.steps == 110
    assert second.redone == 10 and profile.redone == 10
    assert first.ranks[0].steps == 40 and first.ranks[1].steps == 50  # rank 0's last line died with the node
    assert any("different numbers of steps" in note for note in first.notes)
    assert profile.verdict_run is second and profile.dominant == "compute"


@pytest.mark.parametrize("every_rank", [True, False])
def test_a_requeued_run_with_another_bottleneck_is_reported_on_its_own(
    tmp_path: Path, every_rank: bool
) -> None:
    """Run 1 read from a cold cache (data-bound); run 2, requeued, from the node's cache: each run keeps
    its own verdict, the job's is the longer run's, and the steps of both are not summed into one run.
    Also from a log of rank 0's lines only (train.py before issue 47): summed as one run, the job read as
    data-bound over 140 steps."""

    def lines(windows: range, phases: tuple[float, ...]) -> str:
        if not every_rank:
            return "".join(_line(*phases).replace("step 10 ", f"step {w * 10} ", 1) for w in windows)
        return "".join(_rank_line(w * 10, r, phases) for w in windows for r in range(2))

    log = "start host=train-0 world=2 resumed_from=0 restart=0\n" + lines(
        range(1, 8), (0.040, 0.100, 0.010, 0.0)
    )
    log += "start host=train-1 world=2 resumed_from=50 restart=1\n" + lines(
        range(6, 13), (0.002, 0.100, 0.010, 0.0)
    )
    profile = job_profile(log, "log")
    assert [run.dominant for run in profile.runs] == ["data", "compute"]
    assert [run.steps for run in profile.runs] == [70, 70] and profile.steps == 140
    assert profile.redone == 20
    assert profile.dominant == "compute" and profile.verdict_run.index == 2  # equal length: the latest
    path = tmp_path / "slurm-9.out"
    path.write_text(log)
    result = CliRunner().invoke(app, ["job-profile", str(path)], env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "2 runs" in result.output and "at least 20 redone" in result.output
    assert "run 1: data-bound" in result.output and "run 2: compute-bound" in result.output
    document = _cli_json(log)
    assert [run["steps"] for run in document["runs"]] == [70, 70]  # type: ignore[index]


def test_lines_cut_off_or_run_together_are_left_out_and_said() -> None:
    whole = _rank_line(10, 0, (0.001, 0.030, 0.005, 0.0)) + _rank_line(10, 1, (0.001, 0.030, 0.005, 0.0))
    cut = "step 20 loss 0.1 timing rank=1 host=train-0 data_s=0.001 comp"  # the writer died mid-line
    glued = _rank_line(20, 0, (0.001, 0.030, 0.005, 0.0)).rstrip("\n") + _rank_line(
        30, 1, (0.001, 0.03, 0.005, 0.0)
    )
    profile = job_profile(whole + cut + "\n" + glued, "log")
    assert profile.malformed == 1 and profile.runs[0].ranks[1].steps == 20
    assert any("not read whole" in note for note in profile.notes)
    with pytest.raises(SpecError, match="no `timing` lines"):
        job_profile(cut, "log")


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
    as_json = profile.to_json()
    assert {key: as_json[key] for key in ("steps", "step_s", "phases", "dominant", "advice")} == {
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
