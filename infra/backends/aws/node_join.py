"""The node side of the AWS boot: find this instance's node name, take it as hostname, and fetch what
Ansible needs to configure it (the bundle, the stack's group vars, the MUNGE key).

The boot script (infra/backends/aws/bootstrap.py) writes this file onto the node and runs it with the
Python of the venv it installed Ansible into (boto3 is installed next to Ansible; nothing of the AWS CLI
is assumed: neither Ubuntu's nor Debian's cloud images ship it). Stdlib and boto3 only.

Settings come from the environment (GPUPLAT_*, written by the boot script). What another resource of
the stack provides may not exist yet when the node boots (the group vars wait for the filesystem, the
resume program tags the instance right after RunInstances): each is retried until its deadline, then the
boot fails with the reason in /var/log/gpuplat-bootstrap.log.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

IMDS_URL = "http://169.254.169.254"
MUNGE_KEY_FILE = Path("/etc/gpuplat/munge.key")
TAG_NODE = "gpuplat:node"
TAG_ASG = "aws:autoscaling:groupName"
POLL_S = 5.0
IMDS_TIMEOUT_S = 2.0
T = TypeVar("T")


class BootError(Exception):
    """The node cannot join; the message says why."""


# The group var that names the stack's current bundle: a controller's boot script names none (its user
# data must not change when a role does), so it boots from the one the group vars name.
BUNDLE_KEY_VAR = "gpuplat_bundle_key"


@dataclass(frozen=True)
class JoinSettings:
    stack: str
    region: str
    bucket: str
    bundle_key: str
    group_vars_key: str
    munge_parameter: str
    node_name: str  # fixed for controllers; empty: from the gpuplat:node tag or the instance id
    name_wait_s: float
    fetch_wait_s: float
    work: Path
    serving_parameter: str = ""
    """the stack's serving version record (an SSM parameter); empty: the node serves no model"""
    serving_replicas: int = 0
    serving_dir: Path = Path("/etc/gpuplat-inference")

    @classmethod
    def from_environment(cls, env: dict[str, str]) -> JoinSettings:
        try:
            return cls(
                stack=env["GPUPLAT_STACK"],
                region=env["GPUPLAT_REGION"],
                bucket=env["GPUPLAT_BUCKET"],
                bundle_key=env["GPUPLAT_BUNDLE_KEY"],
                group_vars_key=env["GPUPLAT_GROUP_VARS_KEY"],
                munge_parameter=env["GPUPLAT_MUNGE_PARAMETER"],
                node_name=env.get("GPUPLAT_NODE_NAME", ""),
                name_wait_s=float(env["GPUPLAT_NAME_WAIT_S"]),
                fetch_wait_s=float(env["GPUPLAT_FETCH_WAIT_S"]),
                work=Path(env["GPUPLAT_WORK"]),
                serving_parameter=env.get("GPUPLAT_SERVING_PARAMETER", ""),
                serving_replicas=int(env.get("GPUPLAT_SERVING_REPLICAS") or 0),
                serving_dir=Path(env.get("GPUPLAT_SERVING_DIR") or "/etc/gpuplat-inference"),
            )
        except (KeyError, ValueError) as err:
            raise BootError(f"boot settings incomplete: {err}") from err


class Imds:
    """IMDSv2: a session token first, then the path with it."""

    def __init__(self, base_url: str = IMDS_URL) -> None:
        self.base_url = base_url.rstrip("/")

    def _token(self) -> str:
        request = urllib.request.Request(
            f"{self.base_url}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"},
        )
        with urllib.request.urlopen(request, timeout=IMDS_TIMEOUT_S) as response:
            return str(response.read().decode())

    def get(self, path: str) -> str | None:
        """The value, or None where the path does not exist (404)."""
        request = urllib.request.Request(
            f"{self.base_url}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": self._token()}
        )
        try:
            with urllib.request.urlopen(request, timeout=IMDS_TIMEOUT_S) as response:
                return str(response.read().decode())
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise


def until(deadline_s: float, what: str, attempt: Callable[[], T | None], sleep: Callable[[float], None]) -> T:
    """attempt() until it returns a value; BootError naming `what` after `deadline_s` seconds."""
    deadline = time.monotonic() + deadline_s
    last_error = "not there yet"
    while True:
        try:
            value = attempt()
        except Exception as err:
            value, last_error = None, f"{type(err).__name__}: {err}"
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise BootError(f"{what}: gave up after {deadline_s:.0f} s ({last_error})")
        sleep(POLL_S)


def node_name(settings: JoinSettings, imds: Imds, sleep: Callable[[float], None] = time.sleep) -> str:
    """Controllers: their fixed name. Slurm-launched nodes: the gpuplat:node tag, which the resume program
    sets right after RunInstances. Auto Scaling group instances: the instance id."""
    if settings.node_name:
        return settings.node_name
    instance_id = until(60, "instance id from instance metadata", lambda: imds.get("instance-id"), sleep)

    def from_tags() -> str | None:
        keys = (imds.get("tags/instance") or "").split()
        if TAG_NODE in keys:
            return imds.get(f"tags/instance/{TAG_NODE}")
        if TAG_ASG in keys:
            return instance_id
        return None

    return until(settings.name_wait_s, f"the {TAG_NODE} tag of {instance_id}", from_tags, sleep)


def take_name(name: str, address: str, hosts: Path = Path("/etc/hosts")) -> None:
    """Host name = node name, so slurmd registers under the name slurmctld expects."""
    subprocess.run(["hostnamectl", "set-hostname", name], check=True)
    lines = hosts.read_text().splitlines() if hosts.exists() else []
    if not any(line.split()[1:2] == [name] for line in lines if line.strip()):
        hosts.write_text("\n".join([*lines, f"{address} {name}"]) + "\n")


def _missing(err: Exception) -> bool:
    code = str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))
    return code in ("NoSuchKey", "404", "NotFound", "ParameterNotFound")


def fetch(
    settings: JoinSettings, sleep: Callable[[float], None] = time.sleep, munge_file: Path = MUNGE_KEY_FILE
) -> None:
    """The bundle, the group vars and the MUNGE key, each retried until the fetch deadline."""
    import boto3  # type: ignore[import-untyped,unused-ignore]

    s3 = boto3.client("s3", region_name=settings.region)
    ssm = boto3.client("ssm", region_name=settings.region)

    def s3_object(key: str) -> bytes | None:
        try:
            return bytes(s3.get_object(Bucket=settings.bucket, Key=key)["Body"].read())
        except Exception as err:
            if _missing(err):
                return None
            raise

    def munge_key() -> bytes | None:
        try:
            value = ssm.get_parameter(Name=settings.munge_parameter, WithDecryption=True)
        except Exception as err:
            if _missing(err):
                return None
            raise
        return base64.b64decode(value["Parameter"]["Value"])

    where = f"s3://{settings.bucket}/"
    group_vars = until(
        settings.fetch_wait_s,
        where + settings.group_vars_key,
        lambda: s3_object(settings.group_vars_key),
        sleep,
    )
    bundle_key = settings.bundle_key or str(json.loads(group_vars).get(BUNDLE_KEY_VAR) or "")
    if not bundle_key:  # a half-written object fails here too, not in Ansible
        raise BootError(f"{where}{settings.group_vars_key} names no bundle ({BUNDLE_KEY_VAR})")
    bundle = until(settings.fetch_wait_s, where + bundle_key, lambda: s3_object(bundle_key), sleep)
    settings.work.mkdir(parents=True, exist_ok=True)
    (settings.work / "all.json").write_bytes(group_vars)
    (settings.work / "bundle.zip").write_bytes(bundle)
    if settings.serving_parameter:
        serve_recorded_version(settings, ssm, s3)
    if not settings.munge_parameter:  # a node that runs no munged may not read the key
        return
    key = until(settings.fetch_wait_s, f"SSM parameter {settings.munge_parameter}", munge_key, sleep)
    munge_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor = os.open(munge_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(key)


# An object-store version's line in its version file: the URI, a space, the node's copy (infra/serving/
# release.py SOURCE_MARK and version_environment write it; this program runs alone on the node).
SOURCE_MARK = "# gpuplat source: "


def copy_version(s3: Any, source: str, local: Path) -> None:
    """Every object under `source` (s3://bucket/prefix) into `local`, as `aws s3 sync` copies them."""
    bucket, _, prefix = source.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
    root = local.resolve()
    copied = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = str(item["Key"])[len(prefix) :]
            target = (root / relative).resolve()
            if not relative or relative.endswith("/"):
                continue
            if not target.is_relative_to(root):
                raise BootError(f"{source}: object {item['Key']} would land outside {root}")
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, item["Key"], str(target))
            copied += 1
    if (
        not copied
    ):  # a version deleted from the bucket: replicas started on an empty folder would never answer
        raise BootError(f"{source} holds no object: the recorded version is gone from the bucket")


def serve_recorded_version(settings: JoinSettings, ssm: Any, s3: Any = None) -> None:
    """The version the stack's stable replicas serve (infra/serving/version_record.py): copied from the
    object store to this node's disk where it lives there, then its version file written for each of this
    node's replicas before Ansible starts them, as `gpuplat serve` wrote it on the nodes running at the last
    promote. No record: the stack's own model (no file). A record that cannot be read, or a version that
    cannot be copied, fails the boot: a node must not serve another version than its peers."""
    try:
        text = str(ssm.get_parameter(Name=settings.serving_parameter)["Parameter"]["Value"])
    except Exception as err:
        if _missing(err):
            return
        raise BootError(f"cannot read the version record {settings.serving_parameter}: {err}") from err
    for line in text.splitlines():
        if line.startswith(SOURCE_MARK):
            source, _, local = line.removeprefix(SOURCE_MARK).partition(" ")
            try:
                copy_version(s3, source, Path(local))
            except BootError:
                raise
            except Exception as err:
                raise BootError(f"cannot copy the recorded version from {source}: {err}") from err
    settings.serving_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    for replica in range(settings.serving_replicas):
        path = settings.serving_dir / f"version-{replica}.env"
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(text)
        partial.chmod(0o644)
        partial.replace(path)


def main(env: dict[str, str] | None = None) -> int:
    try:
        settings = JoinSettings.from_environment(dict(os.environ) if env is None else env)
        imds = Imds()
        name = node_name(settings, imds)
        address = until(60, "local-ipv4 from instance metadata", lambda: imds.get("local-ipv4"), time.sleep)
        take_name(name, address)
        fetch(settings)
    except (BootError, subprocess.CalledProcessError) as err:
        print(f"gpuplat join: {err}", file=sys.stderr)
        return 1
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
