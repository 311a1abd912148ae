#!/usr/bin/env python3
"""Overload the inference gateway with a bounded burst and check it sheds load cleanly.

N clients (N well above servers * maxconn + max_queue) each send ONE embeddings request
at the same instant. Expected: the excess gets 503 at once (queue full) or after the queue
timeout; every other request is a complete 200 (valid JSON, one embedding per input, of
the model's dimension). Nothing else: no 5xx but 503, no reset, no truncated body.

Bounded: N requests, one per client, each with a hard socket timeout. Standard library
only, so it runs on any node. Prints a JSON summary; exits 1 if an expectation fails.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from urllib.parse import urlsplit


def one_request(url: str, body: bytes, timeout: float, start: threading.Barrier) -> dict[str, object]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    start.wait()
    began = time.perf_counter()
    try:
        conn.request("POST", parts.path, body, {"Content-Type": "application/json", "Connection": "close"})
        resp = conn.getresponse()
        data = resp.read()
        return {"status": resp.status, "seconds": time.perf_counter() - began, "body": data}
    except (OSError, http.client.HTTPException) as err:
        return {"status": 0, "seconds": time.perf_counter() - began, "error": repr(err)}
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8080/v1/embeddings")
    parser.add_argument("--model", required=True)
    parser.add_argument("--clients", type=int, default=60)
    parser.add_argument("--inputs", type=int, default=8, help="inputs per request (sets its cost)")
    parser.add_argument("--words", type=int, default=60, help="words per input")
    parser.add_argument("--dimensions", type=int, default=384, help="expected embedding size")
    parser.add_argument("--fast-503-s", type=float, default=0.5, help="a queue-full 503 arrives within this")
    parser.add_argument("--timeout", type=float, default=60.0, help="hard per-request client timeout")
    args = parser.parse_args()
    if not 1 <= args.clients <= 500:
        parser.error("--clients must be in 1..500 (a bounded test)")

    text = " ".join(f"token{i % 97}" for i in range(args.words))
    body = json.dumps(
        {
            "model": args.model,
            "input": [f"{i} {text}" for i in range(args.inputs)],
            "encoding_format": "float",
        }
    ).encode()
    start = threading.Barrier(args.clients)
    results: list[dict[str, object]] = [{} for _ in range(args.clients)]

    def run(i: int) -> None:
        results[i] = one_request(args.url, body, args.timeout, start)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.clients)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.timeout + 5)
    wall = time.perf_counter() - began

    problems: list[str] = []
    ok = [r for r in results if r.get("status") == 200]
    rejected = [r for r in results if r.get("status") == 503]
    other = [r for r in results if r.get("status") not in (200, 503)]
    for r in other:
        problems.append(
            f"unexpected answer {r.get('status')}: {r.get('error') or r.get('body', b'')[:200]!r}"
        )
    for r in ok:
        try:
            payload = json.loads(r["body"])  # type: ignore[arg-type]
            vectors = [d["embedding"] for d in payload["data"]]
            if len(vectors) != args.inputs or any(len(v) != args.dimensions for v in vectors):
                problems.append(f"incomplete 200: {len(vectors)} vectors of {[len(v) for v in vectors][:3]}")
        except (ValueError, KeyError, TypeError) as err:
            problems.append(f"200 with a broken body ({err}): {r['body'][:120]!r}")  # type: ignore[index]
    fast = sorted(float(r["seconds"]) for r in rejected if float(r["seconds"]) < args.fast_503_s)  # type: ignore[arg-type]
    if not rejected:
        problems.append("no 503: the burst did not exceed capacity, or the gateway queued everything")
    elif not fast:
        problems.append(f"no 503 within {args.fast_503_s}s: the full queue did not reject at once")
    if not ok:
        problems.append("no request succeeded")

    ok_s = sorted(float(r["seconds"]) for r in ok)  # type: ignore[arg-type]
    rej_s = sorted(float(r["seconds"]) for r in rejected)  # type: ignore[arg-type]
    summary = {
        "clients": args.clients,
        "ok": len(ok),
        "rejected_503": len(rejected),
        "rejected_fast": len(fast),
        "other": len(other),
        "ok_seconds_max": round(ok_s[-1], 3) if ok_s else None,
        "rejected_seconds_min": round(rej_s[0], 3) if rej_s else None,
        "rejected_seconds_max": round(rej_s[-1], 3) if rej_s else None,
        "wall_seconds": round(wall, 3),
        "problems": problems,
    }
    print(json.dumps(summary, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
