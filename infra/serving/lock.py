"""A model's release lock: one release at a time per model, held as a lease on the first gateway's node.

The lock is a directory under LOCK_DIR (tmpfs: a restart of that node frees every lock) holding its owner's
description and the second, on the node's own clock, its lease ends. It is made whole elsewhere and renamed
into place (rename(2) onto a non-empty directory fails: of two takers at once one gets it, and no lock is
ever seen without its owner and expiry). The holder renews the lease every sixth of its length while it
runs; a lock whose lease ended (its holder killed on another host: a CI runner gone) or whose holder was a
process of this host that is gone is taken over, never one whose holder still renews it. The node's clock
decides every expiry, so hosts whose clocks differ agree on it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Protocol

from infra.errors import ExitCode, GpuPlatError

LOCK_DIR = "/run/gpuplat-serve"
LEASE_S = 60.0
"""how long a lock outlives its holder's last renewal"""

# Only root on the node reaches the folder (0700, its files made under umask 077): a user of the node who
# could open the mutex file (read permission is enough to flock it: flock.1.adoc, EXAMPLES, "<") could hold
# its flock for ever, and every renewal and take-over would wait on it.
# Arguments of every script: the folder, the model, the owner's description, the lease in seconds.
# Prints "taken", or "held S: OWNER" with the seconds S left of the holder's lease (negative: it ended).
TAKE = """umask 077; mkdir -p "$1" && chmod 700 "$1" || exit 1
lock="$1/$2.lock"; new="$1/.$2.lock.$$"
rm -rf "$new"
mkdir "$new" && printf '%s' "$3" > "$new/owner" && echo $(( $(date +%s) + $4 )) > "$new/expires" || exit 1
if mv -T "$new" "$lock" 2>/dev/null; then echo taken; exit 0; fi
rm -rf "$new"
now=$(date +%s)
# A lock written before leases: its owner file's age.
written=$(stat -c %Y "$lock/owner" 2>/dev/null || echo 0)
expires=$(cat "$lock/expires" 2>/dev/null || echo $(( written + $4 )))
printf 'held %s: ' $(( expires - now )); cat "$lock/owner" 2>/dev/null; echo"""
# The expiry is written to a temporary and renamed over: a script killed while writing it leaves the old
# one, never an empty file that no later script reads as a time (the lock would be held for ever).
# Every change to a held lock (take over, renew, release) is made inside its mutex, so a renewal and a
# take-over never interleave: flock(1) on the file ".MODEL.mutex" beside the lock, which the kernel drops
# when the script's last process ends, killed or not (util-linux sys-utils/flock.1.adoc, -u: a lock "is
# automatically dropped when the file is closed"; -w: give up after that many seconds; util-linux is
# Essential in Debian: 2.38.1 in the bookworm base image). A directory made by mkdir served before: one
# left by a killed script had to be judged stale by its age, and a live script slower than that was
# overtaken.
_MUTEX = """umask 077; lock="$1/$2.lock"
[ -d "$lock" ] || { printf 'lost: '; echo; exit 0; }
exec 9>>"$1/.$2.mutex"
flock -w 5 9 || { printf 'busy: '; cat "$lock/owner" 2>/dev/null; echo; exit 0; }
[ -d "$lock" ] || { printf 'lost: '; echo; exit 0; }
"""
# Extra arguments: the owner seen, the way it may be taken ("gone": its holder's process is gone; "handed":
# its holder handed it to this taker by name (ReleaseLock.hand_over); "expired": only if its lease ended,
# checked again inside the mutex).
TAKE_OVER = (
    _MUTEX
    + """now=$(date +%s)
expires=$(cat "$lock/expires" 2>/dev/null); case $expires in ''|*[!0-9]*) expires=0;; esac
if [ "$(cat "$lock/owner" 2>/dev/null)" = "$5" ] \\
  && { [ "$6" = gone ] || [ "$6" = handed ] || [ "$now" -gt "$expires" ]; }; then
  printf '%s' "$3" > "$lock/owner.$$" && mv "$lock/owner.$$" "$lock/owner" \\
    && echo $(( now + $4 )) > "$lock/expires.$$" && mv "$lock/expires.$$" "$lock/expires" \\
    && echo taken && exit 0
fi
printf 'held 0: '; cat "$lock/owner" 2>/dev/null; echo"""
)
RENEW = (
    _MUTEX
    + """if [ "$(cat "$lock/owner" 2>/dev/null)" = "$3" ]; then
  echo $(( $(date +%s) + $4 )) > "$lock/expires.$$" && mv "$lock/expires.$$" "$lock/expires" \\
    && renewed=renewed
  echo "${renewed:-not renewed}"
else
  printf 'lost: '; cat "$lock/owner" 2>/dev/null; echo
fi"""
)
# Extra argument: the owner it is handed to, whose lease starts now.
HAND_OVER = (
    _MUTEX
    + """if [ "$(cat "$lock/owner" 2>/dev/null)" = "$3" ]; then
  printf '%s' "$5" > "$lock/owner.$$" && mv "$lock/owner.$$" "$lock/owner" \\
    && echo $(( $(date +%s) + $4 )) > "$lock/expires.$$" && mv "$lock/expires.$$" "$lock/expires" \\
    && echo handed && exit 0
fi
printf 'lost: '; cat "$lock/owner" 2>/dev/null; echo"""
)
RELEASE = (
    _MUTEX
    + """if [ "$(cat "$lock/owner" 2>/dev/null)" = "$3" ]; then rm -rf "$lock"; echo released
else printf 'lost: '; cat "$lock/owner" 2>/dev/null; echo; fi"""
)


class Nodes(Protocol):
    def exec(self, node: str, *command: str, timeout: float = 120) -> str: ...


class LockRefused(GpuPlatError):
    """Another release of the model holds its lock."""

    exit_code = ExitCode.POLICY_VIOLATION


class LockLost(GpuPlatError):
    """This command's lease of the model's lock ended (it may be another's now): it must not act further."""


def here() -> str:
    """This process's host and PID namespace, as a lock's owner names them: containers that share a host
    name (podman's --uts=host, CI runners named alike) each number their processes apart, so a pid is
    only known gone in the namespace that gave it."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "pid:[unknown]"
    return f"{socket.gethostname()} in {namespace}"


def gone(holder: str) -> bool:
    """Whether the lock's holder ("... by pid N on HOST in NAMESPACE since ...") was a process of this host
    and PID namespace that is no longer running (one that names no namespace is never known gone)."""
    words = holder.split()
    try:
        pid, on = int(words[words.index("pid") + 1]), words.index("on")
    except (ValueError, IndexError):
        return False
    if " ".join(words[on + 1 : on + 4]) != here() or here().endswith("[unknown]"):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class ReleaseLock:
    """`model`'s release lock on `node`, held by `what` of this process while `with` runs, its lease
    renewed meanwhile by a thread. `lost` is set when a renewal finds the lock another's, or when no renewal
    was confirmed for a lease less a margin by this process's own clock, counted from the moment the last
    confirmed one was sent (the node's lease began after that moment, so it has not ended yet): a process
    stopped past its lease (SIGSTOP, a suspended laptop) or cut off from the node that long knows it may
    have lost the lock before any renewal answers, and does nothing more under it."""

    def __init__(
        self,
        nodes: Nodes,
        node: str,
        model: str,
        what: str,
        say: Callable[[str], None],
        lease_s: float = LEASE_S,
    ) -> None:
        self.nodes, self.node, self.model, self.say = nodes, node, model, say
        self.lease_s = max(1, round(lease_s))
        self.owner = f"{what} by pid {os.getpid()} on {here()} since {time.strftime('%H:%M:%S %Z')}"
        self.lost = threading.Event()
        self._confirmed = time.monotonic()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._handed = False

    def _run(self, script: str, *extra: str, timeout: float = 120) -> str:
        arguments = ("lock", LOCK_DIR, self.model, self.owner, str(self.lease_s), *extra)
        return self.nodes.exec(self.node, "sh", "-c", script, *arguments, timeout=timeout).strip()

    def held(self) -> bool:
        """Whether this command may still act under the lock (see the class)."""
        if not self.lost.is_set() and time.monotonic() - self._confirmed > self.lease_s * 5 / 6:
            self.lost.set()
            self.say(
                f"the release lock of '{self.model}' was not renewed within its {self.lease_s} s lease: "
                "it may be another command's now"
            )
        return not self.lost.is_set()

    def take(self, handed_by: str | None = None) -> None:
        """Take the lock; one held under the name `handed_by` (a holder's `hand_over`) is taken at once."""
        sent = time.monotonic()
        answer = self._run(TAKE)
        if answer != "taken":
            left, _, holder = answer.removeprefix("held ").partition(": ")
            way = (
                "handed"
                if handed_by is not None and holder == handed_by
                else "gone"
                if gone(holder)
                else "expired"
                if _seconds(left) < 0
                else None
            )
            if way is not None:
                why = {"gone": "a process that is gone", "handed": "its holder, who handed it over"}.get(
                    way, f"a holder whose lease ended {-_seconds(left)} s ago"
                )
                self.say(f"taking over the release lock of '{self.model}' from {why} ({holder})")
                answer = self._run(TAKE_OVER, holder, way)
                holder = answer.partition(": ")[2] or holder
            if answer != "taken":
                raise LockRefused(
                    f"a release of '{self.model}' is in progress ({holder}): one release at a time per "
                    "model. Wait for it to end, or stop it (Ctrl-C releases its lock); the lock of a holder "
                    f"that was killed is taken over once its lease ends ({self.lease_s} s after its last "
                    "renewal)"
                )
        self._confirmed = sent
        self._renewer = threading.Thread(target=self._renew, name=f"lease {self.model}", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        """Every sixth of the lease; a renewal that failed (the node slow or out of reach, the mutex busy) is
        tried again a second later, so that one slow answer does not use up the lease's margin.

        Each renewal may take up to a third of the lease (20 s), or what is left of the margin if less: a
        renewal confirmed late is as good as one confirmed at once (the lease counts from when it was sent).
        Giving up after a quarter (15 s) lost locks on a loaded machine, where `podman exec` alone took
        longer: every try was cut off before it answered, and the holder stopped half-way. A renewal that
        hangs for good still leaves time for another before the margin ends (one at a sixth, one at a half).
        """
        every = self.lease_s / 6
        pause = every
        while not self._stop.wait(pause) and self.held():
            sent, pause = time.monotonic(), every
            margin = self._confirmed + self.lease_s * 5 / 6 - sent
            try:
                answer = self._run(RENEW, timeout=max(1.0, min(self.lease_s / 3, margin)))
            except (GpuPlatError, subprocess.SubprocessError, OSError) as error:
                answer = f"not renewed: {error}"
            if answer == "renewed":
                self._confirmed = sent
            elif answer.startswith("lost: "):
                self.lost.set()
                self.say(
                    f"the release lock of '{self.model}' is no longer this command's "
                    f"({answer.removeprefix('lost: ') or 'removed'})"
                )
                return
            else:
                self.say(f"the release lock of '{self.model}' was not renewed: {answer}")
                pause = min(1.0, self.lease_s / 10)

    def hand_over(self, to: str) -> None:
        """Give the lock to a process that takes it with `take(handed_by=to)`: from now on it is held under
        the name `to`, with a whole lease, and never free in between (a promote that came between this
        command's release and the taker's take would get it). This command stops renewing it and leaves it
        in place; a taker that never comes finds it taken over once that lease ends."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        answer = self._run(HAND_OVER, to)
        if answer != "handed":
            self.lost.set()
            raise LockLost(f"the release lock of '{self.model}' could not be handed over: {answer}")
        self._handed = True

    def release(self) -> None:
        """Stop renewing and remove the lock, only if it is still this command's (the script checks the
        owner on the node: a lock taken over since the last renewal is left to its new holder)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self._handed:
            return
        if not self.lost.is_set():
            self._run(RELEASE)
            return
        try:  # the lock may still be this command's, unless taken over: the script removes only its own
            self._run(RELEASE)
        except (GpuPlatError, subprocess.SubprocessError, OSError) as error:
            self.say(f"the release lock of '{self.model}' was left to its lease: {error}")


def _seconds(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0
