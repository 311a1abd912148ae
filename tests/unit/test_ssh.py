"""`gpuplat ssh NODE`: the command that reaches a node, per backend (printed with --print: running it needs
the node). On AWS the instance is found by its tags in a moto EC2 (what SSM then does is AWS's, not
modelled here)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.errors import GpuPlatError
from infra.nodes.reach import node_command, ssm_nodes, stack_instances
from infra.nodes.remote import SshNodes, SshSettings
from infra.platform.resolve import ResolvedPlatform, load_platform
from tests.conftest import empty_moto_account, launch_tagged
from tests.unit.test_cli import gpuplat

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")


def test_local_and_onprem_nodes() -> None:
    shell = gpuplat("ssh", "--stack", "local", "--print", "train-0")
    assert shell.returncode == 0 and shell.stdout.strip() == "podman exec -it gpuplat-local-train-0 bash -l"
    one = gpuplat("ssh", "--stack", "local", "--print", "train-0", "--", "nvidia-smi", "-L")
    assert one.stdout.strip() == "podman exec -i gpuplat-local-train-0 nvidia-smi -L"
    host = gpuplat("ssh", "--stack", "onprem", "--print", "gpu-01", "--", "hostname")
    # The project's ansible.cfg turns host key checking off: a new host's key is taken, a changed one is not
    # (infra/nodes/remote.py).
    assert host.stdout.strip() == "ssh -o StrictHostKeyChecking=accept-new -- 10.40.1.11 hostname"
    # The remote shell gets the arguments as given, not split again at their spaces or run as `;`.
    quoted = gpuplat("ssh", "--stack", "onprem", "--print", "gpu-01", "--", "bash", "-c", "echo a b; ls")
    assert shlex.split(quoted.stdout)[-3:] == ["--", "10.40.1.11", "bash -c 'echo a b; ls'"]
    unknown = gpuplat("ssh", "--stack", "local", "nope")
    assert unknown.returncode == 2 and "its nodes: head-0, train-0" in unknown.stderr


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    empty_moto_account(url)  # the stacks' names are the shipped ones, which other modules launch in too
    for key, value in {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t"}.items():
        monkeypatch.setenv(key, value)
    tools = tmp_path / "bin"  # the AWS CLI and the plugin present (never run here)
    tools.mkdir()
    for tool in ("aws", "session-manager-plugin"):
        (tools / tool).write_text("#!/bin/sh\n")
        (tools / tool).chmod(0o755)
    monkeypatch.setattr("infra.nodes.reach.shutil.which", lambda name: str(tools / name))
    yield boto3.client("ec2", region_name="us-east-1", endpoint_url=url)
    empty_moto_account(url)
    server.stop()


def test_an_aws_node_is_an_ssm_session_to_its_running_instance(
    ec2: Any, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    platform = shipped_platforms["aws-prod"]
    ours = launch_tagged(ec2, **{"gpuplat:stack": "aws-prod", "gpuplat:node": "head-0"})[0]
    launch_tagged(ec2, **{"gpuplat:stack": "aws-prod-2", "gpuplat:node": "head-0"})  # another stack's head-0
    stopped = launch_tagged(ec2, **{"gpuplat:stack": "aws-prod", "gpuplat:node": "train-3"})[0]
    ec2.stop_instances(InstanceIds=[stopped])
    assert node_command(platform, "head-0", [], ec2) == [
        "aws", "ssm", "start-session", "--region", "us-east-1", "--target", ours,
    ]  # fmt: skip
    assert node_command(platform, "head-0", ["sinfo", "-N"], ec2)[-4:] == [
        "--document-name", "AWS-StartInteractiveCommand", "--parameters", '{"command": ["sinfo -N"]}',
    ]  # fmt: skip
    # A command with commas and `=` (the AWS CLI's shorthand would split it or refuse it) is one string.
    query = ["nvidia-smi", "--query-gpu=name,memory.used", "--format=csv"]
    parameters = json.loads(node_command(platform, "head-0", query, ec2)[-1])
    assert parameters == {"command": ["nvidia-smi --query-gpu=name,memory.used --format=csv"]}
    with pytest.raises(GpuPlatError) as absent:
        node_command(platform, "train-3", [], ec2)
    assert absent.value.exit_code == 2 and "(running: head-0)" in absent.value.message


def test_without_the_ssm_tools_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, shipped_platforms: dict[str, ResolvedPlatform]
) -> None:
    monkeypatch.setattr("infra.nodes.reach.shutil.which", lambda name: None)
    with pytest.raises(GpuPlatError) as missing:
        node_command(shipped_platforms["aws-prod"], "head-0", [])
    assert missing.value.exit_code == 3 and "aws, session-manager-plugin" in missing.value.message


def test_an_aws_stacks_nodes_are_its_running_instances_named_as_its_inventory_names_them(
    ec2: Any, write_stack: Callable[..., Path]
) -> None:
    """gpuplat serve's SSM reach (infra/nodes/remote.py SsmNodes) and `gpuplat ssh` find the same instances:
    a node by its gpuplat:node tag, an Auto Scaling group's instance (no such tag) by its id. A stack of its
    own: moto's EC2 is one per process, shared by the tests an xdist worker runs."""

    def renamed(platform: dict[str, Any]) -> None:
        platform["name"] = "aws-reach"

    platform = load_platform(write_stack("aws-prod", renamed, name="aws-reach"))
    head = launch_tagged(ec2, **{"gpuplat:stack": "aws-reach", "gpuplat:node": "head-0"})[0]
    scaled = launch_tagged(ec2, **{"gpuplat:stack": "aws-reach", "gpuplat:pool": "infer"})[0]
    launch_tagged(ec2, **{"gpuplat:stack": "aws-reach-2", "gpuplat:node": "head-0"})
    instances = stack_instances(platform, ec2)
    nodes = ssm_nodes(platform, instances, ssm=object())
    assert nodes.instances == {"head-0": head, scaled: scaled}
    # The serving pool's instance by its pool tag, at the private address the gateways' slots name.
    assert [(i.node, i.pool, i.address.startswith("10.")) for i in instances if i.node == scaled] == [
        (scaled, "infer", True)
    ]
    assert node_command(platform, scaled, ["true"], ec2)[6] == scaled


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client (openssh-client)")
def test_host_key_checking_off_in_ansible_cfg_still_refuses_a_changed_host_key(tmp_path: Path) -> None:
    """ssh's own reading of the options (`ssh -G`): with ansible.cfg's host_key_checking = False a new host's
    key is accepted, but a changed one is never (`no` would let whoever answers at the address in)."""
    settings = SshSettings.of_ansible({}, cfg=tmp_path / "none.cfg")
    assert settings.host_key_checking
    off = SshSettings(host_key_checking=False)
    argv = SshNodes({"gpu-01": "10.40.1.11"}, off).argv("gpu-01", ["true"])
    config = tmp_path / "ssh_config"
    config.write_text("")
    read = subprocess.run(
        ["ssh", "-G", "-F", str(config), *argv[1 : argv.index("--")], "10.40.1.11"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "stricthostkeychecking accept-new" in read.stdout.splitlines()
