"""One release at a time per model: the Lease (coordination.k8s.io/v1) a command or the guard Job holds,
its times by the API server's clock. The standard library only (the guard Job's zip application carries
it): the API it calls is any object with get, create and update of manifests and the server's time."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from infra.errors import ExitCode, GpuPlatError
from infra.k8s.api_refs import ClusterError, Conflict, ObjectRef
from infra.k8s.serving_versions import ServedVersion

LEASE_API = "coordination.k8s.io/v1"
LEASE_DURATION_S = 60


class ReleaseLocked(ClusterError):
    def __init__(self, model: str, holder: str, until: datetime | None) -> None:
        when = f" until {until.isoformat(timespec='seconds')} unless renewed" if until else ""
        super().__init__(
            f"the release of {model} is held by {holder}{when} (Lease gpuplat-release-{model}): wait for it "
            "to end, or, if that command is gone, for the Lease to expire"
        )
        self.holder = holder


class LeaseApi(Protocol):
    """The calls the lock makes (infra/k8s/serving_apply.py ClusterApi, infra/serving/kube_http.py)."""

    def get(self, ref: ObjectRef) -> dict[str, Any] | None: ...
    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]: ...
    def update(self, manifest: Mapping[str, Any]) -> dict[str, Any]: ...


def micro_time(moment: datetime) -> str:
    # MicroTime: RFC 3339 with microseconds (apimachinery pkg/apis/meta/v1/micro_time.go, RFC3339Micro).
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def lease_name(model: str) -> str:
    return f"gpuplat-release-{ServedVersion(f'{model}@0', '').slug.removesuffix('-v0')}"


def default_holder() -> str:
    """Who holds the Lease, for a person to read, and unique: two commands in containers on one host can
    share user, host name (--network host) and pid (each its own PID namespace), and a Lease whose holder
    reads as this command's is taken as its own."""
    user = os.environ.get("USER", "someone")
    return f"{user}@{socket.gethostname()} pid {os.getpid()} {secrets.token_hex(4)}"


@dataclass
class ReleaseLock:
    """One release at a time per model: a coordination.k8s.io/v1 Lease whose holder renews it while the
    release runs. Taken by a create, or by an update guarded by the resourceVersion of an expired (or
    released) Lease it read: of two commands that race, the API server answers the second 409."""

    api: LeaseApi
    namespace: str
    model: str
    holder: str
    duration_s: int = LEASE_DURATION_S
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    _resource_version: str | None = None
    _renewed: datetime | None = None

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(LEASE_API, "Lease", lease_name(self.model), self.namespace)

    def _manifest(self, acquired: datetime, transitions: int) -> dict[str, Any]:
        now = self.now()
        return {
            "apiVersion": LEASE_API,
            "kind": "Lease",
            "metadata": {"name": self.ref.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.holder,
                "leaseDurationSeconds": self.duration_s,
                "acquireTime": micro_time(acquired),
                "renewTime": micro_time(now),
                "leaseTransitions": transitions,
            },
        }

    def _held_by_another(self, live: Mapping[str, Any]) -> tuple[str, datetime] | None:
        spec = live.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = parse_time(spec.get("renewTime"))
        if not holder or holder == self.holder or renewed is None:
            return None
        until = renewed + timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0))
        return (str(holder), until) if until > self.now() else None

    def _refuse_from_live(self) -> ReleaseLocked:
        live = self.api.get(self.ref) or {}
        spec = live.get("spec") or {}
        held = self._held_by_another(live)
        holder = held[0] if held else str(spec.get("holderIdentity") or "another command")
        return ReleaseLocked(self.model, holder, held[1] if held else None)

    def acquire(self, *, may_create: bool = True) -> None:
        """Takes the Lease, free or expired; `may_create=False` (the guard Job, whose Role cannot create
        it: a create is a POST, which carries no name for resourceNames to match) refuses where it is gone:
        the command that handed it over ended, or another deleted it, and the release is no longer this
        holder's to carry."""
        live = self.api.get(self.ref)
        now = self.now()
        if live is None and not may_create:
            raise ReleaseLocked(self.model, "no one (its Lease was deleted)", None)
        try:
            if live is None:
                answer = self.api.create(self._manifest(now, 0))
            else:
                held = self._held_by_another(live)
                if held is not None:
                    raise ReleaseLocked(self.model, *held)
                spec = live.get("spec") or {}
                taken_over = spec.get("holderIdentity") != self.holder
                manifest = self._manifest(now, int(spec.get("leaseTransitions") or 0) + int(taken_over))
                manifest["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
                answer = self.api.update(manifest)
        except Conflict:
            raise self._refuse_from_live() from None
        self._resource_version = answer["metadata"]["resourceVersion"]
        self._renewed = now

    def renew(self, *, force: bool = False) -> None:
        """Renews at a third of the duration (or at once with `force`); a Lease another command took
        meanwhile (this one stalled past the duration) ends the release here."""
        if self._resource_version is None:
            raise ClusterError(f"the release lock of {self.model} is not held")
        now = self.now()
        if (
            not force
            and self._renewed is not None
            and now - self._renewed < timedelta(seconds=self.duration_s / 3)
        ):
            return
        live = self.api.get(self.ref)
        if live is None or (live.get("spec") or {}).get("holderIdentity") != self.holder:
            raise (
                self._refuse_from_live()
                if live
                else ClusterError(f"the release lock of {self.model} is gone")
            )
        acquired = parse_time((live.get("spec") or {}).get("acquireTime")) or now
        manifest = self._manifest(acquired, int((live.get("spec") or {}).get("leaseTransitions") or 0))
        manifest["metadata"]["resourceVersion"] = self._resource_version
        try:
            answer = self.api.update(manifest)
        except Conflict:
            raise self._refuse_from_live() from None
        self._resource_version = answer["metadata"]["resourceVersion"]
        self._renewed = now

    def unexpired(self) -> bool:
        """Whether this command's last acquire or renewal is still within the Lease's duration (by the API
        server's clock as last heard): no other command can have taken it yet, read or not."""
        return self._renewed is not None and self.now() - self._renewed < timedelta(seconds=self.duration_s)

    def seconds_left(self) -> float | None:
        """The seconds before this command's Lease expires unless renewed, by the API server's clock as last
        heard (what bounds the retries of its calls: infra/k8s/api_retry.py); None while it holds none."""
        if self._resource_version is None or self._renewed is None:
            return None
        return self.duration_s - (self.now() - self._renewed).total_seconds()

    def hand_to(self, holder: str) -> None:
        """The Lease given to `holder` (the guard Job this command starts) in one update guarded as a
        renewal is: never free in between, so that no other command takes the release as this one exits."""
        self.renew(force=True)
        live = self.api.get(self.ref) or {}
        spec = live.get("spec") or {}
        manifest = self._manifest(self.now(), int(spec.get("leaseTransitions") or 0) + 1)
        manifest["spec"]["holderIdentity"] = holder
        manifest["metadata"]["resourceVersion"] = self._resource_version
        try:
            self.api.update(manifest)
        except Conflict:
            raise self._refuse_from_live() from None
        self._resource_version = None

    def take_back(self, holder: str) -> bool:
        """The Lease this command handed to `holder` (hand_to) taken back, in one update guarded by the
        resourceVersion read: where `holder` never started (its Job refused, or never unsuspended). False
        where another holds it now (nothing of this command's to take back)."""
        live = self.api.get(self.ref)
        spec = (live or {}).get("spec") or {}
        if live is None or spec.get("holderIdentity") != holder:
            return False
        manifest = self._manifest(self.now(), int(spec.get("leaseTransitions") or 0) + 1)
        manifest["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        try:
            answer = self.api.update(manifest)
        except Conflict:
            return False
        self._resource_version = answer["metadata"]["resourceVersion"]
        self._renewed = self.now()
        return True

    def release(self) -> None:
        """Lets the Lease go at once (holder cleared), guarded as a renewal is."""
        if self._resource_version is None:
            return
        live = self.api.get(self.ref)
        if live is not None and (live.get("spec") or {}).get("holderIdentity") == self.holder:
            manifest = {
                "apiVersion": LEASE_API,
                "kind": "Lease",
                "metadata": {
                    "name": self.ref.name,
                    "namespace": self.namespace,
                    "resourceVersion": self._resource_version,
                },
                "spec": {"leaseDurationSeconds": self.duration_s},
            }
            with contextlib.suppress(Conflict):  # taken by another meanwhile: nothing of ours to let go
                self.api.update(manifest)
        self._resource_version = None


# --------------------------------------------------------------------------------- the release record


def still_held(
    lock: ReleaseLock,
    before: str,
    say: Callable[[str], None],
    taken: Callable[[str], Exception] | None = None,
) -> None:
    """Before a guard's change: the Lease read again and renewed, due or not (a guard stalled past it, whose
    own renewal was not due by its clock, must not change what the new holder carries). A read the API
    does not answer (a 429, a 5xx) is no verdict on the Lease: while the guard's last renewal is within its
    duration no other command can hold it, and the change (a due rollback) goes on. `taken`: the error
    raised where another holds it now (the guard Job's Superseded, exit 10), given what to say."""
    try:
        lock.renew(force=True)
    except ReleaseLocked as locked:
        said = (
            f"the guard of '{lock.model}' lost its release lock ({locked.message}) and stopped before "
            f"{before}: the command that holds it now carries the release (`gpuplat serve status "
            f"{lock.model}`)"
        )
        if taken is not None:
            raise taken(said) from None
        raise GpuPlatError(said, exit_code=ExitCode.NO_VERDICT) from None
    except ClusterError as error:
        if not lock.unexpired():
            raise GpuPlatError(
                f"the guard of '{lock.model}' could not read its release lock ({error.message}) past its "
                f"{lock.duration_s} s lease and stopped before {before}: another command may carry the "
                f"release now (`gpuplat serve status {lock.model}`)",
                exit_code=ExitCode.NO_VERDICT,
            ) from None
        say(
            f"the release lock was not read again before {before} ({error.message}); renewed within its "
            "duration, it is still this guard's"
        )


def lost_at_look(
    lock: ReleaseLock, say: Callable[[str], None], taken: Callable[[str], Exception] | None = None
) -> bool:
    """The Lease read and renewed at a guard's look: False while it is the guard's, True once another holds
    it, so that a guard stalled past it stops at its next look. A read or renewal the API did not answer (a
    429, a 5xx, no route) is no verdict on the Lease: held while its last renewal's duration lasts (the
    look goes on, its own reads under the three-failed-looks rule), lost after. `taken`: the error raised
    instead of True where another holds it now (the guard Job's Superseded, exit 10)."""
    try:
        lock.renew(force=True)
    except ReleaseLocked as locked:
        if taken is not None:
            raise taken(
                f"the guard of '{lock.model}' found its release lock taken at a look ({locked.message}): "
                f"it stopped, leaving the release to that command (`gpuplat serve status {lock.model}`)"
            ) from None
        return True
    except ClusterError as error:
        if not lock.unexpired():
            return True
        say(f"the release lock was not renewed at this look: {error.message}")
    return False
