"""`gpuplat size`: GPU memory per GPU for training, the minimum GPU count and the node type that fits."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from infra.cli import output
from infra.cli.stack_options import JsonFlag
from infra.data.load import catalog
from infra.errors import SpecError
from infra.sizing import (
    GB,
    Attention,
    Optimizer,
    Precision,
    TrainingSizingRequest,
    plan_nodes,
    size_training,
)
from infra.spec.errors import spec_error_from_validation


def sizing(request_fields: dict[str, Any]) -> dict[str, Any]:
    try:
        request = TrainingSizingRequest.model_validate(request_fields)
        result = size_training(request)
    except ValidationError as exc:
        raise spec_error_from_validation("gpuplat size", "flags", exc) from exc
    except ValueError as exc:
        raise SpecError(f"gpuplat size: {exc}") from exc
    node_plan = plan_nodes(result, [n for n in catalog().node_types if n.gpu_count > 0])
    data = result.to_json_dict()
    data["node_plan"] = node_plan.model_dump() if node_plan else None
    if data.get("min_gpus") is None and node_plan is not None:
        node = catalog().get(node_plan.node_type)
        assert node is not None
        data["min_gpus"] = result.min_gpus_for(node.gpu_memory_gib)
        data["min_gpus_memory_gib"] = node.gpu_memory_gib
    return data


def _gb(value: float) -> str:
    return f"{value / GB:,.2f} GB"


def _print_activations(console: Console, detail: dict[str, Any]) -> None:
    layers = (
        f"layers ({detail['layers_per_stage']} x {_gb(detail['bytes_per_layer'])}"
        f" x {detail['microbatches_in_flight']} micro-batch(es))"
    )
    rows = [
        [layers, _gb(detail["layers_bytes"])],
        ["embedding and output-layer inputs", _gb(detail["embedding_output_bytes"])],
        ["16-bit weight copies (autocast)", _gb(detail["weight_copy_bytes"])],
        ["logits kept (fp32)", _gb(detail["logits_kept_bytes"])],
        ["logits, start of backward (fp32)", _gb(detail["logits_backward_bytes"])],
    ]
    title = f"Activations and logits, {detail['stage']} pipeline stage, attention {detail['attention']}"
    console.print(output.table(title, ["part", "bytes"], rows))


def size(
    params: Annotated[float, typer.Option(help="parameter count, e.g. 7.5e9")],
    dp: Annotated[int, typer.Option(help="data-parallel degree")] = 1,
    tp: Annotated[int, typer.Option(help="tensor-parallel degree (inside a node)")] = 1,
    pp: Annotated[int, typer.Option(help="pipeline-parallel degree")] = 1,
    zero: Annotated[int, typer.Option(help="ZeRO stage 0-3")] = 0,
    precision: Annotated[str, typer.Option(help="fp32 | bf16 | fp16 | fp8")] = "bf16",
    optimizer: Annotated[str, typer.Option(help="adam | adamw | sgd-momentum | sgd")] = "adam",
    autocast: Annotated[
        bool, typer.Option(help="PyTorch autocast: fp32 weights, bf16/fp16 compute (HF Trainer, Lightning)")
    ] = False,
    seq_len: Annotated[int | None, typer.Option(help="sequence length (activations)")] = None,
    micro_batch: Annotated[int | None, typer.Option(help="micro-batch size (activations)")] = None,
    hidden: Annotated[int | None, typer.Option(help="hidden size (activations)")] = None,
    layers: Annotated[int | None, typer.Option(help="transformer layers (activations)")] = None,
    heads: Annotated[int | None, typer.Option(help="attention heads (activations)")] = None,
    vocab: Annotated[int | None, typer.Option(help="vocabulary size (fp32 logits)")] = None,
    attention: Annotated[
        str, typer.Option(help="flash (fused kernel, the default) | math (materialised attention matrix)")
    ] = "flash",
    dropout: Annotated[bool, typer.Option(help="dropout layers present (masks kept)")] = True,
    checkpointing: Annotated[bool, typer.Option(help="full activation checkpointing")] = False,
    gpu_memory: Annotated[float | None, typer.Option(help="GPU memory to fit, GiB")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Size GPU memory for training (ZeRO, Korthikanti et al., FlashAttention) and pick a node type."""
    precision_value: Precision = precision  # type: ignore[assignment]  # validated by the model
    optimizer_value: Optimizer = optimizer  # type: ignore[assignment]
    attention_value: Attention = attention  # type: ignore[assignment]
    data = sizing(
        {
            "params": params,
            "dp": dp,
            "tp": tp,
            "pp": pp,
            "zero": zero,
            "precision": precision_value,
            "optimizer": optimizer_value,
            "autocast": autocast,
            "seq_len": seq_len,
            "micro_batch": micro_batch,
            "hidden_size": hidden,
            "layers": layers,
            "num_heads": heads,
            "vocab_size": vocab,
            "attention": attention_value,
            "dropout": dropout,
            "activation_checkpointing": checkpointing,
            "gpu_memory_gib": gpu_memory,
        }
    )
    if json_output:
        output.print_json(data)
        return
    per_gpu = data["per_gpu_bytes"]
    console = output.stdout()
    weights = f"{precision}/{optimizer}" + (" under autocast" if autocast else "")
    console.print(f"{params:.3g} parameters, {weights}, dp={dp} tp={tp} pp={pp}, ZeRO stage {zero}")
    console.print(
        output.table("Memory per GPU", ["part", "bytes"], [[k, _gb(v)] for k, v in per_gpu.items()])
    )
    if data["activation"]:
        _print_activations(console, data["activation"])
    console.print("Assumptions:")
    for assumption in data["assumptions"]:
        console.print(f"  - {assumption}")
    plan = data["node_plan"]
    if plan:
        console.print(
            f"Smallest node type that fits: {plan['node_type']} ({plan['gpus_per_node']} GPUs); "
            f"{plan['nodes']} node(s) for {dp * tp * pp} GPUs, {output.usd(plan['usd_per_hour'])}/h"
        )
    else:
        console.print("No catalog node type fits: raise tp/pp, the ZeRO stage or dp.")
    if data.get("min_gpus") is not None:
        console.print(f"Minimum GPUs with this tp/pp: {data['min_gpus']}")
