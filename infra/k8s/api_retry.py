"""Retries of the calls to the Kubernetes API, one policy for both of its clients: the CLI's
(infra/k8s/serving_apply.py ClusterApi, through the official client) and the guard Job's
(infra/serving/kube_http.py). The standard library only: the guard's zip application carries it
(infra/serving/guard_job_objects.py MODULES).

Modelled on client-go's rest requests (kubernetes/client-go v0.34.0, the stacks' Kubernetes 1.34):
- rest/with_retry.go checkWait (line 309): an answer 429 or any 5xx is retried where it carries a
  Retry-After header in whole seconds (rest/request.go retryAfterSeconds, line 1378); the next try waits
  that long, or the backoff where that is longer (withRetry.Before, line 220). That holds for every verb:
  a body given as bytes can be sent again (IsNextRetry gives up on an opaque reader only, line 156).
- rest/request.go Request.request (lines 1064-1076): a reset connection, an EOF or a lost HTTP/2
  connection is retried for GET only ("We are not automatically retrying 'write' operations, as they are
  not idempotent"), as if answered 500 with Retry-After: 1 (with_retry.go retryAfterResponse).
- rest/request.go NewRequest (line 166): maxRetries 10, so 11 tries at most (IsNextRetry, line 163).

Where this policy differs, and why:
- A 5xx without Retry-After (a load balancer in front of the API server, or one API server of several
  shutting down, answers 502, 503 or 504 without one) and an answer that never came are retried too, the
  wait doubling from FIRST_BACKOFF_S to MAX_BACKOFF_S, each drawn between half and all of it (so that
  the guards of many models do not come back in step). A Retry-After above MAX_RETRY_AFTER_S is not
  waited for: the call stops and says so.
- Writes are retried after a lost answer (a 5xx, no answer) as well, because each write the platform makes
  is told apart on a second try: a create answered 409 AlreadyExists, or a write that carries a
  resourceVersion answered 409 Conflict, after a try that may have gone through, is read back, and is this
  command's own where the object holds every field it sent (a Lease's renewTime to the microsecond, a
  record's text); anything else is the 409 it says. A server-side apply without a resourceVersion and every
  read are idempotent. A 429 was not carried out (API Priority and Fairness rejects before the handler), so
  a 409 after it is the 409 it says.
- Bounded in time as well as in tries: TOTAL_S in all, and never past the Lease this command holds (`bound`:
  the seconds left before it expires). A retry that could still be running within LEASE_MARGIN_S of
  that expiry is not made (its wait and the try's own timeout, `try_s`, counted: a try that hangs until
  its client gives it up may be carried out by the API server that late): the call stops and says so,
  and the lock's callers (infra/k8s/release_lock.py still_held, lost_at_look) then judge the Lease as they
  judge any call not answered.
"""

from __future__ import annotations

import http.client
import random
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from infra.k8s.api_refs import ClusterError, Conflict, Unavailable

ATTEMPTS = 11
"""client-go's maxRetries (10) and the first try"""
TOTAL_S = 30.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
MAX_RETRY_AFTER_S = 10.0
LEASE_MARGIN_S = 5.0
WRITES = ("POST", "PUT", "PATCH")
NOT_COMPARED = (("metadata", "resourceVersion"), ("metadata", "managedFields"), ("status",))

T = TypeVar("T")


def retry_after_s(value: str | None) -> float | None:
    """Retry-After in whole seconds, as client-go reads it (request.go retryAfterSeconds: strconv.Atoi;
    an HTTP-date, RFC 9110 10.2.3, is not read)."""
    try:
        return float(int((value or "").strip()))
    except ValueError:
        return None


def unanswered(error: BaseException) -> bool:
    """Whether an error of the standard library's HTTP stack is a call that may pass if tried again: a
    connection reset, refused or timed out, or an answer cut short. Not a TLS failure (a wrong CA or
    certificate does not heal) nor a name that does not resolve (a wrong kubeconfig)."""
    if isinstance(error, ssl.SSLError | ssl.CertificateError | socket.gaierror):
        return False
    return isinstance(error, ConnectionError | TimeoutError | http.client.HTTPException)


def holds_what_was_sent(sent: Any, live: Any, path: tuple[str, ...] = ()) -> bool:
    """Whether `live` (the object read back) holds every field of `sent` (the body written) with its
    value, lists whole; what the server writes itself (NOT_COMPARED) left out."""
    if path in NOT_COMPARED:
        return True
    if isinstance(sent, Mapping):
        return isinstance(live, Mapping) and all(
            holds_what_was_sent(value, live.get(key), (*path, key)) for key, value in sent.items()
        )
    return bool(sent == live)


@dataclass
class Pace:
    """What the retries wait by: `draw` is the jitter, in [0, 1)."""

    sleep: Callable[[float], None] = time.sleep
    monotonic: Callable[[], float] = time.monotonic
    draw: Callable[[], float] = random.random


def default_pace() -> Pace:
    """The real clock (a test suite puts one in its place that only counts the waits)."""
    return Pace()


@dataclass
class Retrier:
    """Runs one call to the API under the policy above. `pace`: the clock it waits by; `bound`: the seconds
    left before the Lease this client's command holds expires (None: it holds none); `try_s`: the longest
    one try may take before its client gives it up (its request timeout)."""

    pace: Pace = field(default_factory=lambda: default_pace())
    bound: Callable[[], float | None] = lambda: None
    say: Callable[[str], None] = lambda _: None
    attempts: int = ATTEMPTS
    total_s: float = TOTAL_S
    try_s: float = 0.0
    waited: list[float] = field(default_factory=list)
    """each wait before a retry, in order (what a test reads)"""

    def call(
        self,
        what: str,
        attempt: Callable[[], T],
        *,
        verb: str = "GET",
        body: Any = None,
        read_back: Callable[[], T | None] | None = None,
    ) -> T:
        """`attempt` tried until it answers, raises anything but Unavailable, or the policy stops it.
        `verb` and `body`: the request's, a write's (POST, PUT, PATCH) body what a 409 after a try that may
        have gone through is compared with, in the object `read_back` reads."""
        sent = body if verb in WRITES and isinstance(body, Mapping) else None
        started = self.pace.monotonic()
        maybe_done = False
        for tried in range(1, self.attempts + 1):
            try:
                return attempt()
            except Conflict as conflict:
                if not maybe_done or sent is None or read_back is None:
                    raise
                live = read_back()
                if live is not None and holds_what_was_sent(sent, live):
                    self.say(f"{what}: an earlier try went through unanswered, the object read back is its")
                    return live
                raise Conflict(
                    f"{conflict.message} (an earlier try of {what} was not answered; the object read back "
                    "is not what it sent: another client wrote it)"
                ) from None
            except Unavailable as error:
                maybe_done = maybe_done or error.may_have_happened
                wait = self._wait(tried, error)
                stop = self._stop(what, tried, started, wait, error)
                if stop is not None:
                    raise stop from None
                self.waited.append(wait)
                self.pace.sleep(wait)
        raise AssertionError("unreachable: the last try returns or raises")  # pragma: no cover

    def _wait(self, tried: int, error: Unavailable) -> float:
        backoff = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2.0 ** (tried - 1))
        drawn = backoff * (0.5 + self.pace.draw() / 2)
        return max(drawn, error.retry_after) if error.retry_after is not None else drawn

    def _stop(
        self, what: str, tried: int, started: float, wait: float, error: Unavailable
    ) -> ClusterError | None:
        """Why no further try is made (one paragraph), or None."""
        spent = self.pace.monotonic() - started
        after = f"{tried} {'try' if tried == 1 else 'tries'} in {spent:.0f} s"
        why = ""
        if tried >= self.attempts:
            why = f"no try is left ({self.attempts} at most, as client-go's rest client)"
        elif error.retry_after is not None and error.retry_after > MAX_RETRY_AFTER_S:
            why = f"it asked for {error.retry_after:.0f} s before the next, over {MAX_RETRY_AFTER_S:.0f}"
        elif spent + wait > self.total_s:
            why = f"the next, after {wait:.1f} s more, would pass the {self.total_s:.0f} s a call is given"
        else:
            left = self.bound()
            if left is not None and left - wait - self.try_s < LEASE_MARGIN_S:
                within = f", within {self.try_s:.0f} s" if self.try_s else ""
                why = (
                    f"the release lock (Lease) this command holds expires in {max(left, 0):.0f} s, before "
                    f"the next try (after {wait:.1f} s{within}) could be answered: stopped rather than hold "
                    "the release past its Lease"
                )
        if not why:
            return None
        return Unavailable(
            f"{error.message.rstrip('.')} ({what}: {after}; {why})", error.status, error.retry_after
        )
