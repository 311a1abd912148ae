"""Benchmark: offline plan time for an AWS stack of 5 and of 50 pools (1,000 nodes).

Prints wall time per size and the ratio; the goal (issue 3) is under 15 s for 50 pools / 1,000 nodes.
Run: .venv/bin/python benchmarks/plan_scale.py
"""

from __future__ import annotations

import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from infra.plan.report import build_report
from infra.platform.resolve import load_platform
from infra.spec.load import CONFIG_KEY, stack_file


def scaled_stack(pools: int, nodes: int) -> dict[str, Any]:
    document = yaml.safe_load(stack_file("aws-prod").read_text())
    platform = document["config"][CONFIG_KEY]
    head, train, _spot, infer = platform["pools"]
    per_pool = nodes // pools
    generated = [head]
    for index in range(pools - 1):
        template = copy.deepcopy(train if index % 2 == 0 else infer)
        template["name"] = f"{template['name']}-{index}"
        template.pop("count", None)
        template.update({"min": 0 if template["role"] == "train" else 1, "max": per_pool})
        generated.append(template)
    platform["pools"] = generated
    platform["serving"]["pool"] = generated[2]["name"]
    platform["serving"]["max_replicas"] = per_pool
    platform["budget"] = {"max_gpus": nodes * 8, "max_hourly_usd": 1e7}
    return document


def time_plan(pools: int, nodes: int, directory: Path) -> tuple[float, int]:
    path = directory / f"Pulumi.bench-{pools}.yaml"
    path.write_text(yaml.safe_dump(scaled_stack(pools, nodes)))
    start = time.perf_counter()
    report = build_report(load_platform(path))
    return time.perf_counter() - start, len(report.resources)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        time_plan(3, 10, Path(tmp))  # warm imports
        small, small_resources = time_plan(5, 100, Path(tmp))
        large, large_resources = time_plan(50, 1000, Path(tmp))
    print(f"5 pools / 100 nodes:    {small:6.2f} s  ({small_resources} resources)")
    print(f"50 pools / 1000 nodes:  {large:6.2f} s  ({large_resources} resources)")
    print(f"ratio 50/5 pools:       {large / small:6.2f}")
    print(f"goal: 50 pools under 15 s: {'met' if large < 15 else 'NOT met'}")
    return 0 if large < 15 else 1


if __name__ == "__main__":
    sys.exit(main())
