"""A version's golden set (infra/serving/golden.py): its probe run as the node runs it, against a small
OpenAI-shaped server on loopback; the comparison of each answer; and `deploy` asking it before the canary
takes any request. End to end with the CPU reference server: tests/serving/test_serve.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from infra.errors import GpuPlatError
from infra.serving.golden import PROBE, misses
from infra.serving.registry.mlflow import ModelVersion, to_wire_source
from infra.serving.release import CHALLENGER, Release, ServeRefused, ServingLayout
from infra.spec.models import Canary
from tests.threaded_server import serve_in_thread

VECTOR = [0.6, 0.8, 0.0]


@pytest.fixture
def server() -> Iterator[int]:
    """Embeddings of VECTOR for "right", its mirror for "wrong"; chat answers "Paris."; 400 otherwise."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/v1/embeddings" and body.get("input") in ("right", "wrong"):
                sign = 1 if body["input"] == "right" else -1
                answer: dict[str, Any] = {"data": [{"embedding": [sign * x for x in VECTOR]}]}
            elif self.path == "/v1/chat/completions":
                answer = {"choices": [{"message": {"content": "Paris."}}]}
            else:
                self.send_error(400, "bad request")
                return
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    serve_in_thread(httpd)
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def probe(tmp_path: Path, port: int, golden: Any | None) -> str:
    """PROBE as the node runs it (`python3 -c PROBE GOLDEN_PATH PORT`)."""
    path = tmp_path / "golden.json"
    if golden is not None:
        path.write_text(golden if isinstance(golden, str) else json.dumps(golden))
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), str(port)], capture_output=True, text=True, check=True
    )
    return done.stdout


def embedding_case(text: str, vector: list[float], **expect: Any) -> dict[str, Any]:
    return {"path": "/v1/embeddings", "body": {"input": text}, "expect": {"embedding": vector, **expect}}


def test_right_answers_pass_and_each_wrong_one_is_named(tmp_path: Path, server: int) -> None:
    chat = {"path": "/v1/chat/completions", "body": {"messages": []}}
    golden = {
        "cases": [
            embedding_case("right", [1.2, 1.6, 0.0]),  # the same direction, another length: cosine 1
            {**chat, "expect": {"text": "Paris."}},
            {**chat, "expect": {"contains": "Paris"}},
            {"path": "/v1/embeddings", "body": {"input": 7}, "expect": {"status": 400}},
        ]
    }
    assert misses(probe(tmp_path, server, golden)) == []
    golden["cases"] += [
        embedding_case("wrong", VECTOR),
        {**chat, "expect": {"text": "Lyon."}},
        {**chat, "expect": {"contains": "Lyon"}},
        {"path": "/v1/embeddings", "body": {"input": 7}},
        {**chat, "expect": {"embedding": VECTOR}},
        embedding_case("right", [0.8, 0.6, 0.0]),  # cosine 0.96
        embedding_case("right", [0.8, 0.6, 0.0], min_cosine=0.95),
    ]
    found = misses(probe(tmp_path, server, golden))
    assert found is not None
    assert [(miss.case, miss.why.split(",")[0].split(":")[0]) for miss in found] == [
        (5, "embedding at cosine -1.0000 of the expected"),
        (6, "answered 'Paris.'"),
        (7, "answered 'Paris.'"),
        (8, "status 400"),
        (9, "an answer without what `expect` compares (KeyError"),
        (10, "embedding at cosine 0.9600 of the expected"),
    ]


def test_no_golden_file_is_no_golden_set_and_a_broken_one_is_a_miss(tmp_path: Path, server: int) -> None:
    assert misses(probe(tmp_path, server, None)) is None
    for broken, why in (
        ("{not json", "is not a golden set"),
        ({"cases": [{"body": {}}]}, "case 1: each case must be an object whose `path` starts with /"),
    ):
        found = misses(probe(tmp_path, server, broken))
        assert found is not None and len(found) == 1 and why in found[0].why, found
    # A server that is not there answers no case: each is a miss, none passes.
    found = misses(probe(tmp_path, 1, {"cases": [embedding_case("right", VECTOR)]}))
    assert found is not None and found[0].why.startswith("status 0, expected 200")


class Steps:
    """A Release's nodes and registry that record what deploy does, in order; the probe answers `probe`."""

    def __init__(self, probe_output: str) -> None:
        self.probe_output = probe_output
        self.done: list[str] = []

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        self.done.append(f"probe on {node}" if command[:2] == ("python3", "-c") else " ".join(command))
        return self.probe_output

    def set_alias(self, model: str, alias: str, number: int) -> None:
        self.done.append(f"alias {alias}")


def deploying(probe_output: str) -> tuple[Release, Steps]:
    candidate = ModelVersion("embedder", 2, to_wire_source("/shared/models/embedder/2"), "READY")
    steps = Steps(probe_output)
    release = object.__new__(Release)
    release.rules = Canary()
    release.layout = ServingLayout(("head-0",), ("infer-0",), {"infer-0": "infer-0"}, "cpu-reference", 1.0)
    release.nodes = steps
    release.registry = steps  # type: ignore[assignment]
    release.registry.resolve = lambda reference: candidate  # type: ignore[attr-defined]
    release.say = lambda line: None
    release.aliased = lambda model, alias: None  # type: ignore[method-assign]
    release.start_canary = lambda version: steps.done.append("start canary")  # type: ignore[method-assign]
    release.stop_canary = lambda: steps.done.append("stop canary")  # type: ignore[method-assign]
    release.set_share = lambda percent: steps.done.append(f"share {percent}")  # type: ignore[method-assign]
    release.counters = lambda: (None, None)  # type: ignore[method-assign,assignment,return-value]
    return release, steps


def test_deploy_asks_the_golden_set_before_the_canary_takes_a_request(tmp_path: Path, server: int) -> None:
    right = probe(tmp_path, server, {"cases": [embedding_case("right", VECTOR)]})
    release, steps = deploying(right)
    release.deploy("embedder@2", 20)
    assert steps.done == ["start canary", "probe on infer-0", f"alias {CHALLENGER}", "share 20"]

    wrong = probe(tmp_path, server, {"cases": [embedding_case("wrong", VECTOR)]})
    release, steps = deploying(wrong)
    with pytest.raises(ServeRefused) as refused:
        release.deploy("embedder@2", 20)
    assert steps.done == ["start canary", "probe on infer-0", "stop canary"]  # no alias, no share
    assert refused.value.message.startswith(
        "embedder@2 answered 1 case(s) of its golden set (/shared/models/embedder/2/golden.json) wrongly on "
        "infer-0: case 1: embedding at cosine -1.0000"
    )


def answered(cases: list[Any], *bodies: str) -> str:
    """PROBE's output for `cases`, each answered 200 with its body."""
    return json.dumps(
        {"golden": json.dumps({"cases": cases}), "answers": [{"status": 200, "body": b} for b in bodies]}
    )


def test_an_embedding_of_nan_or_infinity_is_a_miss_not_a_pass() -> None:
    # NaN compares false with any floor: `cosine < floor` let a server answering NaN (which Python's json
    # writes and reads) pass every embedding case.
    case = embedding_case("right", VECTOR)
    for vector in ("[NaN, 0.8, 0.0]", "[Infinity, 0.8, 0.0]"):
        found = misses(answered([case], '{"data": [{"embedding": ' + vector + "}]}"))
        assert found is not None and [m.why for m in found] == ["an embedding with NaN or infinite values"]


@pytest.mark.parametrize(
    ("expect", "why"),
    [
        ({"status": "200"}, "`expect.status` must be a whole number"),
        (["text"], "`expect` must be an object"),
        ({"embedding": VECTOR, "min_cosine": float("nan")}, "`expect.min_cosine` must be a finite number"),
        ({"embedding": [float("nan"), 0.8, 0.0]}, "`expect.embedding` must be a non-empty list"),
        ({"embedding": []}, "`expect.embedding` must be a non-empty list"),
    ],
)
def test_a_malformed_expectation_is_one_clear_miss(expect: Any, why: str) -> None:
    found = misses(
        answered([{"path": "/v1/embeddings", "expect": expect}], '{"data": [{"embedding": [0, 1, 0]}]}')
    )
    assert found is not None and len(found) == 1 and found[0].case == 0 and why in found[0].why, found


def test_a_path_off_the_server_is_not_asked(tmp_path: Path, server: int) -> None:
    golden = {"cases": [{"path": "@127.0.0.1:1/v1/embeddings", "body": {"input": "right"}}]}
    found = misses(probe(tmp_path, server, golden))
    assert found is not None and "`path` starts with /" in found[0].why, found


def test_what_a_login_shell_prints_before_the_answer_is_passed_over() -> None:
    case = embedding_case("right", VECTOR)
    assert (
        misses("Welcome to infer-0\n" + answered([case], json.dumps({"data": [{"embedding": VECTOR}]}))) == []
    )
    found = misses("Welcome to infer-0\n")
    assert found is not None and found[0].why.startswith("the probe printed no answer")


def test_a_probe_that_fails_stops_the_canary_and_moves_nothing() -> None:
    release, steps = deploying("")

    def unreachable(node: str, *command: str, timeout: float = 120) -> str:
        steps.done.append(f"probe on {node}")
        raise GpuPlatError("`python3 -c ...` on infer-0 did not end within 600 s")

    steps.exec = unreachable  # type: ignore[method-assign]
    with pytest.raises(GpuPlatError):
        release.deploy("embedder@2", 20)
    assert steps.done == ["start canary", "probe on infer-0", "stop canary"]


def test_every_canary_server_is_asked_and_a_wrong_second_one_refuses(tmp_path: Path, server: int) -> None:
    right = probe(tmp_path, server, {"cases": [embedding_case("right", VECTOR)]})
    wrong = probe(tmp_path, server, {"cases": [embedding_case("wrong", VECTOR)]})
    release, steps = deploying(right)
    release.layout = ServingLayout(("head-0",), ("infer-0", "infer-1"), {}, "cpu-reference", 1.0)
    answers = {"infer-0": right, "infer-1": wrong}

    def exec_on(node: str, *command: str, timeout: float = 120) -> str:
        steps.done.append(f"probe on {node}")
        return answers[node]

    steps.exec = exec_on  # type: ignore[method-assign]
    with pytest.raises(ServeRefused, match="wrongly on infer-1"):
        release.deploy("embedder@2", 20)
    assert steps.done == ["start canary", "probe on infer-0", "probe on infer-1", "stop canary"]


def test_answers_that_do_not_match_the_cases_one_for_one_are_a_miss() -> None:
    case = embedding_case("right", VECTOR)
    found = misses(answered([case, case], json.dumps({"data": [{"embedding": VECTOR}]})))
    assert found is not None and [m.why for m in found] == ["1 answers to 2 cases"]
