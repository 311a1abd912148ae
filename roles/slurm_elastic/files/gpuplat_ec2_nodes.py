#!/usr/bin/env python3
"""Elastic Slurm training pools on EC2: the programs of Slurm power saving.

Every node name of a pool (``<pool>-<i>``) is defined in slurm.conf. Slurm runs:

  resume HOSTLIST       (ResumeProgram) reuse or launch one instance per node name from the pool's
                        launch template, tag it, and tell Slurm its address. Names that got no
                        instance are set POWER_DOWN_FORCE with the AWS error code in the reason, so
                        their jobs go back to the queue and the names are free again.
  suspend HOSTLIST      (SuspendProgram) terminate the instances of those node names.
  resume-fail HOSTLIST  (ResumeFailProgram) the same, for nodes that did not register in time.

and from systemd:

  keep-static           power up the pools' static nodes that Slurm has powered down.
  spot-watch            on a spot instance: on an interruption notice, drain this node, signal its
                        jobs (TERM, so they checkpoint), wait a grace period, then POWER_DOWN_FORCE
                        it so Slurm requeues the jobs and the name gets a new instance.

Instances carry the tags gpuplat:stack, gpuplat:pool, gpuplat:node and Name. The configuration
is a JSON file (``--config``, default /etc/gpuplat/ec2-nodes.json)::

  {"stack": "prod", "region": "us-east-1", "scontrol": "/usr/bin/scontrol",
   "pools": {"train": {"launch_template_id": "lt-...", "subnet_id": "subnet-..." | null,
                       "static_nodes": ["train-0"]}}}

spot-watch reads no configuration file. The EC2 endpoint is boto3's (AWS_ENDPOINT_URL is honoured)
unless ``--endpoint-url`` is given.

Exit codes:
  0  done (suspend of names without instances included)
  1  partly failed: a node got no instance, an EC2 call or an scontrol/scancel command failed
  2  usage error: bad arguments, unreadable or malformed configuration, malformed hostlist
  3  a node name belongs to no configured pool (the other names were handled)
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.handlers
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNKNOWN_NODE = 3

DEFAULT_CONFIG = "/etc/gpuplat/ec2-nodes.json"
DEFAULT_IMDS_URL = "http://169.254.169.254"
TAG_STACK = "gpuplat:stack"
TAG_POOL = "gpuplat:pool"
TAG_NODE = "gpuplat:node"
LIVE_STATES = ("pending", "running")
TERMINABLE_STATES = ("pending", "running", "stopping", "stopped")
# EC2 accepts at most 200 values per describe filter.
FILTER_VALUES_MAX = 200
COMMAND_TIMEOUT_S = 60
ADDRESS_WAIT_S = 60
ADDRESS_POLL_S = 2
IMDS_TIMEOUT_S = 2
IMDS_TOKEN_TTL_S = 60

LOG = logging.getLogger("gpuplat-ec2-nodes")


class UsageError(Exception):
    """Bad arguments, configuration or hostlist (exit 2)."""


@dataclass(frozen=True)
class Pool:
    name: str
    launch_template_id: str
    subnet_id: str | None
    static_nodes: tuple[str, ...]


@dataclass(frozen=True)
class Settings:
    stack: str
    region: str
    scontrol: str
    pools: dict[str, Pool]


def load_settings(path: Path) -> Settings:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read configuration {path}: {err}") from err
    try:
        pools = {name: parse_pool(name, entry) for name, entry in raw["pools"].items()}
        return Settings(
            stack=str(raw["stack"]),
            region=str(raw["region"]),
            scontrol=str(raw.get("scontrol") or "/usr/bin/scontrol"),
            pools=pools,
        )
    except (KeyError, TypeError, AttributeError) as err:
        raise UsageError(f"configuration {path}: missing or malformed entry {err}") from err


def parse_pool(name: str, entry: dict[str, Any]) -> Pool:
    return Pool(
        name=name,
        launch_template_id=str(entry["launch_template_id"]),
        subnet_id=entry.get("subnet_id") or None,
        static_nodes=tuple(str(node) for node in entry.get("static_nodes") or ()),
    )


# --- Slurm hostlists ------------------------------------------------------------------------------

_BRACKET_GROUP = re.compile(r"\[([^\[\]]*)\]")


def expand_hostlist(hostlist: str) -> list[str]:
    """``a-[0-3,5],b-1`` -> a-0 a-1 a-2 a-3 a-5 b-1 (zero padding and several groups kept)."""
    names: dict[str, None] = {}
    for pattern in split_outside_brackets(hostlist):
        names.update(dict.fromkeys(expand_pattern(pattern)))
    if not names:
        raise UsageError(f"empty hostlist {hostlist!r}")
    return list(names)


def split_outside_brackets(hostlist: str) -> list[str]:
    patterns: list[str] = []
    current: list[str] = []
    depth = 0
    for char in hostlist:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise UsageError(f"malformed hostlist {hostlist!r}: unbalanced or nested brackets")
        if char == "," and depth == 0:
            patterns.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise UsageError(f"malformed hostlist {hostlist!r}: unclosed bracket")
    patterns.append("".join(current))
    return [pattern.strip() for pattern in patterns if pattern.strip()]


def expand_pattern(pattern: str) -> list[str]:
    pieces = _BRACKET_GROUP.split(pattern)
    literals, ranges = pieces[0::2], pieces[1::2]
    if any("[" in literal or "]" in literal for literal in literals):
        raise UsageError(f"malformed host pattern {pattern!r}")
    choices = [expand_ranges(spec, pattern) for spec in ranges]
    return [
        literals[0] + "".join(value + literal for value, literal in zip(combo, literals[1:], strict=True))
        for combo in product(*choices)
    ]


def expand_ranges(spec: str, pattern: str) -> list[str]:
    values: list[str] = []
    for item in spec.split(","):
        low, dash, high = item.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise UsageError(f"malformed range {item!r} in {pattern!r}")
        if not dash:
            values.append(low)
            continue
        if int(high) < int(low):
            raise UsageError(f"descending range {item!r} in {pattern!r}")
        values.extend(str(index).zfill(len(low)) for index in range(int(low), int(high) + 1))
    return values


def pool_of(name: str, pools: dict[str, Pool]) -> str | None:
    """The pool of ``<pool>-<int>``; the index has no dash, so this is the longest-prefix match."""
    prefix, dash, index = name.rpartition("-")
    return prefix if dash and index.isdigit() and prefix in pools else None


def group_by_pool(names: Iterable[str], pools: dict[str, Pool]) -> tuple[dict[str, list[str]], list[str]]:
    groups: dict[str, list[str]] = {}
    unknown: list[str] = []
    for name in names:
        pool = pool_of(name, pools)
        if pool is None:
            unknown.append(name)
        else:
            groups.setdefault(pool, []).append(name)
    return groups, unknown


def report_unknown(names: list[str], pools: dict[str, Pool], action: str) -> int:
    if not names:
        return EXIT_OK
    LOG.error(
        "%s: %s belong to no configured pool (pools: %s); names are <pool>-<index>",
        action,
        ",".join(names),
        ",".join(sorted(pools)) or "none",
    )
    return EXIT_UNKNOWN_NODE


# --- Slurm commands -------------------------------------------------------------------------------


def run_command(argv: Sequence[str]) -> str | None:
    """stdout of the command, or None (logged) when it could not run or failed."""
    try:
        result = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        LOG.error("%s: %s", " ".join(argv), err)
        return None
    if result.returncode != 0:
        LOG.error("%s failed (exit %d): %s", " ".join(argv), result.returncode, result.stderr.strip())
        return None
    return result.stdout


class Slurm:
    def __init__(self, scontrol: str) -> None:
        self.scontrol = scontrol

    def update(self, names: Sequence[str], *settings: str) -> bool:
        argv = [self.scontrol, "update", f"nodename={','.join(names)}", *settings]
        ok = run_command(argv) is not None
        if ok:
            LOG.info("scontrol update nodename=%s %s", ",".join(names), " ".join(settings))
        return ok

    def set_address(self, name: str, address: str) -> bool:
        return self.update([name], f"nodeaddr={address}", f"nodehostname={name}")

    def power_down_force(self, names: Sequence[str], reason: str) -> bool:
        return self.update(names, "state=power_down_force", f"reason={reason}")

    def power_up(self, names: Sequence[str]) -> bool:
        return self.update(names, "state=power_up")

    def drain(self, name: str, reason: str) -> bool:
        return self.update([name], "state=drain", f"reason={reason}")

    def show_nodes(self) -> str | None:
        return run_command([self.scontrol, "-o", "show", "node"])

    def signal_jobs(self, name: str, signal: str) -> bool:
        scancel = str(Path(self.scontrol).with_name("scancel"))
        argv = [scancel, f"--signal={signal}", "--full", f"--nodelist={name}"]
        ok = run_command(argv) is not None
        if ok:
            LOG.info("signalled the jobs on %s with %s", name, signal)
        return ok


# --- EC2 ------------------------------------------------------------------------------------------


def error_code(err: Exception) -> str:
    if isinstance(err, ClientError):
        return str(err.response.get("Error", {}).get("Code", "ClientError"))
    return type(err).__name__


def chunks(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def tag_value(instance: dict[str, Any], key: str) -> str | None:
    return next((tag["Value"] for tag in instance.get("Tags", []) if tag["Key"] == key), None)


class Ec2Nodes:
    def __init__(self, client: Any, stack: str) -> None:
        self.client = client
        self.stack = stack

    def instances_of(self, names: Sequence[str], states: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """Instances of this stack tagged with the node names, by name."""
        found: dict[str, list[dict[str, Any]]] = {}
        paginator = self.client.get_paginator("describe_instances")
        for batch in chunks(names, FILTER_VALUES_MAX):
            filters = [
                {"Name": f"tag:{TAG_STACK}", "Values": [self.stack]},
                {"Name": f"tag:{TAG_NODE}", "Values": batch},
                {"Name": "instance-state-name", "Values": list(states)},
            ]
            for page in paginator.paginate(Filters=filters):
                for reservation in page["Reservations"]:
                    for instance in reservation["Instances"]:
                        found.setdefault(str(tag_value(instance, TAG_NODE)), []).append(instance)
        return found

    def launch(self, pool: Pool, names: Sequence[str]) -> tuple[dict[str, dict[str, Any]], str | None]:
        """Launch one instance per name; the instances by name and the error code of those missing.

        After a partial launch (EC2 may start fewer than MaxCount) the rest is asked for again, which
        either starts more (each round at least one, so this ends) or fails with EC2's error code.
        """
        launched: dict[str, dict[str, Any]] = {}
        remaining = list(names)
        while remaining:
            try:
                response = self.client.run_instances(**self.launch_request(pool, len(remaining)))
            except (ClientError, BotoCoreError) as err:
                LOG.error(
                    "resume: pool %s: run_instances for %s failed: %s", pool.name, ",".join(remaining), err
                )
                return launched, error_code(err)
            instances = response["Instances"]
            if not instances:
                return launched, "NoInstanceStarted"
            if len(instances) < len(remaining):
                LOG.warning(
                    "resume: pool %s: EC2 started %d of %d instances",
                    pool.name,
                    len(instances),
                    len(remaining),
                )
            batch, remaining = remaining[: len(instances)], remaining[len(instances) :]
            for name, instance in zip(batch, instances, strict=True):
                if self.tag_node(name, instance):
                    launched[name] = instance
        return launched, None if len(launched) == len(names) else "TaggingFailed"

    def launch_request(self, pool: Pool, count: int) -> dict[str, Any]:
        tags = [{"Key": TAG_STACK, "Value": self.stack}, {"Key": TAG_POOL, "Value": pool.name}]
        request: dict[str, Any] = {
            "LaunchTemplate": {"LaunchTemplateId": pool.launch_template_id, "Version": "$Latest"},
            "MinCount": 1,
            "MaxCount": count,
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        }
        if pool.subnet_id:
            request["SubnetId"] = pool.subnet_id
        return request

    def tag_node(self, name: str, instance: dict[str, Any]) -> bool:
        """Tag a new instance with its node name; an instance that cannot be tagged is terminated."""
        instance_id = instance["InstanceId"]
        tags = [{"Key": TAG_NODE, "Value": name}, {"Key": "Name", "Value": f"{self.stack}-{name}"}]
        try:
            self.client.create_tags(Resources=[instance_id], Tags=tags)
        except (ClientError, BotoCoreError) as err:
            LOG.error("resume: cannot tag %s as %s (%s); terminating it", instance_id, name, err)
            try:
                self.terminate([instance_id])
            except (ClientError, BotoCoreError) as terminate_err:
                LOG.error("resume: cannot terminate the untagged %s: %s", instance_id, terminate_err)
            return False
        LOG.info("resume: launched %s for %s", instance_id, name)
        return True

    def private_addresses(self, instances: dict[str, dict[str, Any]]) -> dict[str, str]:
        """Private IPv4 address by node name, polling (bounded) for instances that have none yet."""
        addresses = {
            name: i["PrivateIpAddress"] for name, i in instances.items() if i.get("PrivateIpAddress")
        }
        deadline = time.monotonic() + ADDRESS_WAIT_S
        while len(addresses) < len(instances) and time.monotonic() < deadline:
            time.sleep(ADDRESS_POLL_S)
            waiting = {instances[name]["InstanceId"]: name for name in instances if name not in addresses}
            response = self.client.describe_instances(InstanceIds=list(waiting))
            for reservation in response["Reservations"]:
                for instance in reservation["Instances"]:
                    if instance.get("PrivateIpAddress"):
                        addresses[waiting[instance["InstanceId"]]] = instance["PrivateIpAddress"]
        return addresses

    def terminate(self, instance_ids: Sequence[str]) -> None:
        self.client.terminate_instances(InstanceIds=list(instance_ids))


def ec2_client(region: str, endpoint_url: str | None) -> Any:
    config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 5, "mode": "standard"})
    return boto3.client("ec2", region_name=region, endpoint_url=endpoint_url, config=config)


# --- resume, suspend, resume-fail -----------------------------------------------------------------


def resume(settings: Settings, ec2: Ec2Nodes, slurm: Slurm, names: list[str]) -> int:
    groups, unknown = group_by_pool(names, settings.pools)
    known = [name for pool_names in groups.values() for name in pool_names]
    if not known:
        return report_unknown(unknown, settings.pools, "resume")
    try:
        existing = {name: found[0] for name, found in ec2.instances_of(known, LIVE_STATES).items()}
    except (ClientError, BotoCoreError) as err:
        LOG.error("resume: cannot look up the instances of %s: %s", ",".join(known), err)
        slurm.power_down_force(known, f"gpuplat resume failed: {error_code(err)}")
        return EXIT_FAILED
    for name, instance in existing.items():
        LOG.info("resume: %s already has instance %s, reusing it", name, instance["InstanceId"])
    started, failed = dict(existing), {}
    for pool_name, pool_names in groups.items():
        missing = [name for name in pool_names if name not in existing]
        if missing:
            launched, code = ec2.launch(settings.pools[pool_name], missing)
            started.update(launched)
            failed.update({name: code or "Unknown" for name in missing if name not in launched})
    ok = announce_addresses(ec2, slurm, started)
    ok = release_failed(slurm, failed) and ok
    return report_unknown(unknown, settings.pools, "resume") or (
        EXIT_OK if ok and not failed else EXIT_FAILED
    )


def announce_addresses(ec2: Ec2Nodes, slurm: Slurm, instances: dict[str, dict[str, Any]]) -> bool:
    try:
        addresses = ec2.private_addresses(instances)
    except (ClientError, BotoCoreError) as err:
        LOG.error("resume: cannot read the addresses of %s: %s", ",".join(instances), err)
        return False
    for name in sorted(set(instances) - set(addresses)):
        LOG.error(
            "resume: %s (%s) has no private address after %d s",
            name,
            instances[name]["InstanceId"],
            ADDRESS_WAIT_S,
        )
    results = [slurm.set_address(name, address) for name, address in sorted(addresses.items())]
    return all(results) and len(addresses) == len(instances)


def release_failed(slurm: Slurm, failed: dict[str, str]) -> bool:
    """POWER_DOWN_FORCE names that got no instance, one call per AWS error code."""
    by_code: dict[str, list[str]] = {}
    for name, code in failed.items():
        by_code.setdefault(code, []).append(name)
    results = []
    for code, names in by_code.items():
        LOG.error(
            "resume: no instance for %s (%s); powering them down so their jobs requeue", ",".join(names), code
        )
        results.append(slurm.power_down_force(names, f"gpuplat resume failed: {code}"))
    return all(results)


def terminate_nodes(settings: Settings, ec2: Ec2Nodes, names: list[str], action: str) -> int:
    groups, unknown = group_by_pool(names, settings.pools)
    known = [name for pool_names in groups.values() for name in pool_names]
    status = report_unknown(unknown, settings.pools, action)
    if not known:
        return status
    try:
        found = ec2.instances_of(known, TERMINABLE_STATES)
        instance_ids = [instance["InstanceId"] for instances in found.values() for instance in instances]
        if instance_ids:
            ec2.terminate(instance_ids)
    except (ClientError, BotoCoreError) as err:
        LOG.error("%s: cannot terminate the instances of %s: %s", action, ",".join(known), err)
        return EXIT_FAILED
    for name in known:
        ids = ",".join(instance["InstanceId"] for instance in found.get(name, [])) or "no instance"
        LOG.info("%s: %s: terminated %s", action, name, ids)
    return status


# --- keep-static ----------------------------------------------------------------------------------

_NODE_NAME = re.compile(r"(?:^|\s)NodeName=(\S+)")
_NODE_STATE = re.compile(r"(?:^|\s)State=(\S+)")
# POWER_UP / POWER_DOWN: requested, not yet started by slurmctld's power thread.
_BUSY_POWER_FLAGS = {"POWER_UP", "POWERING_UP", "POWER_DOWN", "POWERING_DOWN", "DRAIN"}


def parse_node_states(text: str) -> dict[str, set[str]]:
    """State flags by node name from ``scontrol -o show node`` (one node per line)."""
    states: dict[str, set[str]] = {}
    for line in text.splitlines():
        name, state = _NODE_NAME.search(line), _NODE_STATE.search(line)
        if name and state:
            states[name.group(1)] = set(state.group(1).split("+"))
    return states


def needs_power_up(flags: set[str]) -> bool:
    """Powered down and not on its way up or down; drained nodes are left to the administrator."""
    return "POWERED_DOWN" in flags and not flags & _BUSY_POWER_FLAGS


def keep_static(settings: Settings, slurm: Slurm) -> int:
    static = [name for pool in settings.pools.values() for name in pool.static_nodes]
    if not static:
        return EXIT_OK
    output = slurm.show_nodes()
    if output is None:
        return EXIT_FAILED
    states = parse_node_states(output)
    undefined = [name for name in static if name not in states]
    for name in undefined:
        LOG.error("keep-static: static node %s is not defined in Slurm", name)
    for name in (name for name in static if "DRAIN" in states.get(name, set())):
        LOG.warning("keep-static: static node %s is drained; leaving it as it is", name)
    to_power_up = [name for name in static if needs_power_up(states.get(name, set()))]
    if to_power_up:
        LOG.info("keep-static: powering up %s", ",".join(to_power_up))
    powered = slurm.power_up(to_power_up) if to_power_up else True
    return EXIT_OK if powered and not undefined else EXIT_FAILED


# --- spot-watch -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpotWatch:
    node: str
    imds_url: str
    grace_s: float
    interval_s: float


def imds_get(base_url: str, path: str) -> str:
    """GET an IMDSv2 path (token first); urllib errors propagate, HTTPError 404 included."""
    token_request = urllib.request.Request(
        f"{base_url.rstrip('/')}/latest/api/token",
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_S)},
    )
    with urllib.request.urlopen(token_request, timeout=IMDS_TIMEOUT_S) as response:
        token = response.read().decode()
    request = urllib.request.Request(
        f"{base_url.rstrip('/')}{path}", headers={"X-aws-ec2-metadata-token": token}
    )
    with urllib.request.urlopen(request, timeout=IMDS_TIMEOUT_S) as response:
        return str(response.read().decode())


def spot_notice(base_url: str) -> dict[str, Any] | None:
    """The instance-action notice, or None when there is none (404)."""
    try:
        body = imds_get(base_url, "/latest/meta-data/spot/instance-action")
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise
    try:
        notice = json.loads(body)
    except ValueError:
        LOG.warning("spot-watch: unreadable instance-action %r; treating it as a notice", body)
        return {"action": "unknown", "time": "unknown"}
    return notice if isinstance(notice, dict) else {"action": "unknown", "time": "unknown"}


def handle_spot_notice(
    watch: SpotWatch, slurm: Slurm, notice: dict[str, Any], sleep: Callable[[float], None]
) -> int:
    reason = f"spot interruption {notice.get('time', 'unknown')}"
    LOG.warning("spot-watch: %s: %s (%s)", watch.node, reason, notice.get("action", "unknown"))
    drained = slurm.drain(watch.node, reason)
    signalled = slurm.signal_jobs(watch.node, "TERM")
    LOG.info("spot-watch: %s: waiting %.0f s for the jobs to checkpoint", watch.node, watch.grace_s)
    sleep(watch.grace_s)
    powered_down = slurm.power_down_force([watch.node], reason)
    return EXIT_OK if drained and signalled and powered_down else EXIT_FAILED


def spot_watch(watch: SpotWatch, slurm: Slurm, sleep: Callable[[float], None] = time.sleep) -> int:
    """Poll until an interruption notice arrives, handle it, and return."""
    LOG.info("spot-watch: watching %s for node %s every %.0f s", watch.imds_url, watch.node, watch.interval_s)
    while True:
        try:
            notice = spot_notice(watch.imds_url)
        except (urllib.error.URLError, OSError) as err:
            LOG.warning("spot-watch: instance metadata unreachable: %s", err)
            notice = None
        if notice is not None:
            return handle_spot_notice(watch, slurm, notice, sleep)
        sleep(watch.interval_s)


# --- command line ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpuplat-ec2-nodes", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path(DEFAULT_CONFIG))
    parser.add_argument("--endpoint-url", help="EC2 endpoint (default: boto3's, AWS_ENDPOINT_URL honoured)")
    parser.add_argument("--log-file", help="also append the log to this file")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("resume", "suspend", "resume-fail"):
        sub = commands.add_parser(name)
        sub.add_argument("hostlist", nargs="+", help="Slurm hostlist, e.g. train-[0-3,5]")
    commands.add_parser("keep-static")
    spot = commands.add_parser("spot-watch")
    spot.add_argument("--node-name", default=socket.gethostname().split(".")[0])
    spot.add_argument("--imds-url", default=DEFAULT_IMDS_URL)
    spot.add_argument("--grace-seconds", type=float, default=90.0)
    spot.add_argument("--interval-seconds", type=float, default=5.0)
    spot.add_argument("--scontrol", default="/usr/bin/scontrol")
    return parser.parse_args(argv)


def configure_logging(log_file: str | None) -> None:
    LOG.setLevel(logging.INFO)
    LOG.propagate = False
    for handler in list(LOG.handlers):
        LOG.removeHandler(handler)
        handler.close()
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter("%(asctime)s gpuplat-ec2-nodes %(levelname)s %(message)s"))
    LOG.addHandler(stderr)
    if Path("/dev/log").exists():
        try:
            syslog = logging.handlers.SysLogHandler(address="/dev/log")
        except OSError:
            pass
        else:
            syslog.setFormatter(logging.Formatter("gpuplat-ec2-nodes: %(levelname)s %(message)s"))
            LOG.addHandler(syslog)
    if log_file:
        try:
            file_handler = logging.FileHandler(log_file)
        except OSError as err:
            LOG.warning("cannot write the log file %s: %s", log_file, err)
        else:
            file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            LOG.addHandler(file_handler)


def run(args: argparse.Namespace) -> int:
    if args.command == "spot-watch":
        watch = SpotWatch(args.node_name, args.imds_url, args.grace_seconds, args.interval_seconds)
        return spot_watch(watch, Slurm(args.scontrol))
    settings = load_settings(args.config)
    slurm = Slurm(settings.scontrol)
    if args.command == "keep-static":
        return keep_static(settings, slurm)
    names = expand_hostlist(",".join(args.hostlist))
    ec2 = Ec2Nodes(ec2_client(settings.region, args.endpoint_url), settings.stack)
    if args.command == "resume":
        return resume(settings, ec2, slurm, names)
    if args.command == "resume-fail":
        LOG.warning("resume-fail: %s did not register in time; terminating their instances", ",".join(names))
    return terminate_nodes(settings, ec2, names, args.command)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(args.log_file)
    try:
        return run(args)
    except UsageError as err:
        LOG.error("%s", err)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
