"""Benchmark: what checkpointing costs the distributed training example (examples/train_dist/train.py).

Runs the example under torchrun on this machine (gloo, CPU) three times with the same model and steps:
no checkpoint, a synchronous torch.distributed.checkpoint save every --every steps, and an asynchronous
one (staged to host memory, written by a background thread). Prints per mode the wall time per step,
how long training was blocked per checkpoint, and the checkpoint's size on disk; then the ratios
(noisy machines: compare the ratios, not the seconds). The time from a requeue to the first new step
on the platform is printed by the integration test (tests/integration, distributed training).

Run: .venv/bin/python benchmarks/train_checkpoint.py [--procs 2] [--hidden 1024] [--depth 4]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_dist" / "train.py"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
DONE = re.compile(
    r"^done .*steps_run=(\d+) wall_s=([\d.]+) periodic_checkpoints=(\d+) checkpoint_blocked_s=([\d.]+)",
    re.MULTILINE,
)


def run(mode: str, args: argparse.Namespace, directory: Path) -> dict[str, float]:
    every = {"none": args.steps + 1, "sync": args.every, "async": args.every}[mode]
    command = [
        TORCHRUN,
        "--standalone",
        "--nproc-per-node",
        str(args.procs),
        str(SCRIPT),
        "--dir",
        str(directory),
    ]
    command += ["--steps", str(args.steps), "--every", str(every), "--hidden", str(args.hidden)]
    command += ["--depth", str(args.depth), "--log-every", str(args.steps), "--keep", "1"]
    if mode == "sync":
        command.append("--sync-checkpoints")
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    match = DONE.search(done.stdout)
    if done.returncode != 0 or match is None:
        sys.exit(
            f"{mode}: torchrun failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    steps, wall, saves, blocked = int(match[1]), float(match[2]), int(match[3]), float(match[4])
    newest = sorted(directory.glob("step-*"))[-1]
    size = sum(f.stat().st_size for f in newest.iterdir() if f.is_file())
    return {
        "step_s": wall / steps,
        "blocked_s": blocked / saves if saves else 0.0,
        "saves": saves,
        "mib": size / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for mode in ("none", "sync", "async"):
            results[mode] = run(mode, args, Path(scratch) / mode)
    print(
        f"{args.procs} processes, {args.depth} x {args.hidden} hidden, {args.steps} steps, "
        f"checkpoint every {args.every}"
    )
    print(
        f"{'mode':<6} {'step (s)':>9} {'blocked per checkpoint (s)':>27} {'checkpoints':>11} "
        f"{'size (MiB)':>10}"
    )
    for mode, r in results.items():
        print(
            f"{mode:<6} {r['step_s']:>9.4f} {r['blocked_s']:>27.4f} {int(r['saves']):>11} {r['mib']:>10.1f}"
        )
    sync, asynchronous = results["sync"], results["async"]
    print(f"blocked per checkpoint, async / sync: {asynchronous['blocked_s'] / sync['blocked_s']:.2f}")
    print(f"step time, async / none: {asynchronous['step_s'] / results['none']['step_s']:.2f}; "
          f"sync / none: {sync['step_s'] / results['none']['step_s']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
