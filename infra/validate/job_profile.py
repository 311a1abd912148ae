"""Why is the GPU idle? A training job's own account of each step (the `timing` lines that
examples/train_dist/train.py prints: seconds per step waiting for data, computing, communicating and
blocked on checkpoints), summed over the log, and which phase keeps the accelerator waiting.

The order of suspicion follows the field report the platform answers: low utilisation is usually data
starvation first, then communication. The thresholds are this project's: data above 10% of the step,
communication above 30%, checkpoints above 5% (the checkpoint budget of `gpuplat validate`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from infra.errors import SpecError

PHASES = ("data", "compute", "comm", "checkpoint")
_TIMING = re.compile(
    r"timing data_s=(?P<data>[\d.]+) compute_s=(?P<compute>[\d.]+) comm_s=(?P<comm>[\d.]+) "
    r"checkpoint_s=(?P<checkpoint>[\d.]+) steps=(?P<steps>\d+)"
)
# A phase that takes more than this share of a step is what to fix first (checked in this order).
LIMITS = (("data", 0.10), ("comm", 0.30), ("checkpoint", 0.05))
ADVICE = {
    "data": (
        "data-bound: the accelerators wait for batches. Stage the dataset on the node's cache (the stack's "
        "datasets), raise the DataLoader's workers and prefetch, and check that /dev/shm is large enough "
        "for them (the platform sizes it on training nodes)."
    ),
    "comm": (
        "communication-bound: the gradients' all-reduce dominates. Check the transport NCCL chose with "
        "`gpuplat nccl-report` on the job's first-run NCCL log (nccl-<job>-<host>-<pid>.log beside its "
        "output; TCP sockets instead of RDMA is the usual cause) and run the 8 -> 32 GPU scaling check "
        "(`gpuplat validate --params ... --step-compute-s <compute below>`)."
    ),
    "checkpoint": (
        "checkpoint-bound: saving blocks training. Save asynchronously (torch.distributed.checkpoint."
        "async_save) or less often (GPUPLAT_CHECKPOINT_EVERY / --every), and check the shared filesystem's "
        "write throughput with `gpuplat validate`."
    ),
    "compute": "compute-bound: the accelerators are busy; data, communication and checkpoints cost little.",
}


@dataclass(frozen=True)
class JobProfile:
    steps: int
    seconds_per_step: dict[str, float]
    dominant: str

    @property
    def step_s(self) -> float:
        return sum(self.seconds_per_step.values())

    def share(self, phase: str) -> float:
        return self.seconds_per_step[phase] / self.step_s if self.step_s else 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "step_s": self.step_s,
            "phases": {p: {"seconds": self.seconds_per_step[p], "share": self.share(p)} for p in PHASES},
            "dominant": self.dominant,
            "advice": ADVICE[self.dominant],
        }


def job_profile(text: str, source: str) -> JobProfile:
    totals = dict.fromkeys(PHASES, 0.0)
    steps = 0
    for match in _TIMING.finditer(text):
        count = int(match["steps"])
        steps += count
        for phase in PHASES:
            totals[phase] += float(match[phase]) * count
    if steps == 0:
        raise SpecError(
            f"{source}: no `timing` lines (data_s=... compute_s=... comm_s=... checkpoint_s=... steps=N): "
            "give the output of a job that reports them, such as examples/train_dist/train.py"
        )
    per_step = {phase: totals[phase] / steps for phase in PHASES}
    step_s = sum(per_step.values())
    dominant = next((p for p, limit in LIMITS if step_s and per_step[p] / step_s > limit), "compute")
    return JobProfile(steps, per_step, dominant)
