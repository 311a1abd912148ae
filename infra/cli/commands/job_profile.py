"""`gpuplat job-profile`: where a training job's steps go (data, compute, communication, checkpoints),
from its own log, per run of a requeued job and per rank, and what to do about the largest (or about
the straggler the other ranks wait for). Exit 0, or 2 for a log without timing lines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from infra.cli import output
from infra.cli.stack_options import JsonFlag, read_log
from infra.validate.job_profile import ADVICE, PHASES, JobProfile, RunProfile, job_profile


def job_profile_command(
    log: Annotated[Path, typer.Argument(metavar="LOG", help="the job's output (e.g. slurm-<job>.out)")],
    json_output: JsonFlag = False,
) -> None:
    """Why is the GPU idle? Per step: waiting for data, computing, communicating, blocked on checkpoints."""
    text = read_log(log)
    profile = job_profile(text, str(log))
    if json_output:
        output.print_json(profile.to_json())
        return
    console = output.stdout()
    runs = len(profile.runs)
    if runs == 1:
        console.print(escape(f"{log}: {profile.steps} steps, {profile.step_s * 1000:.1f} ms per step"))
    else:
        redone = f" (at least {profile.redone} redone after resuming)" if profile.redone else ""
        console.print(
            escape(
                f"{log}: {runs} runs (a requeued job), {profile.steps} steps run{redone}, "
                f"{profile.step_s * 1000:.1f} ms per step"
            )
        )
    for run in profile.runs:
        _print_run(console, run, titled=runs > 1)
    for note in profile.notes:
        console.print(escape(f"note: {note}"))
    chosen = profile.verdict_run
    if runs > 1:
        console.print(escape(f"Verdict from run {chosen.index} (the longest, {chosen.steps} steps):"))
    if profile.straggler is not None:
        console.print(escape(f"straggler: {profile.straggler.describe()}"))
    console.print(escape(ADVICE[profile.dominant]))


def _print_run(console: Console, run: RunProfile, *, titled: bool) -> None:
    ranks = sorted(r for r in run.ranks if r is not None)
    if titled:
        started = (
            f"started on {run.host}, world {run.world}, from step {run.resumed_from}, restart {run.restart}"
            if run.host
            else "before any start line"
        )
        console.print(
            escape(f"Run {run.index}: {started}: {run.steps} steps, {run.step_s * 1000:.1f} ms per step")
        )
    rows = []
    for phase in PHASES:
        (low_rank, low), (high_rank, high) = run.spread(phase)
        row = [phase, f"{run.seconds_per_step[phase] * 1000:.2f}"]
        if ranks:
            row += [f"{low * 1000:.2f} (rank {low_rank})", f"{high * 1000:.2f} (rank {high_rank})"]
        rows.append([*row, f"{run.share(phase) * 100:.1f}%"])
    columns = ["phase", "ms per step"]
    if ranks:
        columns[1] = f"ms per step (mean of {len(ranks)} ranks)"
        columns += ["lowest", "highest"]
    console.print(output.table("Where a step's time goes", [*columns, "share"], rows))
    if titled:
        console.print(escape(f"run {run.index}: {ADVICE[run.dominant].split(':')[0]}"))
        if run.straggler is not None:
            console.print(escape(f"run {run.index}: straggler: {run.straggler.describe()}"))
    for note in run.notes:
        console.print(escape(f"note (run {run.index}): {note}" if titled else f"note: {note}"))


__all__ = ["JobProfile", "job_profile_command"]
