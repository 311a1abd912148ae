#!/usr/bin/env python3
"""A multi-node PyTorch training job that survives node loss, preemption and its time limit.

Run under torchrun on every node (train.sbatch does it on Slurm, the JobSet of `gpuplat manifests` on
Kueue). It trains a small model with DistributedDataParallel on a synthetic data set fixed by --seed,
in a data order fixed by the seed and the step number, so its result does not depend on where or how
often it was interrupted.

Checkpoints (torch.distributed.checkpoint, every rank writes its own part):
- every --every steps, saved asynchronously: the state is copied to host memory and the training goes
  on while a background thread writes it under DIR/step-NNNNNNNN/;
- a checkpoint counts only once complete: after every rank's part and DCP's .metadata are written,
  rank 0 writes DIR/step-NNNNNNNN/COMPLETE (written to a temporary name, fsynced, renamed). A directory
  without it (a node lost half-way through a save) is never resumed from, and is removed later;
- on start, every rank resumes from the newest complete checkpoint;
- on SIGTERM (spot interruption, preemption, `scontrol requeue`, the time limit's --signal), the ranks
  agree on the step to stop at, wait for a save in flight, save that step at once and exit 143; torchrun
  forwards SIGTERM to its workers and gives them 30 s before SIGKILL (torch/distributed/elastic/agent/
  server/api.py: SignalException -> _shutdown(sigval, timeout=shutdown_timeout), 30 s by default in
  local_elastic_agent.py).

Per step it measures the time spent waiting for data, computing and communicating (the all-reduce of
the gradients); every rank prints them every --log-every steps as a `timing rank=R host=H ...` line (one
whole line each, so the ranks' lines can interleave in one log), and rank 0 writes them for
node_exporter's textfile collector (--metrics-dir): `gpuplat job-profile LOG` says which dominates, and
names a straggler rank the others wait for. On CUDA the host timers are read after
torch.cuda.synchronize() and the all-reduce is timed with CUDA events (kernels run asynchronously: without
it the GPU's work would be counted wherever the host next waits, often as data).
"""

import argparse
import ctypes
import hashlib
import os
import re
import shutil
import signal
import socket
import sys
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
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

COMPLETE = "COMPLETE"
STEP_DIR = re.compile(r"^step-(\d{8})$")
FEATURES, ROWS = 32, 4096


# --- checkpoints on the shared filesystem ------------------------------------------------------------


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def is_complete(path: Path) -> bool:
    """Complete: the marker names the directory's step and DCP's metadata file is there."""
    match = STEP_DIR.match(path.name)
    marker = path / COMPLETE
    try:
        recorded = marker.read_text(encoding="utf-8").strip()
    except OSError:
        return False
    return bool(match) and recorded == f"step={int(match.group(1))}" and (path / ".metadata").is_file()


def checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Every step directory under root, oldest first."""
    found = []
    for path in root.glob("step-*") if root.is_dir() else ():
        match = STEP_DIR.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def newest_complete(root: Path) -> int | None:
    complete = [step for step, path in checkpoints(root) if is_complete(path)]
    return complete[-1] if complete else None


def mark_complete(path: Path, step: int) -> None:
    tmp = path / f".{COMPLETE}.tmp"
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(f"step={step}\n")
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path / COMPLETE)
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def prune(root: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; drop older ones and incomplete ones older than the
    newest complete (a newer incomplete one may be a save still in flight)."""
    found = checkpoints(root)
    complete = [step for step, path in found if is_complete(path)]
    if not complete:
        return
    kept = set(complete[-keep:])
    for step, path in found:
        if step not in kept and step < complete[-1]:
            shutil.rmtree(path, ignore_errors=True)


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="checkpoint directory on shared storage")
    parser.add_argument("--steps", type=int, default=600)
    every = int(os.environ.get("GPUPLAT_CHECKPOINT_EVERY", "50"))
    parser.add_argument("--every", type=int, default=every, help="checkpoint interval in steps")
    parser.add_argument("--keep", type=int, default=2, help="complete checkpoints to keep")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=64, help="width of the hidden layers")
    parser.add_argument("--depth", type=int, default=1, help="number of hidden layers")
    parser.add_argument("--sync-checkpoints", action="store_true", help="save synchronously (benchmarks)")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step (fault tests)")
    parser.add_argument("--log-every", type=int, default=10)
    metrics = os.environ.get("GPUPLAT_JOB_METRICS_DIR")
    parser.add_argument("--metrics-dir", type=Path, default=metrics, help="node_exporter textfile directory")
    parser.add_argument(
        "--job", default=os.environ.get("SLURM_JOB_ID", os.environ.get("JOBSET_NAME", "local"))
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    termination = Termination()
    signal.signal(signal.SIGTERM, termination.handle)
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    try:
        return Trainer(args, termination).run()
    finally:
        dist.destroy_process_group()


class Trainer:
    def __init__(self, args: argparse.Namespace, termination: Termination) -> None:
        self.args = args
        self.termination = termination
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
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
        self.pending: tuple[int, Future[Any]] | None = None
        self.times = StepTimes()
        self.saves = 0
        self.started = time.perf_counter()

    def state(self) -> dict[str, Any]:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def restore(self) -> int:
        newest = newest_complete(self.args.dir) if self.rank == 0 else None
        agreed = torch.tensor([-1 if newest is None else newest])
        dist.broadcast(agreed, src=0)
        step = int(agreed.item())
        if step < 0:
            return 0
        state = self.state()
        dcp.load(state, checkpoint_id=step_dir(self.args.dir, step), process_group=self.checkpoint_group)
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        return step

    def finish_pending(self, wait: bool) -> None:
        if self.pending is None or not (wait or self.pending[1].done()):
            return
        step, future = self.pending
        started = time.perf_counter()
        future.result()
        self.times.add("checkpoint", time.perf_counter() - started)
        self.pending = None
        if self.rank == 0:
            mark_complete(step_dir(self.args.dir, step), step)
            prune(self.args.dir, self.args.keep)

    def save(self, step: int, asynchronous: bool) -> None:
        self.finish_pending(wait=True)
        self.saves += 1
        started = time.perf_counter()
        target = step_dir(self.args.dir, step)
        if asynchronous:
            future = dcp.async_save(self.state(), checkpoint_id=target, process_group=self.checkpoint_group)
            self.pending = (step, future)  # type: ignore[assignment]
        else:
            dcp.save(self.state(), checkpoint_id=target, process_group=self.checkpoint_group)
            done: Future[Any] = Future()
            done.set_result(None)
            self.pending = (step, done)
        self.times.add("checkpoint", time.perf_counter() - started)
        self.finish_pending(wait=not asynchronous)

    def batches(self, start: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        for step in range(start, self.args.steps):
            rows = batch_indices(self.args.seed, step, self.args.batch, self.rank, self.world)
            yield step, self.inputs[rows].to(self.device), self.targets[rows].to(self.device)

    def run(self) -> int:
        args = self.args
        start = self.restore()
        if self.rank == 0:
            print(f"start host={socket.gethostname()} world={self.world} resumed_from={start} "
                  f"restart={os.environ.get('SLURM_RESTART_COUNT', '0')}", flush=True)  # fmt: skip
        loss = torch.tensor(0.0)
        step = start
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
                    (args.dir / "STOPPED").write_text(f"step={done}\n", encoding="utf-8")
                    print(f"SIGTERM: checkpoint at step {done}; exiting to be requeued", flush=True)
                return 128 + signal.SIGTERM
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
