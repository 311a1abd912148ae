"""Mitogen for Ansible where the nodes are this machine's podman containers and gpuplat runs as root.

Plain Ansible costs a new Python process in the node for every task (0.25 CPU-s a task through
playbooks/connection_plugins/gpuplat_podman.py); Mitogen's `setns` connection enters the container's
namespaces once and keeps one interpreter there for the whole run (0.03 CPU-s a task, measured here on
2026-12-05). It needs root on the controller (setns), and its strategy plugin: with any other strategy the
connection does not exist. The runs take it as playbooks/strategy_plugins/gpuplat_mitogen_linear.py,
Mitogen's `mitogen_linear` without its CPU pinning (which puts the controller, its workers and every module
run in a node on one CPU of a 2-CPU machine).

Two things differ from the nodes' own view, and are set here:
- the interpreter inherits the controller's environment (the setns child is forked from it): it replaces
  it with the environment of the container's first process, what podman started the container with (the
  image's ENV, `--env`, the host's proxy variables that podman passes by default), as gpuplat_podman hands
  a module podman's `.Config.Env`;
- the connection is given as extra variables, which outrank the inventory for every host, `localhost`
  too: only playbooks that never delegate to localhost may run this way (site.yml, not validate.yml).

GPUPLAT_MITOGEN=0 turns it off (plain Ansible through gpuplat_podman, as for a non-root user).

The Molecule tiers take the same settings as environment variables (`python -m infra.nodes.mitogen`, which
scripts/lib/molecule-mitogen.sh evaluates): the strategy's, and one GPUPLAT_MOLECULE_<VARIABLE> per extra
variable, which .config/molecule/config.yml's `provisioner.connection_options` gives every instance (and not
localhost: Molecule writes them into each instance's entry of its inventory). Their create and destroy
playbooks and the verify steps delegated to localhost run there under the same strategy: at mitogen 0.3.54
it redirects only the connection types it knows, `local` to its own mitogen_local
(ansible_mitogen/strategy.py:119-153), and an action over any other connection (gpuplat_podman, the
fallback) turns back into plain Ansible's (ansible_mitogen/mixins.py:86-100).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

STRATEGY = "gpuplat_mitogen_linear"
# This project's strategy plugins (STRATEGY), which import Mitogen's.
PROJECT_STRATEGIES = Path(__file__).resolve().parents[2] / "playbooks" / "strategy_plugins"
# Run as the interpreter (mitogen/parent.py get_boot_command appends `-c <first stage> <args>`; the first
# stage re-executes sys.executable, which keeps the environment): /usr/bin/python3, exec'd again with the
# environment of the container's PID 1 (/proc of the container's mount namespace, which setns has entered);
# -I: the first interpreter ignores the PYTHON* variables of the controller it starts with.
ADOPT_CONTAINER_ENVIRONMENT = (
    "import os,sys;"
    "e=dict(v.partition(b'=')[::2] for v in open('/proc/1/environ','rb').read().split(bytes(1))"
    " if b'=' in v);"
    "os.execve(sys.executable,[sys.executable]+sys.argv[1:],e)"
)
SWITCH = "GPUPLAT_MITOGEN"
MOLECULE_PREFIX = "GPUPLAT_MOLECULE_"


@dataclass(frozen=True)
class ContainerSpeedup:
    """What a playbook run adds to use Mitogen: environment variables and extra variables."""

    env: dict[str, str] = field(default_factory=dict)
    extra_vars: dict[str, str] = field(default_factory=dict)


def container_speedup(environ: dict[str, str]) -> ContainerSpeedup | None:
    """Mitogen's settings for a run on container nodes, or None where it cannot or must not be used."""
    if environ.get(SWITCH, "1") == "0" or os.geteuid() != 0:
        return None
    found = importlib.util.find_spec("ansible_mitogen")
    podman = shutil.which("podman", path=environ.get("PATH"))
    if found is None or found.origin is None or podman is None:
        return None
    strategies = f"{PROJECT_STRATEGIES}:{Path(found.origin).parent / 'plugins' / 'strategy'}"
    earlier = environ.get("ANSIBLE_STRATEGY_PLUGINS")
    interpreter = ["/usr/bin/python3", "-I", "-c", ADOPT_CONTAINER_ENVIRONMENT]
    return ContainerSpeedup(
        env={
            "ANSIBLE_STRATEGY_PLUGINS": f"{strategies}:{earlier}" if earlier else strategies,
            "ANSIBLE_STRATEGY": STRATEGY,
        },
        extra_vars={
            "ansible_connection": "setns",
            # setns finds the container's init process the way `docker inspect` does; podman answers alike.
            "mitogen_kind": "docker",
            "mitogen_docker_path": podman,
            "ansible_python_interpreter": shlex.join(interpreter),
        },
    )


def molecule_environment(environ: dict[str, str]) -> dict[str, str]:
    """The environment variables that put a Molecule scenario's instances on Mitogen (none where it is off):
    the strategy's, and each extra variable as GPUPLAT_MOLECULE_<NAME> for .config/molecule/config.yml."""
    speedup = container_speedup(environ)
    if speedup is None:
        return {}
    named = {MOLECULE_PREFIX + name.upper(): value for name, value in speedup.extra_vars.items()}
    return {**speedup.env, **named}


def failure_hint(log_text: str) -> str | None:
    """What to do when a run under Mitogen failed in Mitogen itself (its plugins did not load, its connection
    broke: the log names ansible_mitogen or mitogen), or None when the log does not point at it."""
    if "ansible_mitogen" not in log_text and "mitogen." not in log_text:
        return None
    return (
        "This run used Mitogen for Ansible (infra/nodes/mitogen.py) and the log points at Mitogen itself: "
        f"{SWITCH}=0 runs the playbooks with plain Ansible; `.venv/bin/pip install -e '.[dev,ansible]'` "
        "reinstalls the pinned mitogen."
    )


def main() -> int:
    """Print the Molecule tiers' Mitogen settings as shell `export` lines, nothing where Mitogen is off."""
    for name, value in molecule_environment(dict(os.environ)).items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
