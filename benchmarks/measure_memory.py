"""Benchmark: GPU memory of one training step of a plain PyTorch GPT, printed as a calibration row.

It measures what infra/training/sizing.py predicts, for infra/data/memory_calibration.yaml. After two warm-up
steps (fp32 parameters under torch.autocast(bfloat16), fused AdamW, gradients kept between steps):

    model states = memory allocated before the forward pass (parameters, gradients, AdamW state)
    activations  = growth of allocated memory over the forward pass (the loss included)
    peak         = the most allocated during the step (forward, backward, optimizer step), plus what the
                   process holds outside PyTorch's allocator (CUDA context, libraries)

The row goes to stdout as YAML (append it under `rows:`), the figures and the sizing prediction to
stderr. Run on an otherwise idle GPU, e.g.

    .venv/bin/python benchmarks/measure_memory.py --attention math

It needs torch with a CUDA GPU; without either it says so and exits 3.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import sys
from dataclasses import dataclass
from typing import Any

import yaml

from infra.data.models import GB
from infra.errors import ExitCode
from infra.training.memory_calibration import CalibrationRow
from infra.training.sizing import size_training


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    seq_len: int
    micro_batch: int
    vocab: int


@dataclass(frozen=True)
class Measured:
    model_states: int
    activations: int
    peak: int
    outside_allocator: int


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--attention", choices=["flash", "math"], default="flash")
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout rate; 0 for none")
    parser.add_argument("--warmup", type=int, default=2, help="training steps before the measured one")
    parser.add_argument("--name", help="row name (default: derived from the shape, GPU and attention)")
    return parser.parse_args(argv)


def shape_of(args: argparse.Namespace) -> Shape:
    return Shape(args.hidden, args.layers, args.heads, args.seq_len, args.micro_batch, args.vocab)


def gpt_params(shape: Shape) -> int:
    """Parameters of the GPT built below: tied token embedding, learned positions, biased linears."""
    h = shape.hidden
    per_layer = 12 * h * h + 13 * h  # QKV, projection and two MLP linears with biases; two layer norms
    return shape.vocab * h + shape.seq_len * h + shape.layers * per_layer + 2 * h


def missing_requirement() -> str | None:
    """Why this machine cannot measure, or None."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed: install PyTorch with CUDA on a machine with an NVIDIA GPU"
    import torch

    if not torch.cuda.is_available():
        return (
            f"no CUDA GPU is visible to torch {torch.__version__}: run this on a machine with an NVIDIA GPU"
        )
    return None


def calibration_row(
    args: argparse.Namespace, measured: Measured, *, framework: str, gpu: str, today: dt.date
) -> dict[str, Any]:
    """The YAML row for infra/data/memory_calibration.yaml, validated against its model."""
    shape = shape_of(args)
    params = gpt_params(shape)
    row = {
        "name": args.name or f"gpt-{params / 1e6:.0f}m-{_slug(gpu)}-bf16-autocast-{args.attention}",
        "setup": {
            "params": params,
            "precision": "bf16",
            "autocast": True,
            "optimizer": "adamw",
            "seq_len": shape.seq_len,
            "micro_batch": shape.micro_batch,
            "hidden_size": shape.hidden,
            "layers": shape.layers,
            "num_heads": shape.heads,
            "vocab_size": shape.vocab,
            "dropout": args.dropout > 0,
            "attention": args.attention,
        },
        "framework": framework,
        "gpu": gpu,
        "measured": {
            "model_states_gb": round(measured.model_states / GB, 2),
            "activations_gb": round(measured.activations / GB, 2),
            "peak_gb": round(measured.peak / GB, 2),
        },
        "source": f"benchmarks/measure_memory.py on one {gpu}",
        "as_of": today.isoformat(),
    }
    CalibrationRow.model_validate(row)
    return row


def _slug(text: str) -> str:
    return "-".join(text.lower().replace("nvidia", "").split())


def measure(args: argparse.Namespace) -> tuple[Measured, str, str]:
    """Run the warm-up steps and one measured step; returns the figures, the framework and the GPU name."""
    import torch
    from torch import nn
    from torch.nn import functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    shape = shape_of(args)
    h, head_dim = shape.hidden, shape.hidden // shape.heads
    backend = SDPBackend.FLASH_ATTENTION if args.attention == "flash" else SDPBackend.MATH

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.fc, self.fc_out = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
            self.drop = nn.Dropout(args.dropout)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            q, k, v = (
                t.view(b, s, shape.heads, head_dim).transpose(1, 2) for t in self.qkv(self.ln1(x)).split(h, 2)
            )
            with sdpa_kernel(backend):
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=args.dropout, is_causal=True)
            x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, s, h)))
            return x + self.drop(self.fc_out(F.gelu(self.fc(self.ln2(x)))))

    class Gpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(shape.vocab, h), nn.Embedding(shape.seq_len, h)
            self.drop = nn.Dropout(args.dropout)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.layers))
            self.ln_f = nn.LayerNorm(h)

        def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied embeddings
            return F.cross_entropy(logits.view(-1, shape.vocab), targets.view(-1))

    torch.manual_seed(0)
    model = Gpt().cuda().train()
    counted = sum(p.numel() for p in model.parameters())
    if counted != gpt_params(shape):
        raise RuntimeError(f"model has {counted} parameters, gpt_params() says {gpt_params(shape)}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    idx = torch.randint(shape.vocab, (shape.micro_batch, shape.seq_len), device="cuda")
    targets = torch.randint(shape.vocab, (shape.micro_batch, shape.seq_len), device="cuda")

    def forward() -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss: torch.Tensor = model(idx, targets)
        return loss

    def backward_and_update(loss: torch.Tensor) -> None:
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    for _ in range(args.warmup):
        backward_and_update(forward())
    torch.cuda.synchronize()
    states = torch.cuda.memory_allocated()
    free, total = torch.cuda.mem_get_info()
    outside = total - free - torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    loss = forward()
    torch.cuda.synchronize()
    activations = torch.cuda.memory_allocated() - states
    backward_and_update(loss)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() + outside
    framework = (
        f"PyTorch {torch.__version__}, CUDA {torch.version.cuda}; plain GPT (learned positions, tied "
        f"embeddings, dropout {args.dropout}), fp32 parameters under torch.autocast(bfloat16), fused AdamW; "
        f"scaled_dot_product_attention {backend.name} backend; one GPU, no parallelism"
    )
    return Measured(states, activations, peak, outside), framework, torch.cuda.get_device_name()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    reason = missing_requirement()
    if reason:
        print(f"measure_memory: {reason}", file=sys.stderr)
        return int(ExitCode.ENVIRONMENT)
    measured, framework, gpu = measure(args)
    row = calibration_row(args, measured, framework=framework, gpu=gpu, today=dt.date.today())
    predicted = size_training(CalibrationRow.model_validate(row).setup).per_gpu_bytes.total
    print(
        f"states {measured.model_states / GB:.2f} GB, activations {measured.activations / GB:.2f} GB, "
        f"peak {measured.peak / GB:.2f} GB (outside the allocator {measured.outside_allocator / GB:.2f} GB); "
        f"gpuplat size predicts {predicted / GB:.2f} GB ({predicted / measured.peak - 1:+.1%})",
        file=sys.stderr,
    )
    sys.stdout.write(yaml.safe_dump([row], sort_keys=False, width=110))
    return 0


if __name__ == "__main__":
    sys.exit(main())
