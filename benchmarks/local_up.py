"""Benchmark: `gpuplat up` on the local backend, phase by phase.

Runs, each from nothing (`gpuplat down` first, which also removes the stack's node images), on copies
of the local stack (named bench-*, so a running `local` platform is left alone): a cold `up`, a warm
`up` right after it (nothing changed: the playbooks are skipped), `up --reconfigure` (the playbooks run
and change nothing), then cold `up` with 2, 4 and 8 training nodes. Prints wall time per phase and the
ratios the project aims for: cold configure <= 240 s, reconfigure <= 25% of the cold configure with 0
changed (issue 15); configuring the nodes (configure, node images and join) with 8 training nodes <=
1.3x the time with 2, the pool's first node baked into its image and the others joining from it
(issue 25), and the whole cold `up`. Beside each run's wall time: the CPU seconds of gpuplat and the processes
it waited for (Ansible's controller side; under Mitogen not the nodes' interpreters and what they run, which
it never waits for, nor the containers' services), and the load average when it started: on shared cores
compare runs as ratios, back to back.

Run: .venv/bin/python benchmarks/local_up.py [--sizes 2,4,8]   (needs podman and the base image)
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from infra.nodes.playbook_run import state_dir
from infra.spec.load import CONFIG_KEY, stack_file

GPUPLAT = str(Path(sys.executable).parent / "gpuplat")
PHASE = re.compile(r"^✓ (?P<name>[\w ]+) \((?P<seconds>[\d.]+) s\)", re.MULTILINE)
CHANGES = re.compile(r"is up in [\d.]+ s \((?P<changes>\d+) change")


@dataclass(frozen=True)
class Outcome:
    phases: dict[str, float]  # phase name -> seconds
    changes: int  # tasks changed
    cpu_s: float  # user + system CPU of gpuplat and what it waited for (ansible-playbook, podman)
    load: float  # the 1-minute load average when it started


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(*args: str, keep_log: Path | None = None) -> Outcome:
    load, cpu_before = os.getloadavg()[0], cpu_of_children()
    result = subprocess.run([GPUPLAT, *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"gpuplat {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    if keep_log is not None:
        stack = yaml.safe_load(Path(args[-1]).read_text())["config"][CONFIG_KEY]["name"]
        keep_log.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(state_dir(stack) / "logs" / "site.log", keep_log)
    changes = CHANGES.search(result.stderr)
    phases = {m["name"]: float(m["seconds"]) for m in PHASE.finditer(result.stderr)}
    return Outcome(phases, int(changes["changes"]) if changes else -1, cpu_of_children() - cpu_before, load)


def stack_with_training_nodes(count: int | None, directory: Path, prefix: str = "bench") -> Path:
    """A copy of the local stack named <prefix>-<count> (<prefix>-local: unchanged pools)."""
    document = yaml.safe_load(stack_file("local").read_text())
    platform = copy.deepcopy(document["config"][CONFIG_KEY])
    platform["name"] = f"{prefix}-{count or 'local'}"
    if count is not None:
        # Elastic like the local stack's pool (power saving: every name in slurm.conf), `count` running.
        train = next(p for p in platform["pools"] if p["role"] == "train")
        train.pop("count", None)
        train["min"], train["max"] = count, count + 1
        platform["budget"]["max_gpus"] = 8 * (count + 1) + 8
    document["config"][CONFIG_KEY] = platform
    path = directory / f"Pulumi.bench-{count}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


# Configuring the nodes: the play on the nodes that run it in full, the pools' images baked from their
# first nodes, the other nodes joined from them.
CONFIGURE_PHASES = ("configure", "node images", "join")


def show(label: str, outcome: Outcome) -> tuple[float, float]:
    """Print one run; return its total and its configure time (CONFIGURE_PHASES)."""
    phases = outcome.phases
    total = sum(phases.values())
    detail = ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items())
    print(
        f"{label:<34} {total:7.1f} s   ({detail}; {outcome.changes} changed; "
        f"{outcome.cpu_s:.1f} CPU-s; load {outcome.load:.1f})",
        flush=True,
    )
    return total, sum(phases.get(name, 0.0) for name in CONFIGURE_PHASES)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2,4,8", help="training node counts to time ('' for none)")
    parser.add_argument("--prefix", default="bench", help="stack names: <prefix>-local, <prefix>-<count>")
    parser.add_argument("--keep-logs", type=Path, help="copy each run's site.log into this directory")
    arguments = parser.parse_args()
    sizes = [int(s) for s in arguments.sizes.split(",") if s]
    by_size: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        local = str(stack_with_training_nodes(None, Path(tmp), arguments.prefix))
        run("down", "--stack-file", local)
        logs = arguments.keep_logs
        _, cold = show(
            "cold up (local)", run("up", "--stack-file", local, keep_log=logs and logs / "cold.log")
        )
        show("warm up (no changes, skipped)", run("up", "--stack-file", local))
        _, again = show(
            "up --reconfigure (no changes)",
            run("up", "--reconfigure", "--stack-file", local, keep_log=logs and logs / "reconfigure.log"),
        )
        run("down", "--stack-file", local)
        for count in sizes:
            path = str(stack_with_training_nodes(count, Path(tmp), arguments.prefix))
            by_size[count] = show(f"cold up, {count} training nodes", run("up", "--stack-file", path))
            run("down", "--stack-file", path)
    print(f"cold configure: {cold:.0f} s (goal <= 240)")
    print(f"reconfigure / cold configure: {again / cold:.2f} (goal <= 0.25)")
    if 2 in by_size and 8 in by_size:
        (total_8, configure_8), (total_2, configure_2) = by_size[8], by_size[2]
        print(f"configure, 8 / 2 training nodes: {configure_8 / configure_2:.2f} (goal <= 1.3)")
        print(f"whole cold up, 8 / 2 training nodes: {total_8 / total_2:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
