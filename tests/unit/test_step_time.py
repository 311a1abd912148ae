"""`gpuplat size`'s step time (issue 51, item 11): the precision's throughput, memory bandwidth for the
memory-bound optimizer step, the interconnect for gradient and tensor-parallel traffic, and what spot
interruptions cost. The catalog's figures, each with its source (infra/data/gpu_catalog.yaml)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from infra.data.load import catalog
from infra.data.models import NodeType
from infra.training.sizing import TrainingSizingRequest, size_training
from infra.training.step_time import Shape, precision_tflops, spot_overhead, step_time
from tests.conftest import CONFIG_KEY, stack_document
from tests.unit.test_hostile_input import run_cli
from tests.unit.test_placement import two_gpu_types

SHAPE = Shape(seq_len=4096, micro_batch=1, hidden_size=4096, layers=32)


def node(name: str) -> NodeType:
    found = catalog().get(name)
    assert found is not None
    return found


def sized(**fields: object) -> object:
    return size_training(TrainingSizingRequest.model_validate({"params": 8e9, **fields}))


def test_fp8_runs_at_fp8_throughput_where_the_gpu_has_it_and_at_bf16_on_the_a100() -> None:
    h100 = catalog().gpu_figures("H100")
    a100 = catalog().gpu_figures("A100")
    assert h100 is not None and a100 is not None
    assert precision_tflops(h100, "fp8") == 1978.9 and precision_tflops(h100, "bf16") == 989
    assert precision_tflops(a100, "fp8") == precision_tflops(a100, "bf16") == 312  # Ampere: no FP8
    assert precision_tflops(h100, "fp32") == 494.7  # TF32 Tensor Cores
    fp8 = sized(precision="fp8", dp=8, zero=3)
    bf16 = sized(precision="bf16", dp=8, zero=3)
    p5, p4de = node("p5.48xlarge"), node("p4de.24xlarge")
    h100_fp8, h100_bf16 = step_time(fp8, SHAPE, p5), step_time(bf16, SHAPE, p5)  # type: ignore[arg-type]
    a100_fp8, a100_bf16 = step_time(fp8, SHAPE, p4de), step_time(bf16, SHAPE, p4de)  # type: ignore[arg-type]
    assert h100_fp8 and h100_bf16 and a100_fp8 and a100_bf16
    assert h100_fp8.compute_s == pytest.approx(h100_bf16.compute_s / 2, rel=1e-3)
    assert a100_fp8.compute_s == pytest.approx(a100_bf16.compute_s)


def test_the_optimizer_step_goes_at_memory_bandwidth_so_the_h200_is_faster_than_the_h100() -> None:
    run = sized(dp=8, zero=1)
    h100 = step_time(run, SHAPE, node("p5.48xlarge"))  # type: ignore[arg-type]
    h200 = step_time(run, SHAPE, node("p5e.48xlarge"))  # type: ignore[arg-type]
    assert h100 and h200
    assert h100.compute_s == pytest.approx(h200.compute_s)  # the same Hopper compute
    assert h200.memory_s == pytest.approx(h100.memory_s * 3350 / 4800)
    assert h200.total_s < h100.total_s


def test_tensor_parallel_over_pcie_and_zero3_over_a_thin_network_cost_time() -> None:
    tp8 = sized(tp=8)
    l40s = step_time(tp8, SHAPE, node("g6e.48xlarge"))  # type: ignore[arg-type]
    h100 = step_time(tp8, SHAPE, node("p5.48xlarge"))  # type: ignore[arg-type]
    assert l40s and h100
    # The same bytes over PCIe Gen4 (32 GB/s one way) and over NVLink (450 GB/s one way).
    assert l40s.communication_s == pytest.approx(h100.communication_s * 450 / 32)
    zero3_across = sized(dp=16, zero=3)  # two 8-GPU nodes
    zero3_inside = sized(dp=8, zero=3)
    g6e = node("g6e.48xlarge")
    across = step_time(zero3_across, SHAPE, g6e)  # type: ignore[arg-type]
    inside = step_time(zero3_inside, SHAPE, g6e)  # type: ignore[arg-type]
    assert across and inside
    # 4 x 100 Gbps for 8 GPUs: 6.25 GB/s per GPU across nodes, against PCIe's 32 GB/s inside one.
    assert across.communication_s > 4 * inside.communication_s
    assert across.communication_s > across.compute_s  # ZeRO-3 on that network is bound by it


def test_spot_loses_half_a_checkpoint_interval_and_the_restart_per_interruption() -> None:
    # 100 steps of 36 s between checkpoints: 30 min lost on average, plus 10 min to restart.
    assert spot_overhead(36.0, 100, 24.0, 10.0) == pytest.approx(40 / 60)
    assert spot_overhead(36.0, 100, 0.0, 10.0) == 0.0


def test_size_against_the_stack_prices_precision_and_spot(tmp_path: Path) -> None:
    document = copy.deepcopy(stack_document("aws-k8s"))
    two_gpu_types(document["config"][CONFIG_KEY])
    stack = tmp_path / "Pulumi.mixed.yaml"
    stack.write_text(yaml.safe_dump(document, sort_keys=False))
    shape = ["--seq-len", "4096", "--micro-batch", "1", "--hidden", "4096", "--layers", "32", "--heads", "32"]
    args = ["size", "--params", "8e9", "--dp", "16", "--zero", "3", *shape]
    run = run_cli(*args, "--precision", "fp8", "--stack-file", str(stack), "--json")
    assert run.code == 0, run.err
    pools = {p["pool"]: p for p in json.loads(run.out)["pools"]}
    assert pools["train"]["precision_tflops"] == 1978.9 and pools["train-l40s"]["precision_tflops"] == 733
    assert pools["train"]["step_time_s"] > 0
    assert pools["train-spot"]["spot_overhead"] > 0 and pools["train"]["spot_overhead"] is None
    calm = run_cli(*args, "--spot-interruptions-per-day", "0", "--stack-file", str(stack), "--json")
    calm_pools = {p["pool"]: p for p in json.loads(calm.out)["pools"]}
    assert calm_pools["train-spot"]["spot_overhead"] == 0.0


def test_zero3_moves_half_again_the_gradient_traffic_of_zero1() -> None:
    """ZeRO-3 all-gathers the parameters in the forward and backward passes besides reduce-scattering the
    gradients: 1.5x the all-reduce volume of ZeRO-1/2 (Rajbhandari et al. 2020, section 7)."""
    p5 = node("p5.48xlarge")
    zero1 = step_time(sized(dp=16, zero=1), SHAPE, p5)  # type: ignore[arg-type]
    zero3 = step_time(sized(dp=16, zero=3), SHAPE, p5)  # type: ignore[arg-type]
    assert zero1 and zero3 and zero1.communication_s > 0
    assert zero3.communication_s == pytest.approx(zero1.communication_s * 1.5)


def test_tensor_parallel_traffic_is_per_pipeline_stage() -> None:
    """Each pipeline stage all-reduces activations only for its own layers: two stages, half the layers."""
    p5 = node("p5.48xlarge")
    one_stage = step_time(sized(tp=2), SHAPE, p5)  # type: ignore[arg-type]
    two_stages = step_time(sized(tp=2, pp=2), SHAPE, p5)  # type: ignore[arg-type]
    assert one_stage and two_stages and one_stage.communication_s > 0
    assert two_stages.communication_s == pytest.approx(one_stage.communication_s / 2)
