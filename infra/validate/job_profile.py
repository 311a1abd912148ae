"""Why is the GPU idle? A training job's own account of each step (the `timing` lines that
examples/train_dist/train.py prints: seconds per step waiting for data, computing, communicating and
blocked on checkpoints), per run of the job and per rank, and which phase keeps the accelerator waiting.

The log is what Slurm writes for the job: with `--open-mode=append` a requeued job's runs follow one
another in one file, each beginning with rank 0's `start host=... world=N resumed_from=S restart=K`.
Each run is profiled on its own: a run resumed from a checkpoint redoes the steps after it, and summing
the runs would count those twice. Every rank prints its own lines (`timing rank=R host=H ...`, one
self-contained line each, so lines of several ranks interleaved in one file are still read whole); a
log with rank 0's lines only (before issue 47) is read as before, with a note.

In synchronous data parallelism every rank's step takes as long as the slowest rank's: the others wait
for it in the all-reduce, and that wait is timed as their communication. So a straggler reads as
"communication-bound" from rank 0 alone. With every rank's lines: the rank that works longest before the
all-reduce (data + compute) while the others' communication is longer than its own by most of the
difference is named as the straggler, and the job is straggler-bound, not communication-bound.

The order of suspicion otherwise follows the field report the platform answers: low utilisation is
usually data starvation first, then communication. The thresholds are this project's: data above 10% of
the step, communication above 30%, checkpoints above 5% (the checkpoint budget of `gpuplat validate`);
a straggler when its extra work is above 10% of the step and the others wait at least half of it."""

from __future__ import annotations

import dataclasses
import re
import statistics
from dataclasses import dataclass, field

from infra.errors import SpecError

PHASES = ("data", "compute", "comm", "checkpoint")
_NUMBER = r"\d+(?:\.\d*)?(?:[eE][-+]?\d+)?"
_TIMING = re.compile(
    r"(?:step (?P<step>\d+) loss \S+ )?timing(?: rank=(?P<rank>\d+))?(?: host=(?P<host>\S+))? "
    + " ".join(rf"{phase}_s=(?P<{phase}>{_NUMBER})" for phase in PHASES)
    + r" steps=(?P<steps>\d+)(?!\d)"
)
_START = re.compile(
    r"\bstart host=(?P<host>\S+) world=(?P<world>\d+) resumed_from=(?P<resumed>\d+)"
    r"(?: restart=(?P<restart>\d+))?"
)
_ANY_TIMING = re.compile(r"\btiming (?:rank=|host=|data_s=)")
# A phase that takes more than this share of a step is what to fix first (checked in this order).
LIMITS = (("data", 0.10), ("comm", 0.30), ("checkpoint", 0.05))
# A straggler: its data + compute exceed the other ranks' median by this share of the step, and the
# others' communication exceeds its own by at least this part of that excess (they wait for it).
STRAGGLER_EXCESS = 0.10
STRAGGLER_WAIT = 0.5
# No straggler is named from fewer steps per rank: with per-step noise of 30% (lognormal), 4 ranks and
# 20 steps, identical ranks were named one 8% of the time; from 50 steps, 0.2%, and a rank 30% slower
# was found 97% of the time (tests/unit/test_job_profile.py simulates it with this code).
STRAGGLER_MIN_STEPS = 50
# Fewer steps than this in a run: its first window (start-up, warm-up) weighs heavily; said in a note.
FEW_STEPS = 20
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
    "straggler": (
        "straggler-bound: one rank is slower than the others, which wait for it in the all-reduce (their "
        "communication time is that wait, not the network). Look at that rank's node: its GPU's clocks and "
        "temperature (throttling), `gpuplat-node-check` and the node's health, other work on it, and its "
        "data loading; exclude the node (sbatch --exclude) to confirm."
    ),
}


@dataclass(frozen=True)
class RankTimes:
    """One rank's totals over a run: seconds per phase and the steps they cover."""

    rank: int | None
    host: str | None
    steps: int
    seconds: dict[str, float]

    def per_step(self, phase: str) -> float:
        return self.seconds[phase] / self.steps if self.steps else 0.0

    @property
    def work(self) -> float:
        """Time on its own before the all-reduce: waiting for its data and computing."""
        return self.per_step("data") + self.per_step("compute")


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str | None
    phase: str  # "compute" or "data": where its extra time goes
    excess_s: float  # its data + compute above the other ranks' median, per step
    others_wait_s: float  # the other ranks' median communication above its own, per step
    own_comm_share: float  # its own communication's share of the step: the all-reduce without the wait

    def describe(self) -> str:
        where = f" on {self.host}" if self.host else ""
        return (
            f"rank {self.rank}{where} spends {self.excess_s * 1000:.2f} ms per step more on {self.phase} "
            f"than the median rank, and the others wait {self.others_wait_s * 1000:.2f} ms for it in the "
            f"all-reduce; without that wait communication is {self.own_comm_share * 100:.0f}% of a step"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "host": self.host,
            "phase": self.phase,
            "excess_s": self.excess_s,
            "others_wait_s": self.others_wait_s,
            "own_comm_share": self.own_comm_share,
        }


@dataclass(frozen=True)
class RunProfile:
    """One run of the job (one `start` line to the next) and its ranks."""

    index: int
    host: str | None
    world: int | None
    resumed_from: int | None
    restart: int | None
    last_step: int | None
    ranks: dict[int | None, RankTimes]
    redone: int = 0
    notes: tuple[str, ...] = ()

    @property
    def steps(self) -> int:
        return max((r.steps for r in self.ranks.values()), default=0)

    @property
    def seconds_per_step(self) -> dict[str, float]:
        """The mean over the ranks that reported."""
        return {p: statistics.fmean(r.per_step(p) for r in self.ranks.values()) for p in PHASES}

    @property
    def step_s(self) -> float:
        return sum(self.seconds_per_step.values())

    def share(self, phase: str) -> float:
        return self.seconds_per_step[phase] / self.step_s if self.step_s else 0.0

    def spread(self, phase: str) -> tuple[tuple[int | None, float], tuple[int | None, float]]:
        """(rank, seconds per step) of the lowest and the highest rank in this phase."""
        values = [(r.per_step(phase), r.rank if r.rank is not None else -1) for r in self.ranks.values()]
        low = min(values)
        high = max(values, key=lambda v: (v[0], -v[1]))  # of equals, the lowest rank
        return (_rank(low[1]), low[0]), (_rank(high[1]), high[0])

    @property
    def straggler(self) -> Straggler | None:
        if min(r.steps for r in self.ranks.values()) < STRAGGLER_MIN_STEPS:
            return None
        return find_straggler(list(self.ranks.values()), self.step_s)

    @property
    def dominant(self) -> str:
        if self.straggler is not None:
            return "straggler"
        return verdict(self.seconds_per_step)

    def to_json(self) -> dict[str, object]:
        phases: dict[str, object] = {}
        for phase in PHASES:
            (low_rank, low), (high_rank, high) = self.spread(phase)
            phases[phase] = {
                "seconds": self.seconds_per_step[phase],
                "share": self.share(phase),
                "min": {"rank": low_rank, "seconds": low},
                "max": {"rank": high_rank, "seconds": high},
            }
        straggler = self.straggler
        return {
            "run": self.index,
            "host": self.host,
            "world": self.world,
            "resumed_from": self.resumed_from,
            "restart": self.restart,
            "last_step": self.last_step,
            "steps": self.steps,
            "redone": self.redone,
            "ranks": sorted(r for r in self.ranks if r is not None),
            "step_s": self.step_s,
            "phases": phases,
            "dominant": self.dominant,
            "straggler": straggler.to_json() if straggler else None,
            "notes": list(self.notes),
        }


def _rank(value: int) -> int | None:
    return None if value < 0 else value


def verdict(per_step: dict[str, float]) -> str:
    step_s = sum(per_step.values())
    return next((p for p, limit in LIMITS if step_s and per_step[p] / step_s > limit), "compute")


def find_straggler(ranks: list[RankTimes], step_s: float) -> Straggler | None:
    known = [r for r in ranks if r.rank is not None and r.steps]
    if len(known) < 2 or not step_s:
        return None
    slowest = max(known, key=lambda r: (r.work, -(r.rank or 0)))
    others = [r for r in known if r is not slowest]
    excess = slowest.work - statistics.median(r.work for r in others)
    wait = statistics.median(r.per_step("comm") for r in others) - slowest.per_step("comm")
    if excess <= STRAGGLER_EXCESS * step_s or wait < STRAGGLER_WAIT * excess:
        return None
    extra = {
        phase: slowest.per_step(phase) - statistics.median(r.per_step(phase) for r in others)
        for phase in ("data", "compute")
    }
    assert slowest.rank is not None
    return Straggler(
        rank=slowest.rank,
        host=slowest.host,
        phase=max(extra, key=lambda p: extra[p]),
        excess_s=excess,
        others_wait_s=wait,
        own_comm_share=slowest.per_step("comm") / step_s,
    )


@dataclass(frozen=True)
class JobProfile:
    """Every run of the job; the job's numbers are the runs' step-weighted means, its verdict the
    verdict of its longest run (the latest of equals)."""

    runs: tuple[RunProfile, ...]
    malformed: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def steps(self) -> int:
        """Steps run, over every run (redone steps are run again, and counted as often as they ran)."""
        return sum(run.steps for run in self.runs)

    @property
    def redone(self) -> int:
        return sum(run.redone for run in self.runs)

    @property
    def seconds_per_step(self) -> dict[str, float]:
        total = self.steps
        return {p: sum(r.seconds_per_step[p] * r.steps for r in self.runs) / total for p in PHASES}

    @property
    def step_s(self) -> float:
        return sum(self.seconds_per_step.values())

    def share(self, phase: str) -> float:
        return self.seconds_per_step[phase] / self.step_s if self.step_s else 0.0

    @property
    def verdict_run(self) -> RunProfile:
        return max(self.runs, key=lambda run: (run.steps, run.index))

    @property
    def dominant(self) -> str:
        return self.verdict_run.dominant

    @property
    def straggler(self) -> Straggler | None:
        return self.verdict_run.straggler

    def to_json(self) -> dict[str, object]:
        straggler = self.straggler
        return {
            "steps": self.steps,
            "steps_redone": self.redone,
            "step_s": self.step_s,
            "phases": {p: {"seconds": self.seconds_per_step[p], "share": self.share(p)} for p in PHASES},
            "dominant": self.dominant,
            "verdict_run": self.verdict_run.index,
            "straggler": straggler.to_json() if straggler else None,
            "advice": ADVICE[self.dominant],
            "runs": [run.to_json() for run in self.runs],
            "malformed_lines": self.malformed,
            "notes": list(self.notes),
        }


@dataclass
class _Run:
    host: str | None = None
    world: int | None = None
    resumed_from: int | None = None
    restart: int | None = None
    last_step: int | None = None
    ranks: dict[int | None, list[tuple[str | None, int, list[float]]]] = field(default_factory=dict)


def job_profile(text: str, source: str) -> JobProfile:
    runs: list[_Run] = [_Run()]
    events = sorted([*_START.finditer(text), *_TIMING.finditer(text)], key=lambda m: m.start())
    for match in events:
        if match.re is _START:
            runs.append(
                _Run(
                    host=match["host"],
                    world=int(match["world"]),
                    resumed_from=int(match["resumed"]),
                    restart=int(match["restart"]) if match["restart"] else None,
                )
            )
            continue
        run = runs[-1]
        values = [float(match[phase]) for phase in PHASES]
        rank = int(match["rank"]) if match["rank"] is not None else None
        run.ranks.setdefault(rank, []).append((match["host"], int(match["steps"]), values))
        if match["step"] is not None:
            run.last_step = max(run.last_step or 0, int(match["step"]))
    malformed = len(_ANY_TIMING.findall(text)) - sum(
        len(windows) for run in runs for windows in run.ranks.values()
    )
    profiles: list[RunProfile] = []
    previous_last: int | None = None
    for raw in runs:
        ranks = {rank: _totals(rank, windows) for rank, windows in raw.ranks.items()}
        ranks = {rank: times for rank, times in ranks.items() if times.steps}
        if not ranks:  # a run that ended before its first timing line
            continue
        redone = 0
        if raw.resumed_from is not None and previous_last is not None:
            redone = max(0, previous_last - raw.resumed_from)
        profile = RunProfile(
            index=len(profiles) + 1,
            host=raw.host,
            world=raw.world,
            resumed_from=raw.resumed_from,
            restart=raw.restart,
            last_step=raw.last_step,
            ranks=ranks,
            redone=redone,
        )
        profiles.append(_with_notes(profile))
        previous_last = raw.last_step
    if not profiles:
        raise SpecError(
            f"{source}: no `timing` lines (timing rank=R data_s=... compute_s=... comm_s=... "
            "checkpoint_s=... steps=N): give the output of a job that reports them, such as "
            "examples/train_dist/train.py"
        )
    notes = []
    if malformed > 0:
        notes.append(
            f"{malformed} `timing` line(s) not read whole (cut off, or mixed with another line): left out"
        )
    return JobProfile(tuple(profiles), malformed=max(0, malformed), notes=tuple(notes))


def _totals(rank: int | None, windows: list[tuple[str | None, int, list[float]]]) -> RankTimes:
    seconds = dict.fromkeys(PHASES, 0.0)
    steps = 0
    host = None
    for window_host, count, values in windows:
        host = window_host or host
        steps += count
        for phase, value in zip(PHASES, values, strict=True):
            seconds[phase] += value * count
    return RankTimes(rank, host, steps, seconds)


def _with_notes(run: RunProfile) -> RunProfile:
    notes = []
    reported = sorted(r for r in run.ranks if r is not None)
    if not reported:
        notes.append(
            "only rank 0 reported (a log from before every rank printed its timing): a slow rank elsewhere "
            "shows here as communication"
        )
    elif run.world is not None and len(reported) < run.world:
        missing = sorted(set(range(run.world)) - set(reported))
        shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
        notes.append(f"ranks {shown} of {run.world} did not report: a straggler among them would go unseen")
    counts = {times.steps for times in run.ranks.values()}
    if len(counts) > 1:
        notes.append(f"the ranks reported different numbers of steps ({min(counts)} to {max(counts)})")
    if run.steps < FEW_STEPS:
        notes.append(f"only {run.steps} steps: start-up and warm-up weigh heavily in so few")
    if len(reported) > 1 and min(t.steps for t in run.ranks.values()) < STRAGGLER_MIN_STEPS:
        notes.append(
            f"fewer than {STRAGGLER_MIN_STEPS} steps per rank: too few to tell a straggler from noise, "
            "none named"
        )
    if run.redone:
        notes.append(
            f"resumed from step {run.resumed_from}: redid at least {run.redone} steps of the run before"
        )
    return dataclasses.replace(run, notes=tuple(notes))
