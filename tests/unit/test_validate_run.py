"""`gpuplat validate` after the play: judging what playbooks/validate.yml copied back (laid out here as the
role writes it), the scaling flag against hand-computed cases, and the command's exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from infra.validate import run as validate_run
from infra.validate.cluster_results import (
    CheckpointBudget,
    ScalingInputs,
    judge_cluster,
    scaling_finding,
)
from infra.validate.report import fabric_report
from tests.upstream import NCCL_SAMPLES

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = NCCL_SAMPLES
SIMULATED = "the node's 8 H100 GPUs are simulated (gpuplat_gpu_simulated=true, the local podman cluster)"


def node_check_names() -> tuple[str, ...]:
    """The GPU checks the real node check program reports (all skipped when told the GPUs are absent)."""
    program = ROOT / "roles" / "gpu_validation" / "files" / "gpuplat_node_check.py"
    done = subprocess.run(
        [sys.executable, str(program), "--health-program", "/nonexistent", "--gpu-absent-reason", "absent"],
        capture_output=True,
        text=True,
        check=True,
    )
    return tuple(c["name"] for c in json.loads(done.stdout)["checks"] if c["name"] != "health-program")


GPU_CHECKS = node_check_names()


def node_report(node: str, *reasons: str, absent: str = "", pool: str = "train") -> dict[str, Any]:
    gpu = [
        {"name": c, "status": "skip" if absent else "pass", "detail": absent or "fine"} for c in GPU_CHECKS
    ]
    health = {"name": "health-program", "status": "fail" if reasons else "pass", "detail": "; ".join(reasons)}
    return {
        "node": node,
        "pool": pool,
        "checks": [health, *gpu],
        "drain_reasons": list(reasons),
        "gpu_absent_reason": absent,
    }


def fio_result(bytes_per_second: float) -> dict[str, Any]:
    """The part of fio 3.33's --output-format=json that is read (one job with --group_reporting)."""
    return {
        "fio version": "fio-3.33",
        "jobs": [
            {
                "jobname": "gpuplat-seqread",
                "read": {
                    "io_bytes": int(bytes_per_second * 5),
                    "bw_bytes": int(bytes_per_second),
                    "runtime": 5000,
                },
            }
        ],
    }


def ran(*nodes: str, **extra: Any) -> dict[str, Any]:
    return {"status": "ran", "detail": "ran", "nodes": list(nodes), **extra}


def skipped(reason: str) -> dict[str, Any]:
    return {"status": "skipped", "detail": reason}


class Results:
    """A results directory as the role leaves it (nodes/, drains.json, pools/<pool>.json and raw files)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "nodes").mkdir(parents=True)
        (root / "pools").mkdir()
        self.drains({})

    def node(self, document: dict[str, Any]) -> None:
        (self.root / "nodes" / f"{document['node']}.json").write_text(json.dumps(document))

    def drains(self, values: dict[str, Any]) -> None:
        document = {
            "drained": {},
            "already_drained": {},
            "failing_not_drained": {},
            "resumed": [],
            "unchecked": [],
        }
        (self.root / "drains.json").write_text(json.dumps({**document, **values}))

    def pool(self, pool: str, ready: list[str], steps: dict[str, Any], files: dict[str, str]) -> None:
        record = {
            "pool": pool,
            "partition": pool,
            "gpus_per_node": 8,
            "ready": ready,
            "not_ready": {},
            "run": "20261201T000000Z",
            "mpi_plugin": "pmix",
            "steps": steps,
        }
        (self.root / "pools" / f"{pool}.json").write_text(json.dumps(record))
        (self.root / "pools" / pool).mkdir(exist_ok=True)
        for name, text in files.items():
            (self.root / "pools" / pool / name).write_text(text)


def checkpoint_lines(seconds: dict[str, float], size: int = 2**30) -> str:
    return "\n".join(json.dumps({"node": n, "bytes": size, "seconds": s}) for n, s in seconds.items()) + "\n"


def healthy_pool(
    results: Results, nodes: list[str], nccl: dict[str, Any] | None = None, **files: str
) -> None:
    steps = {
        "storage": ran(*nodes),
        "checkpoint": ran(*nodes),
        **(nccl or {"nccl_1node": skipped(SIMULATED), "nccl_2node": skipped(SIMULATED)}),
    }
    defaults = {f"fio-{n}.json": json.dumps(fio_result(4e9)) for n in nodes}
    defaults["checkpoint.jsonl"] = checkpoint_lines(dict.fromkeys(nodes, 10.0))
    results.pool("train", nodes, steps, {**defaults, **files})


# --- The local cluster ------------------------------------------------------------------------------------


def test_local_run_reports_figures_and_every_skip(tmp_path: Path, shipped_platforms: dict[str, Any]) -> None:
    results = Results(tmp_path)
    for node in ("train-0", "train-1"):
        results.node(node_report(node, absent=SIMULATED))
    healthy_pool(
        results,
        ["train-0", "train-1"],
        **{
            "fio-train-0.json": json.dumps(fio_result(0.5e9)),
            "fio-train-1.json": json.dumps(fio_result(0.3e9)),
            "checkpoint.jsonl": checkpoint_lines({"train-0": 0.4, "train-1": 0.55}, 64 * 2**20),
        },
    )
    report = judge_cluster(shipped_platforms["local"], tmp_path, CheckpointBudget())
    assert report.passed
    pool = report.pools[0]
    storage = pool.finding("storage")
    assert storage is not None and storage.status == "info"
    assert storage.detail.startswith("0.80 GB/s aggregate sequential read from 2 node(s); target 0.80 GB/s")
    assert "not a meaningful target" in storage.detail
    assert pool.checkpoint is not None and pool.checkpoint.worst_seconds == 0.55
    assert [f.status for f in pool.findings if f.check.startswith("nccl")] == ["skip", "skip"]
    assert report.skipped == [
        f"{', '.join(GPU_CHECKS)} on train-0, train-1: {SIMULATED}",
        f"nccl_1node, nccl_2node on pool train: {SIMULATED}",
        "scaling on pool train: not predicted: give --params and --step-compute-s",
    ]
    assert report.to_json()["pools"][0]["storage"]["node_gbps"] == {"train-0": 0.5, "train-1": 0.3}


# --- Gates on a cloud stack -------------------------------------------------------------------------------


def test_storage_below_what_the_stack_was_sized_for_fails(
    tmp_path: Path, shipped_platforms: dict[str, Any]
) -> None:
    results = Results(tmp_path)
    for node in ("train-0", "train-1"):
        results.node(node_report(node))
    slow = {f"fio-train-{i}.json": json.dumps(fio_result(3e9)) for i in (0, 1)}
    healthy_pool(results, ["train-0", "train-1"], **slow)
    report = judge_cluster(shipped_platforms["aws-prod"], tmp_path, CheckpointBudget())
    storage = report.pools[0].finding("storage")
    assert storage is not None and storage.status == "fail"
    # aws-prod: read_gbps_per_gpu 0.5 x (2 nodes x 8 GPUs of p5.48xlarge) = 8 GB/s
    assert storage.detail.startswith("6.00 GB/s aggregate sequential read from 2 node(s); target 8.00 GB/s")
    assert not report.passed


@pytest.mark.parametrize(("worst", "status"), [(89.0, "pass"), (91.0, "fail")])
def test_checkpoint_write_is_held_to_its_budget(
    tmp_path: Path, shipped_platforms: dict[str, Any], worst: float, status: str
) -> None:
    results = Results(tmp_path)
    results.node(node_report("train-0"))
    results.node(node_report("train-1"))
    healthy_pool(
        results,
        ["train-0", "train-1"],
        **{"checkpoint.jsonl": checkpoint_lines({"train-0": 12.0, "train-1": worst})},
    )
    report = judge_cluster(shipped_platforms["aws-prod"], tmp_path, CheckpointBudget(1800, 0.05))
    finding = report.pools[0].finding("checkpoint")
    assert finding is not None and finding.status == status
    assert f"in {worst:.2f} s (slowest of 2 node(s) writing at once); budget 90 s" in finding.detail


def test_a_node_missing_from_the_checkpoint_timings_fails(
    tmp_path: Path, shipped_platforms: dict[str, Any]
) -> None:
    results = Results(tmp_path)
    healthy_pool(results, ["train-0", "train-1"], **{"checkpoint.jsonl": checkpoint_lines({"train-0": 1.0})})
    finding = (
        judge_cluster(shipped_platforms["aws-prod"], tmp_path, CheckpointBudget())
        .pools[0]
        .finding("checkpoint")
    )
    assert finding is not None and (finding.status, finding.detail) == (
        "fail",
        "no checkpoint timing from train-1",
    )


def nccl_steps(**logs: str) -> tuple[dict[str, Any], dict[str, str]]:
    steps = {
        name: ran("train-0", "train-1") if name in logs else skipped("needs two ready nodes; the pool has 1")
        for name in ("nccl_1node", "nccl_2node")
    }
    return steps, {f"{name}.log": text for name, text in logs.items()}


def test_nccl_over_sockets_on_an_efa_pool_fails_the_pool(
    tmp_path: Path, shipped_platforms: dict[str, Any]
) -> None:
    results = Results(tmp_path)
    steps, logs = nccl_steps(nccl_2node=(SAMPLES / "socket-ec2.log").read_text())
    healthy_pool(results, ["train-0", "train-1"], steps, **logs)
    pool = judge_cluster(shipped_platforms["aws-prod"], tmp_path, CheckpointBudget()).pools[0]
    finding = pool.finding("nccl_2node")
    assert finding is not None and finding.status == "fail"
    assert "TCP" in finding.detail
    assert not pool.passed and "nccl_2node" in pool.nccl


def jobs_loading(platform: Any, nccl: str) -> Any:
    """The platform with jobs loading `nccl` (the recorded sample's NCCL, 2.22.3)."""
    return replace(platform, software=replace(platform.software, jobs_nccl=nccl))


def test_nccl_on_efa_with_gpudirect_rdma_passes(tmp_path: Path, shipped_platforms: dict[str, Any]) -> None:
    results = Results(tmp_path)
    steps, logs = nccl_steps(nccl_2node=(SAMPLES / "efa-p5-gdrdma.log").read_text())
    healthy_pool(results, ["train-0", "train-1"], steps, **logs)
    platform = jobs_loading(shipped_platforms["aws-prod"], "2.22.3")
    pool = judge_cluster(platform, tmp_path, CheckpointBudget()).pools[0]
    finding = pool.finding("nccl_2node")
    assert finding is not None and finding.status == "pass", finding
    assert "NCCL 2.22.3" in finding.detail and "GPUDirect RDMA on" in finding.detail
    assert pool.finding("nccl_1node") is not None and pool.finding("nccl_1node").status == "skip"  # type: ignore[union-attr]


def test_a_run_of_another_nccl_than_the_jobs_load_fails(
    tmp_path: Path, shipped_platforms: dict[str, Any]
) -> None:
    """aws-prod's jobs load torch 2.13.0's NCCL 2.29.7: a run on 2.22.3 measured another library."""
    results = Results(tmp_path)
    steps, logs = nccl_steps(nccl_2node=(SAMPLES / "efa-p5-gdrdma.log").read_text())
    healthy_pool(results, ["train-0", "train-1"], steps, **logs)
    pool = judge_cluster(shipped_platforms["aws-prod"], tmp_path, CheckpointBudget()).pools[0]
    finding = pool.finding("nccl_2node")
    assert finding is not None and finding.status == "fail"
    assert finding.detail.startswith(
        "nccl-version: all_reduce_perf ran NCCL 2.22.3+cuda12.2, not 2.29.7 "
        "(torch 2.13.0's wheel, the NCCL jobs load)"
    )


def test_a_failed_step_fails_the_pool_with_its_reason(
    tmp_path: Path, shipped_platforms: dict[str, Any]
) -> None:
    results = Results(tmp_path)
    error = {
        "status": "error",
        "detail": "all_reduce_perf failed (exit 1): srun: error: Unable to allocate resources",
    }
    steps, logs = nccl_steps()
    steps["nccl_1node"] = error
    healthy_pool(results, ["train-0"], steps, **logs)
    pool = judge_cluster(shipped_platforms["aws-prod"], tmp_path, CheckpointBudget()).pools[0]
    assert pool.to_json()["reasons"] == [f"nccl_1node: {error['detail']}"]


# --- Node health ------------------------------------------------------------------------------------------


def test_drained_and_already_drained_nodes_fail_and_unchecked_ones_warn(
    tmp_path: Path, shipped_platforms: dict[str, Any]
) -> None:
    results = Results(tmp_path)
    results.node(node_report("train-0", "xid: fatal XID since boot: XID 79 on PCI:0000:86:00"))
    results.node(node_report("train-1", "health-program: /fsx not mounted"))
    results.node(node_report("train-2"))
    results.drains(
        {
            "drained": {"train-0": "gpuplat-validate: xid: fatal XID since boot: XID 79 on PCI:0000:86:00"},
            "already_drained": {"train-1": "gpuplat-health: /fsx not mounted"},
            "unchecked": ["train-3"],
        }
    )
    healthy_pool(results, ["train-2"])
    record = json.loads((tmp_path / "pools" / "train.json").read_text())
    record["not_ready"] = {
        "train-0": "failed its health checks",
        "train-1": "failed its health checks",
        "train-3": "its health checks did not run",
    }
    (tmp_path / "pools" / "train.json").write_text(json.dumps(record))
    report = judge_cluster(shipped_platforms["aws-prod"], tmp_path, CheckpointBudget())
    assert set(report.failing_nodes) == {"train-0", "train-1"}
    nodes = [(f.status, f.detail) for f in report.pools[0].findings if f.check == "nodes"]
    assert nodes == [
        ("fail", "train-0 drained: xid: fatal XID since boot: XID 79 on PCI:0000:86:00"),
        (
            "fail",
            "train-1 fails health-program: /fsx not mounted"
            " (already drained: gpuplat-health: /fsx not mounted)",
        ),
        ("warn", "train-3: its health checks did not run"),
    ]
    assert not report.passed and report.to_json()["verdict"] == "fail"


@pytest.mark.parametrize(
    ("index", "check", "finding"),
    [
        (
            1 + GPU_CHECKS.index("dcgm-diag"),
            {"name": "dcgm-diag", "status": "error", "detail": "dcgmi diag -r 2 could not run (exit 255)"},
            "train-0 could not run dcgm-diag: dcgmi diag -r 2 could not run (exit 255)",
        ),
        (
            1 + GPU_CHECKS.index("xid"),
            {"name": "xid", "status": "warn", "detail": "XID since boot that needs a look: XID 94"},
            "train-0 xid: XID since boot that needs a look: XID 94",
        ),
    ],
    ids=["could-not-run", "warns"],
)
def test_a_check_that_could_not_run_or_warns_is_a_warning_without_failing(
    tmp_path: Path, shipped_platforms: dict[str, Any], index: int, check: dict[str, str], finding: str
) -> None:
    results = Results(tmp_path)
    document = node_report("train-0")
    document["checks"][index] = check
    results.node(document)
    healthy_pool(results, ["train-0"])
    pool = judge_cluster(shipped_platforms["aws-prod"], tmp_path, CheckpointBudget()).pools[0]
    assert ("warn", finding) in [(f.status, f.detail) for f in pool.findings]
    assert pool.passed


# --- Scaling ----------------------------------------------------------------------------------------------


def busbw_table(busbw: float) -> str:
    """An all_reduce_perf table with nccl-tests' columns (src/common.cu), spacing narrowed, one 1 GiB row."""
    return (
        "#                                           out-of-place                    in-place\n"
        "#  size      count  type redop root   time  algbw   busbw #wrong   time  algbw   busbw #wrong\n"
        "#   (B) (elements)                    (us) (GB/s)  (GB/s)          (us) (GB/s)  (GB/s)\n"
        f"1073741824 268435456 float sum -1 9999.0 107.38 {busbw:7.2f} 0 9999.0 107.38 {busbw:7.2f} 0\n"
        "# Out of bounds values : 0 OK\n"
        f"# Avg bus bandwidth    : {busbw:.2f}\n"
    )


def test_scaling_from_measured_busbw_matches_the_hand_computed_case() -> None:
    """1e9 bf16 gradients (2e9 bytes), 0.1 s of compute, no overlap; ring all-reduce t = S/busbw * 2(n-1)/n:
    8 GPUs at 100 GB/s: 0.02 * 1.75 = 0.035 s, step 0.135 s; 32 GPUs at 20 GB/s: 0.1 * 1.9375 = 0.19375 s,
    step 0.29375 s; speedup 4 * 0.135 / 0.29375 = 1.838: under 2x, and measured, so the pool fails."""
    nccl = {
        "nccl_1node": fabric_report(busbw_table(100.0), source="1", node_type="p5.48xlarge", nodes=1),
        "nccl_2node": fabric_report(busbw_table(20.0), source="2", node_type="p5.48xlarge", nodes=2),
    }
    finding, prediction = scaling_finding(ScalingInputs(1e9, 0.1), "p5.48xlarge", nccl)
    assert prediction is not None
    assert prediction.speedup == pytest.approx(4 * 0.135 / 0.29375, rel=1e-6)
    assert finding.status == "fail"
    assert "(busbw measured within a node, measured across nodes)" in finding.detail


def test_a_gated_figure_alone_never_fails_a_pool() -> None:
    """8 GPUs measured at 100 GB/s, 32 GPUs at p5's two-node gate of 250 GB/s: 0.035 s and
    2e9/250e9 * 1.9375 = 0.0155 s; speedup 4 * 0.135 / 0.1155 = 4.675. A 1e11-parameter model on 1000 GB/s
    within a node: 0.35 s, step 0.45 s; across nodes at the gate 1.55 s, step 1.65 s; 4 * 0.45 / 1.65 = 1.09,
    under 2x, but the gate is a floor, not this fabric: a warning."""
    nccl = {"nccl_1node": fabric_report(busbw_table(100.0), source="1", node_type="p5.48xlarge", nodes=1)}
    finding, prediction = scaling_finding(ScalingInputs(1e9, 0.1), "p5.48xlarge", nccl)
    assert prediction is not None and prediction.speedup == pytest.approx(4 * 0.135 / 0.1155, rel=1e-6)
    assert finding.status == "pass" and "measured within a node, gated across nodes" in finding.detail
    fast = {"nccl_1node": fabric_report(busbw_table(1000.0), source="1", node_type="p5.48xlarge", nodes=1)}
    slow, big = scaling_finding(ScalingInputs(1e11, 0.1), "p5.48xlarge", fast)
    assert big is not None and big.speedup == pytest.approx(4 * 0.45 / 1.65, rel=1e-6)
    assert (big.flag, slow.status) == ("fabric", "warn")


def test_scaling_needs_busbw_for_both_shapes() -> None:
    finding, prediction = scaling_finding(ScalingInputs(1e9, 0.1), "hgx-h100", {})
    assert prediction is None and finding.status == "skip"
    assert (
        finding.detail
        == "not predicted: no intra-node or two-node busbw measured here nor gated for hgx-h100"
    )
    assert (
        scaling_finding(None, "hgx-h100", {})[0].detail == "not predicted: give --params and --step-compute-s"
    )


# --- Before the play: what the command refuses, and its exit codes ----------------------------------------


def gpuplat(*args: str, state: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> tuple[Any, str]:
    """The real entry point in-process: exit code and stderr."""
    from infra.cli.app import main

    monkeypatch.setenv("GPUPLAT_STATE_DIR", str(state))
    monkeypatch.setenv("NO_COLOR", "1")
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    return exit_.value.code, " ".join(capsys.readouterr().err.split())


def test_kueue_stacks_are_refused_with_what_to_do_instead(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    code, err = gpuplat(
        "validate", "--stack", "aws-k8s", state=tmp_path, monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 2
    assert "gpuplat nccl-report" in err and "Traceback" not in err


def test_scaling_options_come_together(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    args = ("validate", "--stack", "aws-prod", "--params", "7e9")
    code, err = gpuplat(*args, state=tmp_path, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and "--step-compute-s" in err


def test_a_cloud_stack_without_inventory_says_where_to_get_one(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    code, err = gpuplat(
        "validate", "--stack", "aws-prod", state=tmp_path, monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 3
    assert f"no inventory for stack aws-prod at {tmp_path}/aws-prod/inventory" in err
    assert "--inventory" in err


def test_a_local_stack_that_is_not_up_says_how_to_bring_it_up(
    write_stack: Any, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    def rename(platform: dict[str, Any]) -> None:
        platform["name"] = "valtest-absent"

    path = write_stack("local", rename, name="valtest-absent")
    code, err = gpuplat(
        "validate", "--stack-file", str(path), state=tmp_path, monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 3, err
    assert "podman is not installed" in err or f"`gpuplat up --stack-file {path}`" in err


def test_the_command_saves_the_report_and_exits_1_on_a_drained_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The play itself needs a cluster (the local one runs it: README); here its results stand in for it."""
    inventory = tmp_path / "inventory"
    inventory.mkdir()

    def play(playbook: str, inventory_path: Path, log_dir: Path, **kwargs: Any) -> None:
        assert (playbook, inventory_path) == ("validate.yml", inventory)
        # validate.yml delegates to localhost: never with a connection given to every host as extra vars.
        assert not kwargs.get("containers")
        results = Results(Path(kwargs["extra_vars"]["gpu_validation_report_dir"]))
        results.node(
            node_report("train-0", "ecc: GPU 1: 3 uncorrectable ECC error(s) since the driver loaded")
        )
        results.drains({"drained": {"train-0": "gpuplat-validate: ecc: GPU 1: 3 uncorrectable ECC error(s)"}})
        healthy_pool(results, ["train-1"])

    monkeypatch.setenv("GPUPLAT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(validate_run, "run_playbook", play)
    from typer.testing import CliRunner

    from infra.cli.app import app

    outcome = CliRunner().invoke(
        app, ["validate", "--stack", "aws-prod", "--inventory", str(inventory), "--checkpoint-gib", "4"]
    )
    assert outcome.exit_code == 1, outcome.output
    saved = tmp_path / "state" / "aws-prod" / "validate"
    assert json.loads((saved / "report.json").read_text())["verdict"] == "fail"
    text = (saved / "report.txt").read_text()
    assert "train-0 drained" in text and "verdict: FAIL" in text
    assert (
        validate_run.extra_vars(validate_run.ValidateOptions(checkpoint_gib=4), saved)[
            "gpu_validation_checkpoint_mib"
        ]
        == "4096"
    )
