"""How `gpuplat serve` reaches a stack's nodes beyond the local platform (infra/nodes/remote.py,
infra/serving/reach.py): on-premises hosts over ssh with the settings Ansible's ssh connection reads, AWS
instances through SSM Run Command. Each command must arrive as given: here the remote side is played by a
local `sh -c` of exactly the string ssh or SSM would hand the node's shell (what sshd and the SSM agent's
runShellScript do with it is theirs, not modelled). SSM's API is botocore's Stubber (no real SSM here);
the serving scenario drives an on-premises stack over a real ssh (tests/serving/test_serve.py)."""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infra.errors import GpuPlatError
from infra.nodes.inventory import static_inventory
from infra.nodes.remote import SSM_SHELL_DOCUMENT, SshNodes, SshSettings, SsmNodes
from infra.platform.resolve import load_platform
from infra.serving.reach import prometheus_url, stack_reach
from infra.serving.release import METRICS_READ, STATE_WRITE, serving_layout
from tests.unit.test_cli import cli_env

# Arguments a release sends that a shell would split, expand or end early if they were not quoted.
AWKWARD = ["printf", "%s|", "two words", "it's", '{"a": "b c"}', "$HOME", "`id`", "a;b", "line\nbreak", ""]


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Path]:
    """An `ssh` first on PATH that records its arguments and does what sshd does with the last one: hands it
    to a shell as `sh -c STRING` (here, locally), or fails as ssh does when it cannot connect (255)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")

    def install(behaviour: str = 'exec sh -c "$last"') -> Path:
        record = tmp_path / "ssh-args"
        (tools / "ssh").write_text(
            "#!/bin/sh\n"
            f'for arg; do printf "%s\\0" "$arg"; done > {record}\n'
            "for last; do :; done\n"
            f"{behaviour}\n"
        )
        (tools / "ssh").chmod(0o755)
        return record

    return install


def ansible_settings(**environment: str) -> SshSettings:
    return SshSettings.of_ansible(environment)


def test_the_project_settings_are_ansibles_and_its_variables_override_them(tmp_path: Path) -> None:
    # The project's ansible.cfg turns host key checking off (as every playbook run has it).
    assert ansible_settings().options() == ["-o", "StrictHostKeyChecking=accept-new"]
    settings = ansible_settings(
        ANSIBLE_REMOTE_USER="deploy",
        ANSIBLE_REMOTE_PORT="2222",
        ANSIBLE_PRIVATE_KEY_FILE="~/keys/site",
        ANSIBLE_HOST_KEY_CHECKING="True",
        ANSIBLE_SSH_ARGS="-o UserKnownHostsFile=/tmp/kh -o 'ProxyJump bastion'",
    )
    assert settings.options() == [
        "-o", "UserKnownHostsFile=/tmp/kh", "-o", "ProxyJump bastion",
        "-o", "Port=2222",
        "-o", f"IdentityFile={os.path.expanduser('~/keys/site')}",
        "-o", "User=deploy",
    ]  # fmt: skip
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\nremote_user = ops\nremote_port = 22\n[ssh_connection]\nssh_args = -C\n")
    from_file = SshSettings.of_ansible({}, cfg)
    assert (from_file.user, from_file.port, from_file.ssh_args, from_file.host_key_checking) == (
        "ops",
        22,
        ("-C",),
        True,
    )
    with pytest.raises(GpuPlatError, match="must be whole numbers"):
        ansible_settings(ANSIBLE_REMOTE_PORT="twenty-two")


def test_a_command_arrives_on_an_ssh_host_as_given(fake_ssh: Callable[..., Path], tmp_path: Path) -> None:
    record = fake_ssh()
    nodes = SshNodes({"gpu-21": "10.40.2.21"}, ansible_settings(ANSIBLE_REMOTE_USER="root"))
    assert nodes.exec("gpu-21", *AWKWARD) == "".join(f"{argument}|" for argument in AWKWARD[2:])
    sent = record.read_text().split("\0")[:-1]
    assert sent[:4] == ["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    assert sent[-3:-1] == ["--", "10.40.2.21"] and "User=root" in sent
    # What a release sends: a program of several lines (nothing listens on port 1: it prints nothing, where
    # a program cut at a line or a quote would fail), a JSON record through a script of its own arguments.
    assert nodes.exec("gpu-21", "python3", "-c", METRICS_READ, "1") == ""
    state = json.dumps({"detail": 'it\'s "quoted" $x `id`; a\nb'})
    nodes.exec("gpu-21", "sh", "-c", STATE_WRITE, "state", str(tmp_path / "state"), "m", state)
    assert (tmp_path / "state" / "m.json").read_text() == state


def test_an_unreachable_host_is_one_paragraph_naming_what_to_set(fake_ssh: Callable[..., Path]) -> None:
    fake_ssh('echo "ssh: connect to host 10.40.2.21 port 22: Connection refused" >&2; exit 255')
    nodes = SshNodes({"gpu-21": "10.40.2.21"}, ansible_settings())
    with pytest.raises(GpuPlatError) as unreachable:
        nodes.exec("gpu-21", "true")
    message = unreachable.value.message
    assert "cannot reach gpu-21 at 10.40.2.21 over ssh" in message and "Connection refused" in message
    assert "ANSIBLE_REMOTE_USER" in message and "\n" not in message
    fake_ssh("echo 'no such unit' >&2; exit 5")
    with pytest.raises(
        GpuPlatError, match=r"`systemctl stop x` failed on gpu-21 \(10.40.2.21\) with exit 5: no such"
    ):
        nodes.exec("gpu-21", "systemctl", "stop", "x")
    fake_ssh("sleep 5")
    with pytest.raises(GpuPlatError, match="did not end within 1 s"):
        nodes.exec("gpu-21", "sleep", "5", timeout=1)
    with pytest.raises(GpuPlatError, match="no host 'gpu-99'"):
        nodes.exec("gpu-99", "true")


def onprem_serving(platform: dict[str, Any]) -> None:
    """The shipped on-premises stack with a registry and the CPU reference engine (its vLLM replicas take
    all eight GPUs of the node: no canary fits, which serve refuses)."""
    platform["serving"].update(
        registry={}, engine="cpu-reference", model="sentence-transformers/all-MiniLM-L6-v2"
    )


def test_an_onprem_stack_is_served_over_ssh_at_the_addresses_its_gateways_use(
    write_stack: Callable[..., Path],
) -> None:
    platform = load_platform(write_stack("onprem", onprem_serving))
    layout = serving_layout(platform)
    assert (layout.gateways, layout.servers) == (("head-01",), ("gpu-21",))
    # The gateway role names each server by its inventory host's ansible_host
    # (roles/inference_gateway/tasks/preflight.yml): the drains and readies must name the same address.
    hosts = static_inventory(platform)["all"]["children"]["pool_infer"]["hosts"]
    assert {node: layout.addresses[node] for node in layout.servers} == {
        node: hosts[node]["ansible_host"] for node in layout.servers
    }
    # The gateway by its own address too: the detached guard's followers on other gateways reach it there.
    assert layout.addresses == {"gpu-21": "10.40.2.21", "head-01": "10.40.0.10"}
    nodes = stack_reach(platform).nodes
    assert isinstance(nodes, SshNodes) and nodes.addresses["head-01"] == "10.40.0.10"
    assert prometheus_url(platform, None) == "http://10.40.0.10:9090"
    assert prometheus_url(platform, "http://p:9090") == "http://p:9090"


def test_serve_on_an_onprem_stack_with_an_unreachable_host_fails_in_one_paragraph(
    write_stack: Callable[..., Path], fake_ssh: Callable[..., Path]
) -> None:
    fake_ssh('echo "ssh: connect to host 10.40.0.10 port 22: No route to host" >&2; exit 255')
    stack = write_stack("onprem", onprem_serving)
    run = subprocess.run(
        [sys.executable, "-c", "from infra.cli.app import main; main()", "serve", "status", "embedder",
         "--stack-file", str(stack), "--registry-url", "http://127.0.0.1:9"],
        capture_output=True, text=True, env={**cli_env(), "PATH": os.environ["PATH"]}, check=False,
    )  # fmt: skip
    assert run.returncode == 4, (run.returncode, run.stderr)
    assert run.stderr.startswith("error: cannot reach head-01 at 10.40.0.10 over ssh"), run.stderr
    assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1, run.stderr


# SSM Run Command, its API stubbed (botocore.stub.Stubber checks each call's parameters against the
# service model); the script it would hand the node is run here with `sh -c`, as the agent runs it.


COMMAND_ID = "0b5a0e9c-7b8a-4a8e-9a41-2f8a3d2c1e00"  # SSM's command ids are 36 characters


def ssm_client() -> Any:
    import boto3

    return boto3.client("ssm", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")


def run_as_agent(script: str) -> tuple[int, str, str]:
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)
    return done.returncode, done.stdout, done.stderr


def invocation(status: str, code: int = 0, out: str = "", err: str = "") -> dict[str, Any]:
    return {"Status": status, "ResponseCode": code, "StandardOutputContent": out, "StandardErrorContent": err}


def test_a_command_arrives_on_an_aws_node_as_given_and_its_output_whole() -> None:
    from botocore.stub import Stubber

    ssm = ssm_client()
    nodes = SsmNodes({"head-0": "i-0123456789abcdef0"}, ssm, sleep=lambda _: None)
    script = nodes.script(AWKWARD)
    code, packed, _ = run_as_agent(script)
    assert code == 0
    expected = "".join(f"{argument}|" for argument in AWKWARD[2:])
    with Stubber(ssm) as stub:
        stub.add_response(
            "send_command",
            {"Command": {"CommandId": COMMAND_ID}},
            {
                "InstanceIds": ["i-0123456789abcdef0"],
                "DocumentName": SSM_SHELL_DOCUMENT,
                "TimeoutSeconds": 120,
                "Parameters": {"commands": [script], "executionTimeout": ["120"]},
            },
        )
        stub.add_client_error("get_command_invocation", "InvocationDoesNotExist")
        stub.add_response("get_command_invocation", invocation("InProgress"))
        stub.add_response("get_command_invocation", invocation("Success", out=packed))
        assert nodes.exec("head-0", *AWKWARD) == expected
        stub.assert_no_pending_responses()
    # A /metrics far past SSM's 24,000 characters comes back whole, packed.
    big = "x 1\n" * 20_000
    code, packed, _ = run_as_agent(nodes.script(["printf", "%s", big]))
    assert len(packed) < 24_000 and SsmNodes.unpack("head-0", packed) == big


def test_an_aws_node_that_fails_or_cannot_be_reached_is_one_paragraph() -> None:
    from botocore.stub import Stubber

    ssm = ssm_client()
    nodes = SsmNodes({"head-0": "i-0123456789abcdef0"}, ssm, sleep=lambda _: None)
    code, _, err = run_as_agent(nodes.script(["sh", "-c", "echo 'no such unit' >&2; exit 5"]))
    assert code == 5
    with Stubber(ssm) as stub:
        stub.add_response("send_command", {"Command": {"CommandId": COMMAND_ID}})
        stub.add_response("get_command_invocation", invocation("Failed", code, err=err))
        with pytest.raises(
            GpuPlatError,
            match=r"failed on head-0 \(i-0123456789abcdef0\) through SSM: Failed \(exit 5\): no such unit",
        ):
            nodes.exec("head-0", "systemctl", "stop", "x")
        stub.add_client_error(
            "send_command", "AccessDeniedException", "not authorized to perform ssm:SendCommand"
        )
        with pytest.raises(GpuPlatError) as denied:
            nodes.exec("head-0", "true")
    assert "cannot reach head-0 (i-0123456789abcdef0) through SSM" in denied.value.message
    assert "ssm:SendCommand" in denied.value.message and "\n" not in denied.value.message
    with pytest.raises(GpuPlatError, match=r"no running instance of node 'infer-0'.*running: head-0"):
        nodes.exec("infer-0", "true")
    with pytest.raises(GpuPlatError, match="longer than the 24000 characters"):
        SsmNodes.unpack("head-0", "A" * 24_000)
    # An answer with no packed output at all was lost (the packing prints a gzip stream even for none).
    with pytest.raises(GpuPlatError, match="answer through SSM is empty"):
        SsmNodes.unpack("head-0", "")
    with pytest.raises(GpuPlatError, match="could not be unpacked"):
        SsmNodes.unpack("head-0", base64.b64encode(b"not gzip").decode())
    assert SsmNodes.unpack("head-0", base64.b64encode(gzip.compress(b"")).decode()) == ""


def test_an_aws_command_that_never_ends_fails_after_its_timeout() -> None:
    from botocore.stub import Stubber

    ssm = ssm_client()
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    nodes = SsmNodes({"head-0": "i-0123456789abcdef0"}, ssm, sleep=sleep, clock=lambda: now[0], poll_s=20)
    with Stubber(ssm) as stub:
        stub.add_response("send_command", {"Command": {"CommandId": COMMAND_ID}})
        for _ in range(3):
            stub.add_response("get_command_invocation", invocation("InProgress"))
        with pytest.raises(GpuPlatError, match="did not end within 40 s"):
            nodes.exec("head-0", "sleep", "60", timeout=10)
        stub.assert_no_pending_responses()


def test_an_onprem_stacks_registry_is_found_where_its_role_binds_it(write_stack: Callable[..., Path]) -> None:
    from infra.serving.registry.locate import registry_url

    platform = load_platform(write_stack("onprem", onprem_serving))
    assert registry_url(platform, None) == "http://10.40.0.10:5000"  # model_registry_listen_address
    assert static_inventory(platform)["all"]["vars"]["model_registry_listen_address"] == "10.40.0.10"
    assert registry_url(platform, "http://tunnel:5000") == "http://tunnel:5000"


def test_an_ipv6_host_address_is_bracketed_in_the_urls_found_for_it(write_stack: Callable[..., Path]) -> None:
    from infra.serving.registry.locate import registry_url

    def on_ipv6(platform: dict[str, Any]) -> None:
        onprem_serving(platform)
        platform["pools"][0]["hosts"][0]["address"] = "fd00:40::10"

    platform = load_platform(write_stack("onprem", on_ipv6))
    # Bare, `http://fd00:40::10:9090` is a URL urllib cannot read a port from.
    assert prometheus_url(platform, None) == "http://[fd00:40::10]:9090"
    assert registry_url(platform, None) == "http://[fd00:40::10]:5000"


def test_a_login_user_that_is_not_root_runs_the_command_through_sudo_that_never_prompts(
    fake_ssh: Callable[..., Path], tmp_path: Path
) -> None:
    fake_ssh()
    tools = tmp_path / "bin"
    (tools / "id").write_text("#!/bin/sh\necho 1000\n")
    # sudo here: its arguments recorded, then what follows `--` run (as a passwordless sudo would).
    (tools / "sudo").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "sudo-args"}\n'
        'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"\n'
    )
    for tool in ("id", "sudo"):
        (tools / tool).chmod(0o755)
    nodes = SshNodes({"gpu-21": "10.40.2.21"}, ansible_settings(ANSIBLE_REMOTE_USER="deploy"))
    assert nodes.exec("gpu-21", "printf", "%s", "a b") == "a b"
    # -n: a sudo that wants a password fails at once instead of waiting for one no one can type.
    assert (tmp_path / "sudo-args").read_text().splitlines() == ["-n", "--", "printf", "%s", "a b"]


def test_every_name_ansible_reads_a_setting_by_counts_the_last_one_set_winning(tmp_path: Path) -> None:
    """ansible-core 2.19.14's ssh connection: host_key_checking and timeout also as ANSIBLE_SSH_* and in
    [ssh_connection], the later name or section winning; a bastion in ssh_common_args / ssh_extra_args."""
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text(
        "[defaults]\nhost_key_checking = False\ntimeout = 5\n"
        "[ssh_connection]\nhost_key_checking = True\ntimeout = 7\nssh_common_args = -o ProxyJump=bastion\n"
    )
    from_file = SshSettings.of_ansible({}, cfg)
    assert (from_file.host_key_checking, from_file.connect_timeout_s) == (True, 7)
    assert from_file.options()[-2:] == ["-o", "ProxyJump=bastion"]
    overridden = SshSettings.of_ansible(
        {
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_SSH_HOST_KEY_CHECKING": "True",
            "ANSIBLE_SSH_TIMEOUT": "3",
            "ANSIBLE_SSH_EXTRA_ARGS": "-o ServerAliveInterval=5",
        },
        cfg,
    )
    assert (overridden.host_key_checking, overridden.connect_timeout_s) == (True, 3)
    assert overridden.options()[-4:] == ["-o", "ProxyJump=bastion", "-o", "ServerAliveInterval=5"]
