"""Instances of the box are podman containers. A loop watches the emulator: an instance that is pending
or running gets a systemd container (its private address, on the box network) that runs the instance's
user data once, as cloud-init does; a terminated instance's container goes away; a container that
stopped under a running instance (its OS halted, or it died) stops the instance, or terminates it when
its shutdown behaviour is terminate.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.backends.local.cluster import simulate_gpus
from infra.nodes.inventory import TAG_POOL
from infra.nodes.podman import podman, wait_systemd
from tests.box.cloud import user_data

LABEL = "gpuplat.box"
BOOT_TIMEOUT_S = 120
# Each round costs one DescribeInstances and one `podman ps` (about 45 ms of CPU), whatever the number of
# instances: the box runs for half an hour beside the other test streams.
POLL_S = 2.0


@dataclass
class Machine:
    instance_id: str
    container: str
    address: str
    booted: threading.Event = field(default_factory=threading.Event)


@dataclass
class HypervisorSettings:
    network: str
    images: dict[str, str]  # AMI id -> podman image
    volumes: list[str]  # podman --volume arguments every instance gets (the FSx stand-in, the image's files)
    environment: dict[str, str]  # what the instance's user data runs with (the region's endpoints)
    gpus: Callable[[str], int]  # instance type -> GPUs (device files)
    # Node names whose next instance boots its OS but never runs its user data (once per name; the
    # name is the gpuplat:node tag the resume program puts on the instance it launched).
    hold_nodes: set[str] = field(default_factory=set)
    # pool -> the --volume arguments its instances get besides `volumes` (by their gpuplat:pool tag).
    pool_volumes: dict[str, list[str]] = field(default_factory=dict)


class Hypervisor:
    def __init__(self, ec2: Any, settings: HypervisorSettings, log: Path) -> None:
        self.ec2 = ec2
        self.settings = settings
        self.log = log
        self.machines: dict[str, Machine] = {}
        self.held: set[str] = set()  # instances whose user data was never run
        # instance -> when the hypervisor saw it terminated (time.monotonic(), within POLL_S)
        self.ended: dict[str, float] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _note(self, text: str) -> None:
        with self.log.open("a") as handle:
            handle.write(f"{time.strftime('%H:%M:%S')} {text}\n")

    def instances(self) -> list[dict[str, Any]]:
        pages = self.ec2.get_paginator("describe_instances").paginate()
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception as err:
                self.errors.append(f"{type(err).__name__}: {err}")
                self._note(f"error: {err}")
            self._stop.wait(POLL_S)

    def running_containers(self) -> set[str] | None:
        """The box's running containers, or None when podman could not say (no machine is judged dead)."""
        listing = podman("ps", "--filter", f"label={LABEL}", "--format", "{{.Names}}", check=False)
        return set(listing.stdout.split()) if listing.returncode == 0 else None

    def reconcile(self) -> None:
        with self._lock:
            booted = {i for i, m in self.machines.items() if m.booted.is_set()}
        # Listed after `booted` was taken: each of those containers had started before the listing.
        running_containers = self.running_containers() if booted else None
        for instance in self.instances():
            instance_id = instance["InstanceId"]
            state = instance["State"]["Name"]
            with self._lock:
                machine = self.machines.get(instance_id)
            if state in ("pending", "running") and machine is None:
                machine = Machine(instance_id, f"box-{instance_id}", instance["PrivateIpAddress"])
                with self._lock:
                    self.machines[instance_id] = machine
                threading.Thread(target=self._boot, args=(machine, instance), daemon=True).start()
            elif state in ("shutting-down", "terminated") and machine is not None:
                self.ended.setdefault(instance_id, time.monotonic())
                podman("rm", "--force", "--time", "0", machine.container, check=False)
                with self._lock:
                    del self.machines[instance_id]
                self._note(f"{instance_id} terminated: container removed")
            elif (
                state == "running" and machine is not None and instance_id in booted
                and running_containers is not None and machine.container not in running_containers
            ):  # fmt: skip
                self.shut_down(instance_id)

    def shut_down(self, instance_id: str) -> None:
        """The instance's container stopped (its OS halted, or it died): EC2 stops the instance, or
        terminates it where its shutdown behaviour says so (EC2 User Guide, "Change instance initiated
        shutdown behavior")."""
        behaviour = self.ec2.describe_instance_attribute(
            InstanceId=instance_id, Attribute="instanceInitiatedShutdownBehavior"
        )["InstanceInitiatedShutdownBehavior"]["Value"]
        if behaviour == "terminate":
            self.ec2.terminate_instances(InstanceIds=[instance_id])
            self._note(f"{instance_id}: container stopped; instance terminated (its shutdown behaviour)")
        else:
            self.ec2.stop_instances(InstanceIds=[instance_id], Force=True)
            self._note(f"{instance_id}: container stopped; instance stopped")

    def _take_hold(self, instance_id: str) -> bool:
        """Whether this instance's node is held; the hold is used up. The resume program tags the name
        just after RunInstances: an untagged instance is waited for while a hold is pending."""
        with self._lock:
            if not self.settings.hold_nodes:
                return False
        deadline = time.monotonic() + 60
        node = ""
        while not node and time.monotonic() < deadline:
            reservations = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
            [described] = reservations[0]["Instances"]
            node = next((t["Value"] for t in described.get("Tags", []) if t["Key"] == "gpuplat:node"), "")
            if not node:
                time.sleep(1)
        with self._lock:
            if node in self.settings.hold_nodes:
                self.settings.hold_nodes.discard(node)
                return True
        return False

    def _boot(self, machine: Machine, instance: dict[str, Any]) -> None:
        try:
            image = self.settings.images[instance["ImageId"]]
            pool = next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == TAG_POOL), "")
            mounted = [*self.settings.volumes, *self.settings.pool_volumes.get(pool, [])]
            volumes = [arg for volume in mounted for arg in ("--volume", volume)]
            hostname = "ip-" + machine.address.replace(".", "-")
            podman(
                "run", "--detach", "--name", machine.container, "--hostname", hostname,
                "--network", self.settings.network, "--ip", machine.address,
                "--systemd=always", "--privileged", "--no-hosts", "--label", f"{LABEL}={machine.instance_id}",
                *volumes, image, "/sbin/init",
            )  # fmt: skip
            wait_systemd(machine.container, BOOT_TIMEOUT_S)
            # An instance's /etc/hostname is its own file; podman bind-mounts one that hostnamed cannot
            # replace ("Device or resource busy"). The image's /etc/hosts is used as is (--no-hosts): as
            # on EC2, no other node's name is known unless the platform writes it.
            podman(
                "exec", machine.container, "sh", "-c", f"umount /etc/hostname; echo {hostname} >/etc/hostname"
            )
            gpus = self.settings.gpus(instance["InstanceType"])
            if gpus:
                simulate_gpus(machine.container, gpus)
            script = user_data(self.ec2, machine.instance_id)
            self._note(f"{machine.instance_id} ({machine.address}, {instance['InstanceType']}) booted")
            machine.booted.set()
            hold = self._take_hold(machine.instance_id)
            if hold or not script:
                self.held.add(machine.instance_id)
                self._note(f"{machine.instance_id}: user data not run")
                return
            podman("exec", machine.container, "mkdir", "-p", "/var/lib/cloud/instance")
            subprocess.run(
                ["podman", "exec", "-i", machine.container, "sh", "-c",
                 "cat > /var/lib/cloud/instance/user-data"],
                input=script, text=True, check=True, env=_podman_env(),
            )  # fmt: skip
            environment = [arg for k, v in self.settings.environment.items() for arg in ("--env", f"{k}={v}")]
            podman(
                "exec", "--detach", *environment, machine.container, "sh", "-c",
                "chmod 700 /var/lib/cloud/instance/user-data; /var/lib/cloud/instance/user-data"
                " >/var/log/cloud-init-output.log 2>&1; echo $? >/var/lib/cloud/instance/boot-finished",
            )  # fmt: skip
        except Exception as err:
            self.errors.append(f"boot of {machine.instance_id}: {err}")
            self._note(f"boot of {machine.instance_id} failed: {err}")

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)


def _podman_env() -> dict[str, str]:
    from infra.nodes.podman import podman_env

    return podman_env()


def remove_all() -> None:
    """Every container of a box (left over from an earlier run included)."""
    listed = podman("ps", "--all", "--filter", f"label={LABEL}", "--format", "{{.Names}}", check=False)
    for name in listed.stdout.split():
        podman("rm", "--force", "--time", "0", name, check=False)
