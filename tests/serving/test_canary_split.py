"""The gateway's canary share against HAProxy itself (molecule/serving: the second replica of the infer node
is also the canary backend's server), through gpuplat_gateway_canary.py on the service node and requests
from this host (the gateway published on 127.0.0.1:18080).

scripts/test-serving.sh runs these between the scenario's verify and its destroy (GPUPLAT_SERVING_SCENARIO
set); elsewhere they skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest

GATEWAY = "http://127.0.0.1:18080/v1/embeddings"
HEAD = "serving-head"
PROGRAM = "/usr/local/lib/gpuplat/gpuplat_gateway_canary.py"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
REQUESTS, SHARE = 300, 20
# Three standard deviations of the canary's count among 300 draws at 20 %: sqrt(300 x 0.2 x 0.8) = 6.9.
TOLERANCE = 3 * (REQUESTS * 0.2 * 0.8) ** 0.5 / REQUESTS

pytestmark = pytest.mark.skipif(
    not os.environ.get("GPUPLAT_SERVING_SCENARIO"),
    reason="needs the converged serving scenario: scripts/test-serving.sh runs these",
)


def canary(*arguments: str) -> dict[str, Any]:
    done = subprocess.run(
        ["podman", "exec", HEAD, "python3", PROGRAM, *arguments], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def send(count: int) -> dict[int, int]:
    """Answers by status code for `count` embeddings requests through the gateway, one at a time."""
    body = json.dumps({"model": MODEL, "input": "a canary release"}).encode()
    codes: dict[int, int] = {}
    for _ in range(count):
        request = urllib.request.Request(GATEWAY, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                code = reply.status
        except urllib.error.HTTPError as failure:
            code = failure.code
        codes[code] = codes.get(code, 0) + 1
    return codes


def requests_by_backend(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    return {
        name: after["backends"][name]["requests"] - before["backends"][name]["requests"]
        for name in after["backends"]
    }


def test_the_canary_gets_its_share_and_keeps_it_across_a_reload_then_none() -> None:
    start = canary("show")
    assert start["canary_percent"] == 0 and start["backends"]["inference_canary"]["servers_up"] == 1, start
    try:
        assert canary("share", str(SHARE))["canary_percent"] == SHARE
        subprocess.run(["podman", "exec", HEAD, "systemctl", "reload", "haproxy"], check=True)
        assert canary("show")["canary_percent"] == SHARE  # the map file kept it
        before = canary("show")
        assert send(REQUESTS) == {200: REQUESTS}
        routed = requests_by_backend(before, canary("show"))
        share = routed["inference_canary"] / sum(routed.values())
        print(f"canary share {share:.1%} of {sum(routed.values())} requests (asked {SHARE} %)")
        assert sum(routed.values()) == REQUESTS
        assert abs(share - SHARE / 100) <= TOLERANCE, routed
    finally:
        canary("share", "0")
    before = canary("show")
    assert send(60) == {200: 60}
    assert requests_by_backend(before, canary("show"))["inference_canary"] == 0
