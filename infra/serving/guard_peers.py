"""The detached guard on a stack with several gateways: the guard runs on the first gateway (the leader) and
publishes the canary's share; every other gateway runs a follower that applies it to its own gateway and
reports its counters back.

Who reaches what (the least new reach a share on every gateway needs): each follower asks the leader, every
REPORT_EVERY_S, over HTTP on PEER_PORT of the leader's address (the network the gateways share), sending its
own gateway's figures (`gpuplat_gateway_canary.py show`) and getting back the share to apply and the guard's
state. The leader answers only a follower named in its state and only from that follower's address: nobody
else reads the state or adds counters to the analysis. No node reaches another's admin socket, shell or
programs: a compromised leader can set the canary's share on the other gateways (0 to 100 % to a version the
operator deployed) and nothing more; a compromised follower can misreport its own counters (it routes its
own requests already), and sway the verdict with them (they are summed with the others'). Plain HTTP, as
the model servers' /metrics the analysis reads: someone who can forge the leader's address on that network
can forge those as well.

Standard library only: the bundle runs on the gateway node's Python.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib import error as url_error
from urllib import request as url_request

from infra.errors import GpuPlatError
from infra.serving.metrics_text import GatewayFigures

PEER_PORT = 8406
"""the leader's port for its followers (the gateway's metrics are on 8404, its requests on 8080)"""
REPORT_EVERY_S = 2.0
CONFIRM_S = 20.0
"""how long the leader waits for every follower to report a new share applied"""
ANSWER_LIMIT = 1 << 20
# How often the board's loop looks whether the guard stopped it: `shutdown()` waits for that look, and the
# default, 0.5 s (CPython 3.11 Lib/socketserver.py, BaseServer.serve_forever), held every guard's end
# (its `systemctl stop` included) half a second after its last report.
BOARD_POLL_S = 0.05
READ_TIMEOUT_S = 10.0
"""a connection that sends no whole request within this is closed (the training nodes of an AWS stack reach
the gateways' every port: a connection left open must not hold a thread for ever); socketserver's
StreamRequestHandler sets its `timeout` on the connection (docs.python.org/3.11/library/socketserver.html,
StreamRequestHandler.timeout via BaseRequestHandler.setup)"""


@dataclass
class Report:
    at: float
    """the leader's clock when the report came"""
    figures: dict[str, Any]
    """the follower gateway's `show`"""


@dataclass
class Board:
    """What the leader publishes (the share to apply, its state) and what its followers reported last."""

    share: int
    state: dict[str, Any]
    clock: Callable[[], float] = time.time
    reports: dict[str, Report] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, share: int, state: dict[str, Any]) -> None:
        with self.lock:
            self.share, self.state = share, json.loads(json.dumps(state))

    def report(self, gateway: str, figures: dict[str, Any]) -> dict[str, Any]:
        """A follower's report; the answer it applies. Figures the guard cannot count are a ValueError and
        are not kept: one follower's unreadable report would fail every look (a canary failing behind the
        other gateways never rolled back) or the check that a share was applied."""
        countable(figures, self.state.get("backends") or {})
        with self.lock:
            self.reports[gateway] = Report(self.clock(), figures)
            return {"share": self.share, "state": self.state}

    def fresh(self, gateway: str, since: float) -> dict[str, Any] | None:
        """The follower's last figures, if they came after `since` (None: none since)."""
        with self.lock:
            found = self.reports.get(gateway)
        return found.figures if found is not None and found.at >= since else None

    def applied(self, gateway: str, share: int, since: float) -> bool:
        figures = self.fresh(gateway, since)
        return figures is not None and int(figures.get("canary_percent", -1)) == share


def countable(figures: dict[str, Any], backends: dict[str, str]) -> GatewayFigures:
    """A gateway's `show` as the guard counts it: a share from 0 to 100, counts that are counts (not
    negative), and every backend the release names."""
    try:
        found = GatewayFigures.from_show(figures)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(
            f"a gateway's figures the guard cannot read ({type(error).__name__}: {error})"
        ) from None
    missing = sorted(set(backends.values()) - set(found.requests))
    counts = (*found.requests.values(), *found.errors.values(), *found.servers_up.values())
    if not 0 <= found.canary_percent <= 100 or min(counts, default=0) < 0 or missing:
        raise ValueError(
            f"a gateway's figures the guard cannot count: share {found.canary_percent} %, a negative count "
            f"or no backend {', '.join(missing) or '-'}"
        )
    return found


def resolved(address: str) -> str:
    """The address a name stands for (a container's name on the local platform), else the name as given."""
    try:
        return socket.gethostbyname(address)
    except OSError:
        return address


def serve_board(
    board: Board, model: str, followers: dict[str, str], port: int = PEER_PORT
) -> ThreadingHTTPServer:
    """The leader's answer to its followers (`followers`: gateway -> address), in a thread of its own."""
    allowed = {gateway: resolved(address) for gateway, address in followers.items()}

    class Answer(BaseHTTPRequestHandler):
        timeout = READ_TIMEOUT_S

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length", ""))
                if not 0 <= length <= ANSWER_LIMIT:  # read(-1) reads to the end, however far
                    raise ValueError(length)
                body = json.loads(self.rfile.read(length))
                gateway, figures = str(body["gateway"]), dict(body["figures"])
            except (ValueError, KeyError, TypeError):
                self.send_error(400, "a follower's report is JSON with gateway and figures")
                return
            if self.path != f"/{model}" or allowed.get(gateway) != self.client_address[0]:
                self.send_error(403, "not a follower of this guard")
                return
            try:
                encoded = json.dumps(board.report(gateway, figures)).encode()
            except ValueError as error:
                self.send_error(400, str(error))
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(encoded)))
            self.end_headers()
            self.wfile.write(encoded)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class FollowersOnly(ThreadingHTTPServer):
        def verify_request(self, request: Any, client_address: Any) -> bool:
            """A connection from an address that is no follower's is closed before a thread or a byte is
            spent on it (BaseServer._handle_request_noblock calls this first: CPython 3.11,
            Lib/socketserver.py)."""
            return bool(client_address[0] in allowed.values())

    try:
        server = FollowersOnly(("", port), Answer)
    except OSError as error:
        raise GpuPlatError(
            f"the guard of '{model}' cannot answer its followers on port {port} of this node ({error}): "
            "another program holds it; free it and start the guard again"
        ) from None
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": BOARD_POLL_S}, name="guard-board", daemon=True
    ).start()
    return server


def ask_leader(url: str, gateway: str, figures: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """One report to the leader; its answer (OSError or ValueError: no answer)."""
    body = json.dumps({"gateway": gateway, "figures": figures}).encode()
    sent = url_request.Request(url, body, {"Content-Type": "application/json"}, method="POST")
    try:
        with url_request.urlopen(sent, timeout=timeout) as answer:
            found = json.loads(answer.read(ANSWER_LIMIT * 8))
    except url_error.URLError as error:
        raise OSError(str(error.reason)) from None
    if not isinstance(found, dict) or not isinstance(found.get("share"), int):
        raise ValueError("the leader's answer holds no share")
    return found
