"""`gpuplat size`: GPU memory per GPU for training, the minimum GPU count and the node type that fits."""

from __future__ import annotations

import re
from typing import Annotated, Any, get_args

import typer
from pydantic import ValidationError
from rich.console import Console

from infra.cli import output
from infra.cli.stack_options import JsonFlag, StackFile, StackName, platform_from_options
from infra.data.load import catalog
from infra.data.models import GB, NodeProvider
from infra.errors import SpecError
from infra.errors.problems import Loc, spec_error, validation_problems
from infra.platform.resolve import ResolvedPlatform
from infra.training.pool_fit import SpotAssumption, pool_fits
from infra.training.sizing import (
    Attention,
    Optimizer,
    Precision,
    TrainingSizingRequest,
    plan_nodes,
    size_training,
)
from infra.training.step_time import Shape

# The flag of each TrainingSizingRequest field: messages name what the user typed.
FLAGS = {
    "params": "--params",
    "dp": "--dp",
    "tp": "--tp",
    "pp": "--pp",
    "zero": "--zero",
    "precision": "--precision",
    "optimizer": "--optimizer",
    "autocast": "--autocast",
    "seq_len": "--seq-len",
    "micro_batch": "--micro-batch",
    "hidden_size": "--hidden",
    "layers": "--layers",
    "num_heads": "--heads",
    "vocab_size": "--vocab",
    "attention": "--attention",
    "dropout": "--dropout",
    "activation_checkpointing": "--checkpointing",
    "gpu_memory_gib": "--gpu-memory",
}


def _field_pattern(fields: list[str]) -> str:
    return "|".join(sorted(fields, key=len, reverse=True))


# Field names as the request's own messages write them: identifiers with an underscore anywhere
# (`seq_len`), any field before `=` (`tp=3`), in a list (`hidden_size, layers`) or opening the message
# (`zero must be`); a field that is also a plain word (layers, attention) is left alone elsewhere.
_FIELD_IN_TEXT = re.compile(
    rf"\b({_field_pattern([f for f in FLAGS if '_' in f])})\b"
    rf"|\b({_field_pattern(list(FLAGS))})(?==)"
    rf"|(?<=, )({_field_pattern(list(FLAGS))})\b"
    rf"|^({_field_pattern(list(FLAGS))})\b"
)

# 1e15 parameters hold 16 PB in weights, gradients and Adam states alone (16 bytes each in mixed
# precision), more than 5000 nodes of the catalog's largest GPUs have (test_hostile_input checks it).
MAX_PARAMS = 1e15


def _in_flag_words(message: str) -> str:
    return _FIELD_IN_TEXT.sub(lambda match: FLAGS[next(g for g in match.groups() if g)], message)


def _flag_path(loc: Loc) -> str:
    return FLAGS.get(str(loc[0]), str(loc[0])) if loc else ""


def _bad_flags(problems: list[tuple[str, str]]) -> SpecError:
    return spec_error(
        "gpuplat size", [(path, _in_flag_words(message)) for path, message in problems], "the flags"
    )


def _provider(value: str) -> NodeProvider:
    providers: tuple[str, ...] = get_args(NodeProvider)
    if value not in providers:
        raise SpecError(
            f"gpuplat size --provider: {value!r} is not a provider; give one of {', '.join(providers)}"
        )
    return value  # type: ignore[return-value]


def _largest_node_gpus() -> int:
    return max(n.gpu_count for n in catalog().node_types)


def _check_bounds(request: TrainingSizingRequest) -> None:
    largest = _largest_node_gpus()
    problems = []
    if request.params > MAX_PARAMS:
        problems.append(
            (
                "--params",
                f"at most {MAX_PARAMS:.0e}: that many parameters hold 16 PB in weights, gradients and "
                "optimizer states alone, more than the largest platform this tool plans can hold "
                f"(got {request.params:g})",
            )
        )
    if request.tp > largest:
        problems.append(
            (
                "--tp",
                f"tensor parallelism stays inside one node, and the largest node type of the catalog has "
                f"{largest} GPUs: use --tp {largest} or less, and --pp to split the model further "
                f"(got {request.tp})",
            )
        )
    if problems:
        raise _bad_flags(problems)


def _gpu_models(provider: NodeProvider) -> list[str]:
    return sorted({n.gpu.model for n in catalog().node_types if n.gpu and n.provider == provider})


def sizing(
    request_fields: dict[str, Any], provider: NodeProvider = "aws", gpu: str | None = None
) -> dict[str, Any]:
    try:
        request = TrainingSizingRequest.model_validate(request_fields)
    except ValidationError as exc:
        raise _bad_flags(validation_problems(exc, _flag_path)) from exc
    _check_bounds(request)
    if gpu is not None and gpu.upper() not in {m.upper() for m in _gpu_models(provider)}:
        raise _bad_flags(
            [
                (
                    "--gpu",
                    f"the {provider} catalog has no {gpu!r} GPU; "
                    f"give one of {', '.join(_gpu_models(provider))}",
                )
            ]
        )
    try:
        return _sized(request, provider, gpu)
    except OverflowError as exc:
        raise _bad_flags([("", f"the inputs are too large to size: a byte count overflows ({exc})")]) from exc
    except ValueError as exc:  # the sizing's own consistency checks
        raise _bad_flags([("", str(exc))]) from exc


def _sized(request: TrainingSizingRequest, provider: NodeProvider, gpu: str | None) -> dict[str, Any]:
    result = size_training(request)
    node_types = [
        n
        for n in catalog().node_types
        if n.gpu and n.provider == provider and (gpu is None or n.gpu.model.upper() == gpu.upper())
    ]
    node_plan = plan_nodes(result, node_types)
    data = result.to_json_dict()
    data["node_plan"] = node_plan.model_dump() if node_plan else None
    if data.get("min_gpus") is None and node_plan is not None:
        node = catalog().get(node_plan.node_type)
        assert node is not None
        data["min_gpus"] = result.min_gpus_for(node.gpu_memory_gib)
        data["min_gpus_memory_gib"] = node.gpu_memory_gib
    return data


def _levers(tp: int, zero: int) -> list[str]:
    """The flags that lower the memory per GPU from where the request stands."""
    largest = _largest_node_gpus()
    levers = [f"--tp (up to {largest}, the GPUs of the largest node)"] if tp < largest else []
    levers.append("--pp")
    if zero < 3:
        levers.append("--zero (up to 3)")
    if zero > 0:
        levers.append("--dp (ZeRO shards over it)")
    return levers


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
    provider: Annotated[
        str | None,
        typer.Option(
            metavar="PROVIDER",
            help="aws | onprem: which of the catalog's node types to choose from (default: the --stack's "
            "backend, else aws)",
        ),
    ] = None,
    gpu: Annotated[
        str | None, typer.Option(metavar="MODEL", help="only node types with this GPU, e.g. H100, A100, L40S")
    ] = None,
    spot_interruptions_per_day: Annotated[
        float, typer.Option(min=0, help="with --stack: spot interruptions per day of running (an assumption)")
    ] = SpotAssumption.interruptions_per_day,
    spot_restart_minutes: Annotated[
        float, typer.Option(min=0, help="with --stack: minutes from a spot interruption to running again")
    ] = SpotAssumption.restart_minutes,
    stack: StackName = None,
    stack_file_path: StackFile = None,
    json_output: JsonFlag = False,
) -> None:
    """Size GPU memory for training (ZeRO, Korthikanti et al., FlashAttention) and pick a node type."""
    precision_value: Precision = precision  # type: ignore[assignment]  # validated by the model
    optimizer_value: Optimizer = optimizer  # type: ignore[assignment]
    attention_value: Attention = attention  # type: ignore[assignment]
    fields = {
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
    platform = (
        platform_from_options(stack, stack_file_path)
        if stack is not None or stack_file_path is not None
        else None
    )
    provider = _provider_for(provider, platform)
    data = sizing(fields, provider, gpu)
    if platform is not None:
        result = size_training(TrainingSizingRequest.model_validate(fields))
        data["stack"] = platform.name
        shape = Shape(seq_len, micro_batch, hidden, layers)
        spot = SpotAssumption(spot_interruptions_per_day, spot_restart_minutes)
        data["pools"] = [fit.as_json() for fit in pool_fits(platform, result, shape, spot)]
        data["spot_assumption"] = {
            "interruptions_per_day": spot.interruptions_per_day,
            "restart_minutes": spot.restart_minutes,
        }
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
            f"Node type ({provider} catalog): {plan['node_type']} ({plan['gpus_per_node']} GPUs); "
            f"{plan['nodes']} node(s) for {dp * tp * pp} GPUs, {output.usd(plan['usd_per_hour'])}/h"
        )
        for refused in plan["left_out"]:
            console.print(f"  left out, cheaper: {refused}")
    else:
        console.print(f"No catalog node type fits: raise {', '.join(_levers(tp, zero))}.")
    if data.get("min_gpus") is not None:
        console.print(f"Minimum GPUs with this tp/pp: {data['min_gpus']}")
    if "pools" in data:
        _print_pools(console, data["stack"], data["pools"])


def _provider_for(given: str | None, platform: ResolvedPlatform | None) -> NodeProvider:
    """--provider, else the stack's: an AWS stack picks AWS instance types, an on-prem or local one the
    on-prem node types; a --provider that contradicts the stack is refused."""
    if platform is None:
        return _provider(given or "aws")
    own: NodeProvider = "aws" if platform.spec.backend == "aws" else "onprem"
    if given is not None and given != own:
        raise SpecError(
            f"gpuplat size --provider {given}: stack {platform.name} is on the {platform.spec.backend} "
            f"backend, which takes {own} node types; leave --provider out or give {own}"
        )
    return own


def _print_pools(console: Console, stack: str, pools: list[dict[str, Any]]) -> None:
    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    rows = [
        [
            p["pool"],
            f"{p['gpu']} {p['gpu_memory_gib']} GiB",
            "yes" if p["fits"] else f"no: {p['why_not']}",
            "-" if p["nodes"] is None else f"{p['nodes']} of {p['pool_max_nodes']}",
            "-" if p["usd_per_hour"] is None else output.usd(p["usd_per_hour"]),
            "-" if p["step_time_s"] is None else f"{p['step_time_s']:.3g} s",
            ratio(p["step_time_ratio"]),
            ratio(p["usd_per_step_ratio"]),
        ]
        for p in pools
    ]
    columns = ["pool", "GPU", "fits", "nodes", "$/h", "step", "step time", "$ per step"]
    console.print(output.table(f"The training pools of {stack}", columns, rows))
    console.print(
        "  step: compute at the precision's dense TFLOPS + the optimizer step at memory bandwidth + "
        "gradient and tensor-parallel traffic (seconds with the activation flags --seq-len ... --layers, "
        "else compute only); step time: over the fastest pool's; $ per step: over the cheapest pool's, "
        "spot with its interruptions (--spot-interruptions-per-day, --spot-restart-minutes: assumptions)"
    )
