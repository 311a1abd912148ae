"""The host's work on each node, the nodes at once: each piece is mostly a `podman exec` (about 0.2 s on a
shared 2-core machine), so one node after another made seconds of a no-change `gpuplat up`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

MOST_AT_ONCE = 8
"""Threads at most: on a 50-node stack, 50 pollers would each start a `podman exec` every half second."""
LOOK_S = 0.5
"""How often the caller's thread wakes while it waits, so that a Ctrl-C reaches it whichever thread the
kernel handed the signal to."""


def at_once(work: Callable[[Item, threading.Event], Result], items: Sequence[Item]) -> list[Result]:
    """`work(item, stop)` for every item, MOST_AT_ONCE at a time; the results in the items' order. The first
    failure, or an interrupt of the caller, is raised at once: `stop` is set (a long wait in `work` looks at
    it and gives up) and what has not started is dropped, so no one waits for the slowest node."""
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=max(1, min(len(items), MOST_AT_ONCE)))
    try:
        futures: list[Future[Result]] = [pool.submit(work, item, stop) for item in items]
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=LOOK_S, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f.done() and f.exception() is not None), None)
            if failed is not None:
                raise failed.exception()  # type: ignore[misc]
        return [future.result() for future in futures]
    finally:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
