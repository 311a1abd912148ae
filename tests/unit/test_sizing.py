"""infra.training.sizing against the ZeRO paper (arXiv:1910.02054), Korthikanti et al. (arXiv:2205.05198) and
the activation terms of its module docstring. The measured rows are in test_memory_calibration.py."""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from infra.cli.commands.size import size, sizing
from infra.data.models import GB, GIB, GpuSpec, NetworkSpec, NicFabric, NodeType, PriceSpec
from infra.errors import SpecError
from infra.training.sizing import (
    PROCESS_OVERHEAD_BYTES,
    TrainingSizingRequest,
    activation_bytes_per_layer,
    logits_bytes,
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
    assert r.per_gpu_bytes.total == r.per_gpu_bytes.model_states + PROCESS_OVERHEAD_BYTES
    assert r.per_gpu_bytes.activations == r.per_gpu_bytes.logits == 0


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


def test_autocast_keeps_fp32_weights_and_grads() -> None:
    # PyTorch AMP: fp32 weights (the master copy), fp32 grads, Adam momentum + variance: 4 + 4 + 8
    r = size_training(req(params=1e9, precision="bf16", optimizer="adamw", autocast=True))
    assert r.bytes_per_param.model_dump() == {"params": 4, "grads": 4, "optimizer": 8}
    assert r.per_gpu_bytes.model_states == 16e9
    z1 = size_training(req(params=1e9, autocast=True, dp=4, zero=1))
    assert (z1.per_gpu_bytes.params, z1.per_gpu_bytes.optimizer) == (4e9, 8e9 / 4)


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


# --- activations: Korthikanti et al. 2022 terms, flash and math attention ---------------------------

# s=2048, b=1, h=4096, a=32: s*b*h = 8_388_608, a*s/h = 16 scores per s*b*h element
SBH = 2048 * 1 * 4096
SCORES = 32 * 2048 * 2048 * 1  # a * s^2 * b
LSE = 4 * 32 * 2048 * 1  # one fp32 log-sum-exp per row and head
ACT = {"seq_len": 2048, "micro_batch": 1, "hidden_size": 4096, "num_heads": 32}
EMBEDDING_OUTPUT = 5 * SBH  # embedding dropout mask 1, final layer-norm input 2, LM-head input 2


def per_layer(**kw: Any) -> float:
    return activation_bytes_per_layer(2048, 1, 4096, 32, **kw)


def test_flash_layer_is_korthikanti_without_the_attention_matrix() -> None:
    assert SBH == 8_388_608
    # 34 sbh (Korthikanti's terms outside the attention core) and the log-sum-exp, nothing in s^2
    assert per_layer() == 34 * SBH + LSE == 285_474_816
    # tp=8 without sequence parallelism: sbh(10 + 24/8), as in Korthikanti
    assert per_layer(tp=8) == 13 * SBH + LSE / 8
    assert per_layer(tp=8, sequence_parallel=True) == (34 * SBH + LSE) / 8
    # no dropout: the two 1-byte masks go
    assert per_layer(dropout=False) == 32 * SBH + LSE


def test_math_layer_keeps_the_scores_in_fp32() -> None:
    # fp32 Q, K, V (12 sbh instead of 6) and per score fp32 softmax output 4, mask 1, fp32 dropout output 4
    math_layer = per_layer(attention="math")
    assert math_layer == 40 * SBH + 9 * SCORES == 184 * SBH
    # with Megatron's 16-bit softmax (5 bytes per score, 16-bit Q, K, V) it is Korthikanti's sbh(34 + 5as/h)
    assert math_layer - 6 * SBH - (9 - 5) * SCORES == SBH * (34 + 5 * 32 * 2048 / 4096)
    assert per_layer(attention="math", dropout=False) == 38 * SBH + 4 * SCORES
    assert per_layer(attention="math", tp=8) == 10 * SBH + (30 * SBH + 9 * SCORES) / 8


def test_layer_precision_and_autocast() -> None:
    # fp32: every activation 4 bytes, masks 1: whole 2*4 + 2*4 + 2, split 3*4 + 4 + 8*4
    assert per_layer(precision="fp32") == 66 * SBH + LSE
    # autocast: the two layer-norm inputs (residual stream) are fp32, the rest 16-bit
    assert per_layer(autocast=True) == 38 * SBH + LSE
    assert per_layer(checkpointing=True) == 2 * SBH
    assert per_layer(checkpointing=True, autocast=True) == 4 * SBH
    assert per_layer(checkpointing=True, tp=8, sequence_parallel=True) == 2 * SBH / 8
    assert activation_bytes_per_layer(2048, 1, 4096, None, 8, checkpointing=True) == 2 * SBH


def test_logits_in_fp32() -> None:
    sbv = 2048 * 1 * 32000
    assert logits_bytes(2048, 1, 32000) == (4 * sbv, 8 * sbv)
    assert logits_bytes(2048, 1, 32000, tp=4) == (sbv, 2 * sbv)
    assert logits_bytes(2048, 1, None) == (0, 0)
    r = size_training(req(params=1e9, layers=2, vocab_size=32000, **ACT))
    assert r.per_gpu_bytes.logits == 12 * sbv
    assert r.per_gpu_bytes.total == (
        r.per_gpu_bytes.model_states + r.per_gpu_bytes.activations + 12 * sbv + PROCESS_OVERHEAD_BYTES
    )


def test_activations_in_result_and_pipeline() -> None:
    layer = math.ceil(per_layer())
    r = size_training(req(params=7e9, layers=32, **ACT))
    assert r.activation is not None and r.activation.stage == "only"
    assert r.per_gpu_bytes.activations == 32 * layer + EMBEDDING_OUTPUT
    assert r.per_gpu_bytes.total == (
        r.per_gpu_bytes.model_states + 32 * layer + EMBEDDING_OUTPUT + PROCESS_OVERHEAD_BYTES
    )
    # pp=4: the first stage holds 8 layers and the embedding mask for 4 micro-batches in flight
    p = size_training(req(params=7e9, layers=32, pp=4, **ACT))
    assert p.activation is not None
    assert (p.activation.stage, p.activation.layers_per_stage, p.activation.microbatches_in_flight) == (
        "first",
        8,
        4,
    )
    assert p.per_gpu_bytes.activations == 32 * layer + 4 * SBH
    # uneven split: ceil(30 / 4) = 8 layers on the first stage
    u = size_training(req(params=7e9, layers=30, pp=4, **ACT))
    assert u.per_gpu_bytes.activations == 8 * 4 * layer + 4 * SBH
    # a large vocabulary makes the last stage (one micro-batch, the logits) the most loaded
    big_vocab = 512_000
    last = size_training(req(params=7e9, layers=32, pp=4, vocab_size=big_vocab, **ACT))
    assert last.activation is not None and last.activation.stage == "last"
    assert last.per_gpu_bytes.activations == 8 * layer + 4 * SBH  # final layer-norm and LM-head inputs
    assert last.per_gpu_bytes.logits == 12 * 2048 * big_vocab
    t = size_training(req(params=7e9, layers=32, tp=8, **ACT))
    assert t.per_gpu_bytes.activations == 32 * math.ceil(per_layer(tp=8)) + EMBEDDING_OUTPUT


def test_autocast_weight_copies_per_microbatch_in_flight() -> None:
    psi = 7e9 / 4
    base = size_training(req(params=7e9, layers=32, pp=4, **ACT))
    amp = size_training(req(params=7e9, layers=32, pp=4, autocast=True, **ACT))
    assert amp.activation is not None and base.activation is not None
    assert amp.activation.weight_copy_bytes == 2 * psi * 4
    assert base.activation.weight_copy_bytes == 0
    # fp32 residual stream: two layer-norm inputs per layer (+4 sbh) on 32 layers' worth
    assert amp.activation.layers_bytes - base.activation.layers_bytes == 32 * 4 * SBH
    # ZeRO-3 shards the fp32 weights, not the 16-bit copies the graph holds
    z3 = size_training(req(params=7e9, layers=32, pp=4, autocast=True, zero=3, dp=8, **ACT))
    assert z3.per_gpu_bytes.activations == amp.per_gpu_bytes.activations


def test_math_attention_outweighs_flash() -> None:
    flash = size_training(req(params=1e9, layers=4, **ACT))
    math_path = size_training(req(params=1e9, layers=4, attention="math", **ACT))
    assert math_path.per_gpu_bytes.activations - flash.per_gpu_bytes.activations == 4 * (
        math.ceil(per_layer(attention="math")) - math.ceil(per_layer())
    )


def test_checkpointing_reduces_memory() -> None:
    full = size_training(req(params=7e9, layers=32, **ACT))
    ckpt = size_training(req(params=7e9, layers=32, activation_checkpointing=True, **ACT))
    assert ckpt.per_gpu_bytes.activations == 32 * 2 * SBH + EMBEDDING_OUTPUT
    assert ckpt.per_gpu_bytes.activations < full.per_gpu_bytes.activations
    assert ckpt.per_gpu_bytes.total < full.per_gpu_bytes.total
    assert ckpt.per_gpu_bytes.model_states == full.per_gpu_bytes.model_states


def test_checkpointing_without_heads_is_allowed() -> None:
    shape = {"seq_len": 2048, "micro_batch": 1, "hidden_size": 4096, "layers": 4}
    r = size_training(req(params=1e9, activation_checkpointing=True, **shape))
    assert r.per_gpu_bytes.activations == 4 * 2 * SBH + EMBEDDING_OUTPUT


def test_assumptions_name_what_was_assumed() -> None:
    bare = size_training(req(params=1e9))
    assert any("activations not counted" in a for a in bare.assumptions)
    assert any("1 GiB" in a for a in bare.assumptions)
    flash = size_training(req(params=1e9, layers=4, **ACT))
    assert any(a.startswith("attention flash") for a in flash.assumptions)
    assert any("logits not counted" in a for a in flash.assumptions)
    math_path = size_training(req(params=1e9, layers=4, vocab_size=32000, attention="math", **ACT))
    assert any(a.startswith("attention math") for a in math_path.assumptions)
    assert any(a.startswith("logits: loss in fp32") for a in math_path.assumptions)


# --- fitting, min_gpus ---------------------------------------------------------------------------------


def test_overhead_counts_when_fitting() -> None:
    # 4.8e9 * 16 = 76.8e9 B fits 80 GiB * 0.9 = 77.3e9 B on its own, not with the 1 GiB overhead
    r = size_training(req(params=4.8e9, gpu_memory_gib=80))
    assert r.per_gpu_bytes.model_states <= r.usable_bytes_per_gpu
    assert r.fits_target is False and r.min_dp is None


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
    assert list(d["per_gpu_bytes"]) == [
        "params",
        "grads",
        "optimizer",
        "model_states",
        "activations",
        "logits",
        "overhead",
        "total",
    ]
    keys = (
        "params_per_gpu",
        "world_size",
        "min_gpus",
        "min_dp",
        "fits_target",
        "bytes_per_param",
        "assumptions",
    )
    for key in keys:
        assert key in d
    assert d == r.model_dump()  # all plain JSON types already


# --- node types ----------------------------------------------------------------------------------------


def node(name: str, gpus: int, mem: int, price: float, fabric: NicFabric = "efa") -> NodeType:
    return NodeType(
        name=name,
        provider="aws",
        family=name.split(".")[0],
        vcpus=8 * max(gpus, 1),
        memory_gib=64 * max(gpus, 1),
        gpu=GpuSpec(model="X", architecture="hopper", count=gpus, memory_gb=mem) if gpus else None,
        network=NetworkSpec(fabric=fabric, nics=1, gbps_per_nic=100),
        price=PriceSpec(on_demand_usd_per_hour=price, source=SRC, as_of=AS_OF),
        source=SRC,
        as_of=AS_OF,
    )


CATALOG = [
    node("cpu.large", 0, 0, 0.5),
    node("small.1x24", 1, 24, 1.0, "ethernet"),
    node("mid.1x48", 1, 48, 2.0, "ethernet"),
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
    # 1.3e9 * 16 + 1 GiB overhead = 21.87e9 B = 20.37 GiB: fits a 24 GB GPU (22.35 GiB) at 5% headroom
    # (21.2 GiB), not at 20%
    r = size_training(req(params=1.3e9, headroom=0.2))
    best = smallest_node_type(r, CATALOG)
    assert best is not None and best.name == "mid.1x48"
    best_lo = smallest_node_type(r, CATALOG, headroom=0.05)
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
        "left_out": [],
    }
    # tp=3 on 8-GPU nodes: 2 tp groups per node, dp*pp = 6 groups -> 3 nodes, 6 GPUs idle
    r3 = size_training(req(params=3e9, tp=3, pp=1, dp=6))
    big = CATALOG[4]
    assert nodes_needed(r3, big) == 3
    with pytest.raises(ValueError, match="fewer than tp"):
        nodes_needed(r, CATALOG[1])
    assert plan_nodes(size_training(req(params=100e9)), CATALOG) is None


def test_a_run_across_nodes_goes_only_on_an_rdma_fabric_and_says_what_it_left_out() -> None:
    """dp=8 of a small model: eight 1-GPU Ethernet nodes would be cheapest ($8/h), but gradients would
    cross plain Ethernet; the plan takes 4-GPU nodes with EFA and names what it refused."""
    r = size_training(req(params=1e9, dp=8))
    plan = plan_nodes(r, CATALOG)
    assert plan is not None and plan.node_type == "mid.4x48" and plan.nodes == 2
    assert plan.left_out == [
        "small.1x24: 8 nodes for $8.00/h, but its network is ethernet (no RDMA between nodes)"
    ]  # mid.1x48 (8 nodes, $16.00/h) costs what the plan costs: not cheaper, not listed
    single = plan_nodes(size_training(req(params=1e9)), CATALOG)  # one GPU: one node, no fabric needed
    assert single is not None and single.node_type == "small.1x24" and single.left_out == []


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
        ({"params": 1e9, "vocab_size": 32000}, "vocab_size given without"),
        ({"params": 1e9, "autocast": True, "precision": "fp32"}, "autocast computes in bf16 or fp16"),
        ({"params": 1e9, "autocast": True, "precision": "fp8"}, "precision must be bf16 or fp16"),
        ({"params": 1e9, "layers": 4, "attention": "sparse", **ACT}, "attention"),
        ({"params": 1e9, "layers": 4, "vocab_size": 0, **ACT}, "greater than 0"),
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


# --- the size command ----------------------------------------------------------------------------------

ISSUE_SHAPE = [
    "--params", "875466752", "--autocast", "--optimizer", "adamw", "--seq-len", "2048", "--micro-batch", "4",
    "--hidden", "2048", "--layers", "16", "--heads", "16", "--vocab", "32000",
]  # fmt: skip


def run_size(*args: str) -> str:
    app = typer.Typer()
    app.command()(size)
    result = CliRunner().invoke(app, list(args), env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def test_size_command_prints_breakdown_and_assumptions() -> None:
    text = run_size(*ISSUE_SHAPE)  # attention defaults to flash
    for part in ("model_states", "activations", "logits", "overhead", "total", "Assumptions:"):
        assert part in text
    assert "attention flash" in text and "30.30 GB" in text  # the total of the flash row
    assert "70.56 GB" in run_size(*ISSUE_SHAPE, "--attention", "math")


def test_size_json_carries_the_same_breakdown() -> None:
    data = json.loads(run_size(*ISSUE_SHAPE, "--attention", "math", "--no-dropout", "--json"))
    per_gpu = data["per_gpu_bytes"]
    assert per_gpu["total"] == sum(per_gpu[k] for k in ("model_states", "activations", "logits", "overhead"))
    assert data["activation"]["attention"] == "math" and data["activation"]["dropout"] is False
    assert (
        data["assumptions"]
        == size_training(
            req(
                params=875466752,
                autocast=True,
                optimizer="adamw",
                seq_len=2048,
                micro_batch=4,
                hidden_size=2048,
                layers=16,
                num_heads=16,
                vocab_size=32000,
                attention="math",
                dropout=False,
            )
        ).assumptions
    )


def test_size_command_names_the_bad_flag() -> None:
    with pytest.raises(SpecError, match="--attention"):
        sizing({"params": 1e9, "seq_len": 2048, "micro_batch": 1, "hidden_size": 4096, "layers": 2,
                "num_heads": 32, "attention": "flash2"})  # fmt: skip
    with pytest.raises(SpecError, match="autocast"):
        sizing({"params": 1e9, "precision": "fp32", "autocast": True})
