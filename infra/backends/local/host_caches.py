"""What the local platform keeps on the host across `gpuplat down`, per stack: the nodes' wheels
(wheelhouse.py) and the Python environments installed from them, archived as the install left them
(roles/python_requirements, restore.yml and archive.yml), which a later cold `up` restores instead of running
pip. Both are named by what their content follows from, so neither can be stale; `gpuplat down --purge`
removes them."""

from __future__ import annotations

import shutil
from pathlib import Path

from infra.nodes.playbook_run import state_dir


def wheelhouse_dir(stack: str) -> Path:
    return state_dir(stack) / "wheels"


def environment_archives_dir(stack: str, node: str) -> Path:
    """A node's archives' directory (made when missing), mounted writable into that node alone: root on one
    node (a training node a job escaped on) must not replace the archive that another node unpacks and runs
    as root (the registry's MLflow on the gateway's node)."""
    directory = state_dir(stack) / "environments" / node
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def purge(stack: str) -> list[str]:
    """Remove the stack's cached wheels and environment archives; return what was removed."""
    removed = []
    for directory in (wheelhouse_dir(stack), state_dir(stack) / "environments"):
        if directory.exists():
            shutil.rmtree(directory)
            removed.append(str(directory))
    return removed
