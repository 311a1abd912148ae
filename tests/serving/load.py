"""The serving scenario's nodes, commands on them, and the clients that load its gateways."""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

HEAD, INFER = "gpuplat-molecule-head-0", "gpuplat-molecule-infer-0"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
VERSION_HEADER = "X-Gpuplat-Model-Version"
# The gateway published on the host's loopback (molecule/serving/molecule.yml).
GATEWAY_ADDRESS = ("127.0.0.1", 18080)


@dataclass(frozen=True)
class Answer:
    sent: float
    at: float
    status: int
    version: str


def node(container: str, *command: str, stdin: str | None = None) -> str:
    """A command on one of the scenario's nodes; its output (fails the test if the command fails)."""
    done = subprocess.run(
        ["podman", "exec", *(["-i"] if stdin is not None else []), container, *command],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, (command, done.stderr)
    return done.stdout


def wait_for(what: str, check: Callable[[], object], timeout_s: float, poll_s: float = 0.5) -> float:
    """Seconds until `check()` holds (polled every `poll_s`); fails past `timeout_s`."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(poll_s)
    return time.monotonic() - started


@contextmanager
def keeping_alive(
    answers: list[Answer],
    failures: list[str],
    clients: int,
    *,
    close: bool = False,
    gateway: tuple[str, int] = GATEWAY_ADDRESS,
    refused: list[float] | None = None,
    pause_s: float = 0.0,
) -> Iterator[None]:
    """`clients` clients sending requests through the gateway one after another, each on a connection it
    keeps open as long as the gateway does (a new one only after an answer that says `Connection: close`);
    with `close`, each request asks for `Connection: close`, so every request opens a connection of its own.
    Anything but a complete answer (a reset, a connection closed under a request) is a failure. With
    `refused`, a connection refused before anything was sent (no process listens: a gateway restarting) is
    not: its time goes there and the client connects again; without it, it is a failure too. `pause_s`: each
    client's wait after an answer (a load the nodes' CPUs leave room beside)."""
    stop = threading.Event()
    body = json.dumps({"model": MODEL, "input": "a canary release"}).encode()
    headers = {"Content-Type": "application/json", **({"Connection": "close"} if close else {})}

    def client() -> None:
        connection = http.client.HTTPConnection(*gateway, timeout=30)
        while not stop.is_set():
            sent = time.monotonic()
            try:
                if connection.sock is None and refused is not None:
                    try:
                        connection.connect()
                    except ConnectionRefusedError:
                        refused.append(sent)
                        time.sleep(0.01)
                        continue
                connection.request("POST", "/v1/embeddings", body, headers)
                reply = connection.getresponse()
                reply.read()
            except (OSError, http.client.HTTPException) as failure:
                failures.append(f"{time.monotonic() - sent:.2f} s: {failure!r}")
                connection.close()
                continue
            answers.append(
                Answer(sent, time.monotonic(), reply.status, reply.getheader(VERSION_HEADER) or "-")
            )
            if reply.will_close:
                connection.close()
            stop.wait(pause_s)
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()
