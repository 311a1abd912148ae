"""Judge an NCCL run against the node type's catalog entry and fabric gates: transport, GPUDirect RDMA, NICs,
bus bandwidth and wrong results. A check passes, fails with its reason, or is skipped saying why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infra.data.models import NodeType
from infra.validate.gates import SHAPE_NODES, BusbwGate, NodeGates, Shape
from infra.validate.nccl_log import NcclLog, Transport
from infra.validate.nccl_tests import ResultRow, ResultsTable

CheckStatus = Literal["pass", "fail", "skip"]

_DEBUG_HINT = "rerun with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET is enough)"
_FABRIC_LINK = {"infiniband": "IB", "roce": "RoCE"}


@dataclass(frozen=True)
class Check:
    name: str
    status: CheckStatus
    reason: str


@dataclass(frozen=True)
class Verdict:
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return all(check.status != "fail" for check in self.checks)

    @property
    def failures(self) -> list[str]:
        return [f"{check.name}: {check.reason}" for check in self.checks if check.status == "fail"]


@dataclass(frozen=True)
class Run:
    """What is judged: the parsed log and tables, the node type (if known) and how many nodes ran."""

    log: NcclLog
    tables: tuple[ResultsTable, ...]
    node: NodeType | None
    gates: NodeGates | None
    nodes: int | None
    one_node: tuple[ResultsTable, ...] = ()  # an all_reduce_perf run on one of these nodes, if given

    @property
    def multi_node(self) -> bool:
        return (self.nodes or 0) > 1 or bool(self.log.connections)

    @property
    def rdma_expected(self) -> bool:
        """A node type without an RDMA fabric may use TCP; without a node type the pool is taken as RDMA."""
        return self.node is None or self.node.network.fabric != "ethernet"


def judge(run: Run) -> Verdict:
    checks = [transport_check(run), gdr_check(run), nics_check(run)]
    checks += busbw_checks(run)
    checks.append(errors_check(run.tables))
    return Verdict(tuple(checks))


def transport_check(run: Run) -> Check:
    log = run.log
    if not log.has_nccl_lines:
        return Check(
            "transport", "fail", f"no NCCL INFO lines: the transport NCCL chose cannot be seen; {_DEBUG_HINT}"
        )
    if not run.multi_node:
        paths = ", ".join(log.intra_node_paths) or "no channel lines"
        return Check(
            "transport", "pass", f"one node: GPUs talk within the node ({paths}), no network to check"
        )
    labels = "; ".join(t.label for t in log.transports.values())
    tcp = log.tcp_transports
    if tcp and run.rdma_expected:
        pool = run.node.name if run.node else "an RDMA pool (no --node-type given)"
        return Check(
            "transport", "fail", f"NCCL runs over TCP on a multi-node run of {pool}: " + _tcp_detail(log, tcp)
        )
    if tcp:
        assert run.node is not None  # rdma_expected is true without a node type
        return Check("transport", "pass", f"{labels}: {run.node.name} has no RDMA fabric")
    if not log.transports:
        return Check(
            "transport",
            "fail",
            f"multi-node run, but no 'Using network' or 'via NET/' line says which network "
            f"NCCL chose; {_DEBUG_HINT}",
        )
    mismatch = _fabric_mismatch(run.node, list(log.transports.values())) if run.node else None
    if mismatch:
        return Check("transport", "fail", mismatch)
    return Check("transport", "pass", labels)


def _tcp_detail(log: NcclLog, tcp: list[Transport]) -> str:
    names = {t.network for t in tcp}
    ranks = [rank for rank, nets in log.rank_networks.items() if names & set(nets)]
    detail = "; ".join(t.label for t in tcp)
    if ranks:
        shown = ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")
        detail += f" (ranks {shown})"
    causes = [f"{f.plugin} {f.problem}: {f.reason}" for f in log.plugin_failures]
    return detail + (f"; net plugin: {'; '.join(causes)}" if causes else "; no net plugin failure was logged")


def _fabric_mismatch(node: NodeType, transports: list[Transport]) -> str | None:
    fabric = node.network.fabric
    if fabric == "efa":
        wrong = [t.label for t in transports if t.kind != "plugin"]
        return (
            f"{node.name} has EFA, which only the aws-ofi-nccl plugin drives; NCCL uses {', '.join(wrong)}"
            if wrong
            else None
        )
    link = _FABRIC_LINK.get(fabric)
    wrong = [t.label for t in transports if t.kind == "ib" and t.links and set(t.links) != {link}]
    if wrong:
        return (
            f"NCCL uses {', '.join(wrong)}, but {node.name}'s fabric is {fabric}: NCCL_IB_HCA may name the "
            "wrong HCAs (for example the front-end Ethernet ports)"
        )
    return None


def _no_network(run: Run) -> str:
    if run.nodes is None:
        return "the log shows neither the node count nor network connections"
    return "one node: no network in use"


def gdr_check(run: Run) -> Check:
    gdr = run.log.gdr
    seen = gdr.state + (
        f", {gdr.with_gdr} of {gdr.connections} network connections" if gdr.connections else ""
    )
    if not run.multi_node:
        return Check("gpudirect-rdma", "skip", _no_network(run))
    if run.node is None:
        return Check("gpudirect-rdma", "skip", f"pass --node-type to judge it ({seen})")
    expectation = run.gates.gpudirect_rdma if run.gates else None
    if expectation is None:
        return Check(
            "gpudirect-rdma", "skip", f"no GPUDirect RDMA expectation recorded for {run.node.name} ({seen})"
        )
    if not expectation.expected:
        return Check("gpudirect-rdma", "pass", f"not expected on {run.node.name} ({seen})")
    if gdr.state == "on":
        return Check("gpudirect-rdma", "pass", f"on ({gdr.evidence})")
    if gdr.state == "unknown":
        return Check(
            "gpudirect-rdma",
            "fail",
            f"expected on {run.node.name}, but the log does not show it; {_DEBUG_HINT}",
        )
    return Check(
        "gpudirect-rdma",
        "fail",
        f"GPUDirect RDMA {seen} ({gdr.evidence}), expected on {run.node.name}: check that nvidia-peermem "
        "is loaded or DMA-BUF is available, NCCL_NET_GDR_LEVEL, and on EFA that aws-ofi-nccl is 1.7 or later "
        "(it turns device RDMA on where the instance has it)",
    )


def nics_check(run: Run) -> Check:
    nics = run.log.nics
    if run.node is None:
        return Check("nics", "skip", "pass --node-type to compare with the catalog")
    expected = run.node.network.nics
    if not run.multi_node or run.log.tcp_transports:
        return Check("nics", "skip", "no RDMA network in use" if run.multi_node else _no_network(run))
    if nics is None or nics.count is None:
        return Check("nics", "skip", "the log does not list the NICs NCCL opened")
    names = f" ({', '.join(nics.names)})" if nics.names else ""
    if nics.count < expected:
        return Check(
            "nics", "fail", f"NCCL opened {nics.count}{names} of the {expected} NICs {run.node.name} has"
        )
    return Check("nics", "pass", f"{nics.count} opened{names}, catalog: {expected}")


def busbw_checks(run: Run) -> list[Check]:
    if not run.tables:
        return [Check("busbw", "skip", "no nccl-tests result table in the log")]
    if run.node is None and not run.one_node:
        return [Check("busbw", "skip", "pass --node-type to compare with its gate")]
    if run.nodes is None:
        return [Check("busbw", "skip", "the log does not show how many nodes ran the test: pass --nodes")]
    shape = next((s for s, n in SHAPE_NODES.items() if n == run.nodes), None)
    gate = run.gates.busbw_gate(shape) if run.gates and shape else None
    if gate is not None and shape is not None:
        return [_busbw_check(table, gate, shape) for table in run.tables]
    if run.nodes > 1 and run.one_node:
        return [_against_one_node(table, run) for table in run.tables]
    unpublished = (
        f"no published figure for {run.node.name} {shape}"
        if run.node and shape
        else f"gates are published for one and two nodes; this run had {run.nodes}"
    )
    if run.nodes > 1:
        unpublished += (
            ": pass --one-node LOG (all_reduce_perf on one of these nodes) to judge it against the "
            "nodes' own figure"
        )
    return [Check("busbw", "skip", f"{unpublished}: busbw not gated" if run.nodes == 1 else unpublished)]


# Below this share of what the nodes reach alone (or of their network, when that is lower), a multi-node
# all_reduce has collapsed across the nodes: the platform's threshold, not a published figure. busbw is
# meant to show the hardware bottleneck, NVLink or network, whatever the rank count (nccl-tests
# doc/PERFORMANCE.md, "Summary"); across two nodes NCCL's trees can reach up to twice the network
# bandwidth, not across three or more (NVIDIA/nccl issue #209, sjeaugey, 2019-06-04).
ONE_NODE_SHARE = 0.5
BANDWIDTH_BOUND_BYTES = 128 * 1024 * 1024  # smaller messages are latency-bound: no bandwidth verdict


def _against_one_node(table: ResultsTable, run: Run) -> Check:
    if table.is_all_reduce is False:
        return Check(
            "busbw", "skip", f"judged for all_reduce_perf, this table is {table.test or 'another test'}"
        )
    largest = max(table.rows, key=lambda row: row.size_bytes, default=None)
    if largest is None or largest.size_bytes < BANDWIDTH_BOUND_BYTES:
        return Check(
            "busbw",
            "skip",
            f"the table stops below {BANDWIDTH_BOUND_BYTES} bytes: run with -e 1G to judge bandwidth",
        )
    alone = max((row.best_busbw_gbps for t in run.one_node for row in t.rows), default=0.0)
    expected, why = alone, f"their one-node figure {alone:.2f} GB/s"
    if run.node is not None:
        network = run.node.network
        ceiling = network.total_gbps / 8 * (2 if run.nodes == 2 else 1)
        if ceiling < expected:
            expected = ceiling
            why = (
                f"their network, {network.nics} x {network.gbps_per_nic:g} Gb/s"
                + (" (x2 with trees on two nodes)" if run.nodes == 2 else "")
                + f", below their one-node figure {alone:.2f} GB/s"
            )
    measured = largest.best_busbw_gbps
    peak = table.peak
    where = f"{run.nodes} nodes reach {measured:.2f} GB/s at {largest.size_bytes} bytes"
    share = measured / expected if expected else 0.0
    judged = f"{share:.0%} of the {expected:.2f} GB/s these nodes should reach ({why})"
    if share < ONE_NODE_SHARE:
        collapse = (
            f"; the peak is {peak.best_busbw_gbps:.2f} GB/s at {peak.size_bytes} bytes"
            if peak and peak.size_bytes != largest.size_bytes
            else ""
        )
        return Check(
            "busbw",
            "fail",
            f"{where}, {judged}: bandwidth collapses across the nodes{collapse}. Check the links between the "
            "nodes (racks, switches, flow control) with a two-node run of each pair",
        )
    return Check("busbw", "pass", f"{where}, {judged}")


def _busbw_check(table: ResultsTable, gate: BusbwGate, shape: Shape) -> Check:
    if table.is_all_reduce is False:
        return Check(
            "busbw",
            "skip",
            f"the gates are for all_reduce_perf, this table is {table.test or 'another test'}",
        )
    row = table.row_at(gate.message_bytes) or _largest_below(table.rows, gate.message_bytes)
    if row is None:
        return Check("busbw", "skip", f"no row at or below {gate.message_bytes} bytes to compare")
    measured = row.busbw(gate.column)
    column = gate.column
    if measured is None:
        measured, column = row.best_busbw_gbps, "in-place" if row.in_place else "out-of-place"
    where = f"{measured:.2f} GB/s ({column}) at {row.size_bytes} bytes"
    if row.size_bytes != gate.message_bytes:
        where += f" (the table stops below the gate's {gate.message_bytes} bytes: run with -e to reach it)"
    figure = (
        f"{shape} gate {gate.min_busbw_gbps:g} GB/s at {gate.message_bytes} bytes ({gate.source.split()[0]})"
    )
    if measured < gate.min_busbw_gbps:
        return Check("busbw", "fail", f"{where} is below the {figure}")
    return Check("busbw", "pass", f"{where} meets the {figure}")


def _largest_below(rows: list[ResultRow], size_bytes: int) -> ResultRow | None:
    return max(
        (row for row in rows if row.size_bytes < size_bytes), key=lambda row: row.size_bytes, default=None
    )


def errors_check(tables: tuple[ResultsTable, ...]) -> Check:
    if not tables:
        return Check("errors", "skip", "no nccl-tests result table in the log")
    wrong = sum(table.wrong_elements for table in tables)
    out_of_bounds = sum(table.out_of_bounds or 0 for table in tables)
    if wrong or out_of_bounds:
        return Check(
            "errors", "fail", f"{wrong} wrong elements (#wrong), {out_of_bounds} out-of-bounds values"
        )
    checked = any(
        m.wrong is not None for t in tables for r in t.rows for m in (r.out_of_place, r.in_place) if m
    )
    if not checked and all(table.out_of_bounds is None for table in tables):
        return Check("errors", "skip", "results were not checked (#wrong N/A or the old 'error' column)")
    return Check("errors", "pass", "no wrong elements")
