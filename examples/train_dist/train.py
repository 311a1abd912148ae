#!/usr/bin/env python3
"""A multi-node PyTorch training job that survives node loss, preemption and its time limit.

Run under torchrun on every node (train.sbatch does it on Slurm, the JobSet of `gpuplat manifests` on
Kueue). It trains a small model with DistributedDataParallel on a synthetic data set fixed by --seed,
in a data order fixed by the seed and the step number, so its result does not depend on where or how
often it was interrupted: a resumed run ends bit-identical to one never interrupted, at the same world
size. (At another world size every step reads the same global batch, but each rank's share and the order
in which the all-reduce sums the gradients change, so the result is close, not bit-identical; a
checkpoint records the world size, and a run of another size refuses it.)

Checkpoints (torch.distributed.checkpoint, every rank writes its own part), under --dir:
- every --every steps, saved asynchronously: the state is copied to host memory (one stager for the run,
  its buffers reused, pinned where CUDA is) and a background thread writes it while the training goes on;
- a save is written under a temporary name (.saving-step-NNNNNNNN-<run>); once every rank's part and
  DCP's .metadata are written, rank 0 writes its COMPLETE marker (the step and the run's identity: the
  arguments that determine the result, and the world size) and renames it to step-NNNNNNNN. A step
  directory is complete from the moment it exists, and is never written again;
- on start, every rank resumes from the newest complete checkpoint; one written with other arguments is
  refused (exit 65), one that does not read back (a truncated shard) is moved aside and the one before is
  tried; a run whose checkpoint is at or past --steps reports its model and exits 0;
- before the first step, rank 0 checks that the directory takes a file and has room for the checkpoints
  kept and one in flight; if not, the run stops (exit 73): requeueing would not help;
- older checkpoints are removed by a thread (renamed out of the step names first), keeping --keep;
- on SIGTERM (spot interruption, preemption, `scontrol requeue`, the time limit's --signal), the ranks
  agree on the step to stop at, wait for a save in flight, save that step at once and exit 143. torchrun
  forwards SIGTERM to its workers and SIGKILLs them after its --shutdown-timeout (30 s unless told:
  torch/distributed/launcher/api.py:145-149, elastic/agent/server/api.py:752-756,
  elastic/multiprocessing/api.py:1023-1052 @v2.13.0); train.sbatch sets it from the job's grace.

torchrun exits 1 whatever its workers' codes (its main is @record, which re-raises ChildFailedError:
torch/distributed/run.py:1025-1028, launcher/api.py:379-387 @v2.13.0), so every rank also writes its exit
code to the file named by GPUPLAT_TRAIN_EXIT_FILE, where train.sbatch reads it.

Per step it measures the time spent waiting for data, computing and communicating (the all-reduce of
the gradients); every rank prints them every --log-every steps as a `timing rank=R host=H ...` line (one
whole line each, so the ranks' lines can interleave in one log), and rank 0 writes them for
node_exporter's textfile collector (--metrics-dir): `gpuplat job-profile LOG` says which dominates, and
names a straggler rank the others wait for. On CUDA the host timers are read after
torch.cuda.synchronize() and the all-reduce is timed with CUDA events (kernels run asynchronously: without
it the GPU's work would be counted wherever the host next waits, often as data).
"""

import argparse
import copy
import ctypes
import hashlib
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.storage import WriteResult
from torch.nn.parallel import DistributedDataParallel

COMPLETE = "COMPLETE"
STEP_DIR = re.compile(r"^step-(\d{8})$")
SAVING, REMOVING, UNREADABLE = ".saving-", ".removing-", ".unreadable-"
FEATURES, ROWS = 32, 4096
# What determines a run's result; its checkpoints record them and a run with other values refuses them.
RUN_IDENTITY = ("seed", "batch", "lr", "hidden", "depth", "world")
# Exit codes train.sbatch acts on (through GPUPLAT_TRAIN_EXIT_FILE).
EXIT_STOPPED = 128 + signal.SIGTERM  # saved on SIGTERM: requeued
EXIT_OTHER_RUN = 65  # sysexits' EX_DATAERR: the directory holds another run's checkpoints; not requeued
EXIT_STORAGE = 73  # EX_CANTCREAT: the directory is not writable or too small; not requeued
EXIT_FILE = "GPUPLAT_TRAIN_EXIT_FILE"
MIB = 2**20
# Free space asked beyond the checkpoints themselves: DCP's metadata, the filesystem's own overhead.
SPACE_FACTOR, SPACE_MARGIN = 1.1, 64 * MIB


# --- checkpoints on the shared filesystem ------------------------------------------------------------


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def saving_dir(root: Path, step: int, run: str) -> Path:
    """Where run `run` writes step's checkpoint until it is complete."""
    return root / f"{SAVING}{step_dir(root, step).name}-{run}"


def read_marker(path: Path) -> dict[str, str]:
    """The KEY=VALUE lines of a checkpoint's COMPLETE marker; empty without one."""
    try:
        text = (path / COMPLETE).read_text(encoding="utf-8")
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def is_complete(path: Path) -> bool:
    """Complete: the marker names the directory's step and DCP's metadata file is there."""
    match = STEP_DIR.match(path.name)
    if not match:
        return False
    return read_marker(path).get("step") == str(int(match.group(1))) and (path / ".metadata").is_file()


def checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Every step directory under root, oldest first."""
    found = []
    for path in root.glob("step-*") if root.is_dir() else ():
        match = STEP_DIR.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def complete_steps(root: Path) -> list[int]:
    return [step for step, path in checkpoints(root) if is_complete(path)]


def newest_complete(root: Path) -> int | None:
    complete = complete_steps(root)
    return complete[-1] if complete else None


def sync_directory(path: Path) -> None:
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_durably(path: Path, text: str) -> None:
    """Written whole or not at all: to a temporary name, fsynced, renamed into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
    sync_directory(path.parent)


def promote(saving: Path, final: Path, marker: dict[str, str]) -> None:
    """Mark a written save complete, then give it its step's name. A directory of that name can only be
    incomplete (saves are of steps past the newest complete one), left by an older version of this
    program: it is set aside for the pruner first."""
    write_durably(saving / COMPLETE, "".join(f"{key}={value}\n" for key, value in marker.items()))
    if final.exists():
        final.rename(final.with_name(f"{REMOVING}{final.name}-{saving.name}"))
    saving.rename(final)
    sync_directory(final.parent)


def set_aside(root: Path) -> list[Path]:
    """Checkpoints that did not read back, renamed out of the step names (restore): oldest step first,
    and of one step, the one set aside first (the rename sets its ctime; the run IDs in the names are
    random)."""
    found = []
    for path in root.glob(f"step-*{UNREADABLE}*") if root.is_dir() else ():
        match = STEP_DIR.match(path.name.split(UNREADABLE, 1)[0])
        if match and path.is_dir():
            found.append((int(match.group(1)), path.stat().st_ctime_ns, path.name, path))
    return [path for *_, path in sorted(found)]


def stale(root: Path, keep: int, run: str) -> list[Path]:
    """What pruning removes: complete checkpoints but the newest `keep`; step directories without a
    marker older than the newest complete one; saves and removals a killed run left; checkpoints set
    aside as unreadable but the newest (kept for a look at why, each as large as a checkpoint). Never the
    newest complete checkpoint (keep >= 1) nor a save of this run (`run`), which may be in flight."""
    found = checkpoints(root)
    complete = [step for step, path in found if is_complete(path)]
    if not complete:
        return []
    kept = set(complete[-keep:])
    old = [path for step, path in found if step not in kept and step < complete[-1]]
    abandoned = [path for path in root.glob(f"{SAVING}*") if not path.name.endswith(f"-{run}")]
    return old + abandoned + set_aside(root)[:-1] + sorted(root.glob(f"{REMOVING}*"))


class Pruner:
    """Removes stale checkpoints in a thread of its own, as torchtitan's purge thread does
    (torchtitan/components/checkpoint.py:95-118 @v0.2.2), so that rank 0 does not hold up training on a
    large rmtree. Each is first renamed out of the step names (at once, atomically): a run killed during
    a removal never finds a half-removed checkpoint under a step's name."""

    def __init__(self, root: Path, run: str) -> None:
        self.root, self.run = root, run
        self.queue: queue.Queue[Path | None] = queue.Queue()
        self.thread = threading.Thread(target=self._remove, name="checkpoint-pruner", daemon=True)
        self.thread.start()

    def prune(self, keep: int) -> None:
        for path in stale(self.root, keep, self.run):
            if not path.name.startswith(REMOVING):
                aside = path.with_name(f"{REMOVING}{path.name}")
                try:
                    path.rename(aside)
                except OSError:  # taken by an earlier removal not yet done: the next prune retries
                    continue
                path = aside
            self.queue.put(path)

    def _remove(self) -> None:
        while (path := self.queue.get()) is not None:
            shutil.rmtree(path, ignore_errors=True)

    def close(self, wait: bool) -> None:
        """`wait`: for the removals queued. Without, they stop with the process (a daemon thread), under
        names no run resumes from and the next prune removes."""
        if wait:
            self.queue.put(None)
            self.thread.join()


class CheckpointWriter(FileSystemWriter):
    """DCP's file writer, refusing to write over an existing checkpoint's metadata (filesystem.py:652-662
    @v2.13.0), and slowed by `delay_s` before it writes .metadata (fault tests: a slow filesystem)."""

    def __init__(self, path: Path, delay_s: float) -> None:
        super().__init__(path, overwrite=False)
        self.delay_s = delay_s

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        time.sleep(self.delay_s)
        super().finish(metadata, results)


def make_stager() -> DefaultStager:
    """One stager for every async save of the run: it keeps its host copy of each tensor between saves
    (_state_dict_stager.py:146-182 @v2.13.0), where async_save without one makes a new, unpinned one per
    save and closes it afterwards (state_dict_saver.py:307-321, 359-360). Pinned, and copied without
    blocking, where CUDA is (StagingOptions, staging.py:106-130). The copy itself stays synchronous
    (use_async_staging=False): the next optimizer step must not change a tensor while it is copied. A
    save reuses the buffers the save before wrote from, so it starts only after that one finished."""
    cuda = torch.cuda.is_available()
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=cuda,
            use_shared_memory=False,
            use_async_staging=False,
            use_non_blocking_copy=cuda,
        )
    )


def storage_problem(root: Path, state_bytes: int, keep: int) -> str | None:
    """Why root cannot take this run's checkpoints (None: it can): it is not writable, or it has less free
    space than the checkpoints kept and one being written (those already there count as kept). statvfs
    does not see a user's quota: a quota already exceeded fails the write test, one about to be does not."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".probe-") as probe:
            probe.write(b"probe")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as error:
        return f"cannot write to {root}: {error.strerror}."
    to_write = keep + 1 - min(len(complete_steps(root)), keep)
    needed = int(state_bytes * to_write * SPACE_FACTOR) + SPACE_MARGIN
    free = shutil.disk_usage(root).free
    if free >= needed:
        return None
    return (
        f"{root} has {free // MIB} MiB free; the {to_write} checkpoint(s) still to be written "
        f"({state_bytes / MIB:.1f} MiB each, --keep {keep} kept and one being written) need about "
        f"{needed // MIB} MiB."
    )


def identity_problem(root: Path, step: int, identity: dict[str, str]) -> str | None:
    """How the checkpoint at step differs from this run's identity (None: it does not)."""
    recorded = read_marker(step_dir(root, step))
    differences = [
        f"{key} {recorded.get(key, '(not recorded)')} (this run: {value})"
        for key, value in identity.items()
        if recorded.get(key) != value
    ]
    if not differences:
        return None
    return (
        f"{root} holds another run's checkpoints: step {step} was written with {', '.join(differences)}. "
        "Resuming it would continue that run with this run's arguments (and a run is bit-identical only "
        "at the same world size). Give this run a directory of its own (train.sbatch: CKPT_DIR), or the "
        "arguments the checkpoint was written with."
    )


def state_bytes(state: Any) -> int:
    """The bytes of every tensor in a (nested) state dict."""
    if isinstance(state, torch.Tensor):
        return state.nbytes
    if isinstance(state, dict):
        return sum(state_bytes(value) for value in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(value) for value in state)
    return 0


def exit_file() -> Path | None:
    """Where train.sbatch reads this run's exit code (GPUPLAT_TRAIN_EXIT_FILE, in a directory it made on
    the job's first node), torchrun's own being 1 whatever its workers'. None where unset, and on the
    other nodes, which have nothing to tell it: every rank leaves the same code."""
    path = Path(os.environ.get(EXIT_FILE, ""))
    return path if path.name and path.parent.is_dir() else None


# --- the model, the data and their order ---------------------------------------------------------------


def dataset(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(ROWS, FEATURES, generator=generator)
    teacher = torch.randn(FEATURES, 1, generator=generator)
    targets = torch.tanh(inputs @ teacher) + 0.01 * torch.randn(ROWS, 1, generator=generator)
    return inputs, targets


def batch_indices(seed: int, step: int, global_batch: int, rank: int, world: int) -> torch.Tensor:
    """This rank's share of step's global batch: an epoch is one permutation fixed by (seed, epoch)."""
    per_epoch = ROWS // global_batch
    epoch, position = divmod(step, per_epoch)
    order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    batch = order[position * global_batch : (position + 1) * global_batch]
    return batch[rank::world]


def make_model(seed: int, hidden: int, depth: int) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(FEATURES, hidden), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, 1))


# --- timing -------------------------------------------------------------------------------------------


@dataclass
class StepTimes:
    data: float = 0.0
    compute: float = 0.0
    comm: float = 0.0
    checkpoint: float = 0.0
    steps: int = 0
    totals: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        setattr(self, phase, getattr(self, phase) + seconds)
        self.totals[phase] = self.totals.get(phase, 0.0) + seconds


class CommTimer:
    """A DDP communication hook that times each gradient bucket's all-reduce, launch to completion. On
    CUDA the future completes when the all-reduce is queued, not done: CUDA events instead, recorded on
    the stream before it and on the stream the result is used on, read by collect() after a
    synchronize."""

    def __init__(self, cuda: bool = False) -> None:
        self.seconds = 0.0
        self.cuda = cuda
        self.events: list[tuple[Any, Any]] = []

    def hook(self, state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        started = time.perf_counter()
        begin = torch.cuda.Event(enable_timing=True) if self.cuda else None
        if begin is not None:
            begin.record()
        tensor = bucket.buffer().div_(dist.get_world_size())
        work = dist.all_reduce(tensor, async_op=True)
        assert work is not None

        def done(future: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            if begin is not None:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self.events.append((begin, end))
            else:
                self.seconds += time.perf_counter() - started
            return future.value()[0]

        return work.get_future().then(done)

    def collect(self) -> float:
        """This step's communication in seconds (on CUDA: after torch.cuda.synchronize())."""
        self.seconds += sum(begin.elapsed_time(end) for begin, end in self.events) / 1000
        self.events.clear()
        return self.seconds


def write_metrics(directory: Path | None, job: str, times: StepTimes, step: int) -> None:
    """Counters for node_exporter's textfile collector (written whole, then renamed into place)."""
    if directory is None or not directory.is_dir():
        return
    lines = [
        "# HELP gpuplat_train_phase_seconds_total Time a training job's rank 0 spent per phase.",
        "# TYPE gpuplat_train_phase_seconds_total counter",
    ]
    for phase in ("data", "compute", "comm", "checkpoint"):
        value = times.totals.get(phase, 0.0)
        lines.append(f'gpuplat_train_phase_seconds_total{{job="{job}",phase="{phase}"}} {value:.6f}')
    lines += [
        "# HELP gpuplat_train_step Last step a training job finished.",
        "# TYPE gpuplat_train_step gauge",
        f'gpuplat_train_step{{job="{job}"}} {step}',
    ]
    final = directory / f"gpuplat-train-{job}.prom"
    tmp = directory / f".{final.name}.{os.getpid()}"
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(final)


# --- the training loop ----------------------------------------------------------------------------------


class Termination:
    """Remembers SIGTERM so the ranks can stop together at a step boundary."""

    def __init__(self) -> None:
        self.requested = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


class Refusal(Exception):
    """A run that must not start: every rank stops with `code`; rank 0 says why."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="checkpoint directory on shared storage")
    parser.add_argument("--steps", type=int, default=600)
    every = int(os.environ.get("GPUPLAT_CHECKPOINT_EVERY", "50"))
    parser.add_argument("--every", type=int, default=every, help="checkpoint interval in steps")
    parser.add_argument(
        "--keep", type=int, default=2, help="complete checkpoints to keep (2: one to fall back to)"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=64, help="width of the hidden layers")
    parser.add_argument("--depth", type=int, default=1, help="number of hidden layers")
    parser.add_argument("--sync-checkpoints", action="store_true", help="save synchronously (benchmarks)")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step (fault tests)")
    parser.add_argument(
        "--save-seconds", type=float, default=0.0, help="extra time per save (fault tests: slow storage)"
    )
    parser.add_argument("--log-every", type=int, default=10)
    metrics = os.environ.get("GPUPLAT_JOB_METRICS_DIR")
    parser.add_argument("--metrics-dir", type=Path, default=metrics, help="node_exporter textfile directory")
    parser.add_argument(
        "--job", default=os.environ.get("SLURM_JOB_ID", os.environ.get("JOBSET_NAME", "local"))
    )
    args = parser.parse_args(argv)
    if args.keep < 1:
        parser.error(
            f"--keep {args.keep}: keep at least 1 complete checkpoint, the one a requeued run resumes from"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    termination = Termination()
    signal.signal(signal.SIGTERM, termination.handle)
    exit_path = exit_file()
    if exit_path:  # a code left by the attempt before, which torchrun restarted in place
        exit_path.unlink(missing_ok=True)
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    try:
        code = Trainer(args, termination).run()
        if code and exit_path:
            tmp = exit_path.with_name(f".{exit_path.name}.{os.getpid()}")
            tmp.write_text(f"{code}\n", encoding="utf-8")
            tmp.replace(exit_path)
        return code
    finally:
        dist.destroy_process_group()


class Trainer:
    def __init__(self, args: argparse.Namespace, termination: Termination) -> None:
        self.args = args
        self.termination = termination
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        values = {**vars(args), "world": self.world}
        self.identity = {key: str(values[key]) for key in RUN_IDENTITY}
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # Checkpoint collectives run in the save thread, on a group of their own.
        self.checkpoint_group = dist.new_group(backend="gloo")
        self.inputs, self.targets = dataset(args.seed)
        self.comm = CommTimer(cuda=self.device.type == "cuda")
        model = make_model(args.seed, args.hidden, args.depth).to(self.device)
        # find_unused_parameters=True keeps DDP's first gradient-bucket layout: otherwise the reducer
        # rebuilds its buckets after the first iteration (reducer.hpp, should_rebuild_buckets), so a
        # resumed run's first step would sum with another layout and, beyond two ranks, in another order.
        self.model = DistributedDataParallel(
            model,
            device_ids=[local_rank] if self.device.type == "cuda" else None,
            find_unused_parameters=True,
        )
        self.model.register_comm_hook(None, self.comm.hook)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=args.lr, momentum=0.9)
        # Names this run's saves in flight (.saving-step-NNNNNNNN-<run>), the same on every rank.
        self.run_id = f"{self.agree(secrets.randbits(31)):08x}"
        self.stager = make_stager()
        self.pruner = Pruner(args.dir, self.run_id)
        self.pending: tuple[int, Path, Future[Any]] | None = None
        self.times = StepTimes()
        self.saves = 0
        self.started = time.perf_counter()

    def agree(self, value: int) -> int:
        """Rank 0's value, on every rank."""
        agreed = torch.tensor([value], dtype=torch.int64)
        dist.broadcast(agreed, src=0)
        return int(agreed.item())

    def refuse_if(self, code: int, problem: str | None) -> None:
        """Rank 0's `problem` (None: none) stops every rank with `code`."""
        if self.agree(int(problem is not None)):
            raise Refusal(code, problem or "")

    def state(self) -> dict[str, Any]:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def check_storage(self) -> None:
        size = state_bytes(self.state())  # DDP: every rank holds the whole state; DCP writes one copy
        self.refuse_if(
            EXIT_STORAGE, storage_problem(self.args.dir, size, self.args.keep) if self.rank == 0 else None
        )

    def restore(self) -> int:
        """Load the newest complete checkpoint that reads back whole and return its step (0: none)."""
        while True:
            newest = newest_complete(self.args.dir) if self.rank == 0 else None
            step = self.agree(-1 if newest is None else newest)
            if step < 0:
                return 0
            path = step_dir(self.args.dir, step)
            self.refuse_if(
                EXIT_OTHER_RUN,
                identity_problem(self.args.dir, step, self.identity) if self.rank == 0 else None,
            )
            # Loaded into a copy (the state twice in memory meanwhile): a load that fails half-way
            # leaves the model as it was, and a run that finds no readable checkpoint starts afresh.
            state = copy.deepcopy(self.state())
            try:
                dcp.load(state, checkpoint_id=path, process_group=self.checkpoint_group)
            except CheckpointException as error:
                # Raised on every rank when any rank's read failed (torch/distributed/checkpoint/utils.py:
                # 267-289, state_dict_loader.py:297-313 @v2.13.0), so the ranks fall back together.
                if self.rank == 0:
                    aside = path.with_name(f"{path.name}{UNREADABLE}{self.run_id}")
                    path.rename(aside)
                    cause = str(error).strip().splitlines()[-1]
                    print(f"checkpoint step {step} does not read back ({cause}); moved to {aside}; "
                          "trying the one before", flush=True)  # fmt: skip
                continue
            set_state_dict(
                self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
            )
            return step

    def finish_pending(self, wait: bool) -> None:
        if self.pending is None or not (wait or self.pending[2].done()):
            return
        step, saving, future = self.pending
        started = time.perf_counter()
        future.result()
        self.times.add("checkpoint", time.perf_counter() - started)
        self.pending = None
        if self.rank == 0:
            # Rank 0's save ends after every rank's part and the metadata are written (DCP's finish).
            promote(saving, step_dir(self.args.dir, step), {"step": str(step), **self.identity})
            self.pruner.prune(self.args.keep)

    def save(self, step: int, asynchronous: bool) -> None:
        # Only steps past the one resumed from, the newest complete: a complete checkpoint is never written
        # again (a run resumed at its last step saves nothing).
        self.finish_pending(wait=True)
        self.saves += 1
        started = time.perf_counter()
        saving = saving_dir(self.args.dir, step, self.run_id)
        writer = CheckpointWriter(saving, self.args.save_seconds)
        if asynchronous:
            future = dcp.async_save(
                self.state(),
                storage_writer=writer,
                process_group=self.checkpoint_group,
                async_stager=self.stager,
            )
            self.pending = (step, saving, future)  # type: ignore[assignment]
        else:
            dcp.save(self.state(), storage_writer=writer, process_group=self.checkpoint_group)
            done: Future[Any] = Future()
            done.set_result(None)
            self.pending = (step, saving, done)
        self.times.add("checkpoint", time.perf_counter() - started)
        self.finish_pending(wait=not asynchronous)

    def batches(self, start: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        for step in range(start, self.args.steps):
            rows = batch_indices(self.args.seed, step, self.args.batch, self.rank, self.world)
            yield step, self.inputs[rows].to(self.device), self.targets[rows].to(self.device)

    def run(self) -> int:
        try:
            self.check_storage()
            start = self.restore()
            return self.train(start)
        except Refusal as refusal:
            if self.rank == 0:
                print(refusal, file=sys.stderr, flush=True)
            return refusal.code
        finally:
            self.stager.close()
            # After SIGTERM the grace is for the save, not for removing old checkpoints.
            self.pruner.close(wait=not self.termination.requested)

    def train(self, start: int) -> int:
        args = self.args
        if self.rank == 0:
            print(f"start host={socket.gethostname()} world={self.world} resumed_from={start} "
                  f"restart={os.environ.get('SLURM_RESTART_COUNT', '0')}", flush=True)  # fmt: skip
        if start >= args.steps:
            if self.rank == 0:
                digest = model_digest(self.model.module)
                print(f"done step={start} resumed_from={start} digest={digest} steps_run=0 "
                      f"(its checkpoint is at step {start}, --steps {args.steps}: nothing to run)",
                      flush=True)  # fmt: skip
            return 0
        loss = torch.tensor(0.0)
        fetched = time.perf_counter()
        for step, inputs, targets in self.batches(start):
            self.synchronize()  # the batch's copy to the device counts as waiting for data
            computing = time.perf_counter()
            self.times.add("data", computing - fetched)
            self.comm.seconds = 0.0
            self.optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(self.model(inputs), targets)
            loss.backward()
            self.optimizer.step()
            if args.step_seconds:
                time.sleep(args.step_seconds)
            stop = torch.tensor([1 if self.termination.requested else 0])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            self.synchronize()  # the step's GPU work is done before the host reads its timer
            comm = self.comm.collect()
            self.times.add("comm", comm)
            self.times.add("compute", max(0.0, time.perf_counter() - computing - comm))
            self.times.steps += 1
            done = step + 1
            if stop.item():
                self.save(done, asynchronous=False)
                if self.rank == 0:
                    print(f"SIGTERM: checkpoint at step {done}; exiting to be requeued", flush=True)
                return EXIT_STOPPED
            if done % args.every == 0 and done < args.steps:
                self.save(done, asynchronous=not args.sync_checkpoints)
            else:
                self.finish_pending(wait=False)
            if done % args.log_every == 0 or done == args.steps:
                self.report(done, float(loss.item()))
            fetched = time.perf_counter()
        periodic_saves, blocked_s = self.saves, self.times.totals.get("checkpoint", 0.0)
        self.save(args.steps, asynchronous=False)
        if self.rank == 0:
            print(f"done step={args.steps} loss={float(loss.item()):.6g} resumed_from={start} "
                  f"digest={model_digest(self.model.module)} steps_run={args.steps - start} "
                  f"wall_s={time.perf_counter() - self.started:.3f} periodic_checkpoints={periodic_saves} "
                  f"checkpoint_blocked_s={blocked_s:.3f}", flush=True)  # fmt: skip
        return 0

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def report(self, step: int, loss: float) -> None:
        """Every rank: one whole line (a single write), its rank and host in it."""
        times, steps = self.times, max(1, self.times.steps)
        line = (f"step {step} loss {loss:.6g} timing rank={self.rank} host={socket.gethostname()} "
                f"data_s={times.data / steps:.6f} compute_s={times.compute / steps:.6f} "
                f"comm_s={times.comm / steps:.6f} checkpoint_s={times.checkpoint / steps:.6f} "
                f"steps={steps}\n")  # fmt: skip
        sys.stdout.write(line)
        sys.stdout.flush()
        if self.rank == 0:
            write_metrics(self.args.metrics_dir, str(self.args.job), times, step)
        self.times = StepTimes(totals=times.totals)


def model_digest(model: nn.Module) -> str:
    """A digest of the parameters' exact bytes: equal digests, bit-identical models."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        exact = tensor.detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(ctypes.string_at(exact.data_ptr(), exact.numel() * exact.element_size()))
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    sys.exit(main())
