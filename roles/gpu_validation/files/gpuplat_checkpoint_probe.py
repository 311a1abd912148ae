#!/usr/bin/env python3
"""Time one checkpoint-sized write the way a training job commits a checkpoint.

  gpuplat-checkpoint-probe --dir DIR --bytes N [--block-mib 8] [--keep]

Writes N incompressible bytes to a temporary name in DIR, flushes and fsyncs the file, renames it
over the final name and fsyncs the directory (examples/train_demo/train.py does the same), then
removes the file unless --keep. Every node of a pool runs it at once through Slurm, as the ranks of
a sharded checkpoint would. Prints one JSON document with the seconds of each phase; exit 0 when the
write completed, 1 when the filesystem refused it (the reason is in the document), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MIB = 1 << 20


def write_checkpoint(directory: Path, size: int, block: int) -> dict[str, float]:
    """Write, fsync, rename, fsync the directory; return the seconds each phase took."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / "checkpoint-probe.bin"
    tmp = directory / f".{final.name}.tmp-{os.getpid()}"
    # One random block, written over and over: incompressible for filesystems that compress.
    payload = os.urandom(min(block, size) or 1)
    start = time.perf_counter()
    with tmp.open("wb") as handle:
        left = size
        while left > 0:
            left -= handle.write(payload[: min(left, len(payload))])
        handle.flush()
        written = time.perf_counter()
        os.fsync(handle.fileno())
    synced = time.perf_counter()
    tmp.replace(final)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    committed = time.perf_counter()
    return {
        "write_s": round(written - start, 4),
        "fsync_s": round(synced - written, 4),
        "commit_s": round(committed - synced, 4),
        "seconds": round(committed - start, 4),
    }


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, required=True, help="directory on the checkpoint filesystem")
    parser.add_argument("--bytes", type=int, required=True, help="checkpoint size this node writes")
    parser.add_argument("--block-mib", type=int, default=8, help="size of each write call")
    parser.add_argument("--keep", action="store_true", help="leave the file in place")
    args = parser.parse_args(argv)
    if args.bytes <= 0 or args.block_mib <= 0:
        parser.error("--bytes and --block-mib must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    result: dict[str, Any] = {"node": socket.gethostname(), "bytes": args.bytes, "dir": str(args.dir)}
    try:
        result.update(write_checkpoint(args.dir, args.bytes, args.block_mib * MIB))
    except OSError as exc:
        result["error"] = f"{exc.filename or args.dir}: {exc.strerror}"
        sys.stdout.write(json.dumps(result) + "\n")
        return 1
    finally:
        if not args.keep:
            for leftover in args.dir.glob("*checkpoint-probe.bin*"):
                leftover.unlink(missing_ok=True)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
