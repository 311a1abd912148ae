#!/usr/bin/env python3
"""Publish the inference pool's autoscaling signals to CloudWatch, once a minute.

The infer pool's Auto Scaling group tracks two custom metrics (infra/backends/aws/node_pool.py):
namespace GpuPlatform/Inference, dimension AutoScalingGroupName, statistic Average:

  RequestsPerSecond     requests this node's model server finished per second, read as the
                        increase of its request counter between two scrapes of /metrics
                        (vLLM: vllm:request_success_total; CPU reference server:
                        gpuplat_inference_requests_total)
  GPUMemoryUtilization  GPU memory in use, percent, the highest over the node's GPUs
                        (nvidia-smi); not sent where there is no GPU

  gpuplat_scaling_agent.py --asg NAME --region REGION [--interval 60]
  gpuplat_scaling_agent.py --dry-run --once --interval 5     # print what it would send

Standard library, plus boto3 only when it publishes.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from typing import Any

NAMESPACE = "GpuPlatform/Inference"
REQUEST_COUNTERS = ("vllm:request_success_total", "gpuplat_inference_requests_total")
LOG = logging.getLogger("gpuplat-scaling-agent")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def request_count(metrics_text: str) -> float | None:
    """Total finished requests in a Prometheus text exposition (None: no known counter)."""
    totals: dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in REQUEST_COUNTERS:
            totals[match.group(1)] = totals.get(match.group(1), 0.0) + float(match.group(3))
    for name in REQUEST_COUNTERS:
        if name in totals:
            return totals[name]
    return None


def gpu_memory_percent(nvidia_smi_csv: str) -> float | None:
    """Highest memory.used / memory.total over the GPUs, percent (csv,noheader,nounits)."""
    worst = None
    for line in nvidia_smi_csv.strip().splitlines():
        used, total = (float(v) for v in line.split(","))
        if total > 0:
            worst = max(worst or 0.0, 100.0 * used / total)
    return worst


def read_gpu_memory() -> float | None:
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout
    return gpu_memory_percent(out)


def scrape(url: str) -> float | None:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return request_count(resp.read().decode())


def metric_data(asg: str, rps: float | None, gpu_mem: float | None) -> list[dict[str, Any]]:
    dims = [{"Name": "AutoScalingGroupName", "Value": asg}]
    data = []
    if rps is not None:
        data.append(
            {
                "MetricName": "RequestsPerSecond",
                "Dimensions": dims,
                "Value": round(rps, 3),
                "Unit": "Count/Second",
            }
        )
    if gpu_mem is not None:
        data.append(
            {
                "MetricName": "GPUMemoryUtilization",
                "Dimensions": dims,
                "Value": round(gpu_mem, 2),
                "Unit": "Percent",
            }
        )
    return data


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--metrics-url", default="http://127.0.0.1:8000/metrics")
    parser.add_argument("--asg", default="", help="Auto Scaling group name (the metric's dimension)")
    parser.add_argument("--region", default="")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between two samples")
    parser.add_argument("--once", action="store_true", help="one interval, then exit")
    parser.add_argument("--dry-run", action="store_true", help="print the metric data instead of sending it")
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
    if not args.dry_run and not (args.asg and args.region):
        parser.error("--asg and --region are required unless --dry-run")

    client = None
    if not args.dry_run:
        import boto3  # only needed to publish

        client = boto3.client("cloudwatch", region_name=args.region)

    previous, previous_at = scrape(args.metrics_url), time.monotonic()
    while True:
        time.sleep(args.interval)
        try:
            count, now = scrape(args.metrics_url), time.monotonic()
            rps = (
                (count - previous) / (now - previous_at)
                if count is not None and previous is not None
                else None
            )
            previous, previous_at = count, now
            data = metric_data(
                args.asg or "dry-run", max(rps, 0.0) if rps is not None else None, read_gpu_memory()
            )
            if client is None:
                print(json.dumps({"Namespace": NAMESPACE, "MetricData": data}), flush=True)
            elif data:
                client.put_metric_data(Namespace=NAMESPACE, MetricData=data)
        except Exception:  # keep publishing: one failed sample must not stop scaling signals
            LOG.exception("sample failed")
            if args.once:
                return 1
        if args.once:
            return 0


if __name__ == "__main__":
    sys.exit(main())
