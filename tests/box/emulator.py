"""The AWS API of the box: moto in server mode on loopback, and in front of it a proxy on the box
network's gateway address that the instances use as their endpoint. The proxy forwards every request
unchanged, except where a test armed a fault for an EC2 action: then it answers what EC2 answers for
that fault (moto never fails for capacity), and RunInstances, which it has start as many instances as
EC2 would (moto starts exactly MinCount) within the capacity a test left.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.threaded_server import serve_in_thread

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "box", "AWS_SECRET_ACCESS_KEY": "box", "AWS_SESSION_TOKEN": "box"}
_FAULT_BODY = """<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>
<RequestID>box-fault</RequestID></Response>"""
# EC2 answers capacity errors with HTTP 500 (InsufficientInstanceCapacity is a server-side error code:
# EC2 API Reference, "Error codes for the Amazon EC2 API", server errors).
FAULT_STATUS = {"InsufficientInstanceCapacity": 500}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class Faults:
    """Armed faults: EC2 action -> [error code, times left]."""

    armed: dict[str, list[Any]] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)
    capacity: int | None = None
    # Launch templates (pools) EC2 has no capacity for: their RunInstances get InsufficientInstanceCapacity.
    no_capacity_templates: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def arm(self, action: str, code: str, times: int = 1) -> None:
        with self.lock:
            self.armed[action] = [code, times]

    def take(self, action: str) -> str | None:
        with self.lock:
            self.seen.append(action)
            entry = self.armed.get(action)
            if not entry or entry[1] <= 0:
                return None
            entry[1] -= 1
            return str(entry[0])

    def count(self, action: str) -> int:
        with self.lock:
            return self.seen.count(action)

    def limit_capacity(self, instances: int | None) -> None:
        """Instances RunInstances can still start (None: no limit)."""
        with self.lock:
            self.capacity = instances

    def refuse_capacity(self, template_id: str, refused: bool = True) -> None:
        with self.lock:
            (self.no_capacity_templates.add if refused else self.no_capacity_templates.discard)(template_id)

    def has_capacity(self, template_id: str) -> bool:
        with self.lock:
            return template_id not in self.no_capacity_templates

    def launch_count(self, min_count: int, max_count: int) -> int | None:
        """How many instances a RunInstances for MinCount..MaxCount starts, as EC2 decides: as many as it
        can up to MaxCount, none (None: InsufficientInstanceCapacity) when that is below MinCount (EC2
        API Reference, RunInstances, MinCount). moto starts exactly MinCount, so the proxy asks it for
        this many."""
        with self.lock:
            available = max_count if self.capacity is None else min(max_count, self.capacity)
            if available < min_count:
                return None
            if self.capacity is not None:
                self.capacity -= available
            return available


class MotoServer:
    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("wb")
        binary = Path(sys.executable).with_name("moto_server")
        self.process = subprocess.Popen(
            [str(binary), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **CREDENTIALS},
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"moto_server did not listen on {self.url} within 30 s (log {log})")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()


def ec2_action(body: bytes, query: str) -> str:
    """The Action of an EC2 query-protocol request (form body or query string)."""
    for text in (body.decode(errors="replace"), query):
        values = urllib.parse.parse_qs(text).get("Action")
        if values:
            return values[0]
    return ""


def template_network(ec2: Any, body: bytes) -> bytes:
    """EC2 launches with the network interfaces, metadata options and shutdown behaviour of the launch
    template a RunInstances names; moto takes them only from the request (moto/ec2/models/instances.py:
    prep_nics, MetadataOptions, instance_initiated_shutdown_behavior) and otherwise invents an address
    in no subnet. Add the template's to such a request (its network unless the request names one), as
    EC2 applies them."""
    form = urllib.parse.parse_qs(body.decode(), keep_blank_values=True)
    template_id = form.get("LaunchTemplate.LaunchTemplateId", [""])[0]
    if not template_id:
        return body
    version = form.get("LaunchTemplate.Version", ["$Latest"])[0]
    data = ec2.describe_launch_template_versions(LaunchTemplateId=template_id, Versions=[version])[
        "LaunchTemplateVersions"
    ][0]["LaunchTemplateData"]
    extra: list[tuple[str, str]] = []
    own_network = any(k.startswith(("NetworkInterface.", "SubnetId")) for k in form)
    for index, interface in enumerate([] if own_network else data.get("NetworkInterfaces", []), start=1):
        prefix = f"NetworkInterface.{index}"
        extra += [(f"{prefix}.DeviceIndex", str(interface.get("DeviceIndex", 0)))]
        if "SubnetId" in interface:
            extra += [(f"{prefix}.SubnetId", interface["SubnetId"])]
        for number, group in enumerate(interface.get("Groups", []), start=1):
            extra += [(f"{prefix}.SecurityGroupId.{number}", group)]
    if not any(k.startswith("MetadataOptions.") for k in form):
        extra += [(f"MetadataOptions.{k}", str(v)) for k, v in data.get("MetadataOptions", {}).items()]
    behaviour = data.get("InstanceInitiatedShutdownBehavior")
    if behaviour and "InstanceInitiatedShutdownBehavior" not in form:
        extra += [("InstanceInitiatedShutdownBehavior", str(behaviour))]
    return body + ("&" + urllib.parse.urlencode(extra)).encode() if extra else body


def launch_as_ec2(body: bytes, faults: Faults) -> tuple[bytes, str | None]:
    """A RunInstances form rewritten so that moto starts what EC2 would (Faults.launch_count), or the
    capacity error EC2 answers instead (none left, or none for the request's launch template)."""
    form = urllib.parse.parse_qs(body.decode(), keep_blank_values=True)
    if not faults.has_capacity(form.get("LaunchTemplate.LaunchTemplateId", [""])[0]):
        return body, "InsufficientInstanceCapacity"
    min_count, max_count = int(form["MinCount"][0]), int(form["MaxCount"][0])
    count = faults.launch_count(min_count, max_count)
    if count is None:
        return body, "InsufficientInstanceCapacity"
    form["MinCount"] = form["MaxCount"] = [str(count)]
    return urllib.parse.urlencode(form, doseq=True).encode(), None


class FaultProxy:
    """Forwards to moto; answers an armed fault instead for the matching EC2 action, and completes
    RunInstances requests from their launch template (`template_network`)."""

    def __init__(self, host: str, upstream_port: int, faults: Faults, ec2: Any) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                action = ec2_action(body, urllib.parse.urlsplit(self.path).query)
                fault = faults.take(action) if action else None
                if fault is None and action == "RunInstances":
                    body, fault = launch_as_ec2(body, faults)
                if fault is not None:
                    payload = _FAULT_BODY.format(code=fault, message=f"box: injected {fault}").encode()
                    self.send_response(FAULT_STATUS.get(fault, 400))
                    self.send_header("Content-Type", "text/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if action == "RunInstances":
                    body = template_network(ec2, body)
                connection = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "connection", "content-length")
                }
                connection.request(self.command, self.path, body=body or None, headers=headers)
                response = connection.getresponse()
                data = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in (
                        "transfer-encoding",
                        "connection",
                        "content-length",
                        "server",
                        "date",
                    ):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                connection.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = serve_in_thread(self.server)
        _ = proxy

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
