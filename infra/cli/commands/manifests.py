"""`gpuplat manifests`: the Kubernetes layer of a kueue stack as YAML files for GitOps or kubectl."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infra.cli import output
from infra.cli.output_tree import Force, write_tree
from infra.cli.stack_options import StackFile, StackName, platform_from_options
from infra.errors import SpecError
from infra.k8s.export import CHART_TYPE, CONFIG_FILE_TYPE, RecordedChart, manifest_files, mock_values
from infra.k8s.objects import CRD_SUFFIX
from infra.k8s.training import example_jobset
from infra.plan.record import record

OutputDir = Annotated[Path, typer.Option("--output", "-o", help="directory to write the manifests into")]


def manifests(
    output_dir: OutputDir, stack: StackName = None, stack_file: StackFile = None, force: Force = False
) -> None:
    """Write the Kubernetes objects, node labels and operator releases of a kueue stack as YAML."""
    platform = platform_from_options(stack, stack_file)
    if platform.spec.scheduler.kind != "kueue":
        raise SpecError(
            f"stack {platform.name} runs Slurm (scheduler.kind {platform.spec.scheduler.kind}); Kubernetes "
            "manifests exist for stacks with scheduler.kind kueue and a kubernetes section"
        )
    recording = record(platform)
    kubernetes = [r for r in recording.resources if r.type.startswith("kubernetes:")]
    objects = [r.inputs for r in kubernetes if "kind" in r.inputs and not r.type.endswith("Patch")]
    patches = [r.inputs for r in kubernetes if r.type.endswith("Patch")]
    crds: dict[str, list[str]] = {}
    for resource in kubernetes:
        if resource.type == CONFIG_FILE_TYPE and CRD_SUFFIX in resource.name:
            crds.setdefault(resource.name.split(CRD_SUFFIX)[0], []).append(str(resource.inputs["file"]))
    charts = [
        RecordedChart(r.name, r.inputs, tuple(crds.get(r.name, ())))
        for r in kubernetes
        if r.type == CHART_TYPE
    ]
    examples = {
        f"{team.name}-jobset.yaml": example_jobset(platform, team.name)
        for team in platform.spec.scheduler.teams
    }
    files = manifest_files(objects, patches, charts, examples)
    write_tree(output_dir, files, force, "the manifests")
    err = output.stderr()
    err.print(
        f"wrote {len(objects)} objects, {len(patches)} node patches and {len(charts)} Helm releases to "
        f"{output_dir}: install operators/helmfile.yaml first (helmfile sync), then"
        f"{' kubectl apply --server-side -f nodes.yaml and' if patches else ''} kubectl apply -k {output_dir}"
    )
    made_up = mock_values(files)
    if made_up:
        err.print(
            "These values are computed by the cloud when `pulumi up` creates the resources; the offline "
            "plan shows placeholders (deploy with `pulumi up`, or fill them in from `pulumi stack output`):"
        )
        for line in made_up:
            err.print(f"  {line}", markup=False)
