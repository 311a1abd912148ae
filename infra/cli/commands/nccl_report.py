"""`gpuplat nccl-report`: which transport NCCL chose, GPUDirect RDMA, NICs and bus bandwidth, judged against
the node type's gates. Exit 0 pass, 1 fail, 2 bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from infra.cli import output
from infra.cli.stack_options import JsonFlag, read_log
from infra.errors import ExitCode
from infra.validate.report import FabricReport, fabric_report

_MARK = {"pass": "pass", "fail": "FAIL", "skip": "skip"}


def nccl_report(
    log: Annotated[
        Path, typer.Argument(metavar="LOG", help="NCCL_DEBUG=INFO output and/or nccl-tests output")
    ],
    node_type: Annotated[
        str | None, typer.Option(help="catalog node type the run used, e.g. p5.48xlarge")
    ] = None,
    nodes: Annotated[
        int | None, typer.Option(min=1, help="nodes in the run, where the log does not say (a bare table)")
    ] = None,
    one_node: Annotated[
        Path | None,
        typer.Option(
            "--one-node",
            metavar="LOG",
            help="all_reduce_perf on one of the same nodes: judges a multi-node run without a published gate",
        ),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Transport per rank, plugin failures, GPUDirect RDMA, NICs and busbw of an NCCL run, judged by gates
    (or, across nodes without one, by the nodes' own one-node figure: --one-node)."""
    text = read_log(log)
    alone = (str(one_node), read_log(one_node)) if one_node else None
    report = fabric_report(text, source=str(log), node_type=node_type, nodes=nodes, one_node=alone)
    if json_output:
        output.print_json(report.to_json())
    else:
        _print(report)
    if not report.verdict.passed:
        raise typer.Exit(int(ExitCode.POLICY_VIOLATION))


def _print(report: FabricReport) -> None:
    data = report.to_json()
    console = output.stdout()
    run = f"{data['ranks'] or '?'} ranks on {data['nodes'] or '?'} node(s)"
    version = f", NCCL {data['nccl_version']}" if data["nccl_version"] else ""
    console.print(escape(f"{report.source}: {run}{version}, node type {data['node_type'] or 'not given'}"))
    nics = data["nics"]
    gdr = data["gpudirect_rdma"]
    summary = [
        ["transport", "; ".join(t["label"] for t in data["transports"]) or "none seen"],
        [
            "GPUDirect RDMA",
            gdr["state"] + (f" ({gdr['with_gdr']}/{gdr['connections']})" if gdr["connections"] else ""),
        ],
        [
            "NICs used / expected",
            f"{nics['used'] if nics['used'] is not None else '?'} / {nics['expected'] or '?'}",
        ],
        ["channels", data["channels"] or "?"],
    ]
    summary += [[f"plugin {f['plugin']}", f"{f['problem']}: {f['reason']}"] for f in data["plugin_failures"]]
    for table in data["tables"]:
        peak = f"{table['peak_busbw_gbps']:.2f} GB/s at {table['peak_at_bytes']} bytes"
        summary.append(["busbw peak / avg", f"{peak} / {table['avg_busbw_gbps'] or '-'}"])
    console.print(output.table("NCCL run", ["what", "seen"], [[k, escape(str(v))] for k, v in summary]))
    checks = [[c["name"], _MARK[c["status"]], escape(c["reason"])] for c in data["checks"]]
    console.print(output.table("Checks", ["check", "result", "why"], checks))
    console.print(f"verdict: {data['verdict'].upper()}")
