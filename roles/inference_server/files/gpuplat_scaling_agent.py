#!/usr/bin/env python3
"""Publish the inference pool's autoscaling signals to CloudWatch, once a minute.

The infer pool's Auto Scaling group tracks custom metrics (infra/backends/aws/node_pool.py):
namespace GpuPlatform/Inference, dimension AutoScalingGroupName, statistic Average. They measure
load, read from every model-server replica of the node (one /metrics URL per replica):

  RequestsPerSecond     requests the node's replicas finished per second, read as the increase of
                        their request counters between two scrapes (vLLM: vllm:request_success_total;
                        CPU reference server: gpuplat_inference_requests_total)
  KVCacheUtilization    KV-cache blocks in use, percent, averaged over the replicas (vLLM:
                        vllm:kv_cache_usage_perc, named vllm:gpu_cache_usage_perc before vLLM 0.10);
                        not sent where the engine has no KV cache
  RequestsWaiting       requests queued inside the replicas, summed (vllm:num_requests_waiting;
                        gpuplat_inference_requests_waiting)

GPU memory is not a load signal: vLLM pre-allocates gpu_memory_fraction (~90%) of every GPU at
start, idle or not.

  gpuplat_scaling_agent.py --region REGION [--asg NAME] --metrics-url URL [--metrics-url URL ...]
  gpuplat_scaling_agent.py --dry-run --once --interval 5     # print what it would send

Without --asg the node asks its own instance metadata (IMDSv2) for its tag aws:autoscaling:groupName,
which Auto Scaling puts on every instance it launches: a node that configures itself at boot has no
inventory that names its group (EC2 User Guide, "View tags for your EC2 instances using instance
metadata": tags/instance/<key>, readable where the launch template allows instance tags in metadata).

With --lifecycle-hook it also lets the group terminate the node without cutting a request: the group's
termination hook holds a leaving instance in Terminating:Wait, and its metadata's
autoscaling/target-lifecycle-state turns to Terminated (Amazon EC2 Auto Scaling User Guide,
"Retrieve the target lifecycle state through instance metadata"). The gateways drain it then
(gpuplat_gateway_targets.py lists the group's terminating instances); the agent waits
--drain-grace-s for them to notice, then until its replicas have no request running or waiting,
then completes the lifecycle action (CONTINUE) and the group terminates it. Past --drain-timeout-s
it completes anyway; the hook's own timeout is the backstop.

A Spot instance learns of its interruption from its metadata's spot/instance-action: 404 until EC2
marks it to be stopped or terminated, then {"action": "terminate"|"stop"|"hibernate", "time": "<UTC>"},
about two minutes ahead, checked every 5 seconds as EC2 recommends (EC2 User Guide, "Spot Instance
interruption notices", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
The Auto Scaling group does not show such an instance as terminating before EC2 acts, so the gateways
cannot learn it from the group: with --agent-port the agent answers HAProxy's agent check on that port
(haproxy.cfg.j2 of roles/inference_gateway: agent-check) with "up" while the node serves and "drain"
once it is leaving, for either reason; the gateways then send it no new request and those in flight
run on. After a notice it waits for its replicas' requests to end, and if the group's hook later holds
the instance it completes the lifecycle action at once.

Standard library, plus boto3 only when it publishes.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

NAMESPACE = "GpuPlatform/Inference"
REQUEST_COUNTERS = ("vllm:request_success_total", "gpuplat_inference_requests_total")
KV_CACHE_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
WAITING_GAUGES = ("vllm:num_requests_waiting", "gpuplat_inference_requests_waiting")
RUNNING_GAUGES = ("vllm:num_requests_running", "gpuplat_inference_requests_running")
LOG = logging.getLogger("gpuplat-scaling-agent")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def _totals(metrics_text: str, names: tuple[str, ...]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in names:
            totals[match.group(1)] = totals.get(match.group(1), 0.0) + float(match.group(3))
    return totals


def _first(totals: dict[str, float], names: tuple[str, ...]) -> float | None:
    return next((totals[name] for name in names if name in totals), None)


def request_count(metrics_text: str) -> float | None:
    """Total finished requests in a Prometheus text exposition (None: no known counter)."""
    return _first(_totals(metrics_text, REQUEST_COUNTERS), REQUEST_COUNTERS)


def kv_cache_usage(metrics_text: str) -> float | None:
    """KV-cache usage of one replica, 0..1 (None: the engine exports none)."""
    return _first(_totals(metrics_text, KV_CACHE_GAUGES), KV_CACHE_GAUGES)


def requests_waiting(metrics_text: str) -> float | None:
    return _first(_totals(metrics_text, WAITING_GAUGES), WAITING_GAUGES)


def requests_in_flight(metrics_text: str) -> float:
    """Requests one replica is running or holding in its queue."""
    running = _first(_totals(metrics_text, RUNNING_GAUGES), RUNNING_GAUGES) or 0.0
    return running + (requests_waiting(metrics_text) or 0.0)


@dataclass(frozen=True)
class Sample:
    requests: float | None
    kv_cache_percent: float | None
    waiting: float | None


def node_sample(texts: list[str]) -> Sample:
    """One node's load over its replicas: requests and waiting summed, KV-cache usage averaged."""
    counts = [c for c in map(request_count, texts) if c is not None]
    kv = [k for k in map(kv_cache_usage, texts) if k is not None]
    waiting = [w for w in map(requests_waiting, texts) if w is not None]
    return Sample(
        requests=sum(counts) if counts else None,
        kv_cache_percent=100.0 * sum(kv) / len(kv) if kv else None,
        waiting=sum(waiting) if waiting else None,
    )


def read_metrics(urls: list[str]) -> list[str]:
    texts = []
    for url in urls:
        with urllib.request.urlopen(url, timeout=10) as resp:
            texts.append(resp.read().decode())
    return texts


def scrape(urls: list[str]) -> Sample:
    return node_sample(read_metrics(urls))


def metric_data(
    asg: str, rps: float | None, kv_cache_percent: float | None, waiting: float | None
) -> list[dict[str, Any]]:
    dims = [{"Name": "AutoScalingGroupName", "Value": asg}]
    values = (
        ("RequestsPerSecond", rps, "Count/Second", 3),
        ("KVCacheUtilization", kv_cache_percent, "Percent", 2),
        ("RequestsWaiting", waiting, "Count", 1),
    )
    return [
        {"MetricName": name, "Dimensions": dims, "Value": round(value, digits), "Unit": unit}
        for name, value, unit, digits in values
        if value is not None
    ]


IMDS_ENDPOINT = "http://169.254.169.254"
GROUP_TAG = "aws:autoscaling:groupName"


def metadata(path: str, endpoint: str = IMDS_ENDPOINT, timeout_s: float = 2.0) -> str:
    """One instance metadata value (IMDSv2: a session token first); HTTPError 404 where it has none."""
    token_request = urllib.request.Request(
        f"{endpoint}/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    )
    with urllib.request.urlopen(token_request, timeout=timeout_s) as reply:
        token = reply.read().decode()
    request = urllib.request.Request(
        f"{endpoint}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as reply:
        return str(reply.read().decode()).strip()


def own_autoscaling_group(endpoint: str = IMDS_ENDPOINT, timeout_s: float = 2.0) -> str:
    """This instance's Auto Scaling group, from its metadata tags."""
    return metadata(f"tags/instance/{GROUP_TAG}", endpoint, timeout_s)


def leaving(endpoint: str = IMDS_ENDPOINT) -> bool:
    """Whether the group is terminating this instance (its target lifecycle state is Terminated)."""
    try:
        return metadata("autoscaling/target-lifecycle-state", endpoint) == "Terminated"
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # not set before the instance's first lifecycle transition
            return False
        raise


@dataclass(frozen=True)
class Departure:
    """Why this instance is leaving."""

    reason: str
    # The group's termination hook holds it (Terminating:Wait): complete the lifecycle action once drained.
    held_by_hook: bool


def spot_interruption(endpoint: str = IMDS_ENDPOINT) -> Departure | None:
    """EC2's interruption notice of this Spot instance (None: none; on-demand instances never get one)."""
    try:
        text = metadata("spot/instance-action", endpoint)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # no notice
            return None
        raise
    try:
        notice = json.loads(text)
        action, when = str(notice["action"]), str(notice["time"])
    except (ValueError, KeyError, TypeError):
        # Unreadable, but present: EC2 has marked the instance all the same.
        action, when = "interruption", text[:40]
    return Departure(f"spot {action} at {when}", held_by_hook=False)


def departure(endpoint: str = IMDS_ENDPOINT) -> Departure | None:
    """Whether this instance is leaving: the group terminates it, or EC2 interrupts it (Spot)."""
    if leaving(endpoint):
        return Departure("the group terminates it (target lifecycle state Terminated)", held_by_hook=True)
    return spot_interruption(endpoint)


class AgentCheck:
    """HAProxy's agent check on this node: one line per connection, "up" while it serves, "drain" once
    it is leaving (HAProxy 2.6 configuration.txt, "agent-check": "drain" sets the server's DRAIN state,
    "up" leaves its administrative state alone)."""

    def __init__(self, port: int, address: str = "0.0.0.0") -> None:
        self.leaving = threading.Event()
        self.listener = socket.create_server((address, port))
        threading.Thread(target=self._serve, name="agent-check", daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def drain(self) -> None:
        self.leaving.set()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:  # closed
                return
            with connection:
                try:
                    connection.sendall(b"drain\n" if self.leaving.is_set() else b"up\n")
                except OSError:
                    continue

    def close(self) -> None:
        self.listener.close()


@dataclass(frozen=True)
class Drain:
    hook: str
    grace_s: float
    timeout_s: float
    poll_s: float = 2.0


def wait_until_drained(drain: Drain, urls: list[str]) -> float:
    """Wait for the gateways to drain this node, then for its replicas to finish what they hold.
    Returns the requests still in flight at the end (0 once drained)."""
    LOG.info("waiting %.0f s for the gateways to drain this instance", drain.grace_s)
    time.sleep(drain.grace_s)
    deadline = time.monotonic() + drain.timeout_s
    in_flight = sum(map(requests_in_flight, read_metrics(urls)))
    while in_flight > 0 and time.monotonic() < deadline:
        time.sleep(drain.poll_s)
        in_flight = sum(map(requests_in_flight, read_metrics(urls)))
    if in_flight > 0:
        LOG.warning("%d request(s) still in flight after %.0f s", in_flight, drain.timeout_s)
    return in_flight


def complete_lifecycle_action(autoscaling: Any, drain: Drain, asg: str, instance_id: str) -> None:
    autoscaling.complete_lifecycle_action(
        LifecycleHookName=drain.hook,
        AutoScalingGroupName=asg,
        LifecycleActionResult="CONTINUE",
        InstanceId=instance_id,
    )
    LOG.info("lifecycle action completed: the group may terminate %s", instance_id)


def wait_or_leave(interval_s: float, endpoint: str, poll_s: float = 5.0) -> Departure | None:
    """Sleep one interval, looking every poll_s whether this instance is leaving (None: it stays)."""
    deadline = time.monotonic() + interval_s
    while time.monotonic() < deadline:
        try:
            gone = departure(endpoint)
            if gone is not None:
                return gone
        except OSError as exc:
            LOG.warning("instance metadata: %s", exc)
        time.sleep(min(poll_s, max(deadline - time.monotonic(), 0.0)))
    return None


@dataclass(frozen=True)
class Leaving:
    """What the agent does once its instance is leaving."""

    drain: Drain
    asg: str
    urls: list[str]
    endpoint: str
    agent_check: AgentCheck | None = None
    autoscaling: Any = None


def leave(how: Leaving, why: Departure, poll_s: float = 5.0) -> float:
    """Drain this node through the gateways' agent check, wait for its requests to end, and complete
    the group's lifecycle action where its hook holds the instance: at once for a termination; after a
    Spot notice once the group moves the instance to Terminated (EC2 may end it before). Returns the
    requests still in flight when it stopped waiting for them."""
    LOG.info("this instance is leaving: %s", why.reason)
    if how.agent_check is not None:
        how.agent_check.drain()
    in_flight = wait_until_drained(how.drain, how.urls)
    if how.autoscaling is None or not how.drain.hook:
        return in_flight
    while not why.held_by_hook:
        time.sleep(poll_s)
        try:
            if leaving(how.endpoint):
                break
        except OSError as exc:
            LOG.warning("instance metadata: %s", exc)
    instance_id = metadata("instance-id", how.endpoint)
    complete_lifecycle_action(how.autoscaling, how.drain, how.asg, instance_id)
    return in_flight


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--metrics-url",
        action="append",
        dest="metrics_urls",
        help="/metrics of one model-server replica; repeat per replica (default: http://127.0.0.1:8000/metrics)",
    )
    parser.add_argument(
        "--asg",
        default="",
        help="Auto Scaling group name (the metric's dimension); default: the instance's tag",
    )
    parser.add_argument("--imds-endpoint", default=IMDS_ENDPOINT, help=argparse.SUPPRESS)
    parser.add_argument("--region", default="")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between two samples")
    parser.add_argument("--once", action="store_true", help="one interval, then exit")
    parser.add_argument("--lifecycle-hook", default="", help="the group's termination hook to complete")
    parser.add_argument("--drain-grace-s", type=float, default=30.0, help="time the gateways get to drain")
    parser.add_argument("--drain-timeout-s", type=float, default=600.0, help="longest wait for requests")
    parser.add_argument(
        "--agent-port", type=int, default=0, help="answer the gateways' agent check here (0: no agent check)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the metric data instead of sending it")
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
    if not args.dry_run and not args.region:
        parser.error("--region is required unless --dry-run")
    if not args.dry_run and not args.asg:
        try:
            args.asg = own_autoscaling_group(args.imds_endpoint)
        except (OSError, urllib.error.HTTPError) as exc:
            parser.error(
                f"no --asg, and the instance metadata did not give the {GROUP_TAG} tag ({exc}): is this an "
                "Auto Scaling instance whose launch template allows instance tags in metadata?"
            )
    urls = args.metrics_urls or ["http://127.0.0.1:8000/metrics"]

    client = autoscaling = None
    if not args.dry_run:
        import boto3  # only needed to publish

        client = boto3.client("cloudwatch", region_name=args.region)
        autoscaling = boto3.client("autoscaling", region_name=args.region)
    agent_check = AgentCheck(args.agent_port) if args.agent_port else None
    leaving_plan = Leaving(
        Drain(args.lifecycle_hook, args.drain_grace_s, args.drain_timeout_s),
        args.asg,
        urls,
        args.imds_endpoint,
        agent_check,
        autoscaling,
    )
    # Watch the instance metadata where something follows from it: a drain through the agent check, or the
    # group's hook to complete.
    watching = agent_check is not None or (bool(args.lifecycle_hook) and autoscaling is not None)

    previous, previous_at = scrape(urls).requests, time.monotonic()
    while True:
        if watching:
            why = wait_or_leave(args.interval, args.imds_endpoint)
            if why is not None:
                leave(leaving_plan, why)
                if agent_check is not None:
                    threading.Event().wait()  # answer "drain" until the instance is gone
                return 0
        else:
            time.sleep(args.interval)
        try:
            sample, now = scrape(urls), time.monotonic()
            count = sample.requests
            rps = (
                (count - previous) / (now - previous_at)
                if count is not None and previous is not None
                else None
            )
            previous, previous_at = count, now
            data = metric_data(
                args.asg or "dry-run",
                max(rps, 0.0) if rps is not None else None,
                sample.kv_cache_percent,
                sample.waiting,
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
