"""resume (Slurm's ResumeProgram) and resume-fail (ResumeFailProgram)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .ec2 import (
    ADDRESS_WAIT_S,
    TERMINABLE_STATES,
    Ec2Nodes,
    ErrorTypes,
    describe_label,
    error_code,
    terminate_named,
)
from .exit_codes import EXIT_FAILED, EXIT_OK
from .holds import (
    CAPACITY_ERROR_CODES,
    POOL_HELD,
    apply_holds,
    hold_reason,
    read_holds,
    record_boot_failures,
    record_capacity_error,
)
from .logs import LOG
from .resume_file import ResumeJob
from .settings import Settings, group_by_pool, report_unknown
from .slurm import Slurm

REASON_RESUME_FAIL = "gpuplat resume-fail: no registration within ResumeTimeout"
REASON_FLEET_STOPPED = "gpuplat fleet stopped: gpuplat down is tearing the stack down"


def resume(
    settings: Settings,
    ec2: Ec2Nodes,
    slurm: Slurm,
    names: list[str],
    now: float | None = None,
    jobs: list[ResumeJob] | None = None,
) -> int:
    """Launch a new instance for every name; names of a held pool get none (holds.py), nor those of a
    stopped fleet (`gpuplat down`: fleet_stopped). The names of
    each job of the resume file (resume_file.py) are launched all or nothing: a job that cannot have
    all its nodes gets none, rather than idle nodes that wait for the rest until SuspendTime.

    An instance a name still has from before is terminated, never reused: slurmctld ignores a
    registration from before the resume request, so a node that booted earlier would wait out
    ResumeTimeout (ParallelCluster's resume always launches: aws-parallelcluster-node v3.11.0,
    src/slurm_plugin/resume.py:172 _resume, which calls instance_manager.py:438 add_instances).
    """
    groups, unknown = group_by_pool(names, settings.pools)
    known = [name for pool_names in groups.values() for name in pool_names]
    if not known:
        return report_unknown(unknown, settings.pools, "resume")
    now = time.time() if now is None else now
    ok = terminate_earlier(ec2, known)
    holds = read_holds(settings)
    stopped = fleet_stopped(settings, ec2, list(groups))
    started: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    cooled = False
    for job_id, by_pool in launch_units(groups, jobs or []):
        launched, missing, codes = launch_unit(settings, ec2, holds, by_pool, job_id, now, stopped)
        started.update(launched)
        failed.update(missing)
        for pool_name, code in codes.items():
            if code in CAPACITY_ERROR_CODES:
                cooled = record_capacity_error(settings, pool_name, code, now) or cooled
    addressed, unaddressed = announce_addresses(ec2, slurm, started)
    failed.update({name: "NoPrivateAddress" for name in unaddressed})
    ok = release_failed(ec2, slurm, failed) and addressed and ok
    if cooled:
        nodes = slurm.nodes()
        ok = nodes is not None and apply_holds(settings, slurm, nodes, now) and ok
    return report_unknown(unknown, settings.pools, "resume") or (
        EXIT_OK if ok and not failed else EXIT_FAILED
    )


def fleet_stopped(settings: Settings, ec2: Ec2Nodes, pools: list[str]) -> dict[str, str]:
    """The pools whose launch template carries the fleet's stop (ec2.py TAG_FLEET), with the reason. When
    EC2 cannot say, none: resume launches, as it does when it cannot look up earlier instances, and IAM
    refuses a launch from a stopped template whatever this program reads (infra/backends/aws/iam.py
    NOT_STOPPED)."""
    templates = {settings.pools[pool].launch_template_id: pool for pool in pools}
    try:
        stopped = ec2.stopped_templates(sorted(templates))
    except ErrorTypes as err:
        LOG.error("resume: cannot read whether the fleet is stopped (%s); launching", error_code(err))
        return {}
    return {
        templates[template]: REASON_FLEET_STOPPED for template in sorted(stopped) if template in templates
    }


def launch_units(
    groups: dict[str, list[str]], jobs: list[ResumeJob]
) -> list[tuple[str | None, dict[str, list[str]]]]:
    """What is launched together: each job's names (by pool), then the names of no job, by pool."""
    pools_of = {name: pool for pool, pool_names in groups.items() for name in pool_names}
    units: list[tuple[str | None, dict[str, list[str]]]] = []
    placed: set[str] = set()
    for job in jobs:
        by_pool: dict[str, list[str]] = {}
        for name in job.names:
            if name in pools_of and name not in placed:
                by_pool.setdefault(pools_of[name], []).append(name)
                placed.add(name)
        if by_pool:
            units.append((job.job_id, by_pool))
    for pool, pool_names in groups.items():
        alone = [name for name in pool_names if name not in placed]
        if alone:  # best effort, each name on its own
            units.append((None, {pool: alone}))
    return units


def launch_unit(
    settings: Settings,
    ec2: Ec2Nodes,
    holds: dict[str, Any],
    by_pool: dict[str, list[str]],
    job_id: str | None,
    now: float,
    stopped: Mapping[str, str] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, str], dict[str, str]]:
    """Launch the names of one unit; the instances by name, the error code of each name without one,
    and each pool's launch error. A job's unit is all or nothing: RunInstances with MinCount as many as
    its names (EC2 starts all or none), and what its other pools got goes again if one pool fails."""
    launched: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    codes: dict[str, str] = {}
    for pool_name, pool_names in by_pool.items():
        held = (stopped or {}).get(pool_name) or hold_reason(holds, pool_name, now)
        if held:
            LOG.warning(
                "resume: pool %s is held (%s): no launch for %s", pool_name, held, ",".join(pool_names)
            )
            failed.update(dict.fromkeys(pool_names, POOL_HELD))
    for pool_name, pool_names in by_pool.items():
        if pool_names[0] in failed:
            continue
        if job_id is not None and failed:  # the job cannot have all its nodes: launch no more of them
            failed.update(dict.fromkeys(pool_names, next(iter(failed.values()))))
            continue
        got, code = ec2.launch(settings.pools[pool_name], pool_names, all_or_nothing=job_id is not None)
        launched.update(got)
        failed.update({name: code or "Unknown" for name in pool_names if name not in got})
        if code:
            codes[pool_name] = code
    if job_id is not None and failed and launched:
        code = next(iter(failed.values()))
        LOG.warning(
            "resume: job %s got %d of its %d nodes (%s); all or nothing: %s go too",
            job_id, len(launched), len(launched) + len(failed), code, ",".join(sorted(launched)),
        )  # fmt: skip
        failed.update(dict.fromkeys(launched, code))
        launched = {}
    return launched, failed, codes


def terminate_earlier(ec2: Ec2Nodes, names: list[str]) -> bool:
    """Terminate the instances the names have from before this resume (logged); whether that worked.
    One left behind is a second instance of its name, which reconcile terminates."""
    try:
        earlier = ec2.instances_of(names, TERMINABLE_STATES)
    except ErrorTypes as err:
        LOG.error("resume: cannot look up the earlier instances of %s: %s", ",".join(names), err)
        return False
    for name, instances in sorted(earlier.items()):
        LOG.warning(
            "resume: %s still has %s from before this resume; terminating it and launching a new one "
            "(Slurm ignores a registration from before the resume request)",
            name,
            ",".join(describe_label(i) for i in instances),
        )
    ids = [i["InstanceId"] for instances in earlier.values() for i in instances]
    return not (ec2.terminate(ids) if ids else [])


def announce_addresses(
    ec2: Ec2Nodes, slurm: Slurm, instances: dict[str, dict[str, Any]]
) -> tuple[bool, list[str]]:
    """Tell Slurm each node's address; whether that worked, and the names whose instance has none."""
    try:
        addresses = ec2.private_addresses(instances)
    except ErrorTypes as err:
        LOG.error("resume: cannot read the addresses of %s: %s", ",".join(instances), err)
        return False, []
    unaddressed = sorted(set(instances) - set(addresses))
    for name in unaddressed:
        LOG.error(
            "resume: %s (%s) has no private address after %.0f s",
            name,
            instances[name]["InstanceId"],
            ADDRESS_WAIT_S,
        )
    results = [slurm.set_address(name, address) for name, address in sorted(addresses.items())]
    return all(results), unaddressed


def release_failed(ec2: Ec2Nodes, slurm: Slurm, failed: dict[str, str]) -> bool:
    """Names without a usable instance: terminate what they got, POWER_DOWN_FORCE them (per error code).

    POWER_DOWN_FORCE requeues their jobs and returns them to power saving (idle~) after
    SuspendTimeout, so the next job that needs them launches them again (the package docstring).
    """
    if not failed:
        return True
    terminated = terminate_named(ec2, sorted(failed), "resume")
    by_code: dict[str, list[str]] = {}
    for name, code in failed.items():
        by_code.setdefault(code, []).append(name)
    results = [terminated]
    for code, names in by_code.items():
        LOG.error(
            "resume: no instance for %s (%s); powering them down so their jobs requeue", ",".join(names), code
        )
        results.append(slurm.power_down_force(names, f"gpuplat resume failed: {code}"))
    return all(results)


def resume_fail(settings: Settings, ec2: Ec2Nodes, slurm: Slurm, names: list[str]) -> int:
    """Slurm set these DOWN+POWERED_DOWN: terminate their instances, then POWER_DOWN_FORCE them.

    DOWN+POWERED_DOWN is never allocated again by itself; POWER_DOWN_FORCE brings it back to
    IDLE+POWERED_DOWN (the package docstring). The suspend it starts runs SuspendProgram again, which
    finds nothing left to terminate.
    """
    LOG.warning("resume-fail: %s did not register in time; terminating their instances", ",".join(names))
    groups, unknown = group_by_pool(names, settings.pools)
    known = [name for pool_names in groups.values() for name in pool_names]
    status = report_unknown(unknown, settings.pools, "resume-fail")
    if not known:
        return status
    terminated = terminate_named(ec2, known, "resume-fail")
    record_boot_failures(
        settings, {pool: len(pool_names) for pool, pool_names in groups.items()}, time.time()
    )
    LOG.info("resume-fail: returning %s to power saving (POWER_DOWN_FORCE)", ",".join(known))
    released = slurm.power_down_force(known, REASON_RESUME_FAIL)
    return status or (EXIT_OK if terminated and released else EXIT_FAILED)
