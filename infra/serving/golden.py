"""A version's golden set: requests with their expected answers, stored with the version (a `golden.json`
beside its files on the shared filesystem), asked of its canary servers before any request is routed to
them. A version that answers one of them wrongly never takes traffic.

golden.json: {"cases": [{"path": "/v1/embeddings", "body": {...}, "expect": {...}}, ...]}, each `expect`
holding `status` (default 200) and at most one of
  `embedding`: the first embedding's vector, matched at a cosine similarity of at least `min_cosine`
               (default 0.999: the same weights on another CPU differ in the last bits, not in direction);
  `text`:      the first choice's text (chat: message.content), exactly, or
  `contains`:  a part of it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

GOLDEN_FILE = "golden.json"
DEFAULT_MIN_COSINE = 0.999
# Run on a model-server node: the golden file's text and each case's answer from the server on the port,
# as one JSON document ({"absent": true} where the version has no golden file).
PROBE = """import json, sys, urllib.error, urllib.request
path, port = sys.argv[1], sys.argv[2]
try:
    text = open(path, encoding="utf-8").read()
except FileNotFoundError:
    print(json.dumps({"absent": True}))
    sys.exit(0)
try:
    asked = [(case["path"], json.dumps(case.get("body", {}))) for case in json.loads(text)["cases"]]
    if not all(where.startswith("/") for where, _ in asked):
        raise ValueError("a path not on this server")
except (ValueError, KeyError, TypeError, AttributeError):
    asked = []  # not a golden set: nothing asked, the comparison says what is wrong with it
answers = []
for where, body in asked:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{where}", data=body.encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            answers.append({"status": reply.status, "body": reply.read().decode(errors="replace")})
    except urllib.error.HTTPError as failure:
        answers.append({"status": failure.code, "body": failure.read().decode(errors="replace")})
    except OSError as failure:
        answers.append({"status": 0, "body": str(failure)})
print(json.dumps({"golden": text, "answers": answers}))
"""


@dataclass(frozen=True)
class Miss:
    case: int
    why: str


def cosine(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        return -1.0
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / norms if norms else -1.0


def _first_text(answer: dict[str, Any]) -> str:
    choice = answer["choices"][0]
    return str(choice["message"]["content"] if "message" in choice else choice["text"])


def _finite_numbers(value: Any) -> bool:
    return all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in value)


def _case_problem(case: Any) -> str | None:
    """What makes `case` no golden case (None: it is one): checked before its answer is compared, so a
    malformed file is one clear miss, never a comparison that passes by accident (NaN compares false)."""
    if (
        not isinstance(case, dict)
        or not isinstance(case.get("path"), str)
        or not case["path"].startswith("/")
    ):
        return "each case must be an object whose `path` starts with /"
    expect = case.get("expect", {})
    if not isinstance(expect, dict):
        return "`expect` must be an object"
    status = expect.get("status", 200)
    if not isinstance(status, int) or isinstance(status, bool):
        return "`expect.status` must be a whole number"
    embedding = expect.get("embedding", [0.0])
    if not isinstance(embedding, list) or not embedding or not _finite_numbers(embedding):
        return "`expect.embedding` must be a non-empty list of finite numbers"
    if not _finite_numbers([expect.get("min_cosine", DEFAULT_MIN_COSINE)]):
        return "`expect.min_cosine` must be a finite number"
    return None


def _check(number: int, case: dict[str, Any], status: int, body: str) -> Miss | None:
    expect = case.get("expect", {})
    wanted_status = int(expect.get("status", 200))
    if status != wanted_status:
        return Miss(number, f"status {status}, expected {wanted_status}: {body[:200]}")
    if not {"embedding", "text", "contains"} & set(expect):
        return None
    try:
        answer = json.loads(body)
        if "embedding" in expect:
            got = [float(x) for x in answer["data"][0]["embedding"]]
            if not _finite_numbers(got):
                return Miss(number, "an embedding with NaN or infinite values")
            floor = float(expect.get("min_cosine", DEFAULT_MIN_COSINE))
            similarity = cosine(got, [float(x) for x in expect["embedding"]])
            if similarity < floor:
                return Miss(number, f"embedding at cosine {similarity:.4f} of the expected, below {floor}")
            return None
        text = _first_text(answer)
    except (ValueError, KeyError, IndexError, TypeError) as error:
        return Miss(number, f"an answer without what `expect` compares ({type(error).__name__}: {error})")
    if "text" in expect and text != expect["text"]:
        return Miss(number, f"answered {text[:120]!r}, expected {str(expect['text'])[:120]!r}")
    if "contains" in expect and str(expect["contains"]) not in text:
        return Miss(number, f"answered {text[:120]!r}, which lacks {str(expect['contains'])[:120]!r}")
    return None


def misses(probe_output: str) -> list[Miss] | None:
    """What PROBE's output says the server answered wrongly (None: the version has no golden set). A golden
    file that is not a list of cases, or answers that do not match it one for one, is a miss of its own."""
    # Its answer is its last line: a login shell's startup files may print before it.
    last = (probe_output.strip().splitlines() or [""])[-1]
    try:
        found = json.loads(last)
        if not isinstance(found, dict):
            raise ValueError("not an object")
    except ValueError as error:
        return [Miss(0, f"the probe printed no answer ({error}): {last[:200]!r}")]
    if found.get("absent"):
        return None
    try:
        cases = json.loads(found["golden"])["cases"]
        if not isinstance(cases, list):
            raise ValueError("`cases` must be a list of objects, each with a `path`")
        problem = next((f"case {n}: {p}" for n, c in enumerate(cases, 1) if (p := _case_problem(c))), None)
        if problem:
            raise ValueError(problem)
    except (ValueError, KeyError, TypeError) as error:
        return [Miss(0, f"{GOLDEN_FILE} is not a golden set ({error})")]
    answers = found["answers"]
    if len(answers) != len(cases):
        return [Miss(0, f"{len(answers)} answers to {len(cases)} cases")]
    return [
        miss
        for number, (case, answer) in enumerate(zip(cases, answers, strict=True), 1)
        if (miss := _check(number, case, int(answer["status"]), str(answer["body"]))) is not None
    ]
