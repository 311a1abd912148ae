"""Benchmark: `gpuplat up` on the local backend, phase by phase.

Runs, each from nothing (`gpuplat down` first): a cold `up` of the local stack, a warm `up` right
after it (nothing to change), then cold `up` with 2, 4 and 8 training nodes. Prints wall time per
phase and the ratios the project aims for: warm <= 25% of cold, 8 training nodes <= 2x the time of 2.

Run: .venv/bin/python benchmarks/local_up.py [--sizes 2,4,8]   (needs podman and the base image)
"""

from __future__ import annotations

import argparse
import copy
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from infra.spec.load import CONFIG_KEY, stack_file

GPUPLAT = str(Path(sys.executable).parent / "gpuplat")
PHASE = re.compile(r"^✓ (?P<name>[\w ]+) \((?P<seconds>[\d.]+) s\)", re.MULTILINE)


def run(*args: str) -> dict[str, float]:
    result = subprocess.run([GPUPLAT, *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"gpuplat {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return {m["name"]: float(m["seconds"]) for m in PHASE.finditer(result.stderr)}


def stack_with_training_nodes(count: int, directory: Path) -> Path:
    document = yaml.safe_load(stack_file("local").read_text())
    platform = copy.deepcopy(document["config"][CONFIG_KEY])
    platform["name"] = f"bench-{count}"
    next(p for p in platform["pools"] if p["role"] == "train")["count"] = count
    platform["budget"]["max_gpus"] = 8 * count + 8
    document["config"][CONFIG_KEY] = platform
    path = directory / f"Pulumi.bench-{count}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def show(label: str, phases: dict[str, float]) -> float:
    total = sum(phases.values())
    detail = ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items())
    print(f"{label:<28} {total:7.1f} s   ({detail})", flush=True)
    return total


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2,4,8", help="training node counts to time")
    sizes = [int(s) for s in parser.parse_args().sizes.split(",")]
    run("down", "--stack", "local")
    cold = show("cold up (local)", run("up", "--stack", "local"))
    warm = show("warm up (local, no changes)", run("up", "--stack", "local"))
    run("down", "--stack", "local")
    by_size: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for count in sizes:
            path = stack_with_training_nodes(count, Path(tmp))
            by_size[count] = show(f"cold up, {count} training nodes", run("up", "--stack-file", str(path)))
            run("down", "--stack-file", str(path))
    print(f"warm / cold: {warm / cold:.2f} (goal <= 0.25)")
    if 2 in by_size and 8 in by_size:
        print(f"8 / 2 training nodes: {by_size[8] / by_size[2]:.2f} (goal <= 2.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
