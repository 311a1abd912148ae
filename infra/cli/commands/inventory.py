"""`gpuplat inventory`: the Ansible inventory for a stack, on stdout or written to a directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infra.backends.local.scale import with_running_sizes
from infra.cli import output
from infra.cli.output_tree import Force, write_tree
from infra.cli.stack_options import StackFile, StackName, platform_from_options
from infra.errors import SpecError
from infra.nodes.inventory import (
    has_ansible_nodes,
    inventory_documents,
    offline_blanks,
    render,
    rendered_files,
)

OutputDir = Annotated[
    Path | None, typer.Option("--output", "-o", help="directory to write the inventory into")
]


def inventory(
    stack: StackName = None, stack_file: StackFile = None, output_dir: OutputDir = None, force: Force = False
) -> None:
    """Write the Ansible inventory: a group per pool, role groups, resolved versions as vars."""
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
    else:
        files = rendered_files(documents)
        write_tree(output_dir, files, force, "the inventory")
        for name in files:
            output.stderr().print(f"wrote {output_dir / name}", markup=False)
    blanks = offline_blanks(platform, documents)
    if blanks:
        err = output.stderr()
        err.print(
            f"note: written offline, this inventory leaves blank what only the deployed stack knows: "
            f"{'; '.join(blanks)}. `gpuplat up --stack {platform.name}` writes it from the stack's outputs "
            f"(or `pulumi stack output group_vars -s {platform.name}`).",
            markup=False,
        )
