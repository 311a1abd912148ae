"""`gpuplat validate`: prove a running Slurm platform: node health, NCCL transport and bus bandwidth, storage
read and checkpoint write, predicted scaling; per pool pass or fail. Exit 0 all pass, 1 a pool fails or a
node failed its health checks, 2 bad input, 3 missing tool or cluster, 4 failure."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from infra.cli import output
from infra.cli.stack_options import JsonFlag, StackFile, StackName, platform_from_options
from infra.errors import ExitCode, SpecError
from infra.validate.cluster_results import (
    CheckpointBudget,
    ClusterValidation,
    PoolValidation,
    ScalingInputs,
)
from infra.validate.run import ValidateOptions, validation_dir
from infra.validate.run import validate as run_validation

_STEP_LABELS = {"nccl_1node": "NCCL, 1 node", "nccl_2node": "NCCL, 2 nodes"}
_MARK = {"pass": "pass", "fail": "FAIL", "warn": "warn", "info": "info", "skip": "skip"}


def scaling_inputs(
    params: float | None, step_compute_s: float | None, bytes_per_grad: float, overlap: float
) -> ScalingInputs | None:
    if params is None and step_compute_s is None:
        return None
    if params is None or step_compute_s is None:
        raise SpecError(
            "the scaling prediction needs both --params (model parameters) and --step-compute-s (compute "
            "seconds of one training step); give both or neither"
        )
    return ScalingInputs(params, step_compute_s, bytes_per_grad, overlap)


def validate(
    stack: StackName = None,
    stack_file: StackFile = None,
    inventory: Annotated[
        Path | None,
        typer.Option(
            help="inventory to run against (default .gpuplat/<stack>/inventory, written by `gpuplat up`)"
        ),
    ] = None,
    dcgm_level: Annotated[
        int, typer.Option(min=1, max=4, help="dcgmi diag level: 1 quick ... 4 extended")
    ] = 2,
    checkpoint_gib: Annotated[
        float | None,
        typer.Option(
            min=0.001, help="checkpoint each node writes, GiB (default 16; 0.0625 on the local cluster)"
        ),
    ] = None,
    checkpoint_interval_s: Annotated[
        float, typer.Option(min=1, help="seconds between checkpoints of your jobs")
    ] = CheckpointBudget.interval_s,
    checkpoint_stall: Annotated[
        float, typer.Option(min=0.001, max=1, help="share of that interval a checkpoint write may take")
    ] = CheckpointBudget.stall_share,
    params: Annotated[float | None, typer.Option(min=1, help="scaling prediction: model parameters")] = None,
    step_compute_s: Annotated[
        float | None, typer.Option(min=1e-6, help="scaling prediction: compute seconds of one training step")
    ] = None,
    bytes_per_grad: Annotated[
        float, typer.Option(min=0.5, help="bytes per gradient element (bf16: 2)")
    ] = 2.0,
    overlap: Annotated[
        float, typer.Option(min=0, max=1, help="share of the all-reduce hidden behind the backward pass")
    ] = 0.0,
    json_output: JsonFlag = False,
) -> None:
    """Prove a running Slurm platform: node health, NCCL, storage, checkpoints, scaling; per pool."""
    platform = platform_from_options(stack, stack_file)
    options = ValidateOptions(
        inventory=inventory,
        dcgm_level=dcgm_level,
        checkpoint_gib=checkpoint_gib,
        budget=CheckpointBudget(checkpoint_interval_s, checkpoint_stall),
        scaling=scaling_inputs(params, step_compute_s, bytes_per_grad, overlap),
    )
    output.stderr().print(
        f"validating {platform.name} (playbooks/validate.yml); log: {validation_dir(platform)}/validate.log"
    )
    report = run_validation(platform, options)
    recorder = Console(
        record=True, width=160, no_color=True, highlight=False, soft_wrap=True, file=io.StringIO()
    )
    render(report, recorder)
    (validation_dir(platform) / "report.txt").write_text(recorder.export_text(), encoding="utf-8")
    if json_output:
        output.print_json(report.to_json())
    else:
        render(report, output.stdout())
    if not report.passed:
        raise typer.Exit(int(ExitCode.POLICY_VIOLATION))


def render(report: ClusterValidation, console: Console) -> None:
    for pool in report.pools:
        console.print(
            output.table(f"Pool {pool.pool} ({pool.node_type})", ["", "result", "figures"], pool_rows(pool))
        )
    if report.nodes:
        checks = list(dict.fromkeys(name for node in report.nodes for name in node.checks))
        rows = [
            [node.node, node.pool, *[_MARK.get(node.checks.get(c, ("-", ""))[0], "-") for c in checks]]
            for node in report.nodes
        ]
        console.print(output.table("Node health", ["node", "pool", *checks], rows))
    for node, reason in report.failing_nodes.items():
        console.print(escape(f"failing node {node}: {reason}"))
    for line in report.skipped:
        console.print(escape(f"skipped: {line}"))
    console.print(f"verdict: {'PASS' if report.passed else 'FAIL'}; results in {report.results_dir.parent}")


def pool_rows(pool: PoolValidation) -> list[list[Any]]:
    ready = ", ".join(pool.ready) or "none"
    not_ready = "; ".join(f"{node}: {why}" for node, why in pool.not_ready.items())
    rows: list[list[Any]] = [
        ["nodes ready", "", escape(ready + (f" (not ready: {not_ready})" if not_ready else ""))]
    ]
    rows += [
        [f.check, _MARK[f.status], escape(f.detail)] for f in pool.findings if f.check == "nodes" and f.detail
    ]
    rows += fabric_rows(pool)
    for check in ("storage", "checkpoint", "scaling"):
        finding = pool.finding(check)
        if finding is not None:
            rows.append([check, _MARK[finding.status], escape(finding.detail)])
    rows.append(["verdict", "PASS" if pool.passed else "FAIL", escape("; ".join(_failures(pool)))])
    return rows


def fabric_rows(pool: PoolValidation) -> list[list[Any]]:
    """Transport, GPUDirect RDMA, NICs and busbw from the two-node run (the one that crosses the fabric),
    else the one-node run; each NCCL step's verdict after them."""
    rows: list[list[Any]] = []
    report = pool.nccl.get("nccl_2node") or pool.nccl.get("nccl_1node")
    if report is not None:
        data = report.to_json()
        gdr, nics = data["gpudirect_rdma"], data["nics"]
        rows += [
            ["transport", "", escape("; ".join(t["label"] for t in data["transports"]) or "within the node")],
            ["GPUDirect RDMA", "", gdr["state"]],
            [
                "NICs used / expected",
                "",
                f"{nics['used'] if nics['used'] is not None else '?'} / {nics['expected']}",
            ],
        ]
    for step in ("nccl_1node", "nccl_2node"):
        finding = pool.finding(step)
        if finding is not None:
            rows.append([_STEP_LABELS[step], _MARK[finding.status], escape(finding.detail)])
    return rows


def _failures(pool: PoolValidation) -> list[str]:
    return [f"{f.check}: {f.detail}" for f in pool.findings if f.status == "fail"]
