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


# --- what the command reports, field by field (issue 46: the survivors of `make mutation`) ---------------


def _windows(first: int, last: int, phases_by_rank: dict[int, tuple[float, ...]], host: str = "") -> str:
    """Windows of 10 steps, steps first*10 .. last*10, a line per rank in the dict's order."""
    return "".join(
        _rank_line(w * 10, rank, phases, host=host)
        for w in range(first, last + 1)
        for rank, phases in phases_by_rank.items()
    )


def test_the_json_of_a_requeued_job_with_a_straggler_field_by_field() -> None:
    """`gpuplat job-profile --json`, the document scripts read: run 1 (ranks 0 and 1 of 4 reported, 30
    steps) was requeued and resumed from step 20; run 2 (every rank, 100 steps) has rank 2 computing at
    half speed. Every key of the job, its runs, their phases and the straggler, with its value."""
    even = (0.002, 0.030, 0.010, 0.001)
    log = "start host=train-0 world=4 resumed_from=0 restart=0\n" + _windows(1, 3, {0: even, 1: even})
    fast, slow = (0.001, 0.030, 0.035, 0.0), (0.001, 0.060, 0.005, 0.0)
    log += "start host=train-1 world=4 resumed_from=20 restart=1\n"
    log += _windows(3, 12, {0: fast, 1: fast, 2: slow, 3: fast})
    document = _cli_json(log)

    def phases(
        seconds: dict[str, float], spread: dict[str, tuple[int, float, int, float]]
    ) -> dict[str, object]:
        step = sum(seconds.values())
        return {
            phase: {
                "seconds": pytest.approx(seconds[phase]),
                "share": pytest.approx(seconds[phase] / step),
                "min": {"rank": spread[phase][0], "seconds": pytest.approx(spread[phase][1])},
                "max": {"rank": spread[phase][2], "seconds": pytest.approx(spread[phase][3])},
            }
            for phase in PHASES
        }

    first_seconds = dict(zip(PHASES, even, strict=True))
    first = {
        "run": 1,
        "host": "train-0",
        "world": 4,
        "resumed_from": 0,
        "restart": 0,
        "last_step": 30,
        "steps": 30,
        "redone": 0,
        "ranks": [0, 1],
        "step_s": pytest.approx(0.043),
        "phases": phases(
            first_seconds, {p: (0, v, 0, v) for p, v in first_seconds.items()}
        ),  # equals: rank 0
        "dominant": "compute",
        "straggler": None,
        "notes": [
            "ranks 2, 3 of 4 did not report: a straggler among them would go unseen",
            "fewer than 50 steps per rank: too few to tell a straggler from noise, none named",
        ],
    }
    second_seconds = {
        "data": 0.001,
        "compute": (3 * 0.030 + 0.060) / 4,
        "comm": (3 * 0.035 + 0.005) / 4,
        "checkpoint": 0.0,
    }
    second = {
        "run": 2,
        "host": "train-1",
        "world": 4,
        "resumed_from": 20,
        "restart": 1,
        "last_step": 120,
        "steps": 100,
        "redone": 10,
        "ranks": [0, 1, 2, 3],
        "step_s": pytest.approx(0.066),
        "phases": phases(
            second_seconds,
            {
                "data": (0, 0.001, 0, 0.001),
                "compute": (0, 0.030, 2, 0.060),
                "comm": (2, 0.005, 0, 0.035),
                "checkpoint": (0, 0.0, 0, 0.0),
            },
        ),
        "dominant": "straggler",
        "straggler": {
            "rank": 2,
            "host": "train-1",
            "phase": "compute",
            "excess_s": pytest.approx(0.030),
            "others_wait_s": pytest.approx(0.030),
            "own_comm_share": pytest.approx(0.005 / 0.066),
        },
        "notes": ["resumed from step 20: redid at least 10 steps of the run before"],
    }
    job_seconds = {p: (first_seconds[p] * 30 + second_seconds[p] * 100) / 130 for p in PHASES}
    job_step = sum(job_seconds.values())
    assert document == {
        "steps": 130,
        "steps_redone": 10,
        "step_s": pytest.approx(job_step),
        "phases": {
            p: {"seconds": pytest.approx(job_seconds[p]), "share": pytest.approx(job_seconds[p] / job_step)}
            for p in PHASES
        },
        "dominant": "straggler",
        "verdict_run": 2,
        "straggler": second["straggler"],
        "advice": ADVICE["straggler"],
        "runs": [first, second],
        "malformed_lines": 0,
        "notes": [],
    }


def test_a_log_of_rank_0_alone_has_no_ranks_and_says_so() -> None:
    """Lines without `rank=` (train.py before issue 47): no rank is named anywhere in the document, the
    note says a slow rank elsewhere reads as communication, and a start line without restart= is read."""
    log = "start host=train-0 world=2 resumed_from=0\n" + "".join(
        _line(0.001, 0.030, 0.005, 0.0).replace("step 10 ", f"step {w * 10} ", 1) for w in range(1, 4)
    )
    run = job_profile(log, "log").to_json()["runs"][0]  # type: ignore[index]
    assert run["restart"] is None and run["ranks"] == [] and run["straggler"] is None
    assert run["phases"]["compute"]["min"] == {"rank": None, "seconds": pytest.approx(0.030)}
    assert run["phases"]["compute"]["max"] == {"rank": None, "seconds": pytest.approx(0.030)}
    assert run["notes"] == [
        "only rank 0 reported (a log from before every rank printed its timing): a slow rank elsewhere shows "
        "here as communication"
    ]


def test_an_idle_run_shares_nothing_in_the_json() -> None:
    run = job_profile(_line(0.0, 0.0, 0.0, 0.0), "log").to_json()["runs"][0]  # type: ignore[index]
    assert run["step_s"] == 0.0 and [run["phases"][p]["share"] for p in PHASES] == [0.0] * 4


@pytest.mark.parametrize(
    ("world", "said"),
    [
        (10, "ranks 2, 3, 4, 5, 6, 7, 8, 9 of 10 did not report"),  # eight missing: all of them named
        (11, "ranks 2, 3, 4, 5, 6, 7, 8, 9 ... of 11 did not report"),  # nine: the first eight and "..."
        (2, None),  # every rank reported
    ],
)
def test_ranks_that_did_not_report_are_named_up_to_eight(world: int, said: str | None) -> None:
    even = (0.001, 0.030, 0.010, 0.0)
    log = f"start host=train-0 world={world} resumed_from=0 restart=0\n" + _windows(1, 5, {0: even, 1: even})
    notes = job_profile(log, "log").runs[0].notes
    if said is None:
        assert notes == ()
    else:
        assert notes == (f"{said}: a straggler among them would go unseen",)


@pytest.mark.parametrize(
    ("steps", "notes"),
    [
        (20, ()),  # 20 steps: not fewer than 20
        (19, ("only 19 steps: start-up and warm-up weigh heavily in so few",)),
    ],
)
def test_a_run_of_fewer_than_20_steps_is_said_to_be_short(steps: int, notes: tuple[str, ...]) -> None:
    text = _rank_line(steps, 0, (0.001, 0.030, 0.010, 0.0), steps=steps)
    assert job_profile(text, "log").runs[0].notes == notes


def test_fifty_steps_a_rank_are_enough_to_name_a_straggler_and_one_rank_never_is() -> None:
    log = _straggler_log(windows=5)  # 50 steps a rank
    profile = job_profile(log, "log")
    assert profile.runs[0].notes == () and profile.straggler is not None and profile.straggler.rank == 2
    alone = "start host=train-0 world=1 resumed_from=0 restart=0\n" + _windows(
        1, 3, {0: (0.001, 0.03, 0.01, 0.0)}
    )
    assert job_profile(alone, "log").runs[0].notes == ()  # one rank, 30 steps: nothing to compare


def test_a_run_resumed_from_the_last_step_of_the_one_before_redid_nothing() -> None:
    even = (0.001, 0.030, 0.010, 0.0)
    log = "start host=train-0 world=1 resumed_from=0 restart=0\n" + _windows(1, 3, {0: even})
    log += "start host=train-0 world=1 resumed_from=30 restart=1\n" + _windows(4, 6, {0: even})
    profile = job_profile(log, "log")
    assert [run.redone for run in profile.runs] == [0, 0] and profile.runs[1].notes == ()


def test_of_two_equally_slow_ranks_the_lowest_is_named() -> None:
    """Ranks 0 and 1 both compute at half speed; the others wait for them: rank 0 is named, whichever
    rank's lines come first."""
    fast, slow = (0.001, 0.030, 0.035, 0.0), (0.001, 0.060, 0.005, 0.0)
    profile = job_profile(_windows(1, 10, {1: slow, 0: slow, 3: fast, 2: fast}), "log")
    assert profile.straggler is not None and profile.straggler.rank == 0


def test_a_rank_waiting_for_its_data_is_a_data_straggler() -> None:
    fast, starved = (0.001, 0.030, 0.045, 0.0), (0.040, 0.030, 0.006, 0.0)
    straggler = job_profile(_windows(1, 10, {0: fast, 1: starved, 2: fast, 3: fast}), "log").straggler
    assert straggler is not None and (straggler.rank, straggler.phase) == (1, "data")


@pytest.mark.parametrize(
    ("slow", "fast", "named"),
    [
        # step 10 s: the slow rank works 1 s (10 % of the step) more and the other waits 1 s: not above 10 %
        ((0.0, 5.0, 5.0, 0.0), (0.0, 4.0, 6.0, 0.0), False),
        # 2 s more, the other waits exactly half of that (1 s): it does wait at least half, named
        ((0.0, 6.0, 2.0, 0.0), (0.0, 4.0, 3.0, 0.0), True),
    ],
)
def test_a_straggler_at_the_limits_of_excess_and_wait(
    slow: tuple[float, ...], fast: tuple[float, ...], named: bool
) -> None:
    """The two limits at their values, in sums a float holds exactly: extra work above 10 % of the step
    (not at it), the others' wait at least half of it. Two ranks are enough to compare."""
    text = _rank_line(50, 0, fast, steps=50) + _rank_line(50, 1, slow, steps=50)
    straggler = job_profile(text, "log").straggler
    assert (straggler is not None and straggler.rank == 1) is named


def test_the_straggler_is_described_in_milliseconds_and_percent() -> None:
    """What the command prints: the extra work and the wait in ms, the straggler's own communication in %
    of the step (0.0156 of 0.0766 s: 20 %); a rank whose lines name no host is described without one,
    and its host is null in the JSON."""
    fast, slow = (0.001, 0.030, 0.0456, 0.0), (0.001, 0.060, 0.0156, 0.0)
    straggler = job_profile(_windows(1, 5, {0: fast, 1: slow}), "log").straggler
    assert straggler is not None
    assert straggler.describe() == (
        "rank 1 on train-0 spends 30.00 ms per step more on compute than the median rank, and the others "
        "wait 30.00 ms for it in the all-reduce; without that wait communication is 20% of a step"
    )
    hostless = _windows(1, 5, {0: fast, 1: slow}).replace(" host=train-0", "")
    straggler = job_profile(hostless, "log").straggler
    assert straggler is not None and straggler.describe().startswith("rank 1 spends 30.00 ms")
    assert straggler.to_json()["host"] is None


def test_a_line_without_a_rank_is_never_named_the_straggler() -> None:
    """A run with rank 0's old-style line (no `rank=`) among every rank's: the old line is no rank of its
    own to blame, however slow it reads."""
    fast, slow = (0.001, 0.030, 0.035, 0.0), (0.001, 0.060, 0.005, 0.0)
    text = _windows(1, 10, {0: fast, 1: fast, 2: slow, 3: fast}) + _line(0.5, 0.5, 0.0, 0.0, steps=50)
    straggler = job_profile(text, "log").straggler
    assert straggler is not None and straggler.rank == 2
