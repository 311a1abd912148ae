# The local cluster's connection: containers.podman.podman with pipelining. The collection's plugin runs
# `podman exec` without -i, so a module cannot be fed on stdin and every task costs a temporary
# directory, a file copy, an exec and a cleanup (four podman processes). Here `podman exec -i` runs
# the module from stdin: one podman process per task, as pipelining gives SSH on real nodes.
from __future__ import annotations

DOCUMENTATION = """
    name: gpuplat_podman
    short_description: Run tasks in the local cluster's podman containers, modules piped on stdin
    description:
        - The containers.podman.podman connection with pipelining (C(podman exec -i)).
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
"""

import shlex

from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.connection import ensure_connect
from ansible_collections.containers.podman.plugins.connection.podman import Connection as PodmanConnection


class Connection(PodmanConnection):
    transport = "gpuplat_podman"
    has_pipelining = True

    @ensure_connect
    def exec_command(self, cmd, in_data=None, sudoable=False):
        if in_data is None:
            return super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        arguments = ["exec", "--interactive"]
        if self.user:
            arguments += ["--user", self.user]
        return self._podman(arguments, shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data)
