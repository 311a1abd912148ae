"""`gpuplat inventory`: the Ansible inventory for a stack, on stdout or written to a directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infra.cli import output
from infra.cli.stack_options import StackFile, StackName, platform_from_options
from infra.errors import GpuPlatError, SpecError
from infra.inventory import has_ansible_nodes, inventory_documents, render, write_inventory
from infra.local.scale import with_running_sizes

OutputDir = Annotated[
    Path | None, typer.Option("--output", "-o", help="directory to write the inventory into")
]


def inventory(stack: StackName = None, stack_file: StackFile = None, output_dir: OutputDir = None) -> None:
    """Write the Ansible inventory: a group per pool, role groups, resolved versions as vars."""
    if output_dir is not None and output_dir.exists() and not output_dir.is_dir():
        raise SpecError(
            f"--output {output_dir}: exists and is not a directory; give a directory (a missing one is "
            "created)"
        )
    platform = platform_from_options(stack, stack_file)
    if not has_ansible_nodes(platform):
        raise SpecError(
            f"{platform.source}: stack {platform.name} runs on EKS: its node groups boot the EKS NVIDIA AMI "
            "and Kubernetes configures them, so there is no Ansible inventory. `gpuplat manifests` shows "
            "what is applied."
        )
    if platform.spec.backend == "local":  # the nodes that run now (`gpuplat scale`)
        platform = with_running_sizes(platform)
    documents = inventory_documents(platform)
    if output_dir is None:
        output.stdout().out(render(documents), end="")
        return
    try:
        written = write_inventory(documents, output_dir)
    except OSError as exc:
        raise GpuPlatError(
            f"--output {output_dir}: cannot write the inventory ({exc.strerror or exc})"
        ) from exc
    for path in written:
        output.stderr().print(f"wrote {path}", markup=False)
