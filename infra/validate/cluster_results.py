"""Judge what playbooks/validate.yml measured on a Slurm platform, pool by pool.

The play (role gpu_validation) copies its results to one directory:

    nodes/<node>.json        the node's health checks and drain reasons (gpuplat_node_check.py)
    drains.json              nodes drained, already drained, resumed, not checked
    pools/<pool>.json        the pool's ready nodes and each step: ran, error or skipped (with the reason)
    pools/<pool>/fio-<node>.json, checkpoint.jsonl, nccl_1node.log, nccl_2node.log

Here every figure meets its target: storage against read_gbps_per_gpu x the GPUs reading, the checkpoint
write against its time budget, the NCCL runs against the fabric gates (infra.validate.report), and the
predicted 8 -> 32 GPU scaling against its rule of thumb (infra.validate.scaling).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from infra.errors import GpuPlatError, SpecError
from infra.platform.resolve import ResolvedPlatform, ResolvedPool
from infra.validate.gates import Shape, fabric_gates
from infra.validate.report import FabricReport, fabric_report
from infra.validate.scaling import ScalingFlag, ScalingPrediction, predict_scaling

Status = Literal["pass", "fail", "warn", "info", "skip"]
GB = 10**9

# The play's step names, and the test shape and node count of its NCCL steps.
NCCL_STEPS: dict[str, tuple[Shape, int]] = {"nccl_1node": ("intra-node", 1), "nccl_2node": ("two-node", 2)}
_FLAG_STATUS: dict[ScalingFlag, Status] = {"ok": "pass", "warn": "warn", "fabric": "fail"}
_LOCAL_NOTE = "local cluster: one disk behind a podman volume, not a meaningful target"


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    detail: str


@dataclass(frozen=True)
class CheckpointBudget:
    """How long a checkpoint may stall training: a share of the interval between checkpoints."""

    interval_s: float = 1800.0
    stall_share: float = 0.05

    @property
    def seconds(self) -> float:
        return self.interval_s * self.stall_share


@dataclass(frozen=True)
class ScalingInputs:
    """The model side of the scaling prediction (the fabric side comes from the NCCL runs or the gates)."""

    params: float
    compute_seconds: float
    bytes_per_grad: float = 2.0
    overlap: float = 0.0


@dataclass(frozen=True)
class StorageFigures:
    node_gbps: dict[str, float]
    aggregate_gbps: float
    target_gbps: float
    gpus: int


@dataclass(frozen=True)
class CheckpointFigures:
    node_seconds: dict[str, float]
    bytes_per_node: int
    worst_seconds: float
    budget_seconds: float


@dataclass(frozen=True)
class NodeHealth:
    node: str
    pool: str
    checks: dict[str, tuple[str, str]]  # check -> (status, detail)
    drain_reasons: tuple[str, ...]
    gpu_absent_reason: str


@dataclass
class PoolValidation:
    pool: str
    node_type: str
    ready: list[str]
    not_ready: dict[str, str]
    findings: list[Finding] = field(default_factory=list)
    nccl: dict[str, FabricReport] = field(default_factory=dict)
    storage: StorageFigures | None = None
    checkpoint: CheckpointFigures | None = None
    scaling: ScalingPrediction | None = None

    @property
    def passed(self) -> bool:
        return all(f.status != "fail" for f in self.findings)

    def finding(self, check: str) -> Finding | None:
        return next((f for f in self.findings if f.check == check), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "node_type": self.node_type,
            "verdict": "pass" if self.passed else "fail",
            "reasons": [f"{f.check}: {f.detail}" for f in self.findings if f.status == "fail"],
            "ready_nodes": self.ready,
            "not_ready_nodes": self.not_ready,
            "findings": [asdict(f) for f in self.findings],
            "storage": asdict(self.storage) if self.storage else None,
            "checkpoint": asdict(self.checkpoint) if self.checkpoint else None,
            "nccl": {step: report.to_json() for step, report in self.nccl.items()},
            "scaling": _scaling_json(self.scaling),
        }


@dataclass(frozen=True)
class ClusterValidation:
    stack: str
    results_dir: Path
    pools: list[PoolValidation]
    nodes: list[NodeHealth]
    drains: dict[str, Any]
    skipped: list[str]

    @property
    def failing_nodes(self) -> dict[str, str]:
        """Nodes that failed a health check, with the reason (drained now, before, or only reported)."""
        failing: dict[str, str] = {}
        for key in ("drained", "already_drained", "failing_not_drained"):
            failing.update(self.drains.get(key, {}))
        return failing

    @property
    def passed(self) -> bool:
        return not self.failing_nodes and all(pool.passed for pool in self.pools)

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "verdict": "pass" if self.passed else "fail",
            "results_dir": str(self.results_dir),
            "pools": [pool.to_json() for pool in self.pools],
            "nodes": [asdict(node) for node in self.nodes],
            "drains": self.drains,
            "skipped": self.skipped,
        }


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GpuPlatError(f"{path}: the validation play left no result here; see the play's log") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise GpuPlatError(f"{path}: cannot read the validation result ({exc})") from exc


def node_health(document: dict[str, Any]) -> NodeHealth:
    return NodeHealth(
        node=document["node"],
        pool=document["pool"],
        checks={c["name"]: (c["status"], c["detail"]) for c in document["checks"]},
        drain_reasons=tuple(document["drain_reasons"]),
        gpu_absent_reason=document.get("gpu_absent_reason", ""),
    )


def storage_finding(
    step: dict[str, Any], pool_dir: Path, pool: ResolvedPool, per_gpu_gbps: float, local: bool
) -> tuple[Finding, StorageFigures | None]:
    if step["status"] != "ran":
        return _not_run("storage", step), None
    node_gbps = {}
    for node in step["nodes"]:
        document = read_json(pool_dir / f"fio-{node}.json")
        node_gbps[node] = sum(job["read"]["bw_bytes"] for job in document["jobs"]) / GB
    gpus = pool.gpus_per_node * len(node_gbps)
    figures = StorageFigures(node_gbps, sum(node_gbps.values()), per_gpu_gbps * gpus, gpus)
    detail = (
        f"{figures.aggregate_gbps:.2f} GB/s aggregate sequential read from {len(node_gbps)} node(s); target "
        f"{figures.target_gbps:.2f} GB/s (read_gbps_per_gpu {per_gpu_gbps:g} x {gpus} GPUs)"
    )
    if local:
        return Finding("storage", "info", f"{detail}; {_LOCAL_NOTE}"), figures
    status: Status = "pass" if figures.aggregate_gbps >= figures.target_gbps else "fail"
    return Finding("storage", status, detail), figures


def checkpoint_finding(
    step: dict[str, Any], pool_dir: Path, budget: CheckpointBudget, local: bool
) -> tuple[Finding, CheckpointFigures | None]:
    if step["status"] != "ran":
        return _not_run("checkpoint", step), None
    path = pool_dir / "checkpoint.jsonl"
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise GpuPlatError(f"{path}: cannot read the checkpoint timings ({exc})") from exc
    missing = sorted(set(step["nodes"]) - {row["node"] for row in rows})
    if missing:
        return Finding("checkpoint", "fail", f"no checkpoint timing from {', '.join(missing)}"), None
    seconds = {row["node"]: float(row["seconds"]) for row in rows}
    size = int(rows[0]["bytes"])
    figures = CheckpointFigures(seconds, size, max(seconds.values()), budget.seconds)
    detail = (
        f"{_size(size)} per node written with fsync and rename in {figures.worst_seconds:.2f} s "
        f"(slowest of {len(seconds)} node(s) writing at once); budget {budget.seconds:.0f} s "
        f"({budget.stall_share:.0%} of a {budget.interval_s:.0f} s checkpoint interval)"
    )
    if local:
        return Finding("checkpoint", "info", f"{detail}; {_LOCAL_NOTE}"), figures
    status: Status = "pass" if figures.worst_seconds <= budget.seconds else "fail"
    return Finding("checkpoint", status, detail), figures


def _size(size: int) -> str:
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


@dataclass(frozen=True)
class MeasuredNccl:
    """The NCCL a run must have measured: the one the jobs load (the plan's)."""

    version: str
    loaded_by: str


def measured_nccl(platform: ResolvedPlatform) -> MeasuredNccl:
    software = platform.software
    if software.jobs_nccl is not None:
        return MeasuredNccl(software.jobs_nccl, f"torch {software.jobs_torch}'s wheel, the NCCL jobs load")
    return MeasuredNccl(software.nccl, "the nodes' libnccl2")


def _other_nccl(report: FabricReport, expected: MeasuredNccl) -> str | None:
    """Why the run did not measure the expected NCCL (None: it did)."""
    ran = report.run.log.nccl_version
    if ran is None:
        return f"the log does not say which NCCL ran (no 'NCCL version' line); expected {expected.version}"
    if ran.split("+")[0] != expected.version:
        return (
            f"all_reduce_perf ran NCCL {ran}, not {expected.version} ({expected.loaded_by}): the figures are "
            "another NCCL's (gpu_validation_training_env_path names the environment whose NCCL it loads)"
        )
    return None


def nccl_finding(
    name: str, step: dict[str, Any], pool_dir: Path, node_type: str, expected: MeasuredNccl
) -> tuple[Finding, FabricReport | None]:
    if step["status"] != "ran":
        return _not_run(name, step), None
    path = pool_dir / f"{name}.log"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
        report = fabric_report(text, source=str(path), node_type=node_type, nodes=NCCL_STEPS[name][1])
    except (OSError, SpecError) as exc:
        return Finding(name, "fail", str(exc)), None
    failures = report.verdict.failures
    other = _other_nccl(report, expected)
    if other is not None:
        failures = [f"nccl-version: {other}", *failures]
    if failures:
        return Finding(name, "fail", "; ".join(failures)), report
    return Finding(name, "pass", f"NCCL {expected.version}, {_nccl_summary(report)}"), report


def _nccl_summary(report: FabricReport) -> str:
    data = report.to_json()
    parts = ["; ".join(t["label"] for t in data["transports"]) or "intra-node"]
    if data["gpudirect_rdma"]["state"] != "unknown":
        parts.append(f"GPUDirect RDMA {data['gpudirect_rdma']['state']}")
    peaks = [t["peak_busbw_gbps"] for t in data["tables"] if t["peak_busbw_gbps"] is not None]
    if peaks:
        parts.append(f"busbw peak {max(peaks):.1f} GB/s")
    busbw = next((c for c in report.verdict.checks if c.name == "busbw"), None)
    if busbw is not None:
        parts.append(busbw.reason)
    return ", ".join(parts)


def _not_run(check: str, step: dict[str, Any]) -> Finding:
    if step["status"] == "skipped":
        return Finding(check, "skip", step["detail"])
    return Finding(check, "fail", step["detail"])


def measured_busbw(report: FabricReport | None) -> float | None:
    """The peak bus bandwidth of the run's all-reduce tables (GB/s)."""
    if report is None:
        return None
    peaks = [t.peak.best_busbw_gbps for t in report.run.tables if t.peak and t.is_all_reduce is not False]
    return max(peaks, default=None)


def scaling_finding(
    inputs: ScalingInputs | None, node_type: str, nccl: dict[str, FabricReport]
) -> tuple[Finding, ScalingPrediction | None]:
    if inputs is None:
        return Finding("scaling", "skip", "not predicted: give --params and --step-compute-s"), None
    gates = fabric_gates().get(node_type)
    busbw: dict[str, tuple[float, str]] = {}
    for step, (shape, _nodes) in NCCL_STEPS.items():
        measured = measured_busbw(nccl.get(step))
        gate = gates.busbw_gate(shape) if gates else None
        if measured is not None:
            busbw[step] = (measured, "measured")
        elif gate is not None:
            busbw[step] = (gate.min_busbw_gbps, "gated")
    missing = [shape for step, (shape, _nodes) in NCCL_STEPS.items() if step not in busbw]
    if missing:
        return (
            Finding(
                "scaling",
                "skip",
                f"not predicted: no {' or '.join(missing)} busbw measured here nor gated for {node_type}",
            ),
            None,
        )
    prediction = predict_scaling(
        params=inputs.params,
        bytes_per_grad=inputs.bytes_per_grad,
        compute_seconds=inputs.compute_seconds,
        base_busbw_gbps=busbw["nccl_1node"][0],
        scaled_busbw_gbps=busbw["nccl_2node"][0],
        overlap=inputs.overlap,
    )
    sources = f"(busbw {busbw['nccl_1node'][1]} within a node, {busbw['nccl_2node'][1]} across nodes)"
    status = _FLAG_STATUS[prediction.flag]
    # A gated figure is a floor, not this fabric: only a measured one can fail the pool.
    if status == "fail" and busbw["nccl_2node"][1] == "gated":
        status = "warn"
    return Finding("scaling", status, f"{prediction.message} {sources}"), prediction


def _scaling_json(prediction: ScalingPrediction | None) -> dict[str, Any] | None:
    if prediction is None:
        return None
    return {
        "speedup": round(prediction.speedup, 3),
        "ideal_speedup": prediction.ideal_speedup,
        "flag": prediction.flag,
        "message": prediction.message,
        "gradient_bytes": prediction.gradient_bytes,
        "base": asdict(prediction.base),
        "scaled": asdict(prediction.scaled),
    }


def node_findings(
    pool: str, pool_nodes: list[str], nodes: list[NodeHealth], drains: dict[str, Any]
) -> list[Finding]:
    drained, before = drains.get("drained", {}), drains.get("already_drained", {})
    reported_only = drains.get("failing_not_drained", {})
    findings = []
    for node in (n for n in nodes if n.pool == pool):
        reasons = "; ".join(node.drain_reasons)
        if node.node in drained:
            findings.append(Finding("nodes", "fail", f"{node.node} drained: {reasons}"))
        elif node.node in before:
            findings.append(
                Finding(
                    "nodes", "fail", f"{node.node} fails {reasons} (already drained: {before[node.node]})"
                )
            )
        elif node.node in reported_only:
            findings.append(Finding("nodes", "fail", f"{node.node} fails {reasons} (not drained: drain off)"))
        for name, (status, detail) in node.checks.items():
            if status == "warn":
                findings.append(Finding("nodes", "warn", f"{node.node} {name}: {detail}"))
        errors = [f"{name}: {detail}" for name, (status, detail) in node.checks.items() if status == "error"]
        if errors:
            findings.append(Finding("nodes", "warn", f"{node.node} could not run {'; '.join(errors)}"))
    for name in sorted(set(drains.get("unchecked", [])) & set(pool_nodes)):
        findings.append(Finding("nodes", "warn", f"{name}: its health checks did not run"))
    return findings


def judge_pool(
    platform: ResolvedPlatform,
    record: dict[str, Any],
    results_dir: Path,
    nodes: list[NodeHealth],
    drains: dict[str, Any],
    budget: CheckpointBudget,
    scaling: ScalingInputs | None,
) -> PoolValidation:
    pool = platform.pool(record["pool"])
    pool_dir = results_dir / "pools" / pool.name
    local = platform.spec.backend == "local"
    result = PoolValidation(pool.name, pool.node_type.name, list(record["ready"]), dict(record["not_ready"]))
    result.findings += node_findings(pool.name, [*result.ready, *result.not_ready], nodes, drains)
    if not result.ready:
        result.findings.append(
            Finding("nodes", "fail", "no node of the pool is ready (idle or mixed, healthy)")
        )
    steps = record["steps"]
    per_gpu = platform.spec.storage.parallel_fs.read_gbps_per_gpu
    storage, result.storage = storage_finding(steps["storage"], pool_dir, pool, per_gpu, local)
    checkpoint, result.checkpoint = checkpoint_finding(steps["checkpoint"], pool_dir, budget, local)
    result.findings += [storage, checkpoint]
    for name in NCCL_STEPS:
        finding, report = nccl_finding(
            name, steps[name], pool_dir, pool.node_type.name, measured_nccl(platform)
        )
        result.findings.append(finding)
        if report is not None:
            result.nccl[name] = report
    finding, result.scaling = scaling_finding(scaling, pool.node_type.name, result.nccl)
    result.findings.append(finding)
    return result


def skipped_checks(nodes: list[NodeHealth], pools: list[PoolValidation]) -> list[str]:
    """Every check that did not run, one line per reason and set of checks: 'xid, ecc on a, b: why'."""
    per_place: dict[tuple[str, str], list[str]] = {}
    for node in nodes:
        for name, (status, detail) in node.checks.items():
            if status == "skip":
                per_place.setdefault((node.node, detail), []).append(name)
    for pool in pools:
        for finding in (f for f in pool.findings if f.status == "skip"):
            per_place.setdefault((f"pool {pool.pool}", finding.detail), []).append(finding.check)
    grouped: dict[tuple[str, str], list[str]] = {}
    for (place, reason), checks in per_place.items():
        grouped.setdefault((", ".join(checks), reason), []).append(place)
    return [f"{checks} on {', '.join(places)}: {reason}" for (checks, reason), places in grouped.items()]


def judge_cluster(
    platform: ResolvedPlatform,
    results_dir: Path,
    budget: CheckpointBudget,
    scaling: ScalingInputs | None = None,
) -> ClusterValidation:
    nodes = [node_health(read_json(path)) for path in sorted((results_dir / "nodes").glob("*.json"))]
    drains = read_json(results_dir / "drains.json")
    pools = [
        judge_pool(platform, read_json(path), results_dir, nodes, drains, budget, scaling)
        for path in sorted((results_dir / "pools").glob("*.json"))
    ]
    return ClusterValidation(platform.name, results_dir, pools, nodes, drains, skipped_checks(nodes, pools))
