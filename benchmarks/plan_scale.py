"""Benchmark: offline plan time of AWS stacks of 5 pools / 100 nodes, 50 pools / 1,000 nodes and 10,000 nodes.

Each size is the shipped aws-prod stack with its pools replaced: the controllers' pool, then training and
inference pools in turn, each of up to nodes / pools nodes. 10,000 nodes are two stacks of 50 pools and
5,000 nodes (100 per pool), planned one after the other in one process: a stack plans at most 5,000 nodes
(infra/spec/limits.py, MAX_NODES: the spec refuses more and says to split the fleet into stacks). Each of
them has the 1,000-node stack's 50 pools, so the size adds nodes, not pools: 100 pools of 100 nodes in all.

Prints, per size, the best of several runs (default 3): wall seconds, CPU seconds of this process
(time.process_time: on a shared machine other load changes it least) and the resources recorded; the
ratios between sizes; and CPU seconds over those of a fixed workload (benchmarks/cpu_speed.py), which
compare across machines and days. The goals (issue 46), on an idle machine: 50 pools / 1,000 nodes
within 2 s, 10,000 nodes within 10 s. A benchmark that prints figures, not a test: it exits 0.

Run: .venv/bin/python benchmarks/plan_scale.py [--runs N]
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cpu_speed import fixed_workload_cpu_s

from infra.plan.report import build_report
from infra.platform.resolve import load_platform
from infra.spec.load import CONFIG_KEY, stack_file


def scaled_stack(pools: int, nodes: int, name: str | None = None) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(stack_file("aws-prod").read_text())
    platform = document["config"][CONFIG_KEY]
    head, train, _spot, infer = platform["pools"]
    per_pool = nodes // pools
    generated = [head]
    for index in range(pools - 1):
        template = copy.deepcopy(train if index % 2 == 0 else infer)
        template["name"] = f"{template['name']}-{index}"
        template.pop("count", None)
        # an inference pool keeps two replicas at its smallest: the canary borrows one replica's GPUs
        template.update({"min": 0 if template["role"] == "train" else 2, "max": per_pool})
        generated.append(template)
    platform["pools"] = generated
    platform["serving"]["pool"] = generated[2]["name"]
    platform["serving"]["max_replicas"] = per_pool
    platform["budget"] = {"max_gpus": nodes * 8, "max_hourly_usd": 1e7}
    if name is not None:
        platform["name"] = name
    return document


@dataclass(frozen=True)
class Size:
    label: str
    # (pools, nodes, stack name: aws-prod's when None) of each stack, planned one after the other
    stacks: tuple[tuple[int, int, str | None], ...]


SMALL = Size("5 pools / 100 nodes", ((5, 100, None),))
LARGE = Size("50 pools / 1,000 nodes", ((50, 1000, None),))
HUGE = Size("10,000 nodes (2 stacks x 50 pools x 100)", ((50, 5000, "bench-east"), (50, 5000, "bench-west")))
GOALS = {LARGE: 2.0, HUGE: 10.0}


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float
    resources: int


def time_size(size: Size, directory: Path) -> Timing:
    """One plan of every stack of `size`, from its stack file to the report."""
    paths = []
    for index, (pools, nodes, name) in enumerate(size.stacks):
        path = directory / f"Pulumi.bench-{pools}-{nodes}-{index}.yaml"
        path.write_text(yaml.safe_dump(scaled_stack(pools, nodes, name)))
        paths.append(path)
    wall, cpu = time.perf_counter(), time.process_time()
    resources = sum(len(build_report(load_platform(path)).resources) for path in paths)
    return Timing(time.perf_counter() - wall, time.process_time() - cpu, resources)


def best(size: Size, directory: Path, runs: int) -> Timing:
    timings = [time_size(size, directory) for _ in range(runs)]
    return Timing(min(t.wall_s for t in timings), min(t.cpu_s for t in timings), timings[0].resources)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per size; the best is printed")
    runs = parser.parse_args().runs
    reference = fixed_workload_cpu_s()
    with tempfile.TemporaryDirectory() as tmp:
        time_size(Size("warm-up", ((3, 10, None),)), Path(tmp))  # imports, first-use caches
        results = {size: best(size, Path(tmp), runs) for size in (SMALL, LARGE, HUGE)}
    load = os.getloadavg()[0]
    print(f"offline plan, best of {runs} runs; load average {load:.2f} on {os.cpu_count()} CPUs")
    print(f"{'size':44} {'resources':>9} {'wall s':>7} {'CPU s':>7} {'CPU / ref':>9}")
    for size, t in results.items():
        print(f"{size.label:44} {t.resources:9d} {t.wall_s:7.2f} {t.cpu_s:7.2f} {t.cpu_s / reference:9.3f}")
    small, large, huge = results[SMALL], results[LARGE], results[HUGE]
    print(f"reference: the fixed workload of benchmarks/cpu_speed.py took {reference:.2f} CPU-s")
    print(
        f"ratios (CPU): 50 / 5 pools {large.cpu_s / small.cpu_s:.2f} "
        f"(resources {large.resources / small.resources:.2f}); 10,000 / 1,000 nodes "
        f"{huge.cpu_s / large.cpu_s:.2f} (resources {huge.resources / large.resources:.2f})"
    )
    for size, goal in GOALS.items():
        t = results[size]
        verdict = "met" if t.wall_s <= goal else "met in CPU time" if t.cpu_s <= goal else "NOT met"
        print(f"goal: {size.label} within {goal:g} s: {verdict} (wall {t.wall_s:.2f} s, CPU {t.cpu_s:.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
