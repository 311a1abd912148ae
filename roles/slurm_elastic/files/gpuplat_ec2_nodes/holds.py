"""A pool's holds, ParallelCluster's protections against launching again what cannot start
(aws-parallelcluster-node v3.11.0, src/slurm_plugin/clustermgtd.py):

- capacity cool-down: a launch EC2 refused for capacity (CAPACITY_ERROR_CODES) holds the pool for
  insufficient_capacity_timeout_s (600 s; clustermgtd.py:166 DEFAULTS insufficient_capacity_timeout,
  :1277 _set_ice_compute_resources_to_down, :1310 _reset_insufficient_capacity_timeout_expired_nodes);
- protected mode: protected_failure_count (10) boot failures of the pool (resume-fail: no registration
  within ResumeTimeout; reconcile: a node powering up whose instance ended, a refused registration;
  replacement.py) with no node of the pool coming up in between hold it until an operator runs
  ``unprotect POOL`` (clustermgtd.py:165 DEFAULTS protected_failure_count, :1019
  _handle_protected_mode_process, :488 _handle_successfully_launched_nodes resets the count, :976
  _enter_protected_mode; `pcluster update-compute-fleet --status START_REQUESTED` is the way out there).

A held pool's dynamic names that are powered down and idle are set DOWN with the hold as reason, as
ParallelCluster does to an ICE compute resource's powered-down nodes: Slurm allocates none of them, so
a job that may also run on another pool (a shared partition's GPU-type alternatives, a job submitted to
several partitions) starts there and the others stay pending. When the hold ends, they are set
POWER_DOWN_FORCE (back to idle~, package docstring), as clustermgtd does with set_nodes_power_down.
A resume for a held pool launches nothing. Static nodes are keep-static's (its own back-off), as
clustermgtd leaves static nodes out of the ICE handling (:787).

The holds live in <state_dir>/pools.json, changed under a lock (resumes run concurrently).
"""

from __future__ import annotations

import calendar
import json
import re
import time
from pathlib import Path
from typing import Any

from .exit_codes import EXIT_FAILED, EXIT_OK, UsageError
from .logs import LOG
from .settings import Settings, pool_of
from .slurm import GOING_UP, HELD, POWERED_OFF, NodeInfo, Slurm
from .state import number, read_state, update_state

# EC2 error codes that mean no capacity now, not a fault of the request (aws-parallelcluster-node
# v3.11.0, src/slurm_plugin/slurm_resources.py:219 SlurmNode.EC2_ICE_ERROR_CODES).
CAPACITY_ERROR_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "MaxSpotInstanceCountExceeded",
        "Unsupported",
        "SpotMaxPriceTooLow",
    }
)
POOL_HELD = "PoolHeld"
REASON_COOLDOWN = "gpuplat capacity cool-down"
REASON_PROTECTED = "gpuplat protected mode"
REASON_HOLD_OVER = "gpuplat hold over: back to power saving"
# A node is up (booted and registered) when none of these is among its flags.
NOT_UP = frozenset({"DOWN", "NOT_RESPONDING", "POWER_DOWN", *POWERED_OFF, *GOING_UP, *HELD})
UP_BASES = frozenset({"IDLE", "ALLOCATED", "MIXED", "COMPLETING"})
_UNTIL = re.compile(r" until (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")


def state_path(settings: Settings) -> Path:
    return settings.state_dir / "pools.json"


def section(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        value = data[key] = {}
    return value


def utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def hold_reason(data: dict[str, Any], pool: str, now: float) -> str | None:
    """Why the pool is held at `now` (the Slurm reason of its held names), or None."""
    protected = section(data, "protected").get(pool)
    if isinstance(protected, dict):
        failures = int(number(protected.get("failures"), 0))
        return f"{REASON_PROTECTED}: {failures} boot failures in a row; gpuplat-ec2-nodes unprotect {pool}"
    cooldown = section(data, "cooldown").get(pool)
    if isinstance(cooldown, dict) and number(cooldown.get("until"), 0) > now:
        return f"{REASON_COOLDOWN}: {cooldown.get('code')} until {utc(number(cooldown.get('until'), 0))}"
    return None


def read_holds(settings: Settings) -> dict[str, Any]:
    return read_state(state_path(settings))


def record_capacity_error(settings: Settings, pool: str, code: str, now: float) -> bool:
    """Hold the pool for the capacity cool-down (0 s: no cool-down); whether it is held."""
    timeout = settings.insufficient_capacity_timeout_s
    if timeout <= 0:
        return False

    def change(data: dict[str, Any]) -> None:
        section(data, "cooldown")[pool] = {"code": code, "since": now, "until": now + timeout}

    update_state(state_path(settings), change)
    LOG.warning(
        "pool %s: %s: capacity cool-down until %s (%.0f s): no launch, its powered-down names DOWN, so "
        "jobs that may run on another pool go there",
        pool,
        code,
        utc(now + timeout),
        timeout,
    )
    return True


def record_boot_failures(settings: Settings, failures: dict[str, int], now: float) -> list[str]:
    """Count boot failures per pool; the pools this puts in protected mode (logged)."""
    threshold = settings.protected_failure_count
    if threshold <= 0:
        return []

    def change(data: dict[str, Any]) -> list[str]:
        counts, protected = section(data, "boot_failures"), section(data, "protected")
        newly = []
        for pool, count in sorted(failures.items()):
            counts[pool] = int(number(counts.get(pool), 0)) + count
            if counts[pool] >= threshold and pool not in protected:
                protected[pool] = {"since": now, "failures": counts[pool]}
                newly.append(pool)
        return newly

    newly, _ = update_state(state_path(settings), change)
    for pool in newly:
        LOG.error(
            "pool %s: %d boot failures in a row (no node of it came up in between): protected mode, no "
            "launch until `gpuplat-ec2-nodes unprotect %s` once the cause (image, bundle, boot log "
            "/var/log/gpuplat-bootstrap.log) is fixed",
            pool,
            threshold,
            pool,
        )
    return newly


def note_nodes_up(settings: Settings, nodes: dict[str, NodeInfo], now: float) -> bool:
    """Reset a pool's boot-failure count when one of its nodes comes up (up now, not in the previous
    round); forget expired cool-downs. Whether the state was written."""

    def change(data: dict[str, Any]) -> None:
        before, counts = section(data, "online"), section(data, "boot_failures")
        online: dict[str, list[str]] = {}
        for name, node in nodes.items():
            pool = pool_of(name, settings.pools)
            if pool and node.flags & UP_BASES and not node.flags & NOT_UP:
                online.setdefault(pool, []).append(name)
        for pool, names in sorted(online.items()):
            seen = before.get(pool)
            came_up = sorted(set(names) - set(seen if isinstance(seen, list) else []))
            if came_up and counts.pop(pool, None):
                LOG.info("pool %s: %s came up; its boot-failure count starts again", pool, ",".join(came_up))
        data["online"] = {pool: sorted(names) for pool, names in online.items()}
        cooldown = section(data, "cooldown")
        over = [p for p, e in cooldown.items() if not isinstance(e, dict) or number(e.get("until"), 0) <= now]
        for pool in over:
            LOG.info("pool %s: capacity cool-down over", pool)
            del cooldown[pool]

    return update_state(state_path(settings), change)[1]


def idle_powered_down(node: NodeInfo) -> bool:
    """IDLE+CLOUD+POWERED_DOWN (POWER_DOWN too, a Slurm quirk): ParallelCluster's is_power()
    (slurm_resources.py:209 SLURM_SCONTROL_POWER_STATES); PLANNED too (22.05+: the backfill scheduler
    plans a pending job on it, which is what the hold is to stop)."""
    return node.flags - {"CLOUD", "POWER_DOWN", "PLANNED"} == {"IDLE", "POWERED_DOWN"}


def held_by_us(node: NodeInfo) -> bool:
    return "DOWN" in node.flags and node.reason.startswith((REASON_COOLDOWN, REASON_PROTECTED))


def cooldown_over(reason: str, now: float) -> bool:
    """A cool-down reason whose end (its `until` time) has come; an unreadable one counts as over."""
    match = _UNTIL.search(reason)
    return match is None or calendar.timegm(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%SZ")) <= now


def slurm_holds(settings: Settings, nodes: dict[str, NodeInfo], now: float) -> dict[str, str]:
    """The holds Slurm's node reasons show, by pool (a protected mode before a cool-down). With two
    controllers each keeps its own state file, but both see these: neither ends the other's hold."""
    holds: dict[str, str] = {}
    for name, node in sorted(nodes.items()):
        pool = pool_of(name, settings.pools)
        reason = node.reason.split(" [", 1)[0]  # scontrol appends " [user@time]"
        if pool is None or not held_by_us(node) or holds.get(pool, "").startswith(REASON_PROTECTED):
            continue
        if reason.startswith(REASON_PROTECTED) or not cooldown_over(reason, now):
            holds[pool] = reason
    return holds


def apply_holds(settings: Settings, slurm: Slurm, nodes: dict[str, NodeInfo], now: float) -> bool:
    """Set the held pools' idle powered-down dynamic names DOWN (a pool's hold: this controller's state,
    else what Slurm's reasons show); return to power saving the names of a pool no longer held whose
    reason is a cool-down. A protected name is released by `unprotect` only. Whether every Slurm
    update worked."""
    data = read_holds(settings)
    shown = slurm_holds(settings, nodes, now)
    static = set(settings.static_nodes)
    hold: dict[str, list[str]] = {}
    release: list[str] = []
    for name, node in sorted(nodes.items()):
        pool = pool_of(name, settings.pools)
        if pool is None or name in static:
            continue
        reason = hold_reason(data, pool, now) or shown.get(pool)
        if reason and idle_powered_down(node):
            hold.setdefault(reason, []).append(name)
        elif reason is None and held_by_us(node) and node.reason.startswith(REASON_COOLDOWN):
            release.append(name)
    return hold_and_release(slurm, hold, release)


def hold_and_release(slurm: Slurm, hold: dict[str, list[str]], release: list[str]) -> bool:
    results = []
    for reason, names in sorted(hold.items()):
        LOG.warning("holding %s DOWN: %s", ",".join(names), reason)
        results.append(slurm.set_down(names, reason))
    if release:
        LOG.info("hold over: %s back to power saving (POWER_DOWN_FORCE)", ",".join(release))
        results.append(slurm.power_down_force(release, REASON_HOLD_OVER))
    return all(results)


def hold_powering_down(settings: Settings, slurm: Slurm, names: list[str], now: float) -> bool:
    """SuspendProgram's part of a hold: set DOWN, with the hold as reason, the names of a held pool
    that slurmctld is powering down (a failed resume's POWER_DOWN_FORCE, an idle suspend). slurmctld
    has just made each IDLE (idle_on_node_suspend clears DOWN, DRAIN and FAIL when a suspend starts:
    power_save.c slurm-21-08-8-2 :509, slurm-22-05-8-1 :510, slurm-24-11-7-1 :627), so a hold set
    before that, by resume, is lost and the name is allocatable again after SuspendTimeout: the
    requeued job took its held pool's name again until reconcile's next round (box scenario k). DOWN
    set now keeps the POWERING_DOWN flag (node_mgr.c _make_node_down keeps the flags) and the end of
    the power-down makes the name available only if it is not DOWN (power_save.c slurm-21-08-8-2
    :542, slurm-22-05-8-1 :537, slurm-24-11-7-1 :654): it ends down~, as apply_holds leaves the other
    names, released the same way. ParallelCluster sets a failed resume's nodes DOWN at once
    (aws-parallelcluster-node v3.11.0, src/slurm_plugin/resume.py:143 _handle_failed_nodes). Static
    names are keep-static's. A pool's hold is this controller's state, else what Slurm's reasons show
    (the other controller's, as apply_holds reads them; Slurm asked only when the state holds none of
    the pools). Whether every Slurm update worked."""
    data = read_holds(settings)
    static = set(settings.static_nodes)
    pools = {name: pool_of(name, settings.pools) for name in sorted(names) if name not in static}
    own = {pool: hold_reason(data, pool, now) for pool in set(pools.values()) if pool}
    shown: dict[str, str] = {}
    if pools and not all(own.values()):
        nodes = slurm.nodes()
        shown = slurm_holds(settings, nodes, now) if nodes is not None else {}
    hold: dict[str, list[str]] = {}
    for name, pool in pools.items():
        reason = (own.get(pool) or shown.get(pool)) if pool else None
        if reason:
            hold.setdefault(reason, []).append(name)
    return hold_and_release(slurm, hold, [])


def unprotect(settings: Settings, slurm: Slurm, pool: str) -> int:
    """End a pool's protected mode and its boot-failure count; release its held names."""
    if pool not in settings.pools:
        raise UsageError(
            f"unprotect: {pool!r} is not a configured pool (pools: {','.join(sorted(settings.pools))}); "
            "`gpuplat-ec2-nodes pools` lists each pool's holds"
        )

    def change(data: dict[str, Any]) -> bool:
        was = section(data, "protected").pop(pool, None) is not None
        section(data, "boot_failures").pop(pool, None)
        return was

    was, saved = update_state(state_path(settings), change)
    LOG.warning(
        "unprotect: pool %s %s on this controller (with two controllers, run it on each: each keeps "
        "its own count)",
        pool,
        "leaves protected mode" if was else "was not protected",
    )
    nodes = slurm.nodes()
    if not saved or nodes is None:
        return EXIT_FAILED
    held = sorted(
        name
        for name, node in nodes.items()
        if pool_of(name, settings.pools) == pool
        and held_by_us(node)
        and node.reason.startswith(REASON_PROTECTED)
    )
    return EXIT_OK if hold_and_release(slurm, {}, held) else EXIT_FAILED


def pools_report(settings: Settings, now: float | None = None) -> str:
    """Each configured pool's hold (null when none) and boot-failure count, as JSON."""
    data = read_holds(settings)
    now = time.time() if now is None else now
    counts = section(data, "boot_failures")
    report = {
        pool: {
            "hold": hold_reason(data, pool, now),
            "boot_failures": int(number(counts.get(pool), 0)),
            "protected_failure_count": settings.protected_failure_count,
        }
        for pool in sorted(settings.pools)
    }
    return json.dumps(report, indent=1, sort_keys=True)
