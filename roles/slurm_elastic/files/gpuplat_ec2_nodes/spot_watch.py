"""spot-watch (a systemd service on a spot node): on an interruption notice, the node's jobs
checkpointed, requeued and the node powered down."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .ec2 import IMDS_TIMEOUT_S
from .exit_codes import EXIT_FAILED, EXIT_OK
from .logs import LOG
from .slurm import Job, Slurm

DEFAULT_IMDS_URL = "http://169.254.169.254"

IMDS_TOKEN_TTL_S = 60


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
    watch: SpotWatch,
    slurm: Slurm,
    notice: dict[str, Any],
    sleep: Callable[[float], None],
    kill: Callable[[int, int], None] = os.kill,
) -> int:
    """Drain, TERM the job steps and the processes the batch scripts started, wait, POWER_DOWN_FORCE,
    then requeue the requeueable batch jobs that ended in the grace period.

    The batch shell itself is not signalled: bash dies on SIGTERM, and with it the job, whose
    other steps Slurm then kills after KillWait instead of the grace. What it started (a torchrun
    run in the script, not under srun) is: `scancel --signal` reaches job steps only, never the
    batch step. POWER_DOWN_FORCE requeues the requeueable batch jobs still running; a job whose
    work ended (checkpointed) in the grace period is requeued here, as `scontrol requeue` takes
    finished jobs back (the package docstring).
    """
    reason = f"spot interruption {notice.get('time', 'unknown')}"
    LOG.warning("spot-watch: %s: %s (%s)", watch.node, reason, notice.get("action", "unknown"))
    drained = slurm.drain(watch.node, reason)
    jobs = slurm.jobs_on(watch.node)
    signalled = slurm.signal_steps(watch.node, "TERM")
    children = term_batch_step_children(slurm, watch.node, jobs or [], kill)
    LOG.info("spot-watch: %s: waiting %.0f s for the jobs to checkpoint", watch.node, watch.grace_s)
    sleep(watch.grace_s)
    powered_down = slurm.power_down_force([watch.node], reason)
    requeued = requeue_ended_jobs(slurm, watch.node, jobs or [])
    ok = drained and jobs is not None and signalled and children and powered_down and requeued
    return EXIT_OK if ok else EXIT_FAILED


def term_batch_step_children(
    slurm: Slurm, node: str, jobs: list[Job], kill: Callable[[int, int], None]
) -> bool:
    """SIGTERM to every process of the batch jobs' batch steps but their shells; whether they were
    listed. A process that ended meanwhile is no failure."""
    batch = [job.job_id for job in jobs if job.batch]
    if not batch:
        return True
    pids = slurm.batch_step_children(batch)
    if pids is None:
        return False
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGTERM)
    LOG.info("spot-watch: %s: SIGTERM to %d processes of the batch steps of jobs %s: %s", node, len(pids),
             ",".join(batch), " ".join(str(pid) for pid in pids) or "none")  # fmt: skip
    return True


# The states a job reaches when its steps end on SIGTERM: exit 0 after a checkpoint, or not.
ENDED_BY_THE_NOTICE = frozenset({"COMPLETED", "FAILED"})


def requeue_ended_jobs(slurm: Slurm, node: str, jobs: list[Job]) -> bool:
    requeueable = [job.job_id for job in jobs if job.batch and job.requeue]
    others = [job.job_id for job in jobs if not (job.batch and job.requeue)]
    if others:
        LOG.warning(
            "spot-watch: %s: jobs %s are not requeueable batch jobs; POWER_DOWN_FORCE ended them",
            node,
            ",".join(others),
        )
    if not requeueable:
        return True
    states = slurm.job_states(requeueable)
    if states is None:
        return False
    ended = [job_id for job_id in requeueable if states.get(job_id) in ENDED_BY_THE_NOTICE]
    return slurm.requeue(ended) if ended else True


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
