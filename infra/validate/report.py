"""One NCCL run, read and judged: what `gpuplat nccl-report` prints and `gpuplat validate` saves per pool."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from infra.data.load import catalog
from infra.data.models import NodeType
from infra.errors import SpecError
from infra.validate.gates import fabric_gates
from infra.validate.nccl_log import NcclLog, parse_nccl_log
from infra.validate.nccl_tests import ResultsTable, parse_results
from infra.validate.verdict import Run, Verdict, judge


@dataclass(frozen=True)
class FabricReport:
    source: str
    run: Run
    verdict: Verdict

    def to_json(self) -> dict[str, Any]:
        log, node = self.run.log, self.run.node
        return {
            "source": self.source,
            "node_type": node.name if node else None,
            "verdict": "pass" if self.verdict.passed else "fail",
            "reasons": self.verdict.failures,
            "checks": [asdict(check) for check in self.verdict.checks],
            "nccl_version": log.nccl_version,
            "ranks": log.ranks,
            "nodes": self.run.nodes,
            "hosts": list(log.hosts),
            "transports": [asdict(t) for t in log.transports.values()],
            "rank_transports": {str(rank): list(nets) for rank, nets in log.rank_networks.items()},
            "intra_node_paths": list(log.intra_node_paths),
            "plugin_failures": [asdict(f) for f in log.plugin_failures],
            "gpudirect_rdma": asdict(log.gdr),
            "nics": {
                "used": log.nics.count if log.nics else None,
                "names": list(log.nics.names) if log.nics else [],
                "source": log.nics.source if log.nics else None,
                "expected": node.network.nics if node else None,
            },
            "channels": log.channels,
            "warnings": list(log.warnings),
            "tables": [_table_json(table) for table in self.run.tables],
        }


def gpu_node_type(name: str) -> NodeType:
    node = catalog().get(name)
    if node is None or node.gpu_count == 0:
        allowed = ", ".join(n.name for n in catalog().node_types if n.gpu_count > 0)
        raise SpecError(f"--node-type {name!r} is not a GPU node type of the catalog; allowed: {allowed}")
    return node


def fabric_report(
    text: str,
    *,
    source: str,
    node_type: str | None = None,
    nodes: int | None = None,
    one_node: tuple[str, str] | None = None,
) -> FabricReport:
    """Read an NCCL log and/or nccl-tests output and judge it; SpecError when the text holds neither.
    `one_node`: (source, text) of an all_reduce_perf run on one of the same nodes, the figure a multi-node
    run without a published gate is judged against."""
    node = gpu_node_type(node_type) if node_type else None
    log = parse_nccl_log(text)
    tables = tuple(parse_results(text))
    if not log.has_nccl_lines and not tables:
        raise SpecError(
            f"{source} is not an NCCL log: no 'NCCL INFO' or 'NCCL WARN' lines and no nccl-tests result "
            "table (run the job with NCCL_DEBUG=INFO and keep the all_reduce_perf output)"
        )
    gates = fabric_gates().get(node.name) if node else None
    alone = _one_node_tables(*one_node) if one_node else ()
    run = Run(log, tables, node, gates, _nodes(log, tables, nodes), alone)
    return FabricReport(source, run, judge(run))


def _one_node_tables(source: str, text: str) -> tuple[ResultsTable, ...]:
    tables = tuple(t for t in parse_results(text) if t.rows and t.is_all_reduce is not False)
    if not tables:
        raise SpecError(f"--one-node {source}: no all_reduce_perf result table in it")
    log_nodes = parse_nccl_log(text).nodes
    seen = max([t.nodes for t in tables if t.nodes] + ([log_nodes] if log_nodes else []), default=1)
    if seen > 1:
        raise SpecError(f"--one-node {source}: that run had {seen} nodes; give a run on one node")
    return tables


def _nodes(log: NcclLog, tables: tuple[ResultsTable, ...], given: int | None) -> int | None:
    table_nodes = max((t.nodes for t in tables if t.nodes), default=None)
    if given is None:
        return log.nodes or table_nodes
    for seen, where in (
        (log.reported_nodes, "NCCL reports nNodes"),
        (table_nodes, "nccl-tests lists ranks on"),
    ):
        if seen is not None and seen != given:
            raise SpecError(f"--nodes {given} contradicts the log: {where} {seen}")
    if len(log.hosts) > given:
        raise SpecError(f"--nodes {given} contradicts the log: {len(log.hosts)} hosts wrote to it")
    return given


def _table_json(table: ResultsTable) -> dict[str, Any]:
    peak = table.peak
    return {
        "test": table.test,
        "error_column": table.error_column,
        "peak_busbw_gbps": peak.best_busbw_gbps if peak else None,
        "peak_at_bytes": peak.size_bytes if peak else None,
        "avg_busbw_gbps": table.avg_busbw_gbps,
        "wrong_elements": table.wrong_elements,
        "out_of_bounds": table.out_of_bounds,
        "rows": [
            {
                "size_bytes": row.size_bytes,
                "dtype": row.dtype,
                "redop": row.redop,
                "out_of_place_busbw_gbps": row.busbw("out-of-place"),
                "in_place_busbw_gbps": row.busbw("in-place"),
            }
            for row in table.rows
        ],
    }
