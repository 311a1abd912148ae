"""`gpuplat manifests`: the Kubernetes layer of a kueue stack as YAML files for GitOps or kubectl."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from infra.cli import output
from infra.cli.stack_options import StackFile, StackName, platform_from_options
from infra.errors import GpuPlatError, SpecError
from infra.k8s.export import CHART_TYPE, RecordedChart, manifest_files, mock_values
from infra.k8s.training import example_jobset
from infra.plan.record import record

OutputDir = Annotated[Path, typer.Option("--output", "-o", help="directory to write the manifests into")]
Force = Annotated[bool, typer.Option("--force", help="replace the directory if it exists")]


def write_tree(directory: Path, files: dict[str, str], replace: bool) -> None:
    """Write every file into a new directory beside `directory`, then move it into place: an error
    leaves the old directory as it was and nothing half-written."""
    if directory.exists() and not directory.is_dir():
        raise SpecError(f"--output {directory}: exists and is not a directory")
    if directory.exists() and any(directory.iterdir()) and not replace:
        raise SpecError(
            f"--output {directory}: the directory exists and is not empty; give --force to replace it, or "
            "another directory"
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        for name, text in files.items():
            path = staging / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise GpuPlatError(f"--output {directory}: cannot write the manifests ({exc.strerror})") from exc


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
    charts = [RecordedChart(r.name, r.inputs) for r in kubernetes if r.type == CHART_TYPE]
    examples = {
        f"{team.name}-jobset.yaml": example_jobset(platform, team.name)
        for team in platform.spec.scheduler.teams
    }
    files = manifest_files(objects, patches, charts, examples)
    write_tree(output_dir, files, force)
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
