"""`--detach` on a Kueue stack: the guard Job started by a command that holds the model's Lease
(infra/serving/on_kubernetes.py), which hands the Lease to the Job and returns.

In order: the guard's record written whole (phase `starting`, naming the Job: an older guard still
writing it meets a 409 and stops); the Job applied suspended (`spec.suspend`: no pod yet); its ConfigMaps,
ServiceAccount, Role, RoleBinding and NetworkPolicy applied naming it as their owner from their first apply
(infra/serving/guard_job_objects.py: they go with it once its TTL has passed); the Lease handed to the Job's
holder (never free in between: a `promote` as this command exits meets the Job); the Job unsuspended. Any
of these refused: the Lease taken back from the Job, the Job and its objects deleted, the record written
`stopped` with the reason, and the error names what is left and what to run.

A command killed in between leaves a suspended Job and the record `starting`; the next `serve deploy`,
`guard`, `promote`, `rollback` or `status` settles it (settle_unstarted) before anything else:
- the Lease held, unexpired, by the Job (killed after the hand-over): the start is finished, the Job
  unsuspended. That is the starter's own last step, the same whoever makes it, so a starter that was only
  slow and makes it too changes nothing; and it is what the operator asked for (`--detach`: a guarded
  canary), where undoing would leave the canary unguarded. The command then meets the Job's Lease as it
  meets any running guard Job's;
- the Lease expired, let go or held by no one (no pod of the Job ever renewed it, or the command was
  killed before the hand-over and its own Lease expired): the Job never ran and cannot hold the release
  now; started, it would only meet the next command's Lease. It is deleted (its objects go with it, their
  ownerReferences name it) and the record written `stopped`;
- the Lease held, unexpired, by another (a command that is still starting it, or the release's next
  holder): nothing is done here; that holder settles it, or the next command after its Lease.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from infra.errors import GpuPlatError
from infra.k8s.api_refs import Conflict
from infra.k8s.release_lock import LEASE_API, lease_name, parse_time
from infra.k8s.serving import serving_objects, version_track_names
from infra.k8s.serving_apply import ClusterApi, ClusterError, ObjectRef, ReleaseDriver, workload_kind
from infra.k8s.serving_versions import ServingRelease
from infra.serving.guard_job import GUARD_RECORD, GUARD_RECORD_KEY
from infra.serving.guard_job_objects import ROLLOUT_S, guard_name, guard_objects, owned_by
from infra.serving.guard_job_plan import job_plan
from infra.serving.pod_readings import pod_servers_up


def stable_pod_spec(driver: ReleaseDriver, current: ServingRelease) -> dict[str, Any]:
    """The stable version's pod template spec as rendered: its image and placement are the Job's."""
    stable = version_track_names(current.stable)[0]
    kind = workload_kind(driver.platform)[1]
    for manifest in serving_objects(driver.platform, driver.facts, current):
        if manifest["kind"] == kind and manifest["metadata"]["name"] == stable:
            spec = manifest["spec"]
            template = (
                spec["leaderWorkerTemplate"]["leaderTemplate"]
                if "leaderWorkerTemplate" in spec
                else spec["template"]
            )
            return dict(template["spec"])
    raise ClusterError(f"the stable version's workload {stable} is not among the release's objects")


def start_guard_job(
    driver: ReleaseDriver,
    current: ServingRelease,
    *,
    past_gate: bool = False,
    duration_s: float | None = None,
) -> str:
    """The guard Job of `current`'s canary started under `driver`'s Lease, which it is handed; its name."""
    name = guard_name(driver.model, secrets.token_hex(3))
    # Where the stack's own files are read, as the release record keeps it (ReleaseDriver._record).
    model_uri = driver.facts.model_uri if isinstance(driver.facts.model_uri, str) else None
    holder = f"job/{name}"
    plan = job_plan(
        driver.platform,
        driver.facts,
        current,
        model_uri,
        holder,
        past_gate=past_gate,
        duration_s=duration_s,
        rollout_s=ROLLOUT_S,
        servers=_servers_up(driver),
    )
    objects = guard_objects(plan, name, stable_pod_spec(driver, current))
    record = {
        "model": driver.model,
        "phase": "starting",
        "detail": f"the guard Job {name} carries the release",
        "canary_percent": current.canary_percent,
        "steps": [step.percent for step in plan.rules.steps],
        "at": driver.api.server_now().isoformat(timespec="seconds"),
        "by": holder,
    }
    _write_record(driver, {GUARD_RECORD_KEY: json.dumps(record)})
    *owned, job = objects
    handed = False
    try:
        created = driver.api.apply(suspended(job, True))
        for manifest in owned:
            driver.api.apply(owned_by(manifest, created))
        driver.lock.hand_to(holder)
        handed = True
        # Its uid: this Job, not one of its name created again. A command that settled this start as undone
        # while this one stalled (settle_unstarted) deleted it; an apply naming a uid is refused (409) where
        # there is none (k8s.io/apiserver pkg/endpoints/handlers/patch.go, patcher.applyPatch, v1.34), and
        # does not bring the Job back without its objects, against the record.
        driver.api.apply(with_uid(suspended(job, False), created))
    except ClusterError as error:
        raise _not_started(driver, current, record, [*owned, job], holder, handed, error) from None
    return name


def with_uid(manifest: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """`manifest` applied to the object `live` only (metadata.uid, a precondition of the apply)."""
    return {**manifest, "metadata": {**manifest["metadata"], "uid": live["metadata"]["uid"]}}


def suspended(job: dict[str, Any], suspend: bool) -> dict[str, Any]:
    """The Job with `spec.suspend` (batch/v1): applied suspended first, so that its objects are owned by it
    from their first apply and no pod runs before the Lease is its."""
    return {**job, "spec": {**job["spec"], "suspend": suspend}}


def _not_started(
    driver: ReleaseDriver,
    current: ServingRelease,
    record: dict[str, Any],
    objects: list[dict[str, Any]],
    holder: str,
    handed: bool,
    error: ClusterError,
) -> ClusterError:
    """A guard Job that could not be started undone, each part best effort: the Lease taken back from it
    (this command's again, released as it exits), the Job and its objects deleted, the guard's record
    written `stopped` with the reason; the error saying what is left and what to run."""
    left: list[str] = []
    if handed:
        try:
            if not driver.lock.take_back(holder):
                left.append(f"the release lock of {driver.model}, which another command holds now")
        except ClusterError:
            left.append(f"the release lock of {driver.model}, held by {holder} until it expires (60 s)")
    for manifest in reversed(objects):
        ref = ObjectRef.of(manifest)
        try:
            driver.api.delete(ref)
        except ClusterError:
            left.append(f"{ref.kind} {ref.name}")
    model = driver.model
    reason = f"the guard Job {holder.removeprefix('job/')} was not started: {error.message.rstrip('.')}"
    try:
        _write_record(
            driver, {GUARD_RECORD_KEY: json.dumps({**record, "phase": "stopped", "detail": reason})}
        )
    except ClusterError:
        left.append(f"the guard's record {GUARD_RECORD} (it still reads `starting`)")
    remains = f" Left in namespace {driver.namespace}: {', '.join(left)}." if left else ""
    canary = (
        f" The canary {current.canary.reference} keeps its {current.canary_percent} % unguarded: "
        f"`gpuplat serve rollback {model}` takes it back, `gpuplat serve guard {model} --detach` tries "
        "the guard Job again."
        if current.canary is not None
        else ""
    )
    return ClusterError(f"{reason}.{remains}{canary}")


def _servers_up(driver: ReleaseDriver) -> tuple[int, int]:
    """The servers up as the gateway pods count them, which the Job weighs each share's load by; none
    (no load weighed, no equal-load analysis) where this command cannot read the pods: the guard Job,
    which reads them at their addresses, is what a stack whose pods the API server cannot dial runs."""
    try:
        return pod_servers_up(driver.api, driver.namespace, driver.say)
    except GpuPlatError as error:
        driver.say(f"the servers up were not read ({error.message}): the guard Job weighs no load")
        return (0, 0)


def _write_record(driver: ReleaseDriver, data: dict[str, str]) -> None:
    """The guard's record replaced whole (the evidence of an earlier release's guard dropped)."""
    ref = ObjectRef("v1", "ConfigMap", GUARD_RECORD, driver.namespace)
    live = driver.api.get(ref)
    if live is None:
        driver.api.create(_record_manifest(driver.namespace, data))
        return
    _replace_record(driver.api, live, data)


def _record_manifest(namespace: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": GUARD_RECORD, "namespace": namespace},
        "data": data,
    }


def _replace_record(api: ClusterApi, live: dict[str, Any], data: dict[str, str]) -> None:
    """The record replaced whole, guarded by the resourceVersion it was read at (a 409 where another
    wrote it since)."""
    manifest = _record_manifest(live["metadata"]["namespace"], data)
    manifest["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
    api.update(manifest)


def read_guard_record(api: ClusterApi, namespace: str) -> dict[str, Any] | None:
    return _guard_of(api.get(ObjectRef("v1", "ConfigMap", GUARD_RECORD, namespace)))


def _guard_of(live: dict[str, Any] | None) -> dict[str, Any] | None:
    text = ((live or {}).get("data") or {}).get(GUARD_RECORD_KEY)
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


UNSUSPEND_MANAGER = "gpuplat-serve-unsuspend"
"""the manager that applies only a Job's spec.suspend: the starter's own apply (FIELD_MANAGER) keeps the
rest of the Job's fields (a partial apply by their manager would drop them: server-side-apply.md,
"Field management")"""


def settle_unstarted(api: ClusterApi, namespace: str, model: str, say: Callable[[str], None]) -> None:
    """A guard Job of `model` whose start a killed command left half done, finished or undone (this
    module's docstring says which and why); nothing where the record names no such Job."""
    live = api.get(ObjectRef("v1", "ConfigMap", GUARD_RECORD, namespace))
    guard = _guard_of(live) or {}
    holder = str(guard.get("by") or "")
    if live is None or guard.get("phase") != "starting" or guard.get("model") != model:
        return
    if not holder.startswith("job/"):
        return
    name = holder.removeprefix("job/")
    job_ref = ObjectRef("batch/v1", "Job", name, namespace)
    job = api.get(job_ref)
    if job is None or not (job.get("spec") or {}).get("suspend"):
        return
    lease = api.get(ObjectRef(LEASE_API, "Lease", lease_name(model), namespace)) or {}
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime"))
    held_by = str(spec.get("holderIdentity") or "")
    until = renewed + timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0)) if renewed else None
    unexpired = bool(held_by) and until is not None and until > api.server_now()
    if unexpired and held_by == holder:
        unsuspend = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"suspend": False},
        }
        api.apply(with_uid(unsuspend, job), manager=UNSUSPEND_MANAGER)
        say(
            f"the guard Job {name}, handed the release lock by a command stopped before it started the "
            "Job, was started now: it carries the release"
        )
        return
    if unexpired:
        return
    api.delete(job_ref)
    reason = (
        f"the guard Job {name} was never started (the command that started it stopped before it "
        "unsuspended it, and its release lock expired): deleted, with its objects"
    )
    try:
        _replace_record(
            api, live, {GUARD_RECORD_KEY: json.dumps({**guard, "phase": "stopped", "detail": reason})}
        )
    except Conflict:
        # Written since it was read: by another command settling this start at the same time (it deleted
        # the Job too), or by the release's next holder. Settled either way, unless the record still names
        # this start as starting.
        again = _guard_of(api.get(ObjectRef("v1", "ConfigMap", GUARD_RECORD, namespace))) or {}
        if again.get("phase") == "starting" and again.get("by") == holder:
            raise
        return
    say(reason)
