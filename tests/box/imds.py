"""Instance metadata for the box's instances: one IMDSv2 server on 169.254.169.254:80, added to the box
network's bridge on the host. Containers reach it through their default route, as instances reach the
real one; the caller's source address says which instance asks (its private IP in the emulator).

Served, as EC2 serves them (EC2 User Guide, "Instance metadata categories"): api/token (PUT, required:
the launch templates set http_tokens required; a token lives for the TTL it was asked for, 1 to 21600 s,
and only on the instance that asked), instance-id, local-ipv4, placement/availability-zone,
tags/instance and tags/instance/<key> (read live from the emulator, so tags set after launch show),
iam/security-credentials/<role> (the instance profile's role, with keys the emulator accepts), and
spot/instance-action once a test has set a notice (404 before, as on EC2). Tags only where the
instance's metadata options allow them (InstanceMetadataTags enabled), as on EC2.
"""

from __future__ import annotations

import datetime
import json
import secrets
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.threaded_server import serve_in_thread

IMDS_ADDRESS = "169.254.169.254"


# How long an instance's description is reused: the real service answers in milliseconds, and asking
# the emulator on every request makes the box's answers slower than botocore's one-second timeout
# when the box is busy. Tags set after launch still show within this.
DESCRIBE_TTL_S = 2.0


# IMDSv2 session tokens live 1 s to 6 h, as the PUT's TTL header asks; other values are refused (EC2 User
# Guide, "Use the Instance Metadata Service to access instance metadata": "a minimum of one second, and a
# maximum of six hours (21,600 seconds)"), and a token works only on the instance it was issued to.
TOKEN_TTL_MIN_S = 1
TOKEN_TTL_MAX_S = 21600


def token_ttl(header: str | None) -> int | None:
    """The TTL the PUT asks for, or None where EC2 answers 400 (missing, not a number, out of range)."""
    if header is None or not header.strip().isdigit():
        return None
    ttl = int(header)
    return ttl if TOKEN_TTL_MIN_S <= ttl <= TOKEN_TTL_MAX_S else None


class InstanceMetadata:
    def __init__(
        self, describe: Callable[[str], dict[str, Any] | None], port: int = 80, address: str = IMDS_ADDRESS
    ) -> None:
        """`describe(private_ip)` returns the emulator's instance with that address, or None. A test of a
        program on this host binds it to loopback (`address`, port 0: any free port)."""
        self._describe = describe
        self._described: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self.tokens: dict[str, tuple[str, float]] = {}  # token -> the address it was issued to, its end
        self.notices: dict[str, dict[str, str]] = {}
        self.lifecycle: dict[str, str] = {}  # instance id -> autoscaling/target-lifecycle-state
        self.lock = threading.Lock()
        box = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, status: int, body: str = "", content_type: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                ttl = token_ttl(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"))
                if self.path != "/latest/api/token" or ttl is None:
                    self._send(400)
                    return
                token = secrets.token_urlsafe(24)
                with box.lock:
                    box.tokens[token] = (self.client_address[0], time.monotonic() + ttl)
                self._send(200, token)

            def do_GET(self) -> None:
                with box.lock:
                    issued = box.tokens.get(self.headers.get("X-aws-ec2-metadata-token") or "")
                # A token is good until its TTL, and only on the instance that asked for it.
                valid = (
                    issued is not None
                    and issued[0] == self.client_address[0]
                    and time.monotonic() < issued[1]
                )
                if not valid:
                    self._send(401)
                    return
                instance = box.describe(self.client_address[0])
                if instance is None or not self.path.startswith("/latest/meta-data/"):
                    self._send(404)
                    return
                value = box.value(instance, self.path.removeprefix("/latest/meta-data/"))
                if value is None:
                    self._send(404)
                else:
                    self._send(200, value)

        self.server = ThreadingHTTPServer((address, port), Handler)
        self.server.daemon_threads = True
        self.thread = serve_in_thread(self.server)

    def describe(self, address: str) -> dict[str, Any] | None:
        with self.lock:
            cached = self._described.get(address)
        if cached is not None and time.monotonic() - cached[0] < DESCRIBE_TTL_S:
            return cached[1]
        instance = self._describe(address)
        with self.lock:
            self._described[address] = (time.monotonic(), instance)
        return instance

    def value(self, instance: dict[str, Any], path: str) -> str | None:
        tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
        role = str(instance.get("IamInstanceProfile", {}).get("Arn", "/box-node")).rsplit("/", 1)[-1]
        fixed = {
            "instance-id": instance["InstanceId"],
            "local-ipv4": instance.get("PrivateIpAddress", ""),
            "instance-type": instance.get("InstanceType", ""),
            "placement/availability-zone": instance.get("Placement", {}).get("AvailabilityZone", ""),
            "tags/instance": "\n".join(sorted(tags)),
            "iam/security-credentials/": role,
        }
        tags_readable = instance.get("MetadataOptions", {}).get("InstanceMetadataTags") == "enabled"
        if path.startswith("tags/") and not tags_readable:
            return None  # EC2 answers 404 unless the instance allows tags in its metadata
        if path in fixed:
            return str(fixed[path])
        if path.startswith("tags/instance/"):
            return tags.get(path.removeprefix("tags/instance/"))
        if path == f"iam/security-credentials/{role}":
            expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=6)
            return json.dumps({
                "Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": "box", "SecretAccessKey": "box",
                "Token": "box", "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "LastUpdated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            })  # fmt: skip
        if path == "autoscaling/target-lifecycle-state":
            with self.lock:
                return self.lifecycle.get(instance["InstanceId"])
        if path == "spot/instance-action":
            with self.lock:
                notice = self.notices.get(instance["InstanceId"])
            return json.dumps(notice) if notice else None
        return None

    def interrupt(self, instance_id: str, when: datetime.datetime) -> None:
        """Post a spot interruption notice (action terminate at `when`), as EC2 does two minutes ahead."""
        with self.lock:
            self.notices[instance_id] = {"action": "terminate", "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}

    def transition(self, instance_id: str, state: str) -> None:
        """The target lifecycle state Auto Scaling moves the instance to (InService, Terminated, ...)."""
        with self.lock:
            self.lifecycle[instance_id] = state

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# Not modelled: the PUT response's IP hop limit (http_put_response_hop_limit 1 keeps containers on a
# node from the token; the box's instances are containers one hop from the host, so every answer
# arrives); the credentials path answers the instance profile's name where EC2 answers the role's.
