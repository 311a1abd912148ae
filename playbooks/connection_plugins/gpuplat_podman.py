# The local cluster's connection: containers.podman.podman made as cheap per task as SSH with
# pipelining and ControlPersist is on real nodes.
#
# The collection's plugin runs `podman exec` without -i, so every task costs a temporary directory,
# a file copy, an exec and a cleanup (four podman processes), and each `podman exec` starts runc and
# a conmon (about 110 ms of a 2-core machine). Here, when the controller runs as root (podman's
# rootful containers, as `gpuplat up` and the Molecule scenarios make them), one `podman container
# inspect` per container and run finds the container's init process and each module runs in the
# container's namespaces through nsenter, fed on stdin (about 3 ms); files are streamed the same
# way. Otherwise (rootless, or a task with a remote user) modules run through `podman exec -i`.
from __future__ import annotations

DOCUMENTATION = """
    name: gpuplat_podman
    short_description: Run tasks in the local cluster's podman containers, modules piped on stdin
    description:
        - The containers.podman.podman connection with pipelining; as root, tasks enter the
          container's namespaces with nsenter instead of starting a podman exec each.
    extends_documentation_fragment: []
    options:
      remote_addr:
        description: The name or ID of the container.
        default: inventory_hostname
        vars:
          - name: ansible_host
          - name: inventory_hostname
          - name: ansible_podman_host
      remote_user:
        description: User to run commands as inside the container (default the container's user).
        vars:
          - name: ansible_user
      podman_extra_args:
        description: Extra arguments for the podman command line.
        default: ''
        vars:
          - name: ansible_podman_extra_args
        env:
          - name: ANSIBLE_PODMAN_EXTRA_ARGS
      podman_executable:
        description: The podman executable.
        default: podman
        vars:
          - name: ansible_podman_executable
        env:
          - name: ANSIBLE_PODMAN_EXECUTABLE
      pipelining:
        description: Feed modules to the interpreter on stdin instead of copying them into the container.
        type: boolean
        default: true
        vars:
          - name: ansible_pipelining
      nsenter:
        description: As root, run tasks with nsenter in the container's namespaces (false - podman exec).
        type: boolean
        default: true
        vars:
          - name: ansible_podman_nsenter
        env:
          - name: GPUPLAT_PODMAN_NSENTER
"""

import json
import os
import shlex
import shutil
import subprocess

from ansible import constants as C
from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.module_utils.common.text.converters import to_bytes, to_native
from ansible.plugins.connection import ensure_connect
from ansible_collections.containers.podman.plugins.connection.podman import Connection as PodmanConnection

# What the container's own processes see of the filesystem: its root, its working directory.
NSENTER_ARGUMENTS = ["--all", "--root", "--wd"]


def _start_time(pid: int) -> str:
    """When the process started (clock ticks since boot): a reused PID starts later."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rpartition(")")[2].split()[19]


class Connection(PodmanConnection):
    transport = "gpuplat_podman"
    has_pipelining = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_pid = 0
        self._nsenter_path: str | None = None
        self._environment: dict[str, str] = {}

    def _nsenter_binary(self) -> str | None:
        """nsenter's path on the controller, when tasks may use it."""
        if not self.get_option("nsenter") or self.user or os.geteuid() != 0:
            return None
        return shutil.which("nsenter")

    def _connect(self):
        self._nsenter_path = self._nsenter_binary()
        if not self._nsenter_path:
            return super()._connect()
        self._init_pid, self._environment = self._container_process()
        self._mount_point = None
        self._connected = True
        return self

    def _container_process(self) -> tuple[int, dict[str, str]]:
        """The container's init process and environment, from this run's cache while that process lives."""
        cache = os.path.join(C.DEFAULT_LOCAL_TMP, f"gpuplat_podman-{self._container_id}.json")
        try:
            with open(cache, encoding="utf-8") as f:
                known = json.load(f)
            if _start_time(known["pid"]) == known["start_time"]:
                return known["pid"], known["environment"]
        except (OSError, ValueError, KeyError):
            pass
        rc, out, err = self._podman(
            ["container", "inspect", "--format", "{{.State.Pid}} {{json .Config.Env}}"]
        )
        if rc != 0:
            raise AnsibleConnectionFailure(
                f"container {self._container_id} not found: {to_native(err).strip()}"
            )
        pid_text, _, environment_json = to_native(out).strip().partition(" ")
        pid = int(pid_text)
        if pid <= 0:
            raise AnsibleConnectionFailure(f"container {self._container_id} is not running")
        environment = dict(item.partition("=")[::2] for item in json.loads(environment_json or "[]"))
        try:
            start_time = _start_time(pid)
        except OSError as gone:
            raise AnsibleConnectionFailure(f"container {self._container_id} stopped: {gone}") from gone
        temporary = f"{cache}.{os.getpid()}"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump({"pid": pid, "start_time": start_time, "environment": environment}, f)
        os.replace(temporary, cache)
        return pid, environment

    def _nsenter(self, command: list[str], in_data: bytes | None = None) -> tuple[int, bytes, bytes]:
        argv = [self._nsenter_path, "--target", str(self._init_pid), *NSENTER_ARGUMENTS, "--", *command]
        process = subprocess.Popen(
            [to_bytes(a, errors="surrogate_or_strict") for a in argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._environment,
        )
        stdout, stderr = process.communicate(input=in_data)
        return process.returncode, stdout, stderr

    @ensure_connect
    def exec_command(self, cmd, in_data=None, sudoable=False):
        command = shlex.split(to_native(cmd, errors="surrogate_or_strict"))
        if self._init_pid:
            return self._nsenter(command, in_data)
        if in_data is None:
            return super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        arguments = ["exec", "--interactive"]
        if self.user:
            arguments += ["--user", self.user]
        return self._podman(arguments, command, in_data)

    @ensure_connect
    def put_file(self, in_path, out_path):
        if not self._init_pid:
            return super().put_file(in_path, out_path)
        with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as source:
            rc, _, err = self._nsenter(["/bin/sh", "-c", 'cat > "$0"', out_path], source.read())
        if rc != 0:
            raise AnsibleError(
                f"could not copy {in_path} to {out_path} in container {self._container_id}: {to_native(err)}"
            )

    @ensure_connect
    def fetch_file(self, in_path, out_path):
        if not self._init_pid:
            return super().fetch_file(in_path, out_path)
        rc, content, err = self._nsenter(["cat", "--", in_path])
        if rc != 0:
            raise AnsibleError(
                f"could not fetch {in_path} from container {self._container_id}: {to_native(err)}"
            )
        with open(to_bytes(out_path, errors="surrogate_or_strict"), "wb") as target:
            target.write(content)
