"""Start a socketserver server (the tests' fake HTTP and Unix-socket servers) on a daemon thread.

`BaseServer.shutdown()` waits until the `serve_forever` loop sees the request, and the loop looks once
per `poll_interval`: 0.5 s by default (CPython 3.11 Lib/socketserver.py, BaseServer.serve_forever and
shutdown). Each fixture that stopped a server after its last request idled that half second: some
60 tests, about 30 s of a core in the unit tier. Looking every 20 ms costs a few hundred idle wake-ups
per test run."""

from __future__ import annotations

import socketserver
import threading

POLL_S = 0.02


def serve_in_thread(server: socketserver.BaseServer) -> threading.Thread:
    """`server.serve_forever` started on a daemon thread that `server.shutdown()` stops within POLL_S."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True)
    thread.start()
    return thread
