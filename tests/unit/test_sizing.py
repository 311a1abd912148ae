"""infra.sizing against the ZeRO paper (arXiv:1910.02054) and Korthikanti et al. (arXiv:2205.05198)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from infra.data.models import GpuSpec, NetworkSpec, NodeType, PriceSpec
from infra.sizing import (
    GB,
    GIB,
    TrainingSizingRequest,
    activation_bytes_per_layer,
    nodes_needed,
    plan_nodes,
    size_training,
    smallest_node_type,
)

SRC = "https://example.com/test-catalog"
AS_OF = dt.date(2025, 1, 1)


def req(**kw: Any) -> TrainingSizingRequest:
    return TrainingSizingRequest(**kw)


# --- ZeRO paper, section 5 / figure 1: Psi = 7.5B, Nd = 64, K = 12 -----------------------------------


@pytest.mark.parametrize(("stage", "expected_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure1(stage: int, expected_gb: float) -> None:
    r = size_training(req(params=7.5e9, precision="fp16", optimizer="adam", dp=64, zero=stage))
    assert r.per_gpu_bytes.model_states / GB == pytest.approx(expected_gb, abs=0.05)
    assert r.per_gpu_bytes.total == r.per_gpu_bytes.model_states
    assert r.per_gpu_bytes.activations == 0


def test_zero_stage_breakdown_exact() -> None:
    psi, nd = 7.5e9, 64
    expected = {
        0: (2 * psi, 2 * psi, 12 * psi),
        1: (2 * psi, 2 * psi, 12 * psi / nd),
        2: (2 * psi, 2 * psi / nd, 12 * psi / nd),
        3: (2 * psi / nd, 2 * psi / nd, 12 * psi / nd),
    }
    for stage, (p, g, o) in expected.items():
        b = size_training(req(params=psi, precision="bf16", dp=nd, zero=stage)).per_gpu_bytes
        assert (b.params, b.grads, b.optimizer) == (p, g, o)
        assert b.model_states == b.params + b.grads + b.optimizer


def test_bytes_per_param_fp32_vs_mixed() -> None:
    mixed = size_training(req(params=1e9, precision="bf16", optimizer="adamw"))
    fp32 = size_training(req(params=1e9, precision="fp32", optimizer="adamw"))
    assert mixed.bytes_per_param.model_dump() == {"params": 2, "grads": 2, "optimizer": 12}
    assert fp32.bytes_per_param.model_dump() == {"params": 4, "grads": 4, "optimizer": 8}
    assert mixed.per_gpu_bytes.model_states == 16e9
    assert fp32.per_gpu_bytes.model_states == 16e9  # same total, split differently
    assert fp32.per_gpu_bytes.params == 4e9 and mixed.per_gpu_bytes.params == 2e9


@pytest.mark.parametrize(
    ("precision", "optimizer", "k"),
    [
        ("fp16", "sgd-momentum", 8),
        ("bf16", "sgd", 4),
        ("fp8", "adam", 12),
        ("fp32", "sgd-momentum", 4),
        ("fp32", "sgd", 0),
    ],
)
def test_optimizer_state_bytes(precision: str, optimizer: str, k: int) -> None:
    r = size_training(req(params=1e9, precision=precision, optimizer=optimizer))
    assert r.bytes_per_param.optimizer == k
    assert r.per_gpu_bytes.optimizer == k * 1e9


def test_fp8_sized_like_bf16() -> None:
    a = size_training(req(params=3e9, precision="fp8", dp=8, zero=2))
    b = size_training(req(params=3e9, precision="bf16", dp=8, zero=2))
    assert a.per_gpu_bytes == b.per_gpu_bytes


def test_tp_pp_shard_params() -> None:
    r = size_training(req(params=8e9, tp=4, pp=2, dp=2))
    assert r.params_per_gpu == 1e9
    assert r.world_size == 16
    assert r.per_gpu_bytes.model_states == 16e9
    z3 = size_training(req(params=8e9, tp=4, pp=2, dp=2, zero=3))
    assert z3.per_gpu_bytes.model_states == 8e9


# --- Korthikanti et al. 2022 activations ---------------------------------------------------------------

# s=2048, b=1, h=4096, a=32: s*b*h = 8_388_608, 5*a*s/h = 80
SBH = 2048 * 1 * 4096
ACT = {"seq_len": 2048, "micro_batch": 1, "hidden_size": 4096, "num_heads": 32}


def test_activation_per_layer_values() -> None:
    assert SBH == 8_388_608
    assert activation_bytes_per_layer(2048, 1, 4096, 32) == 8_388_608 * 114 == 956_301_312
    # tp=8, no sequence parallel: 10 + 24/8 + 80/8 = 23
    assert activation_bytes_per_layer(2048, 1, 4096, 32, 8) == 8_388_608 * 23 == 192_937_984
    # tp=8 with sequence parallel: 114 / 8
    assert activation_bytes_per_layer(2048, 1, 4096, 32, 8, sequence_parallel=True) == 8_388_608 * 114 / 8
    # full checkpointing keeps only the layer input: 2*s*b*h
    assert activation_bytes_per_layer(2048, 1, 4096, 32, checkpointing=True) == 16_777_216
    assert activation_bytes_per_layer(2048, 1, 4096, None, 8, checkpointing=True) == 16_777_216


def test_activations_in_result_and_pipeline() -> None:
    r = size_training(req(params=7e9, layers=32, **ACT))
    assert r.per_gpu_bytes.activations == 32 * 956_301_312
    assert r.per_gpu_bytes.total == r.per_gpu_bytes.model_states + 32 * 956_301_312
    # pp=4: first stage holds 8 layers for 4 micro-batches in flight = 32 layers' worth
    p = size_training(req(params=7e9, layers=32, pp=4, **ACT))
    assert p.activation is not None
    assert (p.activation.layers_per_stage, p.activation.microbatches_in_flight) == (8, 4)
    assert p.per_gpu_bytes.activations == 32 * 956_301_312
    # uneven split: ceil(30 / 4) = 8 layers on the first stage
    u = size_training(req(params=7e9, layers=30, pp=4, **ACT))
    assert u.per_gpu_bytes.activations == 8 * 4 * 956_301_312
    t = size_training(req(params=7e9, layers=32, tp=8, **ACT))
    assert t.per_gpu_bytes.activations == 32 * 192_937_984


def test_fp32_activations_doubled() -> None:
    r = size_training(req(params=1e9, precision="fp32", layers=2, **ACT))
    assert r.per_gpu_bytes.activations == 2 * 2 * 956_301_312


def test_checkpointing_reduces_memory() -> None:
    full = size_training(req(params=7e9, layers=32, **ACT))
    ckpt = size_training(req(params=7e9, layers=32, activation_checkpointing=True, **ACT))
    assert ckpt.per_gpu_bytes.activations == 32 * 2 * SBH
    assert ckpt.per_gpu_bytes.activations < full.per_gpu_bytes.activations
    assert ckpt.per_gpu_bytes.total < full.per_gpu_bytes.total
    assert ckpt.per_gpu_bytes.model_states == full.per_gpu_bytes.model_states


def test_checkpointing_without_heads_is_allowed() -> None:
    shape = {"seq_len": 2048, "micro_batch": 1, "hidden_size": 4096, "layers": 4}
    r = size_training(req(params=1e9, activation_checkpointing=True, **shape))
    assert r.per_gpu_bytes.activations == 4 * 2 * SBH


# --- fitting, min_gpus ---------------------------------------------------------------------------------


def test_fits_and_min_gpus() -> None:
    # 7.5B mixed Adam ZeRO-3: 120e9 / dp bytes; 80 GiB * 0.9 = 77_309_411_328 usable -> dp >= 2
    r = size_training(req(params=7.5e9, dp=1, zero=3, gpu_memory_gib=80))
    assert r.usable_bytes_per_gpu == int(80 * GIB * 0.9)
    assert r.fits_target is False
    assert r.min_dp == 2 and r.min_gpus == 2
    assert r.fits(160) is True
    assert r.fits(80) is False
    assert r.fits(80, headroom=0.0) is False
    # with tp=2, pp=2 the world size scales
    r2 = size_training(req(params=30e9, tp=2, pp=2, zero=3, gpu_memory_gib=80))
    assert r2.min_dp == 2 and r2.min_gpus == 8
    # ZeRO-1 asymptote: params+grads 4*psi never sharded; psi=20e9 -> 80e9 > usable: never fits
    r3 = size_training(req(params=20e9, zero=1, gpu_memory_gib=80))
    assert r3.min_dp is None and r3.min_gpus is None
    # ZeRO-0 does not shard: only dp=1-fit or nothing
    assert size_training(req(params=1e9, zero=0, dp=8, gpu_memory_gib=80)).min_gpus == 1
    assert size_training(req(params=10e9, zero=0, gpu_memory_gib=80)).min_dp is None


def test_min_dp_is_smallest() -> None:
    shape: dict[str, Any] = {
        "params": 70e9,
        "zero": 3,
        "tp": 8,
        "layers": 80,
        "seq_len": 4096,
        "micro_batch": 1,
        "hidden_size": 8192,
        "activation_checkpointing": True,
        "gpu_memory_gib": 80,
    }
    r = size_training(req(dp=1, **shape))
    dp = r.min_dp
    assert dp is not None and dp > 1
    assert r.min_dp_for() == dp and r.min_gpus_for() == dp * 8
    assert size_training(req(dp=dp, **shape)).fits_target is True
    assert size_training(req(dp=dp - 1, **shape)).fits_target is False


def test_no_target_memory() -> None:
    r = size_training(req(params=1e9))
    assert r.gpu_memory_gib is None and r.fits_target is None and r.min_gpus is None
    with pytest.raises(ValueError, match="no GPU memory"):
        r.fits()


def test_json_shape() -> None:
    r = size_training(req(params=7.5e9, dp=64, zero=1, gpu_memory_gib=80))
    d = r.to_json_dict()
    json.dumps(d)
    assert set(d["per_gpu_bytes"]) == {"params", "grads", "optimizer", "model_states", "activations", "total"}
    for key in ("params_per_gpu", "world_size", "min_gpus", "min_dp", "fits_target", "bytes_per_param"):
        assert key in d
    assert d == r.model_dump()  # all plain JSON types already


# --- node types ----------------------------------------------------------------------------------------


def node(name: str, gpus: int, mem: int, price: float) -> NodeType:
    return NodeType(
        name=name,
        provider="aws",
        family=name.split(".")[0],
        vcpus=8 * max(gpus, 1),
        memory_gib=64 * max(gpus, 1),
        gpu=GpuSpec(model="X", architecture="hopper", count=gpus, memory_gib=mem) if gpus else None,
        network=NetworkSpec(fabric="ethernet", nics=1, gbps_per_nic=100),
        price=PriceSpec(on_demand_usd_per_hour=price, source=SRC, as_of=AS_OF),
        source=SRC,
        as_of=AS_OF,
    )


CATALOG = [
    node("cpu.large", 0, 0, 0.5),
    node("small.1x24", 1, 24, 1.0),
    node("mid.1x48", 1, 48, 2.0),
    node("mid.4x48", 4, 48, 8.0),
    node("big.8x80", 8, 80, 40.0),
    node("big.8x141", 8, 141, 40.0),
    node("huge.8x141", 8, 141, 60.0),
]


def test_smallest_node_type() -> None:
    # 1B mixed Adam: 16e9 B = 14.9 GiB; fits 24 GiB * 0.9 = 21.6 GiB
    r = size_training(req(params=1e9))
    best = smallest_node_type(r, CATALOG)
    assert best is not None and best.name == "small.1x24"
    # 2B: 32e9 B = 29.8 GiB -> needs the 48 GiB GPU; 1-GPU node is cheaper than 4-GPU one
    r2 = size_training(req(params=2e9))
    best2 = smallest_node_type(r2, CATALOG)
    assert best2 is not None and best2.name == "mid.1x48"
    # tp=4 needs >= 4 GPUs per node
    r3 = size_training(req(params=8e9, tp=4))
    best3 = smallest_node_type(r3, CATALOG)
    assert best3 is not None and best3.name == "mid.4x48"
    # 4.5e9 * 16 = 72e9 B = 67.1 GiB: fits 80 and 141 GiB (72 GiB usable at 10%), both $40 with 8 GPUs,
    # so the name breaks the tie
    r4 = size_training(req(params=4.5e9))
    best4 = smallest_node_type(r4, CATALOG)
    assert best4 is not None and best4.name == "big.8x141"  # 40$ tie, 8 GPUs each, name order
    assert smallest_node_type(r4, CATALOG, headroom=0.0) is not None
    # nothing fits
    assert smallest_node_type(size_training(req(params=100e9)), CATALOG) is None


def test_headroom_matters() -> None:
    # 1.4e9 * 16 = 22.4e9 B = 20.86 GiB: fits 24 GiB at 10% headroom (21.6), not at 20% (19.2)
    r = size_training(req(params=1.4e9, headroom=0.2))
    best = smallest_node_type(r, CATALOG)
    assert best is not None and best.name == "mid.1x48"
    best_lo = smallest_node_type(r, CATALOG, headroom=0.1)
    assert best_lo is not None and best_lo.name == "small.1x24"


def test_nodes_needed_and_plan() -> None:
    r = size_training(req(params=8e9, tp=4, pp=2, dp=3))  # world 24, model states 32e9 B per GPU
    n = smallest_node_type(r, CATALOG)
    assert n is not None and n.name == "mid.4x48"
    assert nodes_needed(r, n) == 6
    plan = plan_nodes(r, CATALOG)
    assert plan is not None
    assert plan.model_dump() == {
        "node_type": "mid.4x48",
        "gpus_per_node": 4,
        "nodes": 6,
        "total_gpus": 24,
        "idle_gpus": 0,
        "usd_per_hour": 48.0,
    }
    # tp=3 on 8-GPU nodes: 2 tp groups per node, dp*pp = 6 groups -> 3 nodes, 6 GPUs idle
    r3 = size_training(req(params=3e9, tp=3, pp=1, dp=6))
    big = CATALOG[4]
    assert nodes_needed(r3, big) == 3
    with pytest.raises(ValueError, match="fewer than tp"):
        nodes_needed(r, CATALOG[1])
    assert plan_nodes(size_training(req(params=100e9)), CATALOG) is None


# --- validation ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"params": 0}, "greater than 0"),
        ({"params": -1e9}, "greater than 0"),
        ({"params": 1e9, "zero": 4}, "ZeRO stage"),
        ({"params": 1e9, "zero": -1}, "ZeRO stage"),
        ({"params": 1e9, "dp": 0}, "greater than or equal to 1"),
        ({"params": 1e9, "tp": 0}, "greater than or equal to 1"),
        ({"params": 1e9, "precision": "int8"}, "precision"),
        ({"params": 1e9, "optimizer": "adafactor"}, "optimizer"),
        ({"params": 1e9, "seq_len": 2048, "hidden_size": 4096}, "partially given"),
        ({"params": 1e9, "num_heads": 32}, "num_heads given without"),
        ({"params": 1e9, "activation_checkpointing": True}, "activation_checkpointing needs"),
        (
            {"params": 1e9, "seq_len": 2048, "micro_batch": 1, "hidden_size": 4096, "layers": 4},
            "num_heads is required",
        ),
        ({"params": 1e9, "pp": 8, "layers": 4, **ACT}, "exceed layers"),
        ({"params": 1e9, "tp": 3, "layers": 4, **ACT}, "not divisible by tp"),
        ({"params": 1e9, "layers": 4, **{**ACT, "num_heads": 3}}, "not divisible by num_heads"),
        ({"params": 1e9, "headroom": 1.0}, "less than 1"),
        ({"params": 1e9, "gpu_memory_gib": 0}, "greater than 0"),
        ({"params": 1e9, "bogus": 1}, "Extra inputs"),
        ({"params": float("inf")}, "finite"),
    ],
)
def test_validation_errors(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainingSizingRequest(**kw)
