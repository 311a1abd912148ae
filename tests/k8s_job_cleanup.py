"""What becomes of a finished Job and the objects it owns, for the tests that hold a Job's
ttlSecondsAfterFinished to what it causes (the guard Job's: tests/unit/test_guard_job_start.py).

Read at kubernetes/kubernetes pkg/controller/ttlafterfinished/ttlafterfinished_controller.go (stored
snapshot 003e8629): a Job needs cleaning up once it has a ttlSecondsAfterFinished and has finished; it
finished at the lastTransitionTime of its Complete or Failed condition whose status is True
(jobFinishTime); it expires at that time plus the TTL, and is deleted once the time left is 0 or less, with
foreground propagation (DeletePropagationForeground): the garbage collector deletes the objects whose
ownerReferences name its uid, then the Job. No TTL, or not finished: it stays.

Not modelled: the garbage collector's other owners (an object with two owners stays while one is left),
blockOwnerDeletion, finalizers, the controller's queue and its clock skew warning."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

FINISHED = ("Complete", "Failed")


def finished_at(job: dict[str, Any]) -> datetime | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in FINISHED and condition.get("status") == "True":
            return datetime.fromisoformat(condition["lastTransitionTime"].replace("Z", "+00:00"))
    return None


def collect(objects: dict[str, dict[str, Any]], now: datetime) -> set[str]:
    """Deletes from `objects` (path -> object) each Job whose TTL ran out at `now` and every object it owns,
    as the TTL controller and the garbage collector would; returns the paths deleted."""
    expired = set()
    for path, job in objects.items():
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished") if job.get("kind") == "Job" else None
        finish = finished_at(job) if ttl is not None else None
        if finish is not None and finish + timedelta(seconds=int(ttl)) - now <= timedelta(0):
            expired.add(path)
    uids = {objects[path]["metadata"]["uid"] for path in expired}
    owned = {
        path
        for path, obj in objects.items()
        if any(owner.get("uid") in uids for owner in obj["metadata"].get("ownerReferences") or [])
    }
    for path in owned | expired:
        del objects[path]
    return owned | expired
