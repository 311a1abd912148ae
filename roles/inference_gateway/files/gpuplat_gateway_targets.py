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
     A second run with the same instances sends no command. HAProxy's health checks still decide
     whether a slot in service gets traffic (a replica still loading its model gets none).

If the EC2 call fails nothing changes in HAProxy (a failed listing never empties the backend). More
targets than slots: the extra ones are left out, logged, and the exit status is 3.

  gpuplat_gateway_targets.py --region us-east-1 --stack prod --port 8000 --replicas 4 \\
      --backend inference --slot-prefix slot- --socket /run/haproxy/admin.sock
  gpuplat_gateway_targets.py ... --dry-run      # print the commands, send nothing

Standard library and boto3 (python3-boto3). IAM: ec2:DescribeInstances.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

LOG = logging.getLogger("gpuplat-gateway-targets")

TAG_STACK = "gpuplat:stack"
TAG_ROLE = "gpuplat:role"
TAG_POOL = "gpuplat:pool"

# srv_admin_state bits (HAProxy's enum srv_admin): FMAINT 0x01 (forced: CLI or the `disabled`
# keyword), IMAINT 0x02 (inherited from a tracked server), RMAINT 0x20 (address resolution failed).
# CMAINT 0x04 (`disabled` in the configuration) stays set after `state ready`: it is not maintenance
# by itself (HAProxy's SRV_ADMF_MAINT mask is 0x23).
ADMIN_MAINT_MASK = 0x23

Target = tuple[str, int]


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

    @property
    def in_maintenance(self) -> bool:
        return bool(self.admin_state & ADMIN_MAINT_MASK)

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


def running_addresses(
    ec2: Any, stack: str, role: str, pools: Iterable[str] = (), page_size: int | None = None
) -> list[str]:
    """Private IPv4 addresses of the running instances of the stack's pools of this role, every page."""
    addresses: set[str] = set()
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
                if address:
                    addresses.add(address)
    return sorted(addresses, key=_address_key)


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
            )
        )
    return sorted(slots, key=lambda slot: slot.srv_id)


@dataclass(frozen=True)
class Plan:
    commands: list[str]
    unplaced: list[Target]


def plan(slots: list[Slot], wanted: list[Target], backend: str) -> Plan:
    """The runtime API commands that make the slots serve exactly `wanted`, and nothing else."""
    wanted_set = set(wanted)
    placed: set[Target] = set()
    commands: list[str] = []
    free: list[Slot] = []
    for slot in slots:
        if slot.in_maintenance:
            free.append(slot)
        elif slot.target in wanted_set and slot.target not in placed:
            placed.add(slot.target)  # a live slot with a live target: never touched
        else:
            commands.append(f"set server {backend}/{slot.name} state maint")
            free.append(slot)
    # Slots going to maintenance this run are reused after those already idle.
    free.sort(key=lambda slot: (not slot.in_maintenance, slot.srv_id))
    missing = [target for target in wanted if target not in placed]
    # A slot in maintenance that already points at a wanted target only needs `state ready`.
    for target in list(missing):
        match = next((slot for slot in free if slot.in_maintenance and slot.target == target), None)
        if match is not None:
            free.remove(match)
            missing.remove(target)
            commands.append(f"set server {backend}/{match.name} state ready")
    unplaced: list[Target] = []
    for target in missing:
        if not free:
            unplaced.append(target)
            continue
        slot = free.pop(0)
        address, port = target
        if slot.target != target:
            commands.append(f"set server {backend}/{slot.name} addr {address} port {port}")
        commands.append(f"set server {backend}/{slot.name} state ready")
    return Plan(commands=commands, unplaced=unplaced)


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

    def slots(self, backend: str, prefix: str) -> list[Slot]:
        return parse_servers_state(self.send(f"show servers state {backend}"), backend, prefix)


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
    dry_run: bool = False,
    echo: Callable[[str], None] = print,
) -> Plan:
    """One pass: list the instances, read the slots, send what differs. Returns what it planned."""
    addresses = running_addresses(ec2, stack, role, pools)
    wanted = wanted_targets(addresses, base_port, replicas)
    slots = api.slots(backend, prefix)
    if not slots:
        raise RuntimeApiError(f"backend {backend} has no server slot named {prefix}*")
    result = plan(slots, wanted, backend)
    for command in result.commands:
        if dry_run:
            echo(command)
        else:
            LOG.info("%s", command)
            api.apply(command)
    LOG.info(
        "%d instance(s), %d target(s), %d slot(s), %d command(s)",
        len(addresses),
        len(wanted),
        len(slots),
        len(result.commands),
    )
    if result.unplaced:
        LOG.error(
            "%d target(s) without a slot (%s): the infer pool outgrew the %d slots of the gateway "
            "(inference_gateway_max_servers)",
            len(result.unplaced),
            ", ".join(f"{a}:{p}" for a, p in result.unplaced),
            len(slots),
        )
    return result


def ec2_client(region: str, endpoint_url: str | None) -> Any:
    import boto3  # only here: the planning needs no AWS SDK

    return boto3.client("ec2", region_name=region, endpoint_url=endpoint_url)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--region", required=True)
    parser.add_argument("--stack", required=True, help="value of the gpuplat:stack tag")
    parser.add_argument("--role", default="infer", help="value of the gpuplat:role tag")
    parser.add_argument("--pool", action="append", default=[], help="restrict to these gpuplat:pool tags")
    parser.add_argument("--port", type=int, required=True, help="port of replica 0")
    parser.add_argument("--replicas", type=int, default=1, help="replicas per instance: port..port+N-1")
    parser.add_argument("--backend", default="inference")
    parser.add_argument("--slot-prefix", default="slot-")
    parser.add_argument("--socket", default="/run/haproxy/admin.sock", help="HAProxy's admin stats socket")
    parser.add_argument("--endpoint-url", default=None, help="EC2 API endpoint (default: the region's)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, send none")
    args = parser.parse_args(argv)
    if args.replicas < 1:
        parser.error("--replicas must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args = parse_args(argv)
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        result = sync(
            ec2_client(args.region, args.endpoint_url),
            RuntimeApi(args.socket),
            stack=args.stack,
            role=args.role,
            pools=args.pool,
            base_port=args.port,
            replicas=args.replicas,
            backend=args.backend,
            prefix=args.slot_prefix,
            dry_run=args.dry_run,
        )
    except RuntimeApiError as exc:
        LOG.error("%s", exc)
        return 2
    except OSError as exc:
        LOG.error("HAProxy's runtime API at %s: %s", args.socket, exc)
        return 2
    except (BotoCoreError, ClientError) as exc:  # raised before any command: HAProxy unchanged
        LOG.error("listing the instances failed, HAProxy left as it is: %s", exc)
        return 2
    return 3 if result.unplaced else 0


if __name__ == "__main__":
    sys.exit(main())
