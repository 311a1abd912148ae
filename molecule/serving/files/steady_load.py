#!/usr/bin/env python3
"""Keep the inference gateway under steady load until a stop file appears; count every failure.

C clients each send one embeddings request after another, each on a new connection (so that a
gateway reload's listener hand-over is exercised), until --stop-file exists. Every answer must be
a complete 200 with one embedding per input; anything else (a 5xx, a reset, a refused connection,
a truncated body) is a failure. Prints a JSON summary; exits 1 on any failure or if too few requests
were sent for the run to mean anything.

Standard library only, so it runs on any node.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import threading
import time
from urllib.parse import urlsplit


def one_request(url: str, body: bytes, inputs: int, timeout: float) -> str | None:
    """None on a complete 200, otherwise what went wrong."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("POST", parts.path, body, {"Content-Type": "application/json", "Connection": "close"})
        answer = conn.getresponse()
        data = answer.read()
        if answer.status != 200:
            return f"HTTP {answer.status}: {data[:160]!r}"
        vectors = json.loads(data)["data"]
        return None if len(vectors) == inputs else f"200 with {len(vectors)} of {inputs} embeddings"
    except (OSError, http.client.HTTPException, ValueError, KeyError) as err:
        return repr(err)
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8080/v1/embeddings")
    parser.add_argument("--model", required=True)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--inputs", type=int, default=2)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--max-s", type=float, default=600.0, help="stop anyway after this long")
    parser.add_argument("--min-requests", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()

    body = json.dumps({"model": args.model, "input": [f"sentence {i}" for i in range(args.inputs)]}).encode()
    lock = threading.Lock()
    sent = 0
    failures: list[dict[str, object]] = []
    began = time.monotonic()

    def client() -> None:
        nonlocal sent
        while not os.path.exists(args.stop_file) and time.monotonic() - began < args.max_s:
            problem = one_request(args.url, body, args.inputs, args.timeout)
            with lock:
                sent += 1
                if problem is not None:
                    failures.append({"at_s": round(time.monotonic() - began, 2), "problem": problem})

    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    summary = {
        "requests": sent,
        "failed": len(failures),
        "seconds": round(time.monotonic() - began, 1),
        "failures": failures[:20],
    }
    print(json.dumps(summary, indent=2))
    return 1 if failures or sent < args.min_requests else 0


if __name__ == "__main__":
    sys.exit(main())
