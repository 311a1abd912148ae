"""`gpuplat job-profile`: where a training job's steps go (data, compute, communication, checkpoints),
from its own log, and what to do about the largest. Exit 0, or 2 for a log without timing lines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from infra.cli import output
from infra.cli.stack_options import JsonFlag, read_log
from infra.validate.job_profile import ADVICE, PHASES, job_profile


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
    console.print(escape(f"{log}: {profile.steps} steps, {profile.step_s * 1000:.1f} ms per step"))
    rows = [
        [phase, f"{profile.seconds_per_step[phase] * 1000:.2f}", f"{profile.share(phase) * 100:.1f}%"]
        for phase in PHASES
    ]
    console.print(output.table("Where a step's time goes", ["phase", "ms per step", "share"], rows))
    console.print(escape(ADVICE[profile.dominant]))
