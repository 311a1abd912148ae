#!/usr/bin/env python3
"""Call the gateway with the official `openai` client: list the models, embed three sentences.

Prints a JSON summary; the verify playbook asserts on it. The client's default encoding
(base64) is used, so the server's base64 path is what gets exercised.
"""

import json
import sys

from openai import OpenAI


def main() -> None:
    base_url, model = sys.argv[1], sys.argv[2]
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
    models = [m.id for m in client.models.list()]
    resp = client.embeddings.create(
        model=model, input=["A man is eating food.", "A man is eating bread.", "The stock market fell."]
    )
    vecs = [d.embedding for d in resp.data]

    def dot(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    print(
        json.dumps(
            {
                "models": models,
                "count": len(vecs),
                "dims": [len(v) for v in vecs],
                "norms": [round(dot(v, v) ** 0.5, 4) for v in vecs],
                "sim_close": dot(vecs[0], vecs[1]),
                "sim_far": dot(vecs[0], vecs[2]),
                "total_tokens": resp.usage.total_tokens,
            }
        )
    )


if __name__ == "__main__":
    main()
