"""The cloud in a box: the AWS API emulator, instance metadata, podman containers as instances, and the
stack's resources as `pulumi up` would have left them. `CloudBox.start()` brings it up and launches the
controllers; `stop()` removes every container, the network, the volumes and the addresses it added.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import boto3

from infra.backends.aws.bootstrap import GROUP_VARS_KEY, WORK_DIR, bundle_key, bundle_zip
from infra.backends.aws.node_join import BUNDLE_KEY_VAR
from infra.backends.local.host_caches import environment_archives_dir
from infra.backends.local.node_image import seal_and_commit
from infra.backends.local.wheelhouse import ensure_wheelhouse
from infra.data.load import catalog
from infra.lifecycle.fleet import configure_limit, destroy_with_fleet
from infra.nodes import playbook_run
from infra.nodes.inventory import (
    STACK_OUTPUT_GROUP_VARS,
    STACK_OUTPUT_INVENTORY_CONFIG,
    aws_ec2_config,
    stack_inventory_documents,
    write_inventory,
)
from infra.nodes.playbook_run import PlaybookRun, run_playbook
from infra.nodes.podman import podman
from infra.platform.resolve import ResolvedPlatform
from infra.training.job_env import LOCAL_ENVIRONMENT_ARCHIVES
from tests.box.cloud import BoxStack, declare, node_boot_script, user_data, zone_subnet
from tests.box.emulator import CREDENTIALS, FaultProxy, Faults, MotoServer
from tests.box.hypervisor import LABEL, Hypervisor, HypervisorSettings, remove_all
from tests.box.imds import IMDS_ADDRESS, InstanceMetadata

NETWORK = "gpuplat-box"
SHARED_VOLUME = "gpuplat-box-fsx"
PIP_CACHE_VOLUME = "gpuplat-box-pip-cache"
ANCHOR = "gpuplat-box-anchor"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BAKED_IMAGES = "localhost/gpuplat-box-image"
# Where the controllers find the archives of the environments they installed (the host's, per stack).
ENVIRONMENT_ARCHIVES = LOCAL_ENVIRONMENT_ARCHIVES


def box_substitutes(endpoint: str, resume_timeout_s: int) -> dict[str, Any]:
    """Group vars the box overrides, each because the box lacks what AWS has."""
    return {
        # No FSx: a podman volume mounted at the same path on every instance.
        "shared_fs_kind": "local-volume",
        # No GPUs: device files with NVIDIA's major number, as on the local platform.
        "gpuplat_gpu_simulated": True,
        # The box's machines have 2 cores where the instance types have more: slurmd reports what
        # slurm.conf says.
        "slurm_common_extra_config": {"SlurmdParameters": "config_overrides"},
        # The box's kernel mounts cgroups in hybrid mode (v1 and v2), where slurmd's cgroup plugins stop
        # ("Hybrid mode is not supported"); EC2's AMIs boot the unified v2 hierarchy the stack assumes.
        "slurm_common_cgroup_mode": "none",
        # An instance container shares the host's uptime: slurmd must report that it booted when it
        # started, or slurmctld keeps waiting for the resumed node to boot (slurmd -b).
        "slurm_compute_slurmd_extra_options": ["-b"],
        # No directory service: the team users are created on the nodes, as on the local platform.
        "slurm_common_create_users": True,
        # The region's endpoints are the emulator's (the programs Slurm runs get a clean environment).
        "slurm_elastic_endpoint_url": endpoint,
        "monitoring_ec2_endpoint": endpoint,
        # Timers sized for a test.
        "slurm_common_resume_timeout": resume_timeout_s,
        # SuspendTime: idle seconds before slurmctld powers a node down (600 on AWS; the stack's
        # scheduler.scale_down_idle_s, which a stack may not set below 60). Slurm 22.05 has no minimum:
        # power_save.c _do_power_work suspends a node idle since before now - suspend_time, looked at
        # every power_save_interval (10 s). The box's scenarios wait for it before their capacity errors
        # (d, k) and at the end (g).
        "slurm_suspend_time": 30,
        # SuspendTimeout: the suspend program terminates the instance, and the box removes its container
        # within the hypervisor's poll (2 s); the name may be resumed again once it is over (power_save.c:
        # POWERING_DOWN until power_save_req_time + suspend_timeout).
        "slurm_common_suspend_timeout": 15,
        # A requeued job (c, i, k, e) and a name back in power saving (d) are noticed by the next
        # scheduling pass: Slurm's main loop every sched_interval (60 s) and backfill every bf_interval
        # (30 s) by default (slurm.conf(5), Slurm 22.05). The box passes as often as the local platform.
        "slurm_common_scheduler_parameters": ["bf_interval=5", "sched_interval=10"],
        # A requeued job waits cred_expire before it may start again (120 s on AWS).
        "slurm_common_cred_expire": 30,
        "slurm_elastic_spot_grace_s": 20,
        "slurm_elastic_reconcile_interval_s": 20,
        "slurm_elastic_orphan_grace_s": 30,
        # The capacity cool-down after an injected capacity error: d's job (of the spot partition only)
        # runs on the same pool once it is over; k's (of both partitions) on spot2 meanwhile.
        "slurm_elastic_insufficient_capacity_timeout_s": 60,
        # j: protected mode after two boot failures in a row (10 on AWS), so the box pays two failed boots.
        "slurm_elastic_protected_failure_count": 2,
        # The box's shared filesystem lives as long as the box, where FSx keeps the training environment
        # across controllers: the first controller restores it from the archive an earlier box's install
        # left (roles/python_requirements, restore.yml), as the local platform's nodes do, and pip runs
        # only where none is kept for the same wheels.
        "python_requirements_archive_dir": ENVIRONMENT_ARCHIVES,
    }


@dataclass(frozen=True)
class RoleChange:
    """What the box's `pulumi up` of a role change did: the bundle before and after, the group vars it
    wrote, the controllers it stopped and started."""

    bundle_before: str
    bundle_after: str
    group_vars: dict[str, Any]
    restarted: list[str]


@dataclass
class RunCommand:
    """SSM Run Command's AWS-RunShellScript as `gpuplat status` uses it (infra/lifecycle/fleet_holds.py),
    run by the box in the instance's container as root (the SSM agent's user): moto records commands
    but runs none."""

    box: CloudBox
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def send_command(self, InstanceIds: list[str], DocumentName: str, Parameters: dict[str, Any]) -> Any:
        assert DocumentName == "AWS-RunShellScript"
        [instance_id] = InstanceIds
        script = "\n".join(Parameters["commands"])
        ran = podman("exec", self.box.container_of(instance_id), "bash", "-c", script, check=False)
        command_id = f"box-{len(self.results)}"
        self.results[command_id] = {
            "Status": "Success" if ran.returncode == 0 else "Failed",
            "StandardOutputContent": ran.stdout,
            "StandardErrorContent": ran.stderr,
        }
        return {"Command": {"CommandId": command_id}}

    def get_command_invocation(self, CommandId: str, InstanceId: str) -> dict[str, Any]:
        return self.results[CommandId]


def gpus_of(instance_type: str) -> int:
    node_type = next((t for t in catalog().node_types if t.name == instance_type), None)
    return node_type.gpu_count if node_type is not None else 0


@dataclass
class CloudBox:
    platform: ResolvedPlatform
    workdir: Path
    # Above a node's first boot from the bare image: about 3.5 minutes in `make test` beside the other
    # suites, but 6.5 on a slower run of the same machine (2026-12-03), where 420 s failed every resume of
    # scenario b twice and the box with it.
    resume_timeout_s: int = 600

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stop_leftovers()
        subnet = zone_subnet(self.platform.spec.aws.vpc_cidr)
        podman("network", "create", "--subnet", subnet, "--label", f"{LABEL}=network", NETWORK)
        for volume in (SHARED_VOLUME, PIP_CACHE_VOLUME):
            podman("volume", "create", "--label", f"{LABEL}=volume", volume, check=False)
        # The anchor keeps the bridge up before any instance exists. It takes .3, which AWS reserves in
        # every subnet (EC2 User Guide, "Subnet CIDR blocks"), so the emulator never hands it out.
        anchor_ip = str(ipaddress.ip_network(subnet).network_address + 3)
        podman(
            "run", "--detach", "--rm", "--name", ANCHOR, "--network", NETWORK, "--ip", anchor_ip,
            "--label", f"{LABEL}=anchor",
            "localhost/gpuplat-base:bookworm", "sleep", "infinity",
        )  # fmt: skip
        network = json.loads(podman("network", "inspect", NETWORK).stdout)[0]
        self.bridge = str(network["network_interface"])
        self.gateway = str(network["subnets"][0]["gateway"])
        subprocess.run(["ip", "addr", "add", f"{IMDS_ADDRESS}/32", "dev", self.bridge], check=True)
        self.moto = MotoServer(self.workdir / "moto.log")
        self.faults = Faults()
        region = str(self.platform.spec.region)
        self.session = boto3.Session(
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            aws_session_token=CREDENTIALS["AWS_SESSION_TOKEN"],
            region_name=region,
        )
        self.ec2 = self.client("ec2")
        self.proxy = FaultProxy(self.gateway, self.moto.port, self.faults, self.ec2)
        # EC2 as the instances see it (through the proxy: launch templates applied, faults injected).
        self.ec2_api = self.session.client("ec2", endpoint_url=self.proxy.url)
        self.imds = InstanceMetadata(self.instance_at)
        image_id = self.ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        pip_conf = self.workdir / "pip.conf"
        pip_conf.write_text(f"[global]\ncert = {HOST_CA_BUNDLE}\n")
        mount = self.platform.spec.storage.parallel_fs.mount_path
        self.hypervisor = Hypervisor(
            self.ec2,
            HypervisorSettings(
                network=NETWORK,
                images={image_id: "localhost/gpuplat-base:bookworm"},
                volumes=[
                    f"{SHARED_VOLUME}:{mount}",
                    f"{PIP_CACHE_VOLUME}:/root/.cache/pip",
                    f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro",
                    f"{pip_conf}:/etc/pip.conf:ro",
                ],
                environment={"AWS_ENDPOINT_URL": self.proxy.url},
                gpus=gpus_of,
                pool_volumes={self.platform.controller_pool.name: self.controller_volumes()},
            ),
            self.workdir / "hypervisor.log",
        )
        self.stack: BoxStack = declare(
            self.client, self.platform, image_id, box_substitutes(self.proxy.url, self.resume_timeout_s)
        )

    def controller_volumes(self) -> list[str]:
        """What the first controller installs the training environment from (roles/training_env): the
        stack's wheels (training.wheelhouse, downloaded once on the host) and the host's archives of the
        environments installed from them, writable by the controllers alone."""
        wheelhouse = self.platform.spec.training.wheelhouse
        host_wheels = ensure_wheelhouse(self.platform)
        if wheelhouse is None or host_wheels is None:
            return []
        archives = environment_archives_dir(self.platform.name, self.platform.controller_pool.name)
        return [f"{host_wheels}:{wheelhouse}:ro", f"{archives}:{ENVIRONMENT_ARCHIVES}"]

    def client(self, service: str) -> Any:
        return self.session.client(service, endpoint_url=self.moto.url)

    def instance_at(self, address: str) -> dict[str, Any] | None:
        reply = self.ec2.describe_instances(
            Filters=[
                {"Name": "private-ip-address", "Values": [address]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )
        found = [i for r in reply["Reservations"] for i in r["Instances"]]
        return found[0] if found else None

    def instances(self, *states: str, **tags: str) -> list[dict[str, Any]]:
        filters = [{"Name": f"tag:{k.replace('_', ':')}", "Values": [v]} for k, v in tags.items()]
        if states:
            filters.append({"Name": "instance-state-name", "Values": list(states)})
        reply = self.ec2.describe_instances(Filters=filters)
        return [i for r in reply["Reservations"] for i in r["Instances"]]

    def container_of(self, instance_id: str) -> str:
        return f"box-{instance_id}"

    def sh(self, instance_id: str, command: str, check: bool = True, timeout: float = 120) -> str:
        result = podman(
            "exec", self.container_of(instance_id), "bash", "-c", command, check=check, timeout=timeout
        )
        return result.stdout

    def wait_boot(self, instance_id: str, timeout_s: float) -> float:
        """Seconds until the instance's user data finished; AssertionError with its log when it failed."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            done = self.sh(
                instance_id, "cat /var/lib/cloud/instance/boot-finished 2>/dev/null", check=False
            ).strip()
            if done:
                if done != "0":
                    log = self.sh(instance_id, "tail -60 /var/log/gpuplat-bootstrap.log", check=False)
                    raise AssertionError(f"user data of {instance_id} exited {done}:\n{log}")
                return time.monotonic() - start
            time.sleep(3)
        log = self.sh(instance_id, "tail -40 /var/log/gpuplat-bootstrap.log", check=False)
        raise AssertionError(f"user data of {instance_id} not done after {timeout_s:.0f} s:\n{log}")

    def bake(self, instance_id: str, pool: str) -> str:
        """The pool's node image, taken from an instance that booted and joined and sealed by
        infra/backends/aws/image_seal.sh, as the pool's launch template's newest version: instances
        the resume program launches from then on boot it and only configure themselves. Returns the
        image id. (CreateImage of a configured instance: moto records the image, podman holds it.)"""
        image = f"{BAKED_IMAGES}:{pool}"
        seal_and_commit(self.container_of(instance_id), image, {})
        image_id = str(self.ec2.create_image(InstanceId=instance_id, Name=f"gpuplat-{pool}")["ImageId"])
        self.hypervisor.settings.images[image_id] = image
        self.use_image(pool, image_id)
        return image_id

    def use_image(self, pool: str, image_id: str) -> None:
        """The pool's launch template gets a newest version that boots `image_id` (as `pulumi up` does
        when a pool's image changes); the resume program launches `$Latest`."""
        template = self.stack.templates[pool]
        [latest] = self.ec2.describe_launch_template_versions(
            LaunchTemplateId=template, Versions=["$Latest"]
        )["LaunchTemplateVersions"]
        data = {**latest["LaunchTemplateData"], "ImageId": image_id}
        self.ec2.create_launch_template_version(LaunchTemplateId=template, LaunchTemplateData=data)

    def bad_image(self, image_id: str, name: str) -> str:
        """An image made from `image_id` on which every bootstrap fails: its Ansible exits with an
        error (a bad image or bundle on AWS). Registered with the emulator; returns its id."""
        image = f"{BAKED_IMAGES}:{name}"
        container = f"gpuplat-box-{name}-build"
        playbook = f"{WORK_DIR}/venv/bin/ansible-playbook"
        broken = f"printf '#!/bin/sh\\necho bad image >&2\\nexit 1\\n' >{playbook}"
        podman("run", "--name", container, self.hypervisor.settings.images[image_id], "sh", "-c", broken)
        try:
            podman("commit", container, image)
        finally:
            podman("rm", "--force", container, check=False)
        bad_id = str(self.ec2.register_image(Name=f"gpuplat-{name}")["ImageId"])
        self.hypervisor.settings.images[bad_id] = image
        return bad_id

    def change_roles(self, checkout: Path) -> RoleChange:
        """`pulumi up` after the roles changed in `checkout` (the operator's copy of the project), as the
        box plays it: the new bundle under its digest, the group vars naming it, and a new version of
        each training pool's launch template that boots it. A controller whose user data, as the stack
        declares it (cloud.node_boot_script: tests/pulumi/test_box_user_data.py holds it to the program's,
        tests/pulumi/test_aws_controller_changes.py the program to a bundle-free controller's), changes
        with the bundle is stopped and started: the Terraform AWS provider's default for a changed
        user_data of an aws_instance ("Updates to this field will trigger a stop/start of the EC2
        instance by default", resource aws_instance, argument user_data)."""
        s3 = self.client("s3")
        key = bundle_key(checkout)
        s3.put_object(Bucket=self.stack.bucket, Key=key, Body=bundle_zip(checkout))
        group_vars = json.loads(s3.get_object(Bucket=self.stack.bucket, Key=GROUP_VARS_KEY)["Body"].read())
        before = str(group_vars[BUNDLE_KEY_VAR])
        group_vars[BUNDLE_KEY_VAR] = key
        body = json.dumps(group_vars, indent=1).encode()
        s3.put_object(Bucket=self.stack.bucket, Key=GROUP_VARS_KEY, Body=body)
        for pool, template in self.stack.templates.items():
            [latest] = self.ec2.describe_launch_template_versions(
                LaunchTemplateId=template, Versions=["$Latest"]
            )["LaunchTemplateVersions"]
            script = node_boot_script(self.platform, self.stack.bucket, key, pool)
            data = {**latest["LaunchTemplateData"], "UserData": base64.b64encode(script.encode()).decode()}
            self.ec2.create_launch_template_version(LaunchTemplateId=template, LaunchTemplateData=data)
        controller = self.platform.controller_pool.name
        restarted = []
        for node, instance_id in self.stack.controllers.items():
            declared = node_boot_script(self.platform, self.stack.bucket, key, controller, node)
            if declared != user_data(self.ec2, instance_id):
                self.ec2.stop_instances(InstanceIds=[instance_id])
                podman("stop", "--time", "30", self.container_of(instance_id))
                self.ec2.modify_instance_attribute(
                    InstanceId=instance_id, UserData={"Value": declared.encode()}
                )
                podman("start", self.container_of(instance_id))
                self.ec2.start_instances(InstanceIds=[instance_id])
                restarted.append(node)
        return RoleChange(before, key, group_vars, restarted)

    def configure(self, checkout: Path, change: RoleChange) -> PlaybookRun:
        """`gpuplat up`'s configure phase on a cloud stack (infra/lifecycle/bringup.py up_cloud): the
        inventory from the stack's outputs (stack_inventory_documents), then playbooks/site.yml of the
        operator's checkout through it, on every host but Slurm's training nodes (configure_limit). The
        box's substitutes in the aws_ec2 inventory config, as in RunCommand: the emulator's endpoint and
        credentials, and the instance's container reached with podman instead of an SSM session (moto
        records Session Manager calls but opens no session)."""
        config = aws_ec2_config(self.platform, self.stack.bucket)
        config |= {
            "endpoint_url": self.moto.url,
            "access_key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secret_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "session_token": CREDENTIALS["AWS_SESSION_TOKEN"],
        }
        config["compose"] = {
            **config["compose"],
            "ansible_connection": "'gpuplat_podman'",
            "ansible_host": "'box-' + instance_id",
        }
        outputs = {STACK_OUTPUT_GROUP_VARS: change.group_vars, STACK_OUTPUT_INVENTORY_CONFIG: config}
        inventory = self.workdir / "inventory"
        write_inventory(stack_inventory_documents(self.platform, outputs), inventory)
        with mock.patch.object(playbook_run, "PROJECT_ROOT", checkout):
            return run_playbook(
                "site.yml",
                inventory,
                self.workdir / "logs",
                timeout=900,
                limit=configure_limit(self.platform),
            )

    def down(
        self, on_line: Callable[[str], None], before_destroy: Callable[[], None]
    ) -> tuple[str, list[str]]:
        """`gpuplat down` on the box's stack: the CLI's own path (infra/lifecycle/fleet.py
        destroy_with_fleet, run with the operator's credentials against the box's EC2), with the box's
        `pulumi destroy` (there is no Pulumi CLI here): the controllers, Pulumi resources, terminated and
        the training launch templates deleted. Returns the destroy's result and the controllers it
        terminated; `on_line` gets the fleet's lines as the CLI prints them, `before_destroy` runs as the
        destroy begins."""
        destroyed: list[str] = []

        def destroy() -> str:
            before_destroy()
            destroyed.extend(self.stack.controllers.values())
            self.ec2.terminate_instances(InstanceIds=destroyed)
            for template in self.stack.templates.values():
                self.ec2.delete_launch_template(LaunchTemplateId=template)
            return "destroyed"

        operator = {
            **CREDENTIALS,
            "AWS_ENDPOINT_URL": self.moto.url,
            "AWS_DEFAULT_REGION": str(self.platform.spec.region),
        }
        with mock.patch.dict(os.environ, operator):
            result = destroy_with_fleet(self.platform, destroy, on_line)
        return result, destroyed

    def stop(self) -> None:
        for part in ("hypervisor", "imds", "proxy", "moto"):
            if hasattr(self, part):
                getattr(self, part).stop()
        self.stop_leftovers()
        podman("volume", "rm", "--force", PIP_CACHE_VOLUME, check=False)

    def stop_leftovers(self) -> None:
        """What an earlier box left (the pip cache stays: it is only a cache)."""
        remove_all()
        podman("rm", "--force", "--time", "0", ANCHOR, check=False)
        if podman("network", "exists", NETWORK, check=False).returncode == 0:
            podman("network", "rm", "--force", NETWORK, check=False)
        podman("volume", "rm", "--force", SHARED_VOLUME, check=False)
        for listed in podman(
            "images", "--format", "{{.Repository}}:{{.Tag}}", BAKED_IMAGES, check=False
        ).stdout.split():
            podman("rmi", "--force", listed, check=False)
