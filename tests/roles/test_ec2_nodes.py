"""The Slurm power-saving programs of roles/slurm_elastic (the package files/gpuplat_ec2_nodes) against
EC2 (moto server) and a fake IMDS.

EC2 is moto in server mode on loopback; the Slurm side is recorder scripts (scontrol, squeue,
scancel) that append their argv to a file and answer queries with what the test gave them; the
program runs as a subprocess, as Slurm runs it, for the whole path (a pool scaled up and down, the
Slurm wrappers, keep-static, a usage error); the other tests run its command line in this process
(run_in_process: the same argv, exit code and log, and `make mutation` sees the functions they reach) or
drive a command's function (a polling loop, a clock, EC2 calls recorded in the same file as the Slurm
calls to check their order).
keep-static, reconcile and teardown are tested in test_ec2_static.py and test_ec2_reconcile.py,
which share this module's fixtures.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from gpuplat_ec2_nodes import cli as program_cli
from gpuplat_ec2_nodes import ec2 as program_ec2
from gpuplat_ec2_nodes.ec2 import Ec2Nodes
from gpuplat_ec2_nodes.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_UNKNOWN_NODE, EXIT_USAGE, UsageError
from gpuplat_ec2_nodes.hostlist import expand_hostlist
from gpuplat_ec2_nodes.logs import LOG
from gpuplat_ec2_nodes.resume import REASON_RESUME_FAIL, resume, resume_fail
from gpuplat_ec2_nodes.settings import Pool, Settings, parse_pool, pool_of
from gpuplat_ec2_nodes.slurm import Job, NodeInfo, Slurm, parse_jobs, parse_nodes
from gpuplat_ec2_nodes.spot_watch import SpotWatch, spot_watch

from tests.conftest import moto_image
from tests.threaded_server import serve_in_thread

boto3 = pytest.importorskip("boto3")
botocore_exceptions = pytest.importorskip("botocore.exceptions")
ClientError = botocore_exceptions.ClientError
moto_server = pytest.importorskip("moto.server")
botocore_loaders = pytest.importorskip("botocore.loaders")
botocore_session = pytest.importorskip("botocore.session")

ROLE = Path(__file__).resolve().parents[2] / "roles" / "slurm_elastic"
# The program as the tests run it: the package from the role's files (on a node, the launcher the role
# installs as gpuplat-ec2-nodes runs it; test_slurm_wrappers_hand_the_hostlist_to_the_program runs that).
PACKAGE_PARENT = ROLE / "files"
PROGRAM = [sys.executable, "-m", "gpuplat_ec2_nodes"]
REGION = "us-east-1"
STACK = "test-stack"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "t"}
NOTICE = {"action": "terminate", "time": "2026-12-01T10:02:00Z"}


def program_env(**variables: str) -> dict[str, str]:
    """The environment the program runs in: this one, the package importable, and `variables`."""
    path = os.pathsep.join(p for p in (str(PACKAGE_PARENT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **variables}


# --- EC2 (moto server) ----------------------------------------------------------------------------


@dataclass
class Cloud:
    url: str
    ec2: Any
    launch_template_id: str
    subnet_id: str
    stack: str = ""

    def instances(self, **tags: str) -> list[dict[str, Any]]:
        filters = [{"Name": f"tag:{key.replace('_', ':')}", "Values": [value]} for key, value in tags.items()]
        filters.append({"Name": "tag:gpuplat:stack", "Values": [self.stack]})
        reservations = self.ec2.describe_instances(Filters=filters)["Reservations"]
        return [instance for reservation in reservations for instance in reservation["Instances"]]

    def node_instances(self, state: str) -> dict[str, dict[str, Any]]:
        found = [i for i in self.instances() if i["State"]["Name"] == state]
        return {tags_of(i)["gpuplat:node"]: i for i in found}

    def launch(
        self, node: str | None = None, pool: str = "train", stack: str | None = None, role: str = "train"
    ) -> str:
        """An instance as the resume program leaves it (no gpuplat:node tag when node is None)."""
        tags = {"gpuplat:stack": self.stack if stack is None else stack, "gpuplat:pool": pool}
        tags["gpuplat:role"] = role
        if node is not None:
            tags["gpuplat:node"] = node
        [instance] = self.ec2.run_instances(
            LaunchTemplate={"LaunchTemplateId": self.launch_template_id},
            SubnetId=self.subnet_id,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
            ],
        )["Instances"]
        return str(instance["InstanceId"])

    def state(self, instance_id: str) -> str:
        [reservation] = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return str(reservation["Instances"][0]["State"]["Name"])

    def describe(self, instance_id: str) -> dict[str, Any]:
        [reservation] = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return dict(reservation["Instances"][0])

    def protect(self, instance_id: str, protected: bool = True) -> None:
        """DisableApiTermination: TerminateInstances fails for it (OperationNotPermitted)."""
        self.ec2.modify_instance_attribute(InstanceId=instance_id, DisableApiTermination={"Value": protected})


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {tag["Key"]: tag["Value"] for tag in instance.get("Tags", [])}


# The program makes a botocore session per client (ec2.aws_session), and each session's loader reads and
# parses EC2's service model again: 0.1 CPU-s a client, two clients a command run in process. While the
# moto fixture is up, the sessions made in this process share one loader (botocore 1.44:
# session.py `_register_data_loader` registers a component a session's get_component returns; loaders.py
# caches what a loader read, `instance_cache`), so the model is parsed once; every other setting of the
# session (aws_session's metadata-service retries among them) is the program's own.
SHARED_LOADER = botocore_loaders.create_loader()
_new_session = botocore_session.get_session


def session_with_shared_models(env_vars: Any = None) -> Any:
    session = _new_session(env_vars)
    session.register_component("data_loader", SHARED_LOADER)
    return session


MOTO_SERVERS = itertools.count()


@pytest.fixture(scope="module")
def moto_cloud() -> Iterator[Cloud]:
    """One moto server, VPC, subnet and launch template; each test gets its own stack tag.

    moto's backend is one per process and outlives the server: the modules that share this fixture get a
    server each, and a template name and stack tags each (the port in them), so that a test run again in
    the same process (`make mutation` does) sees none of its earlier instances. Named by a number of this
    process, not by the port: a server started after another stopped may be given the same port.
    """
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    serial = next(MOTO_SERVERS)
    with pytest.MonkeyPatch.context() as env:
        for key, value in CREDENTIALS.items():
            env.setenv(key, value)
        env.setattr(botocore_session, "get_session", session_with_shared_models)
        ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url)
        image_id = moto_image(ec2)
        vpc_id = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
        subnet_id = ec2.create_subnet(VpcId=vpc_id, CidrBlock="10.20.1.0/24")["Subnet"]["SubnetId"]
        template = ec2.create_launch_template(
            LaunchTemplateName=f"train-{serial}",
            LaunchTemplateData={"ImageId": image_id, "InstanceType": "p5.48xlarge"},
        )
        yield Cloud(url, ec2, template["LaunchTemplate"]["LaunchTemplateId"], subnet_id, f"stack-{serial}")
    server.stop()


@pytest.fixture
def cloud(moto_cloud: Cloud, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Cloud:
    # An instance moto's fleet starts without its address yet is looked at again after ADDRESS_POLL_S, 2 s
    # of waiting for an answer that is there at the next look.
    monkeypatch.setattr(program_ec2, "ADDRESS_POLL_S", 0.05)
    return replace(moto_cloud, stack=f"{moto_cloud.stack}-{request.node.name}"[:120])


# --- Slurm side (recorder scripts) ----------------------------------------------------------------


@dataclass
class SlurmRecorder:
    """scontrol, squeue and scancel that record their argv; queries answer what the test set."""

    bin_dir: Path
    record: Path

    @property
    def scontrol(self) -> str:
        return str(self.bin_dir / "scontrol")

    def calls(self) -> list[list[str]]:
        if not self.record.exists():
            return []
        return [line.split("\t")[:-1] for line in self.record.read_text().splitlines()]

    def nodes(self, *lines: str) -> None:
        """What `scontrol -o show node` prints (lines made with show_node)."""
        (self.bin_dir / "scontrol.out").write_text("".join(line + "\n" for line in lines))

    def jobs(self, *rows: tuple[int, int, int]) -> None:
        """What `squeue --Format=JobID,BatchFlag,Requeue` prints: (job id, batch flag, requeue)."""
        text = "".join(f"{job:<20}{batch:<20}{requeue:<20}\n" for job, batch, requeue in rows)
        (self.bin_dir / "squeue.out").write_text(text)

    def states(self, *rows: tuple[int, str]) -> None:
        """What `squeue --states=all --Format=JobID,State` prints: (job id, state)."""
        text = "".join(f"{job:<20}{state:<20}\n" for job, state in rows)
        (self.bin_dir / "squeue.states.out").write_text(text)

    def pids(self, *rows: tuple[int, int, str, str]) -> None:
        """What `scontrol listpids` prints: (pid, job id, step id, local id), as Slurm formats it."""
        header = f"{'PID':<8} {'JOBID':<8} {'STEPID':<6} {'LOCALID':<7} {'GLOBALID':<8}\n"
        lines = "".join(
            f"{pid:<8} {job:<8} {step:<6} {local:<7} {local:<8}\n" for pid, job, step, local in rows
        )
        (self.bin_dir / "scontrol.listpids.out").write_text(header + lines)

    def fail(self, command: str) -> None:
        (self.bin_dir / f"{command}.rc").write_text("1")

    def note(self, *fields: str) -> None:
        """Something else happening (a sleep, an EC2 call), in the same order as the calls."""
        with self.record.open("a") as record:
            record.write("".join(f"{field}\t" for field in fields) + "\n")


RECORDER = """#!/bin/sh
{{ printf '%s\\t' "$(basename "$0")"; for arg in "$@"; do printf '%s\\t' "$arg"; done; echo; }} >> {record}
if [ -f "$0.rc" ]; then exit "$(cat "$0.rc")"; fi
case " $* " in
  *--Format=JobID,State" "*) if [ -f "$0.states.out" ]; then cat "$0.states.out"; fi;;
  *" listpids "*) if [ -f "$0.listpids.out" ]; then cat "$0.listpids.out"; fi
    if [ -f "$0.listpids.rc" ]; then exit "$(cat "$0.listpids.rc")"; fi;;
  *" show "*|*--Format=*) if [ -f "$0.out" ]; then cat "$0.out"; fi;;
esac
"""


@pytest.fixture
def slurm(tmp_path: Path) -> SlurmRecorder:
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    record = tmp_path / "slurm-calls.tsv"
    for command in ("scontrol", "squeue", "scancel"):
        script = bin_dir / command
        script.write_text(RECORDER.format(record=record))
        script.chmod(0o755)
    return SlurmRecorder(bin_dir, record)


def show_node(name: str, state: str, reason: str = "", addr: str | None = None) -> str:
    """One line of `scontrol -o show node` as Slurm 24.11 prints it (src/api/node_info.c order)."""
    line = (
        f"NodeName={name} CoresPerSocket=48 CPUAlloc=0 CPUEfctv=192 CPUTot=192 CPULoad=N/A "
        f"AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:8 NodeAddr={addr or name} "
        f"NodeHostName={name} RealMemory=2000000 AllocMem=0 FreeMem=N/A Sockets=2 Boards=1 "
        f"State={state} ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=train "
        "BootTime=None SlurmdStartTime=None LastBusyTime=2026-12-01T09:00:00 ResumeAfterTime=None "
        "CfgTRES=cpu=192,mem=2000000M,billing=192,gres/gpu=8 AllocTRES= CurrentWatts=0 AveWatts=0"
    )
    return line + (f" Reason={reason} [slurm@2026-12-01T09:10:00]" if reason else "")


class RecordingEc2:
    """The moto client, with its changing calls noted in the recorder's file (one order for both)."""

    NOTED = ("run_instances", "create_tags", "terminate_instances")

    def __init__(self, client: Any, slurm: SlurmRecorder) -> None:
        self.client = client
        self.slurm = slurm

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)
        if name not in self.NOTED:
            return method

        def noted(**kwargs: Any) -> Any:
            self.slurm.note("ec2", name, ",".join(kwargs.get("InstanceIds") or kwargs.get("Resources") or []))
            return method(**kwargs)

        return noted


def settings_for(tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, **overrides: Any) -> Any:
    """In-process Settings of write_config's pools."""
    pool = {"launch_template_id": cloud.launch_template_id, "subnet_id": cloud.subnet_id}
    static = overrides.pop("static_nodes", ())
    pools = {
        "train": parse_pool("train", {**pool, "static_nodes": list(static)}),
        "train-spot": parse_pool("train-spot", {**pool, "subnet_id": None}),
    }
    values = {"state_dir": tmp_path / "state", **overrides}
    return Settings(cloud.stack, REGION, slurm.scontrol, pools, **values)


def ec2_nodes(cloud: Cloud, slurm: SlurmRecorder) -> Any:
    client = boto3.client("ec2", region_name=REGION, endpoint_url=cloud.url)
    return Ec2Nodes(RecordingEc2(client, slurm), cloud.stack)


def write_config(
    tmp_path: Path,
    cloud: Cloud,
    slurm: SlurmRecorder,
    settings: dict[str, Any] | None = None,
    **pool_overrides: Any,
) -> Path:
    train = {"launch_template_id": cloud.launch_template_id, "subnet_id": cloud.subnet_id, "static_nodes": []}
    config = {
        "stack": cloud.stack,
        "region": REGION,
        "scontrol": slurm.scontrol,
        "state_dir": str(tmp_path / "state"),
        "pools": {"train": {**train, **pool_overrides}, "train-spot": {**train, "subnet_id": None}},
        **(settings or {}),
    }
    path = tmp_path / "ec2-nodes.json"
    path.write_text(json.dumps(config))
    return path


def run_program(config: Path, cloud: Cloud, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*PROGRAM, "--config", str(config), "--endpoint-url", cloud.url, *args]
    env = program_env(**CREDENTIALS, AWS_DEFAULT_REGION=REGION)
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)


def run_in_process(config: Path, cloud: Cloud, *args: str) -> subprocess.CompletedProcess[str]:
    """run_program's argv, exit code and log, from the command line's main in this process (the moto
    fixture has set the credentials); the program's log is handed back to logging's defaults after."""
    argv = ["--config", str(config), "--endpoint-url", cloud.url, *args]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            code = program_cli.main(argv)
    finally:
        for handler in list(LOG.handlers):
            LOG.removeHandler(handler)
            handler.close()
        LOG.propagate = True
    return subprocess.CompletedProcess(argv, code, "", stderr.getvalue())


def address_updates(slurm: SlurmRecorder) -> dict[str, str]:
    updates = {}
    for call in slurm.calls():
        if call[:2] != ["scontrol", "update"]:
            continue
        settings = dict(arg.split("=", 1) for arg in call[2:])
        if "nodeaddr" in settings:
            assert settings["nodehostname"] == settings["nodename"]
            updates[settings["nodename"]] = settings["nodeaddr"]
    return updates


# --- hostlists and pools --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hostlist", "expected"),
    [
        ("train-0", ["train-0"]),
        ("a-[0-3,5],b-1", ["a-0", "a-1", "a-2", "a-3", "a-5", "b-1"]),
        ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
        ("train-[8-10]", ["train-8", "train-9", "train-10"]),
        ("r[1-2]-n[0,3]", ["r1-n0", "r1-n3", "r2-n0", "r2-n3"]),
        ("train-spot-[1-2],train-1,train-spot-2", ["train-spot-1", "train-spot-2", "train-1"]),
    ],
)
def test_hostlist_expansion(hostlist: str, expected: list[str]) -> None:
    assert expand_hostlist(hostlist) == expected


@pytest.mark.parametrize("hostlist", ["", "a-[1-", "a-1]", "a-[3-1]", "a-[x]", "a-[[1]]", "a-[1-]"])
def test_malformed_hostlists_are_usage_errors(hostlist: str) -> None:
    with pytest.raises(UsageError):
        expand_hostlist(hostlist)


def test_node_names_map_to_the_longest_matching_pool() -> None:
    pools = {name: Pool(name, "lt-1", None, ()) for name in ("train", "train-spot")}
    assert pool_of("train-spot-3", pools) == "train-spot"
    assert pool_of("train-3", pools) == "train"
    assert pool_of("train-spot", pools) is None
    assert pool_of("infer-1", pools) is None
    assert pool_of("train-1a", pools) is None


# --- resume / suspend against EC2 -----------------------------------------------------------------


def test_pool_scales_from_zero_to_three_and_back(tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder) -> None:
    config = write_config(tmp_path, cloud, slurm)

    up = run_program(config, cloud, "resume", "train-[0-2]")
    assert up.returncode == 0, up.stderr
    # moto starts MinCount instances, as EC2 does short of capacity: the rest is asked for again.
    assert "EC2 started 1 of 3 instances" in up.stderr
    running = cloud.node_instances("running") or cloud.node_instances("pending")
    assert sorted(running) == ["train-0", "train-1", "train-2"]
    for name, instance in running.items():
        assert tags_of(instance) | {"gpuplat:stack": cloud.stack, "gpuplat:pool": "train"} == tags_of(
            instance
        )
        assert tags_of(instance)["Name"] == f"{cloud.stack}-{name}"
        assert instance["SubnetId"] == cloud.subnet_id
        assert instance["InstanceId"] in up.stderr
    assert address_updates(slurm) == {name: i["PrivateIpAddress"] for name, i in running.items()}

    down = run_program(config, cloud, "suspend", "train-[0-2]")
    assert down.returncode == 0, down.stderr
    terminated = cloud.node_instances("terminated")
    assert {name: i["InstanceId"] for name, i in terminated.items()} == {
        name: i["InstanceId"] for name, i in running.items()
    }
    assert not cloud.node_instances("running") and not cloud.node_instances("pending")


def test_resume_again_launches_new_instances_and_terminates_the_earlier_ones(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """slurmctld ignores a registration from before the resume request: an instance that booted
    earlier is never reused (resume.py)."""
    config = write_config(tmp_path, cloud, slurm)
    assert run_in_process(config, cloud, "resume", "train-[0-1]").returncode == 0
    first = {tags_of(i)["gpuplat:node"]: i["InstanceId"] for i in cloud.instances()}
    extra = cloud.launch("train-0")  # a second instance of train-0 (as a resume that crashed leaves it)

    again = run_in_process(config, cloud, "resume", "train-[0-2]")
    assert again.returncode == 0, again.stderr
    live = cloud.node_instances("running") or cloud.node_instances("pending")
    assert sorted(live) == ["train-0", "train-1", "train-2"]
    assert not {i["InstanceId"] for i in live.values()} & set(first.values())
    assert {i: cloud.state(i) for i in first.values()} == dict.fromkeys(first.values(), "terminated")
    # each name's earlier instances are named in the log: the ID, the node and the state it was in
    [earlier] = [line for line in again.stderr.splitlines() if "train-0 still has" in line]
    found = re.search(
        r"resume: train-0 still has (.*) from before this resume; terminating it and launching a new one "
        r"\(Slurm ignores a registration from before the resume request\)$",
        earlier,
    )
    assert found, earlier
    labels = [
        f"{instance} (train-0, {state})"
        for instance in (first["train-0"], extra)
        for state in re.findall(rf"{instance} \(train-0, (pending|running)\)", earlier)
    ]
    assert found.group(1) in (",".join(labels), ",".join(reversed(labels))), earlier
    assert cloud.state(extra) == "terminated"
    addresses = [call for call in slurm.calls() if any(arg.startswith("nodeaddr=") for arg in call)]
    assert len(addresses) == 5, "each resume tells Slurm the address of every node it was given"


def test_spot_pool_without_subnet_launches_from_the_template(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    config = write_config(tmp_path, cloud, slurm)
    result = run_in_process(config, cloud, "resume", "train-spot-4")
    assert result.returncode == 0, result.stderr
    [instance] = cloud.instances(gpuplat_node="train-spot-4")
    assert tags_of(instance)["gpuplat:pool"] == "train-spot"
    assert address_updates(slurm) == {"train-spot-4": instance["PrivateIpAddress"]}


def test_a_name_outside_the_pools_fails_clearly(tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder) -> None:
    config = write_config(tmp_path, cloud, slurm)
    result = run_in_process(config, cloud, "resume", "infer-1,train-0")
    assert result.returncode == EXIT_UNKNOWN_NODE
    assert "resume: infer-1 belong to no configured pool (pools: train,train-spot)" in result.stderr
    assert [tags_of(i)["gpuplat:node"] for i in cloud.instances()] == ["train-0"]
    assert list(address_updates(slurm)) == ["train-0"]
    suspended = run_in_process(config, cloud, "suspend", "infer-1,train-0")
    assert suspended.returncode == EXIT_UNKNOWN_NODE
    assert "suspend: infer-1 belong to no configured pool (pools: train,train-spot)" in suspended.stderr
    assert cloud.node_instances("terminated").keys() == {"train-0"}


def test_launch_failure_powers_the_names_down_with_the_aws_error(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    config = write_config(tmp_path, cloud, slurm, subnet_id="subnet-0123456789abcdef0")
    result = run_in_process(config, cloud, "resume", "train-[3-4]")
    assert result.returncode == EXIT_FAILED
    assert cloud.instances() == []
    assert slurm.calls() == [
        [
            "scontrol",
            "update",
            "nodename=train-3,train-4",
            "state=power_down_force",
            "reason=gpuplat resume failed: InvalidSubnetID.NotFound",
        ]
    ]


def test_suspend_of_nodes_without_instances_is_fine(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    config = write_config(tmp_path, cloud, slurm)
    result = run_in_process(config, cloud, "suspend", "train-[5-6]")
    assert result.returncode == 0, result.stderr
    assert "suspend: train-5: terminated no instance" in result.stderr


class CapacityShortEc2(RecordingEc2):
    """EC2 out of capacity after the first instance: the second RunInstances fails."""

    def __init__(self, client: Any, slurm: SlurmRecorder) -> None:
        super().__init__(client, slurm)
        self.launches = 0

    def run_instances(self, **request: Any) -> Any:
        self.launches += 1
        if self.launches > 1:
            error = {"Error": {"Code": "InsufficientInstanceCapacity", "Message": "no p5 in us-east-1a"}}
            raise ClientError(error, "RunInstances")
        return self.client.run_instances(**{**request, "MaxCount": 1})


def test_names_ec2_cannot_serve_are_powered_down_so_their_jobs_requeue(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """POWER_DOWN_FORCE on a POWERING_UP node requeues its jobs and, through the suspend it starts,
    brings the name back to IDLE+POWERED_DOWN (module docstring): the names are tried again."""
    client = boto3.client("ec2", region_name=REGION, endpoint_url=cloud.url)
    ec2 = Ec2Nodes(CapacityShortEc2(client, slurm), cloud.stack)
    settings = settings_for(tmp_path, cloud, slurm, insufficient_capacity_timeout_s=0.0)  # test_ec2_holds.py
    status = resume(settings, ec2, Slurm(slurm.scontrol), ["train-0", "train-1", "train-2"])
    assert status == EXIT_FAILED
    [launched] = cloud.instances()
    assert tags_of(launched)["gpuplat:node"] == "train-0"
    assert [call for call in slurm.calls() if call[0] == "scontrol"] == [
        [
            "scontrol",
            "update",
            "nodename=train-0",
            f"nodeaddr={launched['PrivateIpAddress']}",
            "nodehostname=train-0",
        ],
        [
            "scontrol",
            "update",
            "nodename=train-1,train-2",
            "state=power_down_force",
            "reason=gpuplat resume failed: InsufficientInstanceCapacity",
        ],
    ]


def test_a_capacity_error_returns_the_names_at_once_not_after_botocore_retries(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EC2 answers InsufficientInstanceCapacity with HTTP 500, which botocore's standard mode retries:
    through the program's own clients, one capacity error must reach the program, not be retried away
    (the box's scenario d saw the launch succeed on botocore's second attempt, the names never
    returned and the fault never logged)."""
    from tests.box.emulator import FaultProxy, Faults

    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    faults = Faults()
    faults.arm("RunInstances", "InsufficientInstanceCapacity", times=1)
    upstream = int(cloud.url.rsplit(":", 1)[1])
    proxy = FaultProxy(
        "127.0.0.1", upstream, faults, boto3.client("ec2", region_name=REGION, endpoint_url=cloud.url)
    )
    try:
        ec2 = program_ec2.ec2_nodes(REGION, proxy.url, cloud.stack)
        settings = settings_for(tmp_path, cloud, slurm, insufficient_capacity_timeout_s=0.0)
        status = resume(settings, ec2, Slurm(slurm.scontrol), ["train-0"])
    finally:
        proxy.stop()
    assert status == EXIT_FAILED
    assert faults.count("RunInstances") == 1
    assert not cloud.instances()
    assert slurm.calls()[-1][3:] == [
        "state=power_down_force",
        "reason=gpuplat resume failed: InsufficientInstanceCapacity",
    ]


class AddresslessEc2(RecordingEc2):
    """Instances that never get a private address."""

    def run_instances(self, **request: Any) -> Any:
        return strip_addresses(self.client.run_instances(**request))

    def describe_instances(self, **request: Any) -> Any:
        return strip_addresses(self.client.describe_instances(**request))


def strip_addresses(response: dict[str, Any]) -> dict[str, Any]:
    for instance in response.get("Instances", []) + [
        i for reservation in response.get("Reservations", []) for i in reservation["Instances"]
    ]:
        instance.pop("PrivateIpAddress", None)
    return response


def test_an_instance_without_address_is_terminated_and_its_name_powered_down(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left as it was, the node would wait out ResumeTimeout (30 min) with an instance it cannot use."""
    monkeypatch.setattr(program_ec2, "ADDRESS_WAIT_S", 0.0)
    client = boto3.client("ec2", region_name=REGION, endpoint_url=cloud.url)
    ec2 = Ec2Nodes(AddresslessEc2(client, slurm), cloud.stack)
    status = resume(settings_for(tmp_path, cloud, slurm), ec2, Slurm(slurm.scontrol), ["train-5"])
    assert status == EXIT_FAILED
    [instance] = cloud.instances(gpuplat_node="train-5")
    assert instance["State"]["Name"] == "terminated"
    calls = slurm.calls()
    assert calls[-2:] == [
        ["ec2", "terminate_instances", instance["InstanceId"]],
        [
            "scontrol",
            "update",
            "nodename=train-5",
            "state=power_down_force",
            "reason=gpuplat resume failed: NoPrivateAddress",
        ],
    ]
    assert not address_updates(slurm)


def test_resume_fail_terminates_then_returns_the_nodes_to_power_saving(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """Slurm leaves a node that missed ResumeTimeout DOWN+POWERED_DOWN, never allocated again
    (power_save.c _do_power_work); POWER_DOWN_FORCE after the termination brings it back to idle~."""
    config = write_config(tmp_path, cloud, slurm)
    assert run_in_process(config, cloud, "resume", "train-[0-1]").returncode == 0
    slurm.record.unlink()
    result = run_in_process(config, cloud, "resume-fail", "train-1")
    assert result.returncode == 0, result.stderr
    assert "train-1 did not register in time" in result.stderr
    assert list(cloud.node_instances("terminated")) == ["train-1"]
    assert list(cloud.node_instances("running") or cloud.node_instances("pending")) == ["train-0"]
    assert slurm.calls() == [
        [
            "scontrol",
            "update",
            "nodename=train-1",
            "state=power_down_force",
            f"reason={REASON_RESUME_FAIL}",
        ]
    ]


def test_resume_fail_logs_each_step_and_fails_when_slurm_does_not_take_the_nodes_back(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """resume-fail's log names the step and the nodes (the warning, each termination, the power-down),
    and its exit status is a failure when scontrol refuses POWER_DOWN_FORCE even though the instances
    were terminated: the nodes would stay DOWN+POWERED_DOWN."""
    config = write_config(tmp_path, cloud, slurm)
    assert run_in_process(config, cloud, "resume", "train-[0-1]").returncode == 0
    slurm.fail("scontrol")
    result = run_in_process(config, cloud, "resume-fail", "train-[0-1]")
    assert result.returncode == EXIT_FAILED, result.stderr
    assert list(cloud.node_instances("terminated")) == ["train-0", "train-1"]
    assert (
        "resume-fail: train-0,train-1 did not register in time; terminating their instances" in result.stderr
    )
    for name in ("train-0", "train-1"):
        assert f"resume-fail: {name}: terminated i-" in result.stderr
    assert "resume-fail: returning train-0,train-1 to power saving (POWER_DOWN_FORCE)" in result.stderr


def test_resume_fail_powers_down_only_after_terminating(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    first, second = cloud.launch("train-spot-2", "train-spot"), cloud.launch("train-spot-3", "train-spot")
    status = resume_fail(
        settings_for(tmp_path, cloud, slurm),
        ec2_nodes(cloud, slurm),
        Slurm(slurm.scontrol),
        ["train-spot-2", "train-spot-3", "infer-0"],
    )
    assert status == EXIT_UNKNOWN_NODE, "infer-0 belongs to no pool; the others are handled"
    [terminate, power_down] = slurm.calls()
    assert terminate[:2] == ["ec2", "terminate_instances"] and set(terminate[2].split(",")) == {first, second}
    assert power_down == [
        "scontrol",
        "update",
        "nodename=train-spot-2,train-spot-3",
        "state=power_down_force",
        f"reason={REASON_RESUME_FAIL}",
    ]


def test_bad_configuration_is_a_usage_error(tmp_path: Path, cloud: Cloud) -> None:
    config = tmp_path / "broken.json"
    config.write_text('{"stack": "s"}')
    result = run_program(config, cloud, "suspend", "train-0")
    assert result.returncode == EXIT_USAGE
    assert "missing or malformed entry 'pools'" in result.stderr


def test_slurm_wrappers_hand_the_hostlist_to_the_program(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder
) -> None:
    """The role's ResumeProgram/SuspendProgram wrappers and the launcher they run (gpuplat-ec2-nodes),
    rendered, as Slurm runs them (AWS_ENDPOINT_URL; the launcher finds the package by itself)."""
    jinja2 = pytest.importorskip("jinja2")
    yaml = pytest.importorskip("yaml")
    wrappers = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__slurm_elastic_wrappers"]
    assert {w["path"]: w["command"] for w in wrappers} == {
        "/usr/local/sbin/gpuplat-slurm-resume": "resume",
        "/usr/local/sbin/gpuplat-slurm-suspend": "suspend",
        "/usr/local/sbin/gpuplat-slurm-resume-fail": "resume-fail",
    }
    template = jinja2.Template((ROLE / "templates" / "gpuplat-slurm-wrapper.j2").read_text())
    log_file = tmp_path / "ec2-nodes.log"
    launcher = tmp_path / "gpuplat-ec2-nodes"
    launcher.write_text(
        jinja2.Template((ROLE / "templates" / "gpuplat-ec2-nodes.j2").read_text()).render(
            ansible_managed="test",
            __slurm_elastic_program_lib=PACKAGE_PARENT,
            __slurm_elastic_package_dir=PACKAGE_PARENT / "gpuplat_ec2_nodes",
        )
    )
    context = {
        "ansible_managed": "test",
        "__slurm_elastic_program": f"{sys.executable} {launcher}",
        "__slurm_elastic_config": write_config(tmp_path, cloud, slurm),
        "__slurm_elastic_log_file": log_file,
        "slurm_elastic_endpoint_url": "",
    }
    options = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__slurm_elastic_options"]
    context["__slurm_elastic_options"] = jinja2.Template(options).render(**context)
    for wrapper in wrappers:
        script = tmp_path / Path(wrapper["path"]).name
        script.write_text(template.render(item=wrapper, **context))
        script.chmod(0o755)
    env = {**os.environ, **CREDENTIALS, "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": cloud.url}

    def slurm_runs(program: str, hostlist: str) -> None:
        result = subprocess.run(
            [str(tmp_path / program), hostlist],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr

    slurm_runs("gpuplat-slurm-resume", "train-[0-1]")
    assert sorted(cloud.node_instances("running") or cloud.node_instances("pending")) == [
        "train-0",
        "train-1",
    ]
    slurm_runs("gpuplat-slurm-suspend", "train-[0-1]")
    assert sorted(cloud.node_instances("terminated")) == ["train-0", "train-1"]
    log = log_file.read_text()
    assert "resume: launched" in log and "suspend: train-1: terminated i-" in log


# --- scontrol and squeue output ------------------------------------------------------------------


def test_node_lines_give_flags_address_and_reason() -> None:
    text = "\n".join(
        [
            show_node("a-1", "ALLOCATED+CLOUD", addr="10.0.0.7"),
            show_node("a-2", "DOWN+CLOUD+POWERED_DOWN", "ResumeTimeout reached") + " Comment=x Extra=y",
            show_node("a-3", "IDLE+CLOUD+DRAIN", "disk full on /scratch"),
        ]
    )
    parsed = parse_nodes(text)
    assert parsed["a-1"] == NodeInfo("a-1", frozenset({"ALLOCATED", "CLOUD"}), "10.0.0.7", "")
    assert parsed["a-2"].flags == {"DOWN", "CLOUD", "POWERED_DOWN"}
    assert parsed["a-2"].reason == "ResumeTimeout reached [slurm@2026-12-01T09:10:00]"
    assert parsed["a-3"].reason.startswith("disk full on /scratch")


def test_squeue_rows_give_batch_and_requeue_flags() -> None:
    text = f"{101:<20}{1:<20}{1:<20}\n{102:<20}{0:<20}{1:<20}\n{103:<20}{1:<20}{0:<20}\n"
    assert parse_jobs(text) == [
        Job("101", batch=True, requeue=True),
        Job("102", batch=False, requeue=True),
        Job("103", batch=True, requeue=False),
    ]


# --- spot-watch against a fake IMDSv2 -------------------------------------------------------------


CREDENTIALS_PATH = "/latest/meta-data/iam/security-credentials"
INSTANCE_ROLE = "gpuplat-controller"
INSTANCE_CREDENTIALS = {
    "Code": "Success",
    "Type": "AWS-HMAC",
    "AccessKeyId": "profile",
    "SecretAccessKey": "profile",
    "Token": "profile",
    "Expiration": "2099-01-01T00:00:00Z",
}


class FakeImds(ThreadingHTTPServer):
    token = "imds-token-1"

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ImdsHandler)
        self.responses: list[int] = []
        self.notice = json.dumps(NOTICE).encode()  # the body of an instance-action answered 200
        self.requests: list[str] = []
        self.credential_delays: list[float] = []  # seconds before each answer with credentials
        self.stalled: set[str] = set()  # request methods answered only once `released` is set
        self.released = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class ImdsHandler(BaseHTTPRequestHandler):
    server: FakeImds

    def do_PUT(self) -> None:
        self.server.requests.append(self.requestline.rsplit(" ", 1)[0])  # as sent: self.path folds "//"
        self.stall()
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if self.path != "/latest/api/token" or not (ttl.isdigit() and 1 <= int(ttl) <= 21600):
            self.reply(400, b"")  # IMDS's answer to a TTL missing or outside 1 to 21600 s
            return
        self.reply(200, self.server.token.encode())

    def do_GET(self) -> None:
        self.server.requests.append(self.requestline.rsplit(" ", 1)[0])
        self.stall()
        if self.headers.get("X-aws-ec2-metadata-token") != self.server.token:
            self.reply(401, b"")
        elif self.path == f"{CREDENTIALS_PATH}/":
            self.reply(200, INSTANCE_ROLE.encode())
        elif self.path == f"{CREDENTIALS_PATH}/{INSTANCE_ROLE}":
            if self.server.credential_delays:
                time.sleep(self.server.credential_delays.pop(0))
            self.reply(200, json.dumps(INSTANCE_CREDENTIALS).encode())
        elif self.path != "/latest/meta-data/spot/instance-action":
            self.reply(404, b"")
        else:
            status = self.server.responses.pop(0) if self.server.responses else 404
            self.reply(status, self.server.notice if status == 200 else b"")

    def stall(self) -> None:
        """An IMDS that takes the connection and does not answer (until the test releases it)."""
        if self.command in self.server.stalled:
            self.server.released.wait(timeout=60)

    def reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    server = FakeImds()
    serve_in_thread(server)
    yield server
    server.released.set()
    server.shutdown()
    server.server_close()


def test_instance_profile_credentials_survive_a_slow_metadata_answer(
    imds: FakeImds, cloud: Cloud, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """botocore asks the instance metadata for credentials once, with a one-second timeout: one slow
    answer failed a whole resume with "Unable to locate credentials" in the box. The programs ask again."""
    for key in CREDENTIALS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    imds.credential_delays = [1.5]
    client = program_ec2.ec2_client(REGION, cloud.url)
    assert "Reservations" in client.describe_instances()
    assert imds.requests.count(f"GET {CREDENTIALS_PATH}/{INSTANCE_ROLE}") >= 1


class StopWatching(Exception):
    pass


def sleeps_at_most(count: int) -> Callable[[float], None]:
    """A sleep that ends the watch at its call `count + 1` (a notice missed keeps it polling)."""
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) > count:
            raise StopWatching

    return sleep


def test_spot_watch_without_notice_does_nothing(
    imds: FakeImds, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise StopWatching

    watch = SpotWatch("train-spot-1", imds.url, grace_s=0.1, interval_s=5.0)
    with pytest.raises(StopWatching):
        spot_watch(watch, Slurm(slurm.scontrol), sleep=sleep)
    assert sleeps == [5.0, 5.0, 5.0]
    assert imds.requests == ["PUT /latest/api/token", "GET /latest/meta-data/spot/instance-action"] * 3
    assert slurm.calls() == []
    assert "unreachable" not in caplog.text, "404 is no notice, not an error"


def test_spot_watch_keeps_polling_through_imds_errors(
    imds: FakeImds, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    imds.responses = [500, 404, 200]
    sleeps: list[float] = []
    watch = SpotWatch("train-spot-1", imds.url, grace_s=30.0, interval_s=5.0)
    assert spot_watch(watch, Slurm(slurm.scontrol), sleep=sleeps.append) == EXIT_OK
    assert sleeps == [5.0, 5.0, 30.0], "two polls, then the grace period after the notice"
    assert "HTTP Error 500" in caplog.text
    calls = slurm.calls()
    assert [call[0] for call in calls] == ["scontrol", "squeue", "scancel", "scontrol"], "no job to requeue"
    assert calls[0][2:4] == ["nodename=train-spot-1", "state=drain"]
    assert calls[3][2:4] == ["nodename=train-spot-1", "state=power_down_force"]


def test_spot_watch_unreachable_imds_is_logged_not_fatal(slurm: SlurmRecorder) -> None:
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise StopWatching

    watch = SpotWatch("train-spot-1", "http://127.0.0.1:9", grace_s=0.1, interval_s=5.0)
    with pytest.raises(StopWatching):
        spot_watch(watch, Slurm(slurm.scontrol), sleep=sleep)
    assert slurm.calls() == []


SPOT_REASON = f"reason=spot interruption {NOTICE['time']}"
SQUEUE_JOBS_ON_SPOT_1 = [
    "squeue",
    "--noheader",
    "--nodelist=train-spot-1",
    "--states=RUNNING,SUSPENDED",
    "--Format=JobID,BatchFlag,Requeue",
]


def squeue_states(*job_ids: str) -> list[str]:
    return ["squeue", "--noheader", f"--jobs={','.join(job_ids)}", "--states=all", "--Format=JobID,State"]


def test_spot_notice_terms_the_steps_powers_down_then_requeues_the_jobs_that_ended(
    imds: FakeImds, slurm: SlurmRecorder
) -> None:
    """SIGTERM goes to the job steps (`scancel --signal` without --full: job_mgr.c _signal_job,
    KILL_STEPS_ONLY) and to what the batch scripts started, never to a batch shell, which bash would
    die of, ending the job and its steps at once. After the grace, POWER_DOWN_FORCE requeues the
    requeueable batch jobs still running (101, now PENDING) and ends the others; those that ended in
    the grace (104 checkpointed and exited, 105 failed) are requeued then, and never one still
    running: requeued twice, 22.05 leaks its GPU."""
    imds.responses = [200]
    slurm.jobs((101, 1, 1), (102, 0, 1), (103, 1, 0), (104, 1, 1), (105, 1, 1))  # 102 srun, 103 --no-requeue
    slurm.states((101, "PENDING"), (104, "COMPLETED"), (105, "FAILED"))
    watch = SpotWatch("train-spot-1", imds.url, grace_s=90.0, interval_s=5.0)

    def sleep(seconds: float) -> None:
        slurm.note("sleep", str(seconds))

    assert spot_watch(watch, Slurm(slurm.scontrol), sleep=sleep) == EXIT_OK
    assert slurm.calls() == [
        ["scontrol", "update", "nodename=train-spot-1", "state=drain", SPOT_REASON],
        SQUEUE_JOBS_ON_SPOT_1,
        ["scancel", "--signal=TERM", "--nodelist=train-spot-1"],
        ["scontrol", "listpids"],
        ["sleep", "90.0"],
        ["scontrol", "update", "nodename=train-spot-1", "state=power_down_force", SPOT_REASON],
        squeue_states("101", "104", "105"),
        ["scontrol", "requeue", "104,105"],
    ]


def test_a_spot_notice_terms_what_the_batch_script_started_but_not_the_batch_shell(
    imds: FakeImds, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """A torchrun run in the batch script (not under srun) is in no job step: `scancel --signal`
    never reaches it. spot-watch signals every process `scontrol listpids` lists in the batch step but
    the step's task (the shell), before the grace: here real processes stand for them."""
    imds.responses = [200]
    slurm.jobs((101, 1, 1), (102, 0, 1))  # 102: an salloc/srun job, without a batch step
    shell, trainer, other_job, extern, step_helper = (
        subprocess.Popen(["sleep", "60"]) for _ in range(5)
    )  # fmt: skip
    gone = subprocess.Popen(["true"])
    gone.wait()
    slurm.pids(
        (shell.pid, 101, "batch", "0"), (trainer.pid, 101, "batch", "-"), (gone.pid, 101, "batch", "-"),
        (other_job.pid, 99, "batch", "-"), (extern.pid, 101, "extern", "-"), (step_helper.pid, 101, "0", "-"),
    )  # fmt: skip
    signalled_at: list[int | None] = []

    def sleep(_: float) -> None:
        signalled_at.append(trainer.wait(timeout=10))

    caplog.set_level("INFO", logger=LOG.name)
    try:
        watch = SpotWatch("train-spot-1", imds.url, grace_s=90.0, interval_s=5.0)
        assert spot_watch(watch, Slurm(slurm.scontrol), sleep=sleep) == EXIT_OK
        assert signalled_at == [-15], "TERM within the grace, not at its end"
        assert (
            f"spot-watch: train-spot-1: SIGTERM to 2 processes of the batch steps of jobs 101: "
            f"{trainer.pid} {gone.pid}"
        ) in [r.getMessage() for r in caplog.records], "each process listed, by its pid"
        assert shell.poll() is None and other_job.poll() is None
        assert extern.poll() is None and step_helper.poll() is None, "other steps: scancel's"
    finally:
        for process in (shell, trainer, other_job, extern, step_helper):
            process.kill()
            process.wait()


def test_a_listpids_that_could_not_reach_every_step_still_terms_what_it_listed(
    imds: FakeImds, slurm: SlurmRecorder
) -> None:
    """`scontrol listpids` exits 1 when one slurmstepd cannot be reached (a step that ended while it
    listed, a stale socket), after printing the steps it reached (info_job.c _list_pids_one_step)."""
    imds.responses = [200]
    slurm.jobs((101, 1, 1))
    trainer = subprocess.Popen(["sleep", "60"])
    slurm.pids((trainer.pid, 101, "batch", "-"))
    (slurm.bin_dir / "scontrol.listpids.rc").write_text("1")
    try:
        watch = SpotWatch("train-spot-1", imds.url, grace_s=1.0, interval_s=5.0)
        spot_watch(watch, Slurm(slurm.scontrol), sleep=lambda _: None)
        assert trainer.wait(timeout=10) == -15
    finally:
        trainer.kill()
        trainer.wait()


def test_a_failed_listpids_still_waits_the_grace_and_powers_down(
    imds: FakeImds, slurm: SlurmRecorder
) -> None:
    imds.responses = [200]
    slurm.jobs((101, 1, 1))
    slurm.fail("scontrol")
    watch = SpotWatch("train-spot-1", imds.url, grace_s=1.0, interval_s=5.0)
    assert spot_watch(watch, Slurm(slurm.scontrol), sleep=lambda _: None) == EXIT_FAILED
    assert ["scontrol", "listpids"] in slurm.calls()
    assert slurm.calls()[-2][3] == "state=power_down_force"


def test_spot_watch_logs_what_it_watches_the_notice_and_the_jobs_it_cannot_requeue(
    imds: FakeImds, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    imds.responses = [404, 200]
    slurm.jobs((101, 1, 1), (102, 0, 1), (103, 1, 0))  # 102 srun, 103 --no-requeue
    slurm.states((101, "PENDING"))
    watch = SpotWatch("train-spot-1", imds.url + "/", grace_s=90.0, interval_s=5.0)
    caplog.set_level("INFO", logger=LOG.name)
    assert spot_watch(watch, Slurm(slurm.scontrol), sleep=sleeps_at_most(2)) == EXIT_OK
    assert imds.requests == ["PUT /latest/api/token", "GET /latest/meta-data/spot/instance-action"] * 2
    assert [r.getMessage() for r in caplog.records if r.module == "spot_watch"] == [
        f"spot-watch: watching {imds.url}/ for node train-spot-1 every 5 s",
        f"spot-watch: train-spot-1: spot interruption {NOTICE['time']} (terminate)",
        "spot-watch: train-spot-1: SIGTERM to 0 processes of the batch steps of jobs 101,103: none",
        "spot-watch: train-spot-1: waiting 90 s for the jobs to checkpoint",
        "spot-watch: train-spot-1: jobs 102,103 are not requeueable batch jobs; POWER_DOWN_FORCE ended them",
    ]


@pytest.mark.parametrize(
    ("body", "unreadable"),
    [(b"<html>maintenance</html>", True), (b'["terminate"]', False), (b"{}", False)],
)
def test_a_notice_without_a_readable_time_or_action_is_still_handled(
    imds: FakeImds, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture, body: bytes, unreadable: bool
) -> None:
    """Whatever instance-action holds, its presence is the notice: the node is drained and powered
    down with the time unknown."""
    imds.responses, imds.notice = [200], body
    watch = SpotWatch("train-spot-1", imds.url, grace_s=1.0, interval_s=5.0)
    caplog.set_level("INFO", logger=LOG.name)
    assert spot_watch(watch, Slurm(slurm.scontrol), sleep=sleeps_at_most(1)) == EXIT_OK
    reason = "reason=spot interruption unknown"
    assert [call for call in slurm.calls() if call[:2] == ["scontrol", "update"]] == [
        ["scontrol", "update", "nodename=train-spot-1", "state=drain", reason],
        ["scontrol", "update", "nodename=train-spot-1", "state=power_down_force", reason],
    ]
    messages = [r.getMessage() for r in caplog.records if r.name == LOG.name]
    assert "spot-watch: train-spot-1: spot interruption unknown (unknown)" in messages
    warning = f"spot-watch: unreadable instance-action {body.decode()!r}; treating it as a notice"
    assert (warning in messages) is unreadable


def test_unreachable_instance_metadata_is_logged_and_polled_again(
    slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        raise StopWatching

    watch = SpotWatch("train-spot-1", "http://127.0.0.1:9", grace_s=0.1, interval_s=5.0)
    with pytest.raises(StopWatching):
        spot_watch(watch, Slurm(slurm.scontrol), sleep=sleep)
    assert sleeps == [5.0]
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith("spot-watch: instance metadata unreachable: <urlopen error [Errno 111]")


def test_spot_notice_requeues_nothing_itself_when_every_job_was_still_running(
    imds: FakeImds, slurm: SlurmRecorder
) -> None:
    imds.responses = [200]
    slurm.jobs((101, 1, 1))
    slurm.states((101, "PENDING"))
    watch = SpotWatch("train-spot-1", imds.url, grace_s=1.0, interval_s=5.0)
    assert spot_watch(watch, Slurm(slurm.scontrol), sleep=lambda _: None) == EXIT_OK
    assert slurm.calls()[-2:] == [
        ["scontrol", "update", "nodename=train-spot-1", "state=power_down_force", SPOT_REASON],
        squeue_states("101"),
    ]


def test_spot_notice_without_squeue_still_terms_and_powers_down(imds: FakeImds, slurm: SlurmRecorder) -> None:
    """Without the job list, POWER_DOWN_FORCE's own requeue (of jobs still running) is what is left."""
    imds.responses = [200]
    slurm.fail("squeue")
    watch = SpotWatch("train-spot-1", imds.url, grace_s=1.0, interval_s=5.0)
    assert spot_watch(watch, Slurm(slurm.scontrol), sleep=lambda _: None) == EXIT_FAILED
    assert [call[:2] for call in slurm.calls()] == [
        ["scontrol", "update"],
        ["squeue", "--noheader"],
        ["scancel", "--signal=TERM"],
        ["scontrol", "update"],
    ]
    assert slurm.calls()[-1][3] == "state=power_down_force"


def test_spot_watch_program_handles_a_notice_within_the_grace(imds: FakeImds, slurm: SlurmRecorder) -> None:
    imds.responses = [404, 200]
    slurm.jobs((7, 1, 1))
    slurm.states((7, "COMPLETED"))
    argv = [
        *PROGRAM,
        "spot-watch",
        "--node-name=train-spot-1",
        f"--imds-url={imds.url}",
        f"--scontrol={slurm.scontrol}",
        "--grace-seconds=0.5",
        "--interval-seconds=0.1",
    ]
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=program_env(), check=False)
    assert result.returncode == 0, result.stderr
    assert slurm.calls() == [
        ["scontrol", "update", "nodename=train-spot-1", "state=drain", SPOT_REASON],
        SQUEUE_JOBS_ON_SPOT_1,
        ["scancel", "--signal=TERM", "--nodelist=train-spot-1"],
        ["scontrol", "listpids"],
        ["scontrol", "update", "nodename=train-spot-1", "state=power_down_force", SPOT_REASON],
        squeue_states("7"),
        ["scontrol", "requeue", "7"],
    ]
    assert time.monotonic() - started >= 0.5
    assert "train-spot-1" in result.stderr


class UnreachableEc2(RecordingEc2):
    """EC2 refusing every describe (a throttled or denied DescribeInstances)."""

    def get_paginator(self, name: str) -> Any:
        raise ClientError(
            {"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}, "DescribeInstances"
        )


def test_resume_without_describes_still_launches_says_so_and_only_unknown_names_launch_nothing(
    tmp_path: Path, cloud: Cloud, slurm: SlurmRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    """A throttled DescribeInstances: the earlier instances cannot be looked up, so none is terminated, but
    every name still gets a new one (resume always launches, as ParallelCluster's does; a second instance
    of a name is reconcile's to terminate). The run reports the failure."""
    client = boto3.client("ec2", region_name=REGION, endpoint_url=cloud.url)
    settings = settings_for(tmp_path, cloud, slurm)
    status = resume(
        settings,
        Ec2Nodes(UnreachableEc2(client, slurm), cloud.stack),
        Slurm(slurm.scontrol),
        ["train-0", "train-1"],
    )
    assert status == EXIT_FAILED
    launched = sorted(tags_of(i)["gpuplat:node"] for i in cloud.instances())
    assert launched == ["train-0", "train-1"]
    assert not any("power_down_force" in " ".join(call) for call in slurm.calls()), slurm.calls()
    looked_up = (
        "resume: cannot look up the earlier instances of train-0,train-1: An error occurred "
        "(RequestLimitExceeded)"
    )
    messages = [r.getMessage() for r in caplog.records if r.name == LOG.name]
    assert any(m.startswith(looked_up) for m in messages), messages
    caplog.clear()
    slurm.record.unlink()
    before = len(cloud.instances())
    assert resume(settings, ec2_nodes(cloud, slurm), Slurm(slurm.scontrol), ["infer-1"]) == EXIT_UNKNOWN_NODE
    assert slurm.calls() == [] and len(cloud.instances()) == before
    assert [r.getMessage() for r in caplog.records if r.name == LOG.name] == [
        "resume: infer-1 belong to no configured pool (pools: train,train-spot); names are <pool>-<index>"
    ]
