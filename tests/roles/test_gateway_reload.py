"""The AWS gateway's slots survive a reload and a restart with the real HAProxy (Debian's 2.6), under load.

HAProxy runs in master-worker mode from the configuration the role renders for aws (discover: server
slots filled at run time) and is reloaded and stopped with the commands of the unit's drop-in
(templates/gpuplat-server-state.conf.j2: ExecReload, ExecStop, KillSignal), as systemd runs them. Two
model servers on loopback (127.0.0.1 and 127.0.0.2) answer each request after a few milliseconds;
the targets program fills two slots with them once, then never runs again: whatever the gateway
serves after the reload and the restart, it found in the state file.

Clients: keep-alive ones (one connection reused) and `Connection: close` ones, all the time. A
failed request is any answer but 200, or a connection lost after the request was sent. A connection
refused while no process listens (between the stop and the start) sent nothing: the client tries it
again and the test counts it apart.

Needs /usr/sbin/haproxy (scripts/setup-host.sh installs Debian's package); skips saying so without it.
"""

from __future__ import annotations

import datetime
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import load_script
from tests.roles.test_serving_discovery import REGION, STACK, targets_program
from tests.roles.test_serving_templates import ROLES, cluster, render, role_vars, scaling_agent
from tests.threaded_server import serve_in_thread

HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
TEMPLATES = ROLES / "inference_gateway" / "templates"
MODEL_SERVERS = ("127.0.0.1", "127.0.0.2")
# The package's unit (Debian bookworm's haproxy 2.6: /lib/systemd/system/haproxy.service): ExecStart,
# and the signal systemd stops it with unless a drop-in says otherwise.
PACKAGE_START = "{haproxy} -Ws -f $CONFIG -p $PIDFILE $EXTRAOPTS"
PACKAGE_KILL_SIGNAL = "SIGTERM"
# The unit's programs, as this host has them.
HOST_PROGRAMS = {"/usr/sbin/haproxy": str(HAPROXY), "/usr/bin/python3": sys.executable}

pytestmark = pytest.mark.skipif(
    HAPROXY is None, reason="no haproxy binary: scripts/setup-host.sh installs Debian's package"
)


def canary_program() -> ModuleType:
    """roles/inference_gateway/files/gpuplat_gateway_canary.py (it imports the targets program's client)."""
    targets_program()
    return load_script(ROLES / "inference_gateway" / "files" / "gpuplat_gateway_canary.py")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ModelServer:
    """A replica: /health 200; any other path answers after `delay_s`, so requests are in flight."""

    def __init__(self, address: str, port: int, delay_s: float = 0.02) -> None:
        self.address = address
        self.requests = 0  # answered, health checks aside
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path != "/health":
                    time.sleep(delay_s)
                    replica.requests += 1
                body = b'{"ok":true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # HAProxy's health checks close without reading the whole answer

        self.server = Server((address, port), Handler)
        serve_in_thread(self.server)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Tally:
    ok: int = 0
    refused: int = 0
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, ok: bool = False, refused: bool = False, failure: str = "") -> None:
        with self.lock:
            self.ok += ok
            self.refused += refused
            if failure:
                self.failures.append(failure)


class Load:
    """Clients sending GET /v1/embeddings in a loop: keep-alive ones and Connection: close ones."""

    def __init__(self, port: int, keep_alive: int = 3, close: int = 3) -> None:
        self.port = port
        self.stopping = threading.Event()
        self.tally = {"keep-alive": Tally(), "close": Tally()}
        self.threads = [
            threading.Thread(target=self.client, args=(kind,), daemon=True)
            for kind, count in (("keep-alive", keep_alive), ("close", close))
            for _ in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def client(self, kind: str) -> None:
        tally = self.tally[kind]
        connection: http.client.HTTPConnection | None = None
        while not self.stopping.is_set():
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                try:
                    connection.connect()
                except ConnectionRefusedError:  # nothing listens: nothing was sent
                    connection = None
                    tally.add(refused=True)
                    time.sleep(0.01)
                    continue
            headers = {"Connection": "close"} if kind == "close" else {}
            try:
                connection.request("GET", "/v1/embeddings", headers=headers)
                answer = connection.getresponse()
                answer.read()
                if answer.status == 200:
                    tally.add(ok=True)
                else:
                    tally.add(failure=f"HTTP {answer.status}")
                if kind == "close" or answer.will_close:
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException) as exc:
                tally.add(failure=f"{type(exc).__name__}: {exc}")
                connection.close()
                connection = None

    def counts(self) -> dict[str, tuple[int, int, int]]:
        return {kind: (t.ok, len(t.failures), t.refused) for kind, t in self.tally.items()}

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=15)


class FakeEc2:
    """ec2:DescribeInstances (paginated) for two running instances at the model servers' addresses."""

    def __init__(self, addresses: tuple[str, ...]) -> None:
        self.page = {
            "Reservations": [
                {
                    "Instances": [
                        {"InstanceId": f"i-{n}", "State": {"Name": "running"}, "PrivateIpAddress": address}
                        for n, address in enumerate(addresses)
                    ]
                }
            ]
        }

    def get_paginator(self, name: str) -> FakeEc2:
        assert name == "describe_instances"
        return self

    def paginate(self, **_: Any) -> list[dict[str, Any]]:
        return [self.page]


@dataclass
class Gateway:
    """The gateway as the role installs it on aws, run as its systemd unit would run it."""

    directory: Path
    port: int
    server_port: int
    agent_port: int
    config: Path = field(init=False)
    dropin: dict[str, list[str]] = field(init=False)
    master: subprocess.Popen[bytes] | None = None
    replicas: list[ModelServer] = field(default_factory=list)
    canary_port: int = field(default_factory=lambda: free_port())

    def __post_init__(self) -> None:
        variables = role_vars(
            "inference_gateway",
            {
                **cluster(replicas=1, tp=1),
                "gpuplat_backend": "aws",
                "gpuplat_stack": STACK,
                "gpuplat_region": REGION,
                "inference_gateway_max_servers": 4,
                "inference_gateway_port": self.port,
                "inference_gateway_bind_address": "127.0.0.1",
                "inference_gateway_metrics_port": free_port(),
                "inference_gateway_server_port": self.server_port,
                "inference_gateway_canary_port": self.canary_port,
                "inference_gateway_agent_port": self.agent_port,
                "inference_gateway_health_interval_s": 1,
                "inference_gateway_timeout_s": 20,
                "inference_gateway_log_target": "127.0.0.1:9",
            },
        )
        # The role's own paths, under this test's directory (set after role_vars: vars/main.yml wins there).
        variables.update(
            __inference_gateway_admin_socket=str(self.directory / "admin.sock"),
            __inference_gateway_state_file=str(self.directory / "state" / "server-state"),
            __inference_gateway_targets_dir=str(ROLES / "inference_gateway" / "files"),
            __inference_gateway_version_map=str(self.directory / "versions.map"),
        )
        # As the role creates it before the configuration (every draw to the stable backend).
        canary = canary_program()
        canary.write_map(Path(variables["__inference_gateway_version_map"]), canary.version_map(0))
        self.variables = variables
        config = render(TEMPLATES / "haproxy.cfg.j2", {**variables, "__inference_gateway_backends": []})
        # The host's own settings: no privilege drop (the test may run as any user), no daemon (the
        # test holds the master process, as systemd does with -Ws).
        config = re.sub(r"^\s+(user|group) haproxy\n|^\s+daemon\n", "", config, flags=re.MULTILINE)
        self.config = self.directory / "haproxy.cfg"
        self.config.write_text(config)
        self.dropin = unit_settings(render(TEMPLATES / "gpuplat-server-state.conf.j2", variables))
        self.environment = {
            "CONFIG": str(self.config),
            "PIDFILE": str(self.directory / "haproxy.pid"),
            "EXTRAOPTS": f"-S {self.directory / 'master.sock'}",
        }

    @property
    def admin_socket(self) -> str:
        return str(self.variables["__inference_gateway_admin_socket"])

    def command(self, line: str) -> list[str]:
        """A unit's command line as systemd runs it: $VARIABLES expanded, its programs on this host."""
        environment = {**self.environment, "MAINPID": str(self.master.pid if self.master else 0)}
        words = []
        for word in line.split():
            if word.startswith("$"):
                words.extend(environment[word[1:]].split())
            else:
                words.append(HOST_PROGRAMS.get(word, word))
        return words

    def run_unit_commands(self, setting: str) -> None:
        for line in self.dropin.get(setting, []):
            ignore_failure = line.startswith("-")
            result = subprocess.run(self.command(line.lstrip("-")), capture_output=True, timeout=30)
            assert ignore_failure or result.returncode == 0, (line, result.stderr.decode())

    def start(self) -> None:
        assert self.master is None
        self.master = subprocess.Popen(
            self.command(PACKAGE_START.format(haproxy=HAPROXY)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        wait_for(lambda: Path(self.admin_socket).exists() and listening(self.port), "HAProxy listening")

    def reload(self) -> None:
        """systemctl reload: the drop-in's ExecReload lines (check, save the state, USR2 to the master)."""
        workers = self.workers()
        self.run_unit_commands("ExecReload")
        wait_for(lambda: self.workers() - workers, "a new worker")

    def stop(self) -> None:
        """systemctl stop: ExecStop, then KillSignal to the main process, which must leave in time."""
        assert self.master is not None
        self.run_unit_commands("ExecStop")
        kill_signal = (self.dropin.get("KillSignal") or [PACKAGE_KILL_SIGNAL])[-1]
        self.master.send_signal(getattr(signal, kill_signal))
        timeout = float((self.dropin.get("TimeoutStopSec") or ["90"])[-1])
        try:
            status = self.master.wait(timeout=timeout)
        finally:
            if self.master.poll() is None:
                self.master.kill()
                self.master.wait()
            self.master = None
        # A status systemd counts as a clean stop (the package's SuccessExitStatus=143 and 0).
        assert status in (0, 143), f"HAProxy's master left with status {status}"

    def workers(self) -> set[int]:
        assert self.master is not None
        children = Path(f"/proc/{self.master.pid}/task/{self.master.pid}/children")
        return {int(pid) for pid in children.read_text().split()} if children.exists() else set()


def unit_settings(text: str) -> dict[str, list[str]]:
    """The settings of a systemd unit file, in order; an empty assignment resets the list, as systemd does."""
    settings: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith(("#", "[")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        settings[key] = [*settings.get(key, []), value] if value else []
    return settings


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def wait_for(condition: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout_s} s"
        time.sleep(0.02)


def serving(program: ModuleType, gateway: Gateway) -> set[tuple[str, int]]:
    """The slots in service that HAProxy's checks count up."""
    slots = program.RuntimeApi(gateway.admin_socket).slots("inference", "slot-")
    return {slot.target for slot in slots if not slot.in_maintenance and slot.op_state == program.OP_RUNNING}


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    # A short path: UNIX socket paths are limited to ~107 bytes.
    with tempfile.TemporaryDirectory(prefix="gwr") as directory:
        server_port = free_port()
        gateway = Gateway(Path(directory), port=free_port(), server_port=server_port, agent_port=free_port())
        gateway.replicas = [ModelServer(address, server_port) for address in MODEL_SERVERS]
        try:
            yield gateway
        finally:
            if gateway.master is not None:
                gateway.master.kill()
                gateway.master.wait()
            for pid in gateway_pids(Path(directory)):
                os.kill(pid, signal.SIGKILL)
            for replica in gateway.replicas:
                replica.stop()


def gateway_pids(directory: Path) -> list[int]:
    """HAProxy processes (workers left behind) started from this test's configuration."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(directory).encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def fill_slots(program: ModuleType, gateway: Gateway) -> None:
    """One pass of the targets program: a slot for each model server."""
    program.sync(
        FakeEc2(MODEL_SERVERS),
        program.RuntimeApi(gateway.admin_socket),
        stack=STACK,
        role="infer",
        pools=[],
        base_port=gateway.server_port,
        replicas=1,
        backend="inference",
        prefix="slot-",
    )


def test_a_reload_and_a_restart_keep_the_slots_and_lose_no_request(gateway: Gateway) -> None:
    program = targets_program()
    wanted = {(address, gateway.server_port) for address in MODEL_SERVERS}
    gateway.start()
    assert serving(program, gateway) == set()  # a first start: every slot disabled, nothing to serve

    # One pass of the targets program; then it never runs again in this test.
    fill_slots(program, gateway)
    wait_for(lambda: serving(program, gateway) == wanted, "both slots up on HAProxy's checks")

    load = Load(gateway.port)
    try:
        time.sleep(1.0)
        before_reload = load.counts()
        gateway.reload()
        assert serving(program, gateway) == wanted  # the new process: the slots' addresses, up
        time.sleep(1.5)
        after_reload = load.counts()

        gateway.stop()
        gateway.start()
        # Before any check of the new process could count a server up (rise 2 x inter 1 s): from the
        # state file.
        assert serving(program, gateway) == wanted
        time.sleep(1.5)
    finally:
        load.stop()
    counts = load.counts()
    failures = {kind: tally.failures[:5] for kind, tally in load.tally.items() if tally.failures}
    assert not failures, (failures, counts)
    for kind in ("keep-alive", "close"):
        # Requests went through in every phase: before the reload, across it, across the restart.
        assert before_reload[kind][0] > 0 and after_reload[kind][0] > before_reload[kind][0], kind
        assert counts[kind][0] > after_reload[kind][0], kind
    print(f"\nrequests answered 200, failed, connects refused while stopped: {counts}")


def test_a_spot_interruption_drains_the_node_on_the_gateway(gateway: Gateway) -> None:
    """Each node's scaling agent answers the gateway's agent check; EC2 posts a Spot interruption notice
    in one node's instance metadata (the box's IMDSv2 stand-in): that node's slot goes to DRAIN on
    HAProxy and gets no new request, the other takes them all, none fails."""
    from tests.box.imds import InstanceMetadata

    program, agent = targets_program(), scaling_agent()
    gateway.start()
    fill_slots(program, gateway)
    api = program.RuntimeApi(gateway.admin_socket)
    staying, leaving = gateway.replicas
    metadata = InstanceMetadata(
        lambda address: {"InstanceId": "i-leaving", "Tags": []}, port=0, address="127.0.0.1"
    )
    endpoint = f"http://127.0.0.1:{metadata.server.server_address[1]}"
    checks = [agent.AgentCheck(gateway.agent_port, replica.address) for replica in gateway.replicas]
    load = None
    try:
        wait_for(lambda: len(serving(program, gateway)) == 2, "both slots up")
        load = Load(gateway.port, keep_alive=2, close=2)
        assert agent.wait_or_leave(0.2, endpoint, poll_s=0.1) is None  # no notice (404)
        time.sleep(0.5)
        assert leaving.requests > 0

        metadata.interrupt("i-leaving", datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=2))
        why = agent.wait_or_leave(5.0, endpoint, poll_s=0.1)
        assert why is not None and why.reason.startswith("spot terminate at ")
        checks[1].drain()  # what leave() does first
        # HAProxy's agent check (agent-inter 1 s here) reads "drain" from the leaving node.
        wait_for(
            lambda: {s.address for s in api.slots("inference", "slot-") if s.draining} == {leaving.address},
            "the leaving node's slot in drain",
        )
        time.sleep(0.2)  # requests sent before the drain finish
        before, staying_before = leaving.requests, staying.requests
        time.sleep(1.0)
        assert leaving.requests == before and staying.requests > staying_before
    finally:
        if load is not None:
            load.stop()
        for check in checks:
            check.close()
        metadata.stop()
    assert load is not None and not [t.failures for t in load.tally.values() if t.failures]
