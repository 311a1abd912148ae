#!/usr/bin/env python3
"""A small deterministic training job that survives preemption and node loss.

It fits y = w.x + b by SGD on a synthetic data set fixed by --seed (pure Python, CPU, no packages),
saving a checkpoint every --every steps to shared storage and resuming from the newest complete one
when it starts. Submit it requeueable, with the work in a job step (srun), which is what Slurm
signals first when it preempts the job:

    sbatch --requeue --partition train --gres gpu:1 --wrap \
        "srun python3 /shared/jobs/train.py --dir /shared/checkpoints/demo --steps 400 --every 20"

Preemption (spot): Slurm sends SIGTERM and gives the job its QoS's GraceTime before it requeues or
cancels it. On SIGTERM the job finishes the step it is in, writes a checkpoint at once (not at the
next --every), and then waits to be stopped (at most --term-wait seconds, then exits 143): a job
that exits by itself during the grace period could be recorded as finished instead of requeued.

Checkpoint conventions (use the same for your own jobs):
- write to a temporary name in the same directory, flush and fsync the file, rename it over the final
  name, fsync the directory: a reader sees the old checkpoint or the new one, never half of one;
- name checkpoints by step (ckpt-00000420.json) and keep the last K; a checksum inside each file lets
  the loader skip a damaged one and fall back to the previous;
- on start, resume from the newest complete checkpoint; the job's result must not depend on whether
  it was interrupted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

FEATURES = 4


def dataset(seed: int, size: int = 256) -> list[tuple[list[float], float]]:
    rng = random.Random(seed)
    true_w = [rng.uniform(-2, 2) for _ in range(FEATURES)]
    rows = []
    for _ in range(size):
        x = [rng.uniform(-1, 1) for _ in range(FEATURES)]
        rows.append((x, sum(w * v for w, v in zip(true_w, x, strict=True)) + 0.5 + rng.gauss(0, 0.01)))
    return rows


def train_step(state: dict[str, Any], rows: list[tuple[list[float], float]], lr: float) -> None:
    """One SGD step on the mini-batch picked deterministically by the step number."""
    step = state["step"]
    batch = [rows[(step * 16 + i) % len(rows)] for i in range(16)]
    grad_w = [0.0] * FEATURES
    grad_b = 0.0
    loss = 0.0
    for x, y in batch:
        error = sum(w * v for w, v in zip(state["w"], x, strict=True)) + state["b"] - y
        loss += error * error / len(batch)
        for i in range(FEATURES):
            grad_w[i] += 2 * error * x[i] / len(batch)
        grad_b += 2 * error / len(batch)
    state["w"] = [w - lr * g for w, g in zip(state["w"], grad_w, strict=True)]
    state["b"] -= lr * grad_b
    state["loss"] = loss
    state["step"] = step + 1


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def save_checkpoint(directory: Path, state: dict[str, Any], keep: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"ckpt-{state['step']:08d}.json"
    tmp = directory / f".{final.name}.tmp-{os.getpid()}"
    document = {"state": state, "sha256": _digest(state)}
    with tmp.open("w", encoding="utf-8") as handle:
        json.dump(document, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(final)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in sorted(directory.glob("ckpt-*.json"))[:-keep]:
        old.unlink(missing_ok=True)
    return final


def load_latest(directory: Path) -> dict[str, Any] | None:
    for path in sorted(directory.glob("ckpt-*.json"), reverse=True):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        state = document.get("state")
        if isinstance(state, dict) and document.get("sha256") == _digest(state):
            return state
    return None


class Preemption:
    """Remembers a SIGTERM (preemption, time limit, scancel) so the loop can checkpoint at a step boundary."""

    def __init__(self) -> None:
        self.requested = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="checkpoint directory on shared storage")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=20, help="checkpoint interval in steps")
    parser.add_argument("--keep", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (for fault tests)")
    parser.add_argument("--progress", action="store_true", help="print a line per step")
    parser.add_argument("--term-wait", type=float, default=900.0,
                        help="after SIGTERM and its checkpoint, seconds to wait to be stopped")  # fmt: skip
    args = parser.parse_args(argv)
    preemption = Preemption()
    previous = signal.signal(signal.SIGTERM, preemption.handle)
    try:
        return _train(args, preemption)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _train(args: argparse.Namespace, preemption: Preemption) -> int:

    rows = dataset(args.seed)
    state = load_latest(args.dir)
    resumed_from = state["step"] if state else 0
    if state is None:
        state = {"step": 0, "w": [0.0] * FEATURES, "b": 0.0, "loss": None}
    print(f"start host={os.uname().nodename} resumed_from={resumed_from} "
          f"restart={os.environ.get('SLURM_RESTART_COUNT', '0')}", flush=True)  # fmt: skip
    while state["step"] < args.steps:
        train_step(state, rows, args.lr)
        if state["step"] % args.every == 0 or state["step"] == args.steps:
            save_checkpoint(args.dir, state, args.keep)
        if args.progress:
            print(f"step {state['step']}", flush=True)
        if preemption.requested:
            save_checkpoint(args.dir, state, args.keep)
            print(f"SIGTERM: checkpoint at step {state['step']}; waiting to be requeued", flush=True)
            deadline = time.monotonic() + args.term_wait
            while time.monotonic() < deadline:
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            return 128 + signal.SIGTERM
        if args.step_seconds:
            time.sleep(args.step_seconds)
    result = {"step": state["step"], "w": state["w"], "b": state["b"], "loss": state["loss"],
              "resumed_from": resumed_from}  # fmt: skip
    (args.dir / "result.json").write_text(json.dumps(result, sort_keys=True), encoding="utf-8")
    print(f"done step={state['step']} loss={state['loss']:.6g} resumed_from={resumed_from}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
