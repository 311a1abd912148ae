"""Run one command on a node of an on-premises or AWS stack and read what it printed: over ssh to the host's
address from the stack file (as Ansible's ssh connection reaches it), or through SSM Run Command on the
node's instance (as Ansible's aws_ssm connection reaches AWS nodes, through the same SSM agent).

Both take the command as an argv and make it arrive as given: each reach hands the remote side one shell
string, so the arguments are quoted into it (shlex.join), never split again at their spaces.
"""

from __future__ import annotations

import base64
import binascii
import configparser
import gzip
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.errors import EnvironmentProblem, GpuPlatError
from infra.spec.load import PROJECT_ROOT

ANSIBLE_CFG = PROJECT_ROOT / "ansible.cfg"
# ssh's exit status when the connection itself failed (ssh(1), EXIT STATUS: "255 if an error occurred").
SSH_FAILED = 255
# As Ansible's playbooks do (`become: true`, sudo its default method): a command runs as root, through
# `sudo -n` (never a password prompt) where the login user is not root.
AS_ROOT = 'if [ "$(id -u)" -eq 0 ]; then exec "$@"; fi; exec sudo -n -- "$@"'


@dataclass(frozen=True)
class SshSettings:
    """What Ansible's ssh connection takes from ansible.cfg and the environment for hosts whose inventory
    names only their address (infra/nodes/inventory.py `_host_vars`): the user, port, key and host key
    checking, each given to ssh as Ansible gives it (ansible-core 2.19.14,
    ansible/plugins/connection/ssh.py `_build_command`, lines 882-925: `-o StrictHostKeyChecking=no` where
    host_key_checking is false (here accept-new, see `options`), `-o Port=`, `-o IdentityFile=`,
    `-o User=`, `-o ConnectTimeout=`). Unset, ssh's own
    configuration (~/.ssh/config, the agent) decides, for Ansible and for gpuplat alike."""

    user: str | None = None
    port: int | None = None
    private_key_file: str | None = None
    host_key_checking: bool = True
    connect_timeout_s: int = 10
    ssh_args: tuple[str, ...] = ()
    """ANSIBLE_SSH_ARGS or [ssh_connection] ssh_args, where set (Ansible's own default, a ControlPersist
    master, is not applied: it would leave an ssh process behind each command)"""
    extra_args: tuple[str, ...] = ()
    """ssh_common_args, then ssh_extra_args (ANSIBLE_SSH_COMMON_ARGS, ANSIBLE_SSH_EXTRA_ARGS): where a site
    names its bastion (`-o ProxyJump=...`), after every other option as Ansible adds them"""

    @classmethod
    def of_ansible(cls, environ: Mapping[str, str] | None = None, cfg: Any = ANSIBLE_CFG) -> SshSettings:
        """The project's ansible.cfg (the one gpuplat runs its playbooks with, [defaults]), each setting
        overridden by its ANSIBLE_* variable as Ansible's configuration manager does."""
        environ = os.environ if environ is None else environ
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(cfg)

        def setting(
            variables: tuple[str, ...], key: str, sections: tuple[str, ...] = ("defaults",)
        ) -> str | None:
            # As ansible/config/manager.py (ansible-core 2.19.14) reads a plugin option: any of its variables
            # over the file, and of several names (or sections) the last one set (`_loop_entries`, lines
            # 521-537; the ini entries, lines 633-650). The names: plugins/connection/ssh.py DOCUMENTATION.
            found = [environ[v] for v in variables if environ.get(v, "").strip()] or [
                value for section in sections if (value := parser.get(section, key, fallback=None))
            ]
            return found[-1].strip() if found and found[-1].strip() else None

        both = ("defaults", "ssh_connection")
        port = setting(("ANSIBLE_REMOTE_PORT",), "remote_port")
        checking = setting(
            ("ANSIBLE_HOST_KEY_CHECKING", "ANSIBLE_SSH_HOST_KEY_CHECKING"), "host_key_checking", both
        )
        timeout = setting(("ANSIBLE_TIMEOUT", "ANSIBLE_SSH_TIMEOUT"), "timeout", both)
        extra = [
            setting((variable,), key, ("ssh_connection",)) or ""
            for variable, key in (
                ("ANSIBLE_SSH_COMMON_ARGS", "ssh_common_args"),
                ("ANSIBLE_SSH_EXTRA_ARGS", "ssh_extra_args"),
            )
        ]
        try:
            return cls(
                user=setting(("ANSIBLE_REMOTE_USER",), "remote_user"),
                port=int(port) if port else None,
                private_key_file=setting(("ANSIBLE_PRIVATE_KEY_FILE",), "private_key_file"),
                host_key_checking=checking is None or checking.lower() not in ("false", "no", "0", "off"),
                connect_timeout_s=int(timeout) if timeout else 10,
                ssh_args=tuple(
                    shlex.split(setting(("ANSIBLE_SSH_ARGS",), "ssh_args", ("ssh_connection",)) or "")
                ),
                extra_args=tuple(shlex.split(" ".join(extra))),
            )
        except ValueError as error:
            raise GpuPlatError(
                f"ANSIBLE_REMOTE_PORT / ANSIBLE_TIMEOUT (or remote_port / timeout in {cfg}) must be whole "
                f"numbers: {error}"
            ) from None

    def options(self) -> list[str]:
        # Where Ansible's setting turns checking off it gives StrictHostKeyChecking=no, which also lets a
        # host whose key CHANGED be reached (ssh_config(5), OpenSSH 9.2): whoever answers at its address
        # would take the operator's root commands and forge their answers (a golden set passed, a gateway's
        # figures). gpuplat accepts a host's first key, as Ansible's first run needs, never a changed one.
        found = [] if self.host_key_checking else ["-o", "StrictHostKeyChecking=accept-new"]
        if self.port is not None:
            found += ["-o", f"Port={self.port}"]
        if self.private_key_file:
            found += ["-o", f"IdentityFile={os.path.expanduser(self.private_key_file)}"]
        if self.user:
            found += ["-o", f"User={self.user}"]
        return [*self.ssh_args, *found, *self.extra_args]

    def describe(self) -> str:
        return (
            ", ".join(
                f"{name} {value}"
                for name, value in (
                    ("user", self.user),
                    ("port", self.port),
                    ("key", self.private_key_file),
                )
                if value is not None
            )
            or "ssh's own configuration"
        )


def ssh_argv(address: str, command: Sequence[str], options: Sequence[str] = ()) -> list[str]:
    """ssh to `address`, running `command` there (none: a login shell). ssh(1) hands its command to the
    remote user's shell as one string: the arguments are quoted so they arrive as given (as through SSM),
    and `--` keeps an address from being read as an option."""
    return ["ssh", *options, "--", address, *([shlex.join(command)] if command else [])]


class SshNodes:
    """The nodes of an on-premises stack, by name, reached over ssh at their addresses (`Nodes`)."""

    def __init__(
        self,
        addresses: Mapping[str, str],
        settings: SshSettings,
        run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    ) -> None:
        self.addresses = dict(addresses)
        self.settings = settings
        self.run = run

    def argv(self, node: str, command: Sequence[str]) -> list[str]:
        """Non-interactive (BatchMode: a missing key fails at once instead of asking for a password)."""
        options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.settings.connect_timeout_s}"]
        as_root = ["sh", "-c", AS_ROOT, "gpuplat", *command]
        return ssh_argv(self.addresses[node], as_root, [*options, *self.settings.options()])

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        if node not in self.addresses:
            raise GpuPlatError(f"no host {node!r} in the stack: its hosts are {', '.join(self.addresses)}")
        if shutil.which("ssh") is None:
            raise EnvironmentProblem(
                "gpuplat reaches on-premises hosts with ssh, which is not installed here: install the "
                "OpenSSH client (Debian: openssh-client)"
            )
        address = self.addresses[node]
        try:
            done = self.run(
                self.argv(node, command), capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise GpuPlatError(
                f"`{shlex.join(command)[:200]}` on {node} ({address}) did not end within {timeout:.0f} s"
            ) from None
        if done.returncode == SSH_FAILED:
            raise GpuPlatError(
                f"cannot reach {node} at {address} over ssh ({self.settings.describe()}): "
                f"{_last_lines(done.stderr) or 'ssh exited 255'}. gpuplat reaches the hosts as Ansible does: "
                "set ANSIBLE_REMOTE_USER, ANSIBLE_PRIVATE_KEY_FILE or ANSIBLE_REMOTE_PORT (or ~/.ssh/config) "
                f"so that `ssh {address} true` works without a prompt, with root or passwordless sudo there"
            )
        if done.returncode != 0:
            raise GpuPlatError(
                f"`{shlex.join(command)[:200]}` failed on {node} ({address}) with exit {done.returncode}: "
                f"{_last_lines(done.stderr) or 'no error output'}"
            )
        return done.stdout


def _last_lines(text: str, count: int = 3) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines()[-count:] if line.strip())


# SSM Run Command's shell document: its `commands` run as one shell script, as root, by the SSM agent
# (docs.aws.amazon.com/systems-manager/latest/userguide/documents-command-ssm-plugin-reference.html,
# aws:runShellScript).
SSM_SHELL_DOCUMENT = "AWS-RunShellScript"
# GetCommandInvocation returns "the first 24,000 characters written by the plugin to stdout" and "the first
# 8,000 characters written ... to stderr" (botocore 1.44.18, data/ssm/2014-11-06/service-2.json,
# GetCommandInvocationResult): stdout travels gzipped and in base64 (a node's /metrics is larger than that),
# and an answer still too long fails instead of being cut.
SSM_STDOUT_LIMIT = 24_000
SSM_PACKED = (
    'out=$(mktemp) || exit 1; "$@" > "$out"; status=$?; gzip -c < "$out" | base64 -w 0; rm -f "$out"; '
    'exit "$status"'
)
# The statuses of an invocation that has ended (CommandInvocationStatus, the same file).
SSM_ENDED = {"Success", "Failed", "Cancelled", "TimedOut"}


class SsmNodes:
    """The nodes of an AWS stack, by name (their gpuplat:node tag, or instance id), reached through SSM Run
    Command on their running instances (`Nodes`). Needs ssm:SendCommand and ssm:GetCommandInvocation; the
    nodes' SSM agent and instance role are the ones Ansible's aws_ssm connection uses."""

    def __init__(
        self,
        instances: Mapping[str, str],
        ssm: Any,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.5,
    ) -> None:
        self.instances = dict(instances)
        self.ssm = ssm
        self.sleep = sleep
        self.clock = clock
        self.poll_s = poll_s

    @staticmethod
    def script(command: Sequence[str]) -> str:
        """The shell line the document runs: `command` quoted as given, its stdout packed."""
        return shlex.join(["sh", "-c", SSM_PACKED, "gpuplat", *command])

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        if node not in self.instances:
            raise GpuPlatError(
                f"no running instance of node {node!r} in the stack (running: "
                f"{', '.join(sorted(self.instances)) or 'none'})"
            )
        instance = self.instances[node]
        shown = shlex.join(command)[:200]
        try:
            sent = self.ssm.send_command(
                InstanceIds=[instance],
                DocumentName=SSM_SHELL_DOCUMENT,
                # SendCommand's delivery timeout is at least 30 s (TimeoutSeconds, the same file).
                TimeoutSeconds=max(30, int(timeout)),
                Parameters={
                    "commands": [self.script(command)],
                    "executionTimeout": [str(max(1, int(timeout)))],
                },
            )
            command_id = sent["Command"]["CommandId"]
            answer = self._wait(command_id, instance, timeout)
        except (BotoCoreError, ClientError) as error:
            raise GpuPlatError(
                f"cannot reach {node} ({instance}) through SSM: {error}. gpuplat reaches AWS nodes as "
                "Ansible does (SSM): your credentials need ssm:SendCommand and ssm:GetCommandInvocation, and "
                "the node its SSM agent online (`aws ssm describe-instance-information`)"
            ) from None
        status = answer.get("Status")
        if status != "Success":
            code = answer.get("ResponseCode", -1)
            raise GpuPlatError(
                f"`{shown}` failed on {node} ({instance}) through SSM: {status} "
                f"(exit {code}): {_last_lines(answer.get('StandardErrorContent', '')) or 'no error output'}"
            )
        return self.unpack(node, answer.get("StandardOutputContent", ""))

    def _wait(self, command_id: str, instance: str, timeout: float) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        deadline = self.clock() + timeout + 30
        while True:
            self.sleep(self.poll_s)
            try:
                answer: dict[str, Any] = self.ssm.get_command_invocation(
                    CommandId=command_id, InstanceId=instance
                )
            except ClientError as error:
                # Right after SendCommand the invocation may not be listed yet.
                if error.response.get("Error", {}).get("Code") != "InvocationDoesNotExist":
                    raise
                answer = {"Status": "Pending"}
            if answer.get("Status") in SSM_ENDED:
                return answer
            if self.clock() > deadline:
                raise GpuPlatError(
                    f"SSM command {command_id} on {instance} did not end within {timeout + 30:.0f} s "
                    f"(status {answer.get('Status')})"
                )

    @staticmethod
    def unpack(node: str, packed: str) -> str:
        if not packed.strip():
            # The packing script prints a gzip stream even for no output (20 bytes at least): none at all
            # means the command's output was lost on its way (moto's SSM, for one, runs nothing).
            raise GpuPlatError(
                f"{node}'s answer through SSM is empty: its packed output never is, so it was lost"
            )
        if len(packed) >= SSM_STDOUT_LIMIT:
            raise GpuPlatError(
                f"{node}'s answer through SSM is longer than the {SSM_STDOUT_LIMIT} characters SSM returns "
                "(gzipped): it was cut, and nothing was read from it"
            )
        try:
            return gzip.decompress(base64.b64decode(packed.strip(), validate=True)).decode()
        except (binascii.Error, OSError, EOFError, UnicodeDecodeError) as error:
            raise GpuPlatError(f"{node}'s answer through SSM could not be unpacked: {error}") from None
