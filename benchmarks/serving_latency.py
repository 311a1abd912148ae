"""Latency through the inference gateway against direct to a model server: p50 / p95 / p99.

Runs against a serving stack that is up: the Molecule scenario while it lives
(`molecule converge -s serving` publishes the gateway on 127.0.0.1:18080 and the model
server on 127.0.0.1:18000) or the local cluster. Sends the same bounded set of
embeddings requests to each URL at a fixed client concurrency (at or below the
gateway's per-server limit, so this measures the gateway's overhead, not its queue):

    python benchmarks/serving_latency.py \\
        --gateway http://127.0.0.1:18080 --direct http://127.0.0.1:18000 \\
        --model sentence-transformers/all-MiniLM-L6-v2 --requests 200 --concurrency 4

Traffic goes only to the URLs given; keep them on loopback or the project's own
containers. Standard library only. Exits 1 if any request failed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_REQUESTS = 5000


@dataclass
class Result:
    target: str
    seconds: list[float]
    errors: int
    wall: float

    def quantile(self, q: float) -> float:
        ordered = sorted(self.seconds)
        if not ordered:
            return float("nan")
        # nearest-rank quantile: the value below which q of the samples fall
        rank = max(1, int(q * len(ordered) + 0.999999))
        return ordered[min(rank, len(ordered)) - 1]

    def row(self) -> dict[str, float | int | str]:
        ms = 1000.0
        return {
            "target": self.target,
            "ok": len(self.seconds),
            "errors": self.errors,
            "rps": round(len(self.seconds) / self.wall, 1) if self.wall else 0.0,
            "mean_ms": round(statistics.fmean(self.seconds) * ms, 1) if self.seconds else float("nan"),
            "p50_ms": round(self.quantile(0.50) * ms, 1),
            "p95_ms": round(self.quantile(0.95) * ms, 1),
            "p99_ms": round(self.quantile(0.99) * ms, 1),
        }


def send(base_url: str, body: bytes, timeout: float) -> float | None:
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    path = parts.path.rstrip("/") + "/v1/embeddings"
    began = time.perf_counter()
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200 or not json.loads(data).get("data"):
            return None
        return time.perf_counter() - began
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


def measure(name: str, base_url: str, body: bytes, requests: int, concurrency: int, timeout: float) -> Result:
    for _ in range(min(5, requests)):  # warm up connections and the server
        send(base_url, body, timeout)
    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        samples = list(pool.map(lambda _: send(base_url, body, timeout), range(requests)))
    wall = time.perf_counter() - began
    ok = [s for s in samples if s is not None]
    return Result(name, ok, len(samples) - len(ok), wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gateway", required=True, help="gateway base URL, e.g. http://127.0.0.1:18080")
    parser.add_argument("--direct", required=True, help="model server base URL, e.g. http://127.0.0.1:18000")
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--requests", type=int, default=200, help=f"per target, at most {MAX_REQUESTS}")
    parser.add_argument("--concurrency", type=int, default=4, help="client threads (<= per-server limit)")
    parser.add_argument(
        "--input", default="The quick brown fox jumps over the lazy dog.", help="text to embed"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request timeout (seconds)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if not 1 <= args.requests <= MAX_REQUESTS or not 1 <= args.concurrency <= 64:
        parser.error(f"--requests must be in 1..{MAX_REQUESTS} and --concurrency in 1..64 (bounded load)")

    body = json.dumps({"model": args.model, "input": args.input, "encoding_format": "float"}).encode()
    results = [
        measure("direct", args.direct, body, args.requests, args.concurrency, args.timeout),
        measure("gateway", args.gateway, body, args.requests, args.concurrency, args.timeout),
    ]
    rows = [r.row() for r in results]
    overhead = {
        "p50_ms": round(float(rows[1]["p50_ms"]) - float(rows[0]["p50_ms"]), 1),
        "p95_ms": round(float(rows[1]["p95_ms"]) - float(rows[0]["p95_ms"]), 1),
    }
    if args.json:
        print(
            json.dumps(
                {
                    "requests": args.requests,
                    "concurrency": args.concurrency,
                    "results": rows,
                    "gateway_overhead": overhead,
                },
                indent=2,
            )
        )
    else:
        cols = list(rows[0])
        print("  ".join(f"{c:>8}" for c in cols))
        for row in rows:
            print("  ".join(f"{row[c]!s:>8}" for c in cols))
        print(
            f"gateway overhead: p50 {overhead['p50_ms']:+.1f} ms, p95 {overhead['p95_ms']:+.1f} ms "
            f"({args.requests} requests per target, concurrency {args.concurrency})"
        )
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
