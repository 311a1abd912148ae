#!/usr/bin/env python3
"""Route the inference gateway to the infer pool's running instances (AWS), every ~15 s.

On AWS the infer pool is an Auto Scaling group: instances come and go with the load. HAProxy's
backend `inference` holds a fixed number of server slots (inference_gateway_max_servers, the pool's
max nodes x replicas per node), all `disabled` in haproxy.cfg. This program, run by a systemd timer
on the gateway:

  1. lists the running instances of the stack's infer pool: ec2:DescribeInstances, filtered on
     tag:gpuplat:stack, tag:gpuplat:role (and optionally tag:gpuplat:pool), instance-state-name=running,
     every page;
  2. wants one server per replica of each: (private IP, base port + i) for i < replicas;
  3. reads the slots from HAProxy's runtime API (`show servers state <backend>` on the stats socket)
     and changes only what differs:
       - a slot in service whose target is still wanted stays as it is (never touched);
       - a slot in service whose target is gone (instance scaled in or terminated), or a duplicate,
         goes to maintenance: `set server <backend>/<slot> state maint`;
       - each wanted target without a slot takes a slot in maintenance, one that already points at
         it if there is one (`state ready` only), otherwise the first free one:
         `set server <backend>/<slot> addr <ip> port <port>` then `set server <backend>/<slot> state ready`.
     A second run with the same instances sends no command.
  4. a slot leaves maintenance only once its replica answers GET /health with 200: HAProxy counts a
     server leaving maintenance as up before any check (server.c: "start OK but check immediately"),
     so a replica still loading its model would get the first requests. A slot whose replica is not
     healthy yet gets its address and stays in maintenance until a later pass;
  5. instances the Auto Scaling group is terminating (lifecycle state Terminating:Wait, held there by
     the group's termination hook) are drained, not cut: `set server ... state drain` keeps their
     requests in flight running and sends them no new one;
  6. with --canary-backend, the canary backend's slots the same way, one per instance at its canary
     port (--canary-port): a slot leaves maintenance once the canary there answers /health, so only
     the instances where `gpuplat serve deploy` started a canary take the canary's share;
  7. with --state-file, once it changed a slot (or where the file is missing) it saves the servers'
     state there, the file haproxy.cfg's server-state-file names: a HAProxy that starts again, even
     after a crash, finds the slots' last addresses and states in it (haproxy.cfg.j2, init-addr last).

Other commands, on every backend (the gateway's other servers too, matched by address):

  save-state FILE        `show servers state` into FILE, before a reload or stop (haproxy.cfg's
                         server-state-file: the new process starts with the slots as they were)
  drain HOST:PORT        put every server pointing at HOST:PORT into drain and wait until none has a
                         request in flight (`show stat` scur and qcur 0); a rolling restart runs this
                         on every gateway before it restarts a replica
  ready HOST:PORT        take those servers out of drain and wait until HAProxy's checks count
                         them up

If the EC2 call fails nothing changes in HAProxy (a failed listing never empties the backend). More
targets than slots: the extra ones are left out, logged, and the exit status is 3.

  gpuplat_gateway_targets.py sync --region us-east-1 --stack prod --port 8000 --replicas 4 \\
      --backend inference --slot-prefix slot- --socket /run/haproxy/admin.sock
  gpuplat_gateway_targets.py sync ... --state-file /run/gpuplat-gateway/server-state
  gpuplat_gateway_targets.py sync ... --dry-run      # print the commands, send nothing
  gpuplat_gateway_targets.py save-state /run/gpuplat-gateway/server-state
  gpuplat_gateway_targets.py drain 10.0.3.7:8001 --wait-s 600
  gpuplat_gateway_targets.py ready 10.0.3.7:8001

Each pass also publishes the gateways' backlog per serving instance of the group (CloudWatch
GpuPlatform/Inference GatewayBacklogPerInstance): requests queued because every replica is at its
limit, which the group's target tracking follows.

Standard library, and boto3 (python3-boto3) for sync. IAM: ec2:DescribeInstances,
autoscaling:DescribeAutoScalingInstances, cloudwatch:PutMetricData.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG = logging.getLogger("gpuplat-gateway-targets")

TAG_STACK = "gpuplat:stack"
TAG_ROLE = "gpuplat:role"
TAG_POOL = "gpuplat:pool"
TAG_GROUP = "aws:autoscaling:groupName"
# The gateways' backlog per instance of the infer group, which its target-tracking policy follows
# (infra/backends/aws/node_pool.py GATEWAY_BACKLOG_METRIC).
METRICS_NAMESPACE = "GpuPlatform/Inference"
BACKLOG_METRIC = "GatewayBacklogPerInstance"

# srv_admin_state bits (HAProxy's enum srv_admin): FMAINT 0x01 (forced: CLI or the `disabled`
# keyword), IMAINT 0x02 (inherited from a tracked server), RMAINT 0x20 (address resolution failed).
# CMAINT 0x04 (`disabled` in the configuration) stays set after `state ready`: it is not maintenance
# by itself (HAProxy's SRV_ADMF_MAINT mask is 0x23).
ADMIN_MAINT_MASK = 0x23
# SRV_ADMF_FDRAIN: `set server ... state drain` (weight 0 for new requests, those in flight run on).
ADMIN_DRAIN = 0x08
# srv_op_state SRV_ST_RUNNING: the health checks passed; the server takes requests.
OP_RUNNING = 2
# The Auto Scaling lifecycle states of an instance the group is terminating (API reference,
# AutoScalingInstanceDetails LifecycleState): the termination hook holds it in Terminating:Wait until its
# requests have ended (the node completes the lifecycle action).
TERMINATING_STATES = frozenset({"Terminating", "Terminating:Wait", "Terminating:Proceed"})

Target = tuple[str, int]
Health = Callable[[Target], bool]


class RuntimeApiError(RuntimeError):
    """HAProxy refused a command or its answer could not be read."""


@dataclass(frozen=True)
class Slot:
    """One server line of the backend, as `show servers state` reports it."""

    srv_id: int
    name: str
    address: str
    port: int
    admin_state: int
    op_state: int = 2

    @property
    def in_maintenance(self) -> bool:
        return bool(self.admin_state & ADMIN_MAINT_MASK)

    @property
    def draining(self) -> bool:
        return bool(self.admin_state & ADMIN_DRAIN)

    @property
    def target(self) -> Target:
        return (self.address, self.port)


def instance_filters(stack: str, role: str, pools: Iterable[str] = ()) -> list[dict[str, Any]]:
    filters: list[dict[str, Any]] = [
        {"Name": f"tag:{TAG_STACK}", "Values": [stack]},
        {"Name": f"tag:{TAG_ROLE}", "Values": [role]},
        {"Name": "instance-state-name", "Values": ["running"]},
    ]
    pools = sorted(pools)
    if pools:
        filters.append({"Name": f"tag:{TAG_POOL}", "Values": pools})
    return filters


@dataclass(frozen=True)
class Instance:
    address: str
    group: str  # its Auto Scaling group (tag aws:autoscaling:groupName), "" for none


def running_instances(
    ec2: Any, stack: str, role: str, pools: Iterable[str] = (), page_size: int | None = None
) -> dict[str, Instance]:
    """Instance id -> private IPv4 address and group of the running instances of the stack's pools of
    this role."""
    instances: dict[str, Instance] = {}
    paginator = ec2.get_paginator("describe_instances")
    pagination = {"PageSize": page_size} if page_size else {}
    for page in paginator.paginate(Filters=instance_filters(stack, role, pools), PaginationConfig=pagination):
        for reservation in page.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                # The filter already asks for running ones; an instance without a private address
                # (not yet attached) cannot be routed to.
                if instance.get("State", {}).get("Name") != "running":
                    continue
                address = instance.get("PrivateIpAddress")
                tags = {tag["Key"]: tag["Value"] for tag in instance.get("Tags", [])}
                if address:
                    instances[instance["InstanceId"]] = Instance(address, tags.get(TAG_GROUP, ""))
    return instances


def running_addresses(
    ec2: Any, stack: str, role: str, pools: Iterable[str] = (), page_size: int | None = None
) -> list[str]:
    """Private IPv4 addresses of the running instances of the stack's pools of this role, every page."""
    instances = running_instances(ec2, stack, role, pools, page_size).values()
    return sorted({instance.address for instance in instances}, key=_address_key)


def terminating_addresses(autoscaling: Any, instances: dict[str, Instance]) -> set[str]:
    """Addresses of the instances (id -> address) that their Auto Scaling group is terminating."""
    ids = sorted(instances)
    terminating: set[str] = set()
    for start in range(0, len(ids), 50):  # DescribeAutoScalingInstances takes at most 50 ids
        answer = autoscaling.describe_auto_scaling_instances(InstanceIds=ids[start : start + 50])
        for instance in answer.get("AutoScalingInstances", []):
            if instance.get("LifecycleState") in TERMINATING_STATES:
                terminating.add(instances[instance["InstanceId"]].address)
    return terminating


def _address_key(address: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in address.split("."))
    except ValueError:
        return (1 << 16,)


def wanted_targets(addresses: Iterable[str], base_port: int, replicas: int) -> list[Target]:
    """Replica i of each instance listens on base_port + i."""
    return [(address, base_port + replica) for address in addresses for replica in range(replicas)]


def parse_servers_state(text: str, backend: str, prefix: str) -> list[Slot]:
    """Slots of `backend` whose name starts with `prefix`, from `show servers state [backend]`.

    The answer: a version line ("1"), a "# be_id be_name srv_id srv_name srv_addr srv_op_state
    srv_admin_state ... srv_port ..." header, then one line per server, fields separated by spaces.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or lines[0].strip() != "1":
        raise RuntimeApiError(f"unexpected answer to 'show servers state': {text[:200]!r}")
    columns: list[str] = []
    slots: list[Slot] = []
    for line in lines[1:]:
        if line.startswith("#"):
            columns = line.lstrip("#").split()
            continue
        if not columns:
            raise RuntimeApiError("'show servers state' answered without its header line")
        row = dict(zip(columns, line.split(), strict=False))
        if row.get("be_name") != backend or not row.get("srv_name", "").startswith(prefix):
            continue
        slots.append(
            Slot(
                srv_id=int(row["srv_id"]),
                name=row["srv_name"],
                address=row["srv_addr"],
                port=int(row["srv_port"]),
                admin_state=int(row["srv_admin_state"]),
                op_state=int(row["srv_op_state"]),
            )
        )
    return sorted(slots, key=lambda slot: slot.srv_id)


@dataclass(frozen=True)
class CanarySlots:
    """The canary backend's slots: one per instance, at the instance's canary port (`gpuplat serve`
    starts a canary there on the instances of a release; elsewhere nothing answers and the slot stays in
    maintenance)."""

    backend: str
    prefix: str
    port: int


@dataclass(frozen=True)
class Plan:
    commands: list[str]
    unplaced: list[Target]
    unhealthy: list[Target]


def always_healthy(target: Target) -> bool:
    return True


def plan(
    slots: list[Slot],
    wanted: list[Target],
    backend: str,
    draining: Iterable[str] = (),
    healthy: Health = always_healthy,
) -> Plan:
    """The runtime API commands that make the slots serve exactly `wanted`, and nothing else.

    `draining`: addresses of instances being terminated: their live slots are drained, never reused.
    `healthy`: whether a target answers its health check; only healthy targets leave maintenance.
    """
    wanted_set = set(wanted)
    leaving = set(draining)
    placed: set[Target] = set()
    commands: list[str] = []
    free: list[Slot] = []
    for slot in slots:
        if slot.in_maintenance:
            free.append(slot)
        elif slot.address in leaving:
            if not slot.draining:
                commands.append(f"set server {backend}/{slot.name} state drain")
        elif slot.target in wanted_set and slot.target not in placed:
            placed.add(slot.target)  # a live slot with a live target: never touched
        else:
            commands.append(f"set server {backend}/{slot.name} state maint")
            free.append(slot)
    # Slots going to maintenance this run are reused after those already idle.
    free.sort(key=lambda slot: (not slot.in_maintenance, slot.srv_id))
    missing = [target for target in wanted if target not in placed and target[0] not in leaving]
    unhealthy: list[Target] = []
    # A slot in maintenance that already points at a wanted target only needs `state ready`.
    for target in list(missing):
        match = next((slot for slot in free if slot.in_maintenance and slot.target == target), None)
        if match is not None:
            free.remove(match)
            missing.remove(target)
            if healthy(target):
                commands.append(f"set server {backend}/{match.name} state ready")
            else:
                unhealthy.append(target)
    unplaced: list[Target] = []
    for target in missing:
        if not free:
            unplaced.append(target)
            continue
        slot = free.pop(0)
        address, port = target
        if slot.target != target:
            commands.append(f"set server {backend}/{slot.name} addr {address} port {port}")
        if healthy(target):
            commands.append(f"set server {backend}/{slot.name} state ready")
        else:
            unhealthy.append(target)
    return Plan(commands=commands, unplaced=unplaced, unhealthy=unhealthy)


def http_health(path: str, timeout_s: float = 2.0) -> Health:
    """A probe of a replica's health endpoint: True on HTTP 200."""

    def probe(target: Target) -> bool:
        address, port = target
        try:
            with urllib.request.urlopen(f"http://{address}:{port}{path}", timeout=timeout_s) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    return probe


class RuntimeApi:
    """HAProxy's runtime API on a UNIX stats socket: one command per connection."""

    def __init__(self, path: str, timeout_s: float = 5.0, connect_wait_s: float = 10.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self.connect_wait_s = connect_wait_s

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self.connect_wait_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout_s)
            try:
                sock.connect(self.path)
                return sock
            except (FileNotFoundError, ConnectionRefusedError):
                sock.close()
                # HAProxy (re)starting: its socket comes back within a second or two.
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
            except OSError:
                sock.close()
                raise

    def send(self, command: str) -> str:
        with self._connect() as sock:
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def apply(self, command: str) -> None:
        answer = self.send(command).strip()
        # `set server ... addr` answers "IP changed from '127.0.0.1' to '10.0.0.5', port changed from
        # '8000' to '8001' by 'stats socket command'" (or "no need to change the addr, ..."); `set
        # server ... state` answers nothing. Anything else ("No such server.", ...) is a refusal.
        addr_ok = "changed" in answer or "no need to change" in answer
        ok = addr_ok if " addr " in command else answer == ""
        if not ok:
            raise RuntimeApiError(f"HAProxy refused {command!r}: {answer}")

    def slots(self, backend: str, prefix: str = "") -> list[Slot]:
        return parse_servers_state(self.send(f"show servers state {backend}"), backend, prefix)

    def stats(self, backend: str) -> dict[str, dict[str, str]]:
        """`show stat` of one backend: its servers' rows and its own (svname BACKEND), by svname."""
        lines = self.send("show stat").splitlines()
        if not lines or not lines[0].startswith("# "):
            raise RuntimeApiError(f"unexpected answer to 'show stat': {lines[:1]!r}")
        rows = csv.DictReader([lines[0][2:], *lines[1:]])
        return {row["svname"]: row for row in rows if row.get("pxname") == backend}

    def in_flight(self, backend: str) -> dict[str, int]:
        """Requests each server of the backend has in flight or queued (scur + qcur)."""
        return {
            name: int(row.get("scur") or 0) + int(row.get("qcur") or 0)
            for name, row in self.stats(backend).items()
            if name not in ("FRONTEND", "BACKEND")
        }

    def backlog(self, backend: str) -> int:
        """Requests the backend queues because every server is at its limit (its qcur)."""
        return int(self.stats(backend).get("BACKEND", {}).get("qcur") or 0)


def backlog_metric_data(instances: Iterable[Instance], backlog: int, gateways: int) -> list[dict[str, Any]]:
    """The backlog of all gateways per serving instance, for each group: this gateway queues about
    1/gateways of it, so its own backlog x gateways / instances."""
    groups: dict[str, int] = {}
    for instance in instances:
        if instance.group:
            groups[instance.group] = groups.get(instance.group, 0) + 1
    serving = sum(groups.values())
    if not serving:
        return []
    value = round(backlog * max(gateways, 1) / serving, 3)
    return [
        {
            "MetricName": BACKLOG_METRIC,
            "Dimensions": [{"Name": "AutoScalingGroupName", "Value": group}],
            "Value": value,
            "Unit": "Count",
        }
        for group in sorted(groups)
    ]


def sync(
    ec2: Any,
    api: RuntimeApi,
    *,
    stack: str,
    role: str,
    pools: Iterable[str],
    base_port: int,
    replicas: int,
    backend: str,
    prefix: str,
    autoscaling: Any = None,
    cloudwatch: Any = None,
    gateways: int = 1,
    healthy: Health = always_healthy,
    state_file: Path | None = None,
    dry_run: bool = False,
    echo: Callable[[str], None] = print,
    canary: CanarySlots | None = None,
) -> Plan:
    """One pass: list the instances, read the slots (the canary backend's too, with `canary`), send what
    differs. Returns what it planned."""
    instances = running_instances(ec2, stack, role, pools)
    addresses = sorted({instance.address for instance in instances.values()}, key=_address_key)
    leaving = terminating_addresses(autoscaling, instances) if autoscaling and instances else set()
    wanted = wanted_targets(addresses, base_port, replicas)
    slots = api.slots(backend, prefix)
    if not slots:
        raise RuntimeApiError(f"backend {backend} has no server slot named {prefix}*")
    result = plan(slots, wanted, backend, leaving, healthy)
    canary_result = Plan([], [], [])
    if canary is not None:
        canary_slots = api.slots(canary.backend, canary.prefix)
        if not canary_slots:
            raise RuntimeApiError(f"backend {canary.backend} has no server slot named {canary.prefix}*")
        # One canary slot per instance; it stays in maintenance while no canary answers there.
        canary_wanted = wanted_targets(addresses, canary.port, 1)
        canary_result = plan(canary_slots, canary_wanted, canary.backend, leaving, healthy)
    for command in result.commands + canary_result.commands:
        if dry_run:
            echo(command)
        else:
            LOG.info("%s", command)
            api.apply(command)
    changed = result.commands + canary_result.commands
    if state_file is not None and not dry_run and (changed or not state_file.exists()):
        save_state(api, state_file)
    LOG.info(
        "%d instance(s), %d target(s), %d slot(s), %d command(s)",
        len(addresses),
        len(wanted),
        len(slots),
        len(changed),
    )
    if cloudwatch is not None:
        serving = [i for i in instances.values() if i.address not in leaving]
        data = backlog_metric_data(serving, api.backlog(backend), gateways)
        if dry_run:
            echo(f"put-metric-data {METRICS_NAMESPACE} {data}")
        elif data:
            cloudwatch.put_metric_data(Namespace=METRICS_NAMESPACE, MetricData=data)
    if result.unhealthy:
        LOG.info(
            "waiting for the health of %s: in maintenance until it answers",
            ", ".join(f"{a}:{p}" for a, p in result.unhealthy),
        )
    if canary_result.unplaced:
        LOG.error(
            "%d instance(s) without a canary slot: the infer pool outgrew the %d slots of %s",
            len(canary_result.unplaced),
            len(canary_slots),
            canary.backend if canary else "",
        )
    if result.unplaced:
        LOG.error(
            "%d target(s) without a slot (%s): the infer pool outgrew the %d slots of the gateway "
            "(inference_gateway_max_servers)",
            len(result.unplaced),
            ", ".join(f"{a}:{p}" for a, p in result.unplaced),
            len(slots),
        )
    return Plan(changed, result.unplaced + canary_result.unplaced, result.unhealthy)


def aws_clients(region: str, endpoint_url: str | None) -> tuple[Any, Any, Any]:
    import boto3  # only here: the other commands and the planning need no AWS SDK

    def client(service: str) -> Any:
        return boto3.client(service, region_name=region, endpoint_url=endpoint_url)

    return client("ec2"), client("autoscaling"), client("cloudwatch")


def haproxy_running(api: RuntimeApi, otherwise: str) -> bool:
    """Whether HAProxy's admin socket is there; if not, says what that means for this command."""
    if Path(api.path).exists():
        return True
    LOG.info("HAProxy is not running (no %s): %s", api.path, otherwise)
    return False


def save_state(api: RuntimeApi, path: Path) -> int:
    """The servers' state, for the next process to start from (haproxy.cfg: server-state-file)."""
    if not haproxy_running(api, "no state to save"):
        return 0
    text = api.send("show servers state")
    if not text.startswith("1"):
        raise RuntimeApiError(f"unexpected answer to 'show servers state': {text[:200]!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    # A name of its own: the timer's pass and the unit's ExecReload may save at the same time.
    handle, partial = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".partial")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.chmod(partial, 0o644)
        os.replace(partial, path)  # the reloading process never reads a half-written file
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    LOG.info("saved the state of %d server(s) to %s", text.count("\n") - 2, path)
    return 0


def parse_target(text: str) -> tuple[set[str], int]:
    """HOST:PORT -> the host's IPv4 addresses and the port."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{text!r} is not HOST:PORT")
    infos = socket.getaddrinfo(host, int(port), family=socket.AF_INET, type=socket.SOCK_STREAM)
    return {str(info[4][0]) for info in infos}, int(port)


def servers_at(api: RuntimeApi, backend: str, target: str) -> list[Slot]:
    addresses, port = parse_target(target)
    return [slot for slot in api.slots(backend) if slot.address in addresses and slot.port == port]


def drain(api: RuntimeApi, backend: str, target: str, wait_s: float, poll_s: float = 0.5) -> int:
    """Drain every server of the backend at target; 0 once none has a request in flight."""
    if not haproxy_running(api, f"nothing in flight to {target}"):
        return 0
    servers = servers_at(api, backend, target)
    if not servers:
        LOG.info("no server of %s points at %s: nothing to drain", backend, target)
        return 0
    for server in servers:
        if not server.draining:
            api.apply(f"set server {backend}/{server.name} state drain")
    names = {server.name for server in servers}
    deadline = time.monotonic() + wait_s
    while True:
        busy = {name: count for name, count in api.in_flight(backend).items() if name in names and count}
        if not busy:
            LOG.info("%s drained (%s)", target, ", ".join(sorted(names)))
            return 0
        if time.monotonic() >= deadline:
            LOG.error("%s still has requests in flight after %.0f s: %s", target, wait_s, busy)
            return 4
        time.sleep(poll_s)


def ready(api: RuntimeApi, backend: str, target: str, wait_s: float, poll_s: float = 0.5) -> int:
    """Take the servers at target out of drain (those in maintenance stay there), then wait until
    HAProxy's own checks count them up: a rolling restart drains the next replica only after that."""
    if not haproxy_running(api, "nothing to take out of drain"):
        return 0
    servers = [server for server in servers_at(api, backend, target) if not server.in_maintenance]
    for server in servers:
        if server.draining:
            api.apply(f"set server {backend}/{server.name} state ready")
    names = {server.name for server in servers}
    deadline = time.monotonic() + wait_s
    while True:
        down = [s.name for s in api.slots(backend) if s.name in names and s.op_state != OP_RUNNING]
        if not down:
            return 0
        if time.monotonic() >= deadline:
            LOG.error("%s not up on the gateway's checks after %.0f s: %s", target, wait_s, ", ".join(down))
            return 4
        time.sleep(poll_s)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--socket", default="/run/haproxy/admin.sock", help="HAProxy's admin stats socket")
    parser.add_argument("--backend", default="inference")
    commands = parser.add_subparsers(dest="command", required=True)
    sync_parser = commands.add_parser("sync", help="route the backend's slots to the running instances")
    sync_parser.add_argument("--region", required=True)
    sync_parser.add_argument("--stack", required=True, help="value of the gpuplat:stack tag")
    sync_parser.add_argument("--role", default="infer", help="value of the gpuplat:role tag")
    sync_parser.add_argument(
        "--pool", action="append", default=[], help="restrict to these gpuplat:pool tags"
    )
    sync_parser.add_argument("--port", type=int, required=True, help="port of replica 0")
    sync_parser.add_argument("--replicas", type=int, default=1, help="replicas per instance: port..port+N-1")
    sync_parser.add_argument("--slot-prefix", default="slot-")
    sync_parser.add_argument("--gateways", type=int, default=1, help="gateways of the stack (backlog share)")
    sync_parser.add_argument("--health-path", default="/health", help="a slot leaves maintenance on 200 here")
    sync_parser.add_argument("--endpoint-url", default=None, help="AWS API endpoint (default: the region's)")
    sync_parser.add_argument(
        "--state-file", type=Path, default=None, help="save the servers' state here after a change"
    )
    sync_parser.add_argument("--dry-run", action="store_true", help="print the commands, send none")
    sync_parser.add_argument("--canary-backend", default=None, help="also fill this backend's canary slots")
    sync_parser.add_argument("--canary-slot-prefix", default="canary-")
    sync_parser.add_argument("--canary-port", type=int, default=None, help="each instance's canary port")
    save_parser = commands.add_parser("save-state", help="save the servers' state for the next process")
    save_parser.add_argument("file", type=Path)
    for name, what in (("drain", "drain the servers at HOST:PORT"), ("ready", "take them out of drain")):
        target_parser = commands.add_parser(name, help=what)
        target_parser.add_argument("target", help="HOST:PORT of a model-server replica")
        target_parser.add_argument("--wait-s", type=float, default=600.0 if name == "drain" else 60.0)
    args = parser.parse_args(argv)
    if args.command == "sync" and args.replicas < 1:
        parser.error("--replicas must be at least 1")
    if args.command == "sync" and (args.canary_backend is None) != (args.canary_port is None):
        parser.error("--canary-backend and --canary-port go together")
    return args


def run_sync(args: argparse.Namespace, api: RuntimeApi) -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    ec2, autoscaling, cloudwatch = aws_clients(args.region, args.endpoint_url)
    try:
        result = sync(
            ec2,
            api,
            stack=args.stack,
            role=args.role,
            pools=args.pool,
            base_port=args.port,
            replicas=args.replicas,
            backend=args.backend,
            prefix=args.slot_prefix,
            autoscaling=autoscaling,
            cloudwatch=cloudwatch,
            gateways=args.gateways,
            healthy=http_health(args.health_path),
            state_file=args.state_file,
            dry_run=args.dry_run,
            canary=(
                None
                if args.canary_backend is None
                else CanarySlots(args.canary_backend, args.canary_slot_prefix, args.canary_port)
            ),
        )
    except (BotoCoreError, ClientError) as exc:  # raised before any command: HAProxy unchanged
        LOG.error("listing the instances failed, HAProxy left as it is: %s", exc)
        return 2
    return 3 if result.unplaced else 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    api = RuntimeApi(args.socket)
    try:
        if args.command == "sync":
            return run_sync(args, api)
        if args.command == "save-state":
            return save_state(api, args.file)
        if args.command == "drain":
            return drain(api, args.backend, args.target, args.wait_s)
        return ready(api, args.backend, args.target, args.wait_s)
    except RuntimeApiError as exc:
        LOG.error("%s", exc)
        return 2
    except (OSError, ValueError) as exc:
        LOG.error("HAProxy's runtime API at %s: %s", args.socket, exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
