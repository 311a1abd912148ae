"""resume (Slurm's ResumeProgram) and resume-fail (ResumeFailProgram)."""

from __future__ import annotations

from typing import Any

from .ec2 import ADDRESS_WAIT_S, LIVE_STATES, Ec2Nodes, ErrorTypes, error_code, terminate_named
from .exit_codes import EXIT_FAILED, EXIT_OK
from .logs import LOG
from .settings import Settings, group_by_pool, report_unknown
from .slurm import Slurm

REASON_RESUME_FAIL = "gpuplat resume-fail: no registration within ResumeTimeout"


def resume(settings: Settings, ec2: Ec2Nodes, slurm: Slurm, names: list[str]) -> int:
    groups, unknown = group_by_pool(names, settings.pools)
    known = [name for pool_names in groups.values() for name in pool_names]
    if not known:
        return report_unknown(unknown, settings.pools, "resume")
    try:
        existing = {name: found[0] for name, found in ec2.instances_of(known, LIVE_STATES).items()}
    except ErrorTypes as err:
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
    ok, unaddressed = announce_addresses(ec2, slurm, started)
    failed.update({name: "NoPrivateAddress" for name in unaddressed})
    ok = release_failed(ec2, slurm, failed) and ok
    return report_unknown(unknown, settings.pools, "resume") or (
        EXIT_OK if ok and not failed else EXIT_FAILED
    )


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
    LOG.info("resume-fail: returning %s to power saving (POWER_DOWN_FORCE)", ",".join(known))
    released = slurm.power_down_force(known, REASON_RESUME_FAIL)
    return status or (EXIT_OK if terminated and released else EXIT_FAILED)
