"""The event loops the Pulumi SDK leaves behind, closed before the process ends. No Pulumi import here:
the CLI ends every command with `release_event_loops`, most of which never start the SDK."""

from __future__ import annotations

import asyncio
import gc

_sdk_ran = False


def note_sdk_ran() -> None:
    """Called by whatever runs the Pulumi SDK in this process: there may be loops to release at the end."""
    global _sdk_ran
    _sdk_ran = True


def release_event_loops() -> None:
    """Close the event loops the Pulumi SDK leaves behind (it creates one on demand when none is set)
    while their sockets are still open. Left to the garbage collector, a loop and its self-pipe sit in
    one reference cycle, the sockets may be finalized first, and the loop's finalizer then prints
    'Exception ignored in BaseEventLoop.__del__ ... Invalid file descriptor'.

    Only after the SDK ran in this process: the sweep walks every object on the heap, which a command that
    never started the SDK (`--help`, `size`, `ssh`, most of them) has no loop to pay for.

    No collection follows: a closed loop's finalizer prints nothing (CPython 3.11.7
    Lib/asyncio/base_events.py lines 690-694: BaseEventLoop.__del__ acts only on a loop still open),
    and the walk already finds the loops that are unreachable garbage not yet collected
    (gc.get_objects lists every object the collector tracks). A full collection after the walk cost
    some 50 ms in a CLI process and 77 ms in a test worker, about four times the walk."""
    global _sdk_ran
    if not _sdk_ran:
        return
    _sdk_ran = False
    for obj in gc.get_objects():
        if isinstance(obj, asyncio.AbstractEventLoop) and not obj.is_running() and not obj.is_closed():
            obj.close()
    asyncio.set_event_loop(None)
