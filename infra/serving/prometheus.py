"""Instant queries against a stack's Prometheus (its HTTP API, /api/v1/query), stdlib only."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request

from infra.errors import GpuPlatError


def instant(url: str, expression: str, timeout_s: float = 10) -> list[tuple[dict[str, str], float]]:
    """Each series of an instant vector: (labels, value); NaN values (no observations) are left out."""
    address = f"{url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    try:
        with urllib.request.urlopen(address, timeout=timeout_s) as reply:
            answer = json.loads(reply.read().decode())
    except (urllib.error.URLError, TimeoutError, ConnectionError, ValueError) as failure:
        raise GpuPlatError(f"Prometheus at {url} did not answer the query ({failure})") from None
    if answer.get("status") != "success" or answer["data"].get("resultType") != "vector":
        raise GpuPlatError(f"Prometheus at {url} refused '{expression}': {answer.get('error', answer)}")
    series = []
    for item in answer["data"]["result"]:
        value = float(item["value"][1])
        if not math.isnan(value):
            series.append(({str(k): str(v) for k, v in item["metric"].items()}, value))
    return series
