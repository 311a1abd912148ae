"""`gpuplat plan`: run the program offline under mocks and show resources, costs, storage and budget."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from infra.cli import output
from infra.cli.commands.check import PolicyConfigFile, fail_on_mandatory
from infra.cli.stack_options import JsonFlag, SetOption, StackFile, StackName, stack_path
from infra.errors import SpecError
from infra.lifecycle import cloud_stack
from infra.plan.diff import PlanDiff, ResourceChange, load_base, markdown, plan_diff, shown
from infra.plan.report import PlanReport, build_report
from infra.plan.snapshot import snapshot
from infra.platform.resolve import load_platform
from infra.policy.config import load_policy_config
from infra.policy.rules.service_costs import NOT_COUNTED
from infra.policy.settings import PolicyConfig


def render_plan(report: PlanReport) -> None:
    console = output.stdout()
    console.print(f"Plan for stack [bold]{report.stack}[/] (backend {report.backend}, {report.source})")
    console.print(
        output.table(
            "Resources by type",
            ["type", "count"],
            [[t, n] for t, n in report.resources_by_type.items()] or [["(none: no cloud resources)", 0]],
        )
    )
    console.print(
        output.table(
            "Pools",
            [
                "pool",
                "role",
                "type",
                "GPU",
                "nodes",
                "GPUs",
                "capacity",
                "$/h node",
                "$/h pool",
                "$/h on-demand",
            ],
            [
                [
                    p.name,
                    p.role,
                    p.instance_type,
                    p.gpu_model,
                    f"{p.nodes_min}-{p.nodes_max}" if p.nodes_min != p.nodes_max else p.nodes_max,
                    p.gpus,
                    p.capacity,
                    output.usd(p.node_usd_per_hour),
                    output.usd(p.usd_per_hour),
                    output.usd(p.on_demand_usd_per_hour),
                ]
                for p in report.pools
            ],
        )
    )
    s = report.storage
    supply = (
        "-"
        if s.supply_gbps is None
        else f"{s.supply_gbps:.1f} GB/s ({s.capacity_gib} GiB at {s.per_unit_mbps} MB/s/TiB)"
    )
    verdict = {True: "meets demand", False: "SHORT", None: "not provisioned by this backend"}[s.meets_demand]
    console.print(
        f"Storage {s.kind}: {s.training_gpus} training GPUs need {s.demand_gbps:.1f} GB/s; "
        f"supply {supply}: {verdict}"
    )
    if report.services:
        console.print(
            output.table(
                "Services (by the hour, besides the instances)",
                ["resource", "what", "$/h"],
                [[c["resource"], c["what"], f"${c['usd_per_hour']:,.3f}"] for c in report.services],
            )
        )
        console.print(f"Not counted: {NOT_COUNTED}")
    b = report.budget
    console.print(
        f"Budget: {b.gpus}/{b.max_gpus} GPUs, {output.usd(b.usd_per_hour)}/{output.usd(b.max_usd_per_hour)} "
        f"per hour at full size: {'within budget' if b.within else 'OVER BUDGET'}"
    )
    sw = report.software
    console.print(
        f"Software: driver {sw['driver_version']} ({'open' if sw['open_kernel_modules'] else 'proprietary'} "
        f"modules), fabric manager {sw['fabric_manager_version']}, CUDA {sw['cuda_package_version']}, "
        f"NCCL {sw['nccl']}+cuda{sw['nccl_cuda_build']} (the nodes')"
    )
    if sw["jobs_nccl"]:
        console.print(
            f"NCCL jobs run: {sw['jobs_nccl']}, from torch {sw['jobs_torch']}'s wheel (training environment)"
        )
    if sw["efa"]:
        efa = sw["efa"]
        named = efa["nccl_supported"]
        console.print(
            f"EFA installer {efa['installer']}: aws-ofi-nccl {efa['aws_ofi_nccl']} (supports NCCL "
            f"{'.'.join(named.split('.')[:2])}: its release names {named}, other patches of that minor "
            f"taken as supported), plugin {efa['plugin_path']}"
        )
    if sw["gdrcopy"]:
        console.print(
            f"GDRCopy {sw['gdrcopy']['version']} on the training GPU nodes of the RDMA fabric: libgdrapi and "
            f"gdrdrv, built by DKMS against driver {sw['driver_version']}"
        )
    if report.unverified_facts:
        console.print(
            f"Unverified facts: {len(report.unverified_facts)} of the packages the nodes install were never "
            "seen at that version in NVIDIA's index (infra/data/packages.yaml, `accepted` says why; --json "
            "lists them)"
        )
    for warning in report.warnings:
        console.print(escape(f"Warning: {warning}"))
    if not report.verdicts:
        console.print("Policies: no violations (details: gpuplat check)")
    for verdict_line in report.verdicts:
        console.print(
            escape(
                f"[{verdict_line['severity']}] {verdict_line['rule']} {verdict_line['resource']}: "
                f"{verdict_line['message']} Fix: {verdict_line['remediation']}"
            )
        )


DeployedFlag = Annotated[
    bool,
    typer.Option(
        "--deployed",
        help="also preview against what is deployed (pulumi preview --diff; needs the Pulumi CLI)",
    ),
]


RefreshFlag = Annotated[
    bool,
    typer.Option(
        "--refresh",
        help="with --deployed: also read the cloud back against the stack's state (pulumi refresh "
        "--preview-only): what changed outside Pulumi (drift); the state is not written",
    ),
]


BaseOption = Annotated[
    str | None,
    typer.Option(
        "--base",
        help="compare with this revision: a stack file, or a git branch, tag or commit of the stack file",
    ),
]
FormatOption = Annotated[
    str | None, typer.Option("--format", help="text | json | markdown (markdown: with --base)")
]
_FORMATS = ("text", "json", "markdown")


def plan(
    stack: StackName = None,
    stack_file: StackFile = None,
    policy_config: PolicyConfigFile = None,
    deployed: DeployedFlag = False,
    base: BaseOption = None,
    output_format: FormatOption = None,
    json_output: JsonFlag = False,
    overrides: SetOption = None,
    refresh: RefreshFlag = False,
) -> None:
    """Plan offline: the real Pulumi program under the SDK's mocks; no Pulumi CLI, no cloud calls.
    Exits 1 on a mandatory policy violation, as `gpuplat check` does. --deployed adds what `pulumi up`
    would change in the deployed stack; --base shows what changes against another revision."""
    output_format = output.chosen_format(output_format, json_output, _FORMATS)
    if output_format == "markdown" and base is None:
        raise SpecError("--format markdown shows a difference: give --base (a stack file or a git revision)")
    config = load_policy_config(policy_config) if policy_config else PolicyConfig()
    path = stack_path(stack, stack_file)
    if base is not None:
        planned_base = load_base(path, base)  # a bad base is refused before the head is planned
        head = snapshot(load_platform(path, overrides or ()), config=config)
        diff = plan_diff(planned_base.snapshot, head, planned_base.label, str(path), planned_base.code)
        render_diff(diff, output_format)
        fail_on_mandatory({diff.stack: {v["rule"] for v in diff.mandatory}})
        return
    if refresh and not deployed:
        raise SpecError("--refresh reads the deployed stack back: give it with --deployed")
    if overrides and deployed:
        raise SpecError(
            "--set changes what is planned, not what is deployed: --deployed previews the stack file as "
            "Pulumi deploys it; edit the file, or plan without --deployed"
        )
    platform = load_platform(path, overrides or ())
    report = build_report(platform, config=config)
    changes = drifted = None
    if deployed:
        deployed_stack = cloud_stack.open_stack(platform, "`gpuplat plan --deployed`", create=False)
        if refresh:
            drifted = cloud_stack.drift(deployed_stack, _to_stderr)
        changes = cloud_stack.preview(deployed_stack, _to_stderr)
    if output_format == "json":
        extra: dict[str, Any] = {"deployed_changes": changes.counts} if changes else {}
        if drifted is not None:
            extra["drift"] = drifted.counts
        output.print_json({**report.to_dict(), **extra})
    else:
        render_plan(report)
        if drifted is not None:
            output.stdout().print(f"Drift of the deployed stack: {drifted.line()}", markup=False)
        if changes is not None:
            output.stdout().print(f"Against the deployed stack: {changes.line()}", markup=False)
    fail_on_mandatory({report.stack: {v["rule"] for v in report.verdicts if v["severity"] == "mandatory"}})


def _to_stderr(line: str) -> None:
    """Pulumi's own lines, as they come, beside the plan on stdout."""
    output.stderr().out(line.rstrip())


def render_diff(diff: PlanDiff, output_format: str) -> None:
    if output_format == "json":
        output.print_json(diff.to_dict())
        return
    if output_format == "markdown":
        output.stdout().out(markdown(diff), end="", highlight=False)
        return
    counts = diff.counts()
    console = output.stdout()
    console.print(
        f"Stack {diff.stack}: {diff.base} -> {diff.head}: {counts['add']} to add, {counts['change']} to "
        f"change, {counts['remove']} to remove; GPUs {diff.before.gpus} -> {diff.after.gpus}, "
        f"{output.usd(diff.before.usd_per_hour)}/h -> {output.usd(diff.after.usd_per_hour)}/h at full size",
        markup=False,
    )
    if diff.settings:
        console.print(output.table(
            "Setting changes", ["setting", "before", "after"],
            [[s.field, shown(s.old), shown(s.new)] for s in diff.settings],
        ))  # fmt: skip
    if diff.changes:
        console.print(output.table(
            "Resource changes", ["change", "type", "name", "inputs"],
            [[c.op, c.type, c.name, _values_text(c)] for c in diff.changes],
        ))  # fmt: skip
    mandatory = len(diff.mandatory)
    console.print(
        f"Policy: {'FAILED' if mandatory else 'passed'} ({mandatory} mandatory, "
        f"{len(diff.verdicts) - mandatory} advisory findings; details: gpuplat check)",
        markup=False,
    )


def _values_text(change: ResourceChange) -> str:
    return "\n".join(f"{v.field}: {shown(v.old)} -> {shown(v.new)}" for v in change.values)
