"""`gpuplat serve` end to end on the serving scenario (molecule/serving, its nodes named as a local stack
called molecule names them): two registered versions of the CPU reference model, a canary's share
measured at the client by the version every answer carries, a failing canary rolled back by the guard,
a canary slower by its architecture rolled back for its latency, promote, and a rollback to the previous
version. Requests go through the gateway published on
127.0.0.1:18080; the registry answers on 127.0.0.1:15000.

scripts/test-serving.sh runs these between the scenario's verify and its destroy (GPUPLAT_SERVING_SCENARIO
set); elsewhere they skip, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from infra.serving.load import equal_load_percent
from tests.serving.load import HEAD, INFER, MODEL, VERSION_HEADER, Answer, keeping_alive, node, wait_for
from tests.unit.test_hostile_input import CliRun, run_cli

GATEWAY = "http://127.0.0.1:18080/v1/embeddings"
REGISTRY = "http://127.0.0.1:15000"
PROMETHEUS = "http://127.0.0.1:19090"
REPLICA_0_METRICS = "http://127.0.0.1:18000/metrics"
REQUESTS, SHARE = 300, 20
# Three standard deviations of the canary's count among 300 draws at 20 %: sqrt(300 x 0.2 x 0.8) = 6.9.
TOLERANCE = 3 * (REQUESTS * 0.2 * 0.8) ** 0.5 / REQUESTS
# From the canary's failure to its share at 0: the guard looks every 5 s and its sequential test rolls
# back once three of the canary's answers since it started failed (tests/unit/test_canary.py); at 20 % of
# a client's sequential requests that is well under 15 s.
ROLLBACK_BOUND_S = 30.0

pytestmark = pytest.mark.skipif(
    not os.environ.get("GPUPLAT_SERVING_SCENARIO"),
    reason="needs the converged serving scenario: scripts/test-serving.sh runs these",
)


def ask(text: str = "a canary release") -> Answer:
    body = json.dumps({"model": MODEL, "input": text}).encode()
    request = urllib.request.Request(GATEWAY, data=body, headers={"Content-Type": "application/json"})
    sent = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return Answer(sent, time.monotonic(), reply.status, reply.headers.get(VERSION_HEADER) or "stack")
    except urllib.error.HTTPError as failure:
        return Answer(sent, time.monotonic(), failure.code, failure.headers.get(VERSION_HEADER) or "-")


def versions_answering(count: int) -> Counter[str]:
    answers = [ask() for _ in range(count)]
    assert {a.status for a in answers} == {200}, Counter(a.status for a in answers)
    return Counter(a.version for a in answers)


def molecule_stack(directory: Path, max_latency_ratio: float) -> Path:
    """The shipped local stack as the scenario's nodes are named (a stack called molecule), with its
    registry and a canary analysis short enough for a test."""
    from tests.unit.test_hostile_input import write_variant

    def molecule(platform: dict[str, Any]) -> None:
        platform["name"] = "molecule"
        platform["serving"]["registry"] = {}
        platform["serving"]["canary"] = {
            "gate_metric": "accuracy",
            "gate_min": 0.8,
            "min_requests": 10,
            "interval_s": 30,
            "max_latency_ratio": max_latency_ratio,
        }

    return write_variant(directory, "local", molecule, name="molecule")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The fault injected with this stack is errors. A fresh canary's first answers, on a machine that runs
    # the rest of the suite beside it, have come out 1.9 x slower than the stable version's: a ratio of 5
    # keeps an identical canary's latency out of these tests; the latency rollback has a stack of its own.
    return molecule_stack(tmp_path_factory.mktemp("serve"), max_latency_ratio=5)


@pytest.fixture(scope="module")
def latency_stack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same nodes with max_latency_ratio 1.5: the deeper version's ~4 x, timed by its own server, is
    well past it, a fresh canary's 1.9 x warm-up is not what is judged (the deeper one stays slower)."""
    return molecule_stack(tmp_path_factory.mktemp("serve-latency"), max_latency_ratio=1.5)


@pytest.fixture(scope="module")
def model(stack: Path) -> str:
    """A model of this run with three versions on the node's /shared: 1 and 2 pass the gate, 3 misses it."""
    name = f"embedder-{uuid.uuid4().hex[:8]}"
    archive = node(
        INFER, "find", "/opt/gpuplat-inference/venv", "-path", "*all_minilm_l6_v2/model.zip"
    ).strip()
    for version, accuracy in ((1, "0.90"), (2, "0.93"), (3, "0.70")):
        folder = f"/shared/models/{name}/{version}"
        node(INFER, "sh", "-c", f"mkdir -p {folder} && cp {archive} {folder}/model.zip")
        registered = cli(
            stack, "models", "register", name, folder, "--metric", f"accuracy={accuracy}", "--json"
        )
        assert registered.code == 0, registered.err
    return name


# Run on the model-server node with its own Python (numpy, safetensors): a model archive whose encoder has
# `depth` layers, the source's layers repeated in order (6 -> 24 for all-MiniLM-L6-v2). A real BERT of that
# depth: the CPU reference server reads num_hidden_layers from config.json and runs every layer, so each
# request costs depth / 6 times the source's encoder compute.
DEEPER = """import json, sys, zipfile
from safetensors.numpy import load, save
source, target, depth = sys.argv[1], sys.argv[2], int(sys.argv[3])
with zipfile.ZipFile(source) as archive:
    files = {name: archive.read(name) for name in archive.namelist() if not name.endswith("/")}
config = json.loads(files["config.json"])
layers = config["num_hidden_layers"]
weights = load(files["model.safetensors"])
for name in [name for name in weights if name.startswith("encoder.layer.")]:
    _, _, number, rest = name.split(".", 3)
    for repeat in range(1, depth // layers):
        weights[f"encoder.layer.{int(number) + repeat * layers}.{rest}"] = weights[name]
config["num_hidden_layers"] = depth
files["config.json"] = json.dumps(config).encode()
files["model.safetensors"] = save(weights)
with zipfile.ZipFile(target, "w") as archive:
    for name, data in files.items():
        archive.writestr(name, data)
"""
# About 130 tokens: the encoder's layers, not the HTTP round trip, take most of a request's time (on this
# machine 34 ms of CPU at 6 layers and 133 at 24, against 4 and 17 for "a canary release").
LONG_INPUT = " ".join(["a canary release takes a share of the requests while its guard compares latency"] * 8)


@pytest.fixture(scope="module")
def deeper(stack: Path, model: str) -> str:
    """Version 4 of the model: the same embedder with 24 layers instead of 6, its gate metric passing."""
    folder = f"/shared/models/{model}/4"
    archive = f"/shared/models/{model}/1/model.zip"
    started = time.monotonic()
    node(INFER, "mkdir", "-p", folder)
    node(INFER, "/opt/gpuplat-inference/venv/bin/python", "-c", DEEPER, archive, f"{folder}/model.zip", "24")
    registered = cli(stack, "models", "register", model, folder, "--metric", "accuracy=0.95", "--json")
    assert registered.code == 0, registered.err
    print(f"the 24-layer version built and registered in {time.monotonic() - started:.1f} s")
    return f"{model}@{json.loads(registered.out)['version']}"


def cli(stack: Path, *arguments: str) -> CliRun:
    return run_cli(*arguments, "--stack-file", str(stack), "--registry-url", REGISTRY)


def serve(stack: Path, *arguments: str) -> CliRun:
    latency = ["--prometheus-url", PROMETHEUS] if arguments[0] in ("deploy", "status") else []
    run = cli(stack, "serve", *arguments, *latency)
    assert run.code == 0, (arguments, run.code, run.err)
    return run


def with_latencies(stack: Path, model: str) -> dict[str, Any]:
    """`serve status --json` once Prometheus has both versions' p95, requests flowing meanwhile: a rate needs
    two scrapes (every 5 s in the scenario) that differ, and a burst that ends between two scrapes of a
    fresh canary's series leaves its rate at nothing."""
    answers: list[Answer] = []
    deadline = time.monotonic() + 60
    with sending(answers):
        while True:
            status: dict[str, Any] = json.loads(serve(stack, "status", model, "--json").out)
            if all(v["p95_ms"] is not None for v in status["versions"]) or time.monotonic() > deadline:
                break
            time.sleep(2)
    assert {a.status for a in answers} <= {200}, Counter(a.status for a in answers)
    return status


SLOTS = """import sys
sys.path.insert(0, "/usr/local/lib/gpuplat")
from gpuplat_gateway_targets import RuntimeApi
for slot in RuntimeApi("/run/haproxy/admin.sock").slots("inference_canary"):
    print(slot.address, slot.port, int(slot.draining))
"""


def canary_servers() -> dict[tuple[str, int], bool]:
    """The gateway's canary backend, as HAProxy holds it: (address, port) -> whether it is in drain."""
    lines = node(HEAD, "python3", "-c", SLOTS).split("\n")
    return {(a, int(p)): d == "1" for a, p, d in (line.split() for line in lines if line.strip())}


def canary_percent() -> int:
    show = node(HEAD, "python3", "/usr/local/lib/gpuplat/gpuplat_gateway_canary.py", "show")
    return int(json.loads(show)["canary_percent"])


@pytest.fixture(scope="module")
def first_stable(stack: Path, model: str) -> Iterator[str]:
    """Version 1 on every replica (no canary): the stable version the rest starts from."""
    serve(stack, "deploy", f"{model}@1")
    yield f"{model}@1"


def test_a_version_below_the_gate_is_refused(stack: Path, model: str) -> None:
    run = cli(stack, "serve", "deploy", f"{model}@3", "--canary", "20")
    assert run.code == 1, (run.code, run.err)
    assert "has accuracy 0.7; serving.canary.gate_min asks at least 0.8" in run.err, run.err


def test_a_straight_deploy_serves_the_version_on_every_replica(first_stable: str) -> None:
    assert versions_answering(20) == {first_stable: 20}
    assert canary_percent() == 0
    with urllib.request.urlopen(REPLICA_0_METRICS, timeout=10) as reply:
        metrics = reply.read().decode()
    assert f'gpuplat_inference_model_version_info{{version="{first_stable}"}} 1.0' in metrics


def embedding_of(text: str) -> list[float]:
    body = json.dumps({"model": MODEL, "input": text}).encode()
    request = urllib.request.Request(GATEWAY, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return [float(x) for x in json.loads(reply.read())["data"][0]["embedding"]]


def test_a_version_that_misses_its_golden_set_never_takes_a_request(
    stack: Path, model: str, first_stable: str
) -> None:
    """Version 2 (the same weights as the stable one) stores the answer the stable version gives as its
    golden set, and passes it whenever it is deployed after this; another version, the same archive with
    that answer turned around as its golden set, is refused before its canary takes any request."""
    expected = embedding_of("a golden question")
    for folder, vector in (("2", expected), ("missed", [-x for x in expected])):
        path = f"/shared/models/{model}/{folder}"
        golden = {"cases": [{"path": "/v1/embeddings", "body": {"model": MODEL, "input": "a golden question"},
                             "expect": {"embedding": vector}}]}  # fmt: skip
        node(INFER, "sh", "-c", f'mkdir -p {path} && cp /shared/models/{model}/1/model.zip {path}/ '
             '&& printf %s "$1" > ' + f"{path}/golden.json", "sh", json.dumps(golden))  # fmt: skip
    missed = f"/shared/models/{model}/missed"
    registered = cli(stack, "models", "register", model, missed, "--metric", "accuracy=0.9", "--json")
    assert registered.code == 0, registered.err
    reference = f"{model}@{json.loads(registered.out)['version']}"
    started = time.monotonic()
    run = cli(stack, "serve", "deploy", reference, "--canary", str(SHARE))
    print(f"golden set missed: exit {run.code} in {time.monotonic() - started:.1f} s")
    assert run.code == 1 and "answered 1 case(s) of its golden set" in run.err, (run.code, run.err)
    assert "took no request" in run.err
    assert canary_percent() == 0 and versions_answering(20) == {first_stable: 20}
    status = json.loads(serve(stack, "status", model, "--json").out)
    assert status["versions"][1]["version"] is None, status["versions"]  # no challenger alias was set
    assert ("canary", "not answering") in {(r["slot"], r["serves"]) for r in status["replicas"]}


# The scenario's nodes as on-premises hosts at their addresses on its network (molecule/serving/molecule.yml),
# reached over ssh as Ansible reaches listed hosts (prepare.yml installs Debian's OpenSSH server).
ONPREM_HOSTS = {"head": ("head-0", "10.213.48.10"), "infer": ("infer-0", "10.213.48.11")}


@pytest.fixture(scope="module")
def onprem(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """An on-premises stack whose gateway and model-server hosts are the scenario's nodes (its train host is
    never reached), and the environment Ansible's ssh connection would read: root, with a key made for this
    test and authorised on both nodes, and a known_hosts file of the test's own."""
    from tests.unit.test_hostile_input import write_variant

    directory = tmp_path_factory.mktemp("onprem")
    key = directory / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    public = (directory / "id_ed25519.pub").read_text().strip()
    for container in (HEAD, INFER):
        line = f"mkdir -p -m 700 /root/.ssh && echo {public!r} >> /root/.ssh/authorized_keys"
        node(container, "sh", "-c", line)

    def hosts(platform: dict[str, Any]) -> None:
        platform["name"] = "molecule-onprem"
        platform["backend"] = "onprem"
        for pool in platform["pools"]:
            for size in ("count", "min", "max"):
                pool.pop(size, None)
            name, address = ONPREM_HOSTS.get(pool["name"], (f"{pool['name']}-0", "192.0.2.1"))
            pool["hosts"] = [{"name": name, "address": address}]
            if pool["role"] == "infer":
                pool["instance_type"] = "hgx-h100"  # an on-premises node type (the CPU engine uses no GPU)
        platform["storage"]["parallel_fs"].update(kind="nfs", source="10.213.48.10:/shared")
        platform["serving"]["registry"] = {}
        platform["serving"]["canary"] = {"gate_metric": "accuracy", "gate_min": 0.8}

    environment = {
        "ANSIBLE_REMOTE_USER": "root",
        "ANSIBLE_PRIVATE_KEY_FILE": str(key),
        "ANSIBLE_SSH_ARGS": f"-o UserKnownHostsFile={directory / 'known_hosts'}",
    }
    return write_variant(directory, "local", hosts, name="molecule-onprem"), environment


def test_serve_drives_an_onprem_stack_over_ssh(
    onprem: tuple[Path, dict[str, str]], model: str, first_stable: str
) -> None:
    """deploy --canary, status and rollback of an on-premises stack: every step on the nodes over ssh, the
    gateways told the servers by the hosts' addresses (what its haproxy.cfg resolves their names to), the
    registry and Prometheus found at the gateway and controller host's address."""
    stack, environment = onprem

    def serve_onprem(*arguments: str) -> CliRun:
        started = time.monotonic()
        run = run_cli("serve", *arguments, "--stack-file", str(stack), env=environment)
        print(f"onprem serve {arguments[0]}: exit {run.code} in {time.monotonic() - started:.1f} s")
        assert run.code == 0, (arguments, run.code, run.err)
        return run

    canary_server = ("10.213.48.11", 8100)
    assert canary_servers() == {canary_server: True}  # drained when the straight deploy stopped its canary
    deployed = serve_onprem("deploy", f"{model}@2", "--canary", str(SHARE))
    assert f"{model}@2 answered its golden set as expected on infer-0" in deployed.err, deployed.err
    try:
        # Taken out of drain at the host's address: a target that matched no server would have left it so.
        assert canary_servers() == {canary_server: False}
        assert canary_percent() == SHARE
        status = json.loads(serve_onprem("status", model, "--json").out)
        assert [(v["role"], v["version"], v["share_percent"]) for v in status["versions"]] == [
            ("stable", first_stable, 100 - SHARE),
            ("canary", f"{model}@2", SHARE),
        ]
        # Read over ssh from each server's own /metrics on infer-0.
        assert [(r["node"], r["slot"], r["serves"]) for r in status["replicas"]] == [
            ("infer-0", "0", first_stable),
            ("infer-0", "1", first_stable),
            ("infer-0", "canary", f"{model}@2"),
        ], status["replicas"]
        assert set(versions_answering(60)) == {first_stable, f"{model}@2"}
    finally:
        serve_onprem("rollback", model)
    assert canary_servers() == {canary_server: True}  # drained at that address before it stopped
    assert canary_percent() == 0
    assert versions_answering(20) == {first_stable: 20}


def test_the_canary_gets_its_share_and_keeps_it_across_a_reload(
    stack: Path, model: str, first_stable: str
) -> None:
    serve(stack, "deploy", f"{model}@2", "--canary", str(SHARE))
    try:
        node(HEAD, "systemctl", "reload", "haproxy")
        assert canary_percent() == SHARE  # the map file kept it
        answered = versions_answering(REQUESTS)
        share = answered[f"{model}@2"] / REQUESTS
        print(f"canary share {share:.1%} of {REQUESTS} requests (asked {SHARE} %, tolerance {TOLERANCE:.1%})")
        assert set(answered) == {first_stable, f"{model}@2"}, answered
        assert abs(share - SHARE / 100) <= TOLERANCE, answered
        status = with_latencies(stack, model)
        assert [(v["role"], v["version"], v["share_percent"]) for v in status["versions"]] == [
            ("stable", first_stable, 100 - SHARE),
            ("canary", f"{model}@2", SHARE),
        ]
        print("p95 at the model servers (ms):", [(v["role"], v["p95_ms"]) for v in status["versions"]])
        assert all(0 < v["p95_ms"] < 30_000 for v in status["versions"]), status
    finally:
        serve(stack, "rollback", model)
    assert canary_percent() == 0
    assert versions_answering(20) == {first_stable: 20}


def at_most_failed(sent: int) -> float:
    """The most of `sent` requests a failing canary may fail while the guard holds its share: the canary's
    draws, and 3 standard deviations. The guard holds SHARE, then the share that loads the canary slot as
    each of infer-0's 2 stable replicas (33 %, infra/serving/load.py) while it judges the latency: a canary
    failing after the guard moved on fails up to that share."""
    held = max(SHARE, equal_load_percent(1, 2) or 0) / 100
    return held * sent + 3 * (sent * held * (1 - held)) ** 0.5


def test_a_failing_canary_is_rolled_back_by_the_guard(stack: Path, model: str, first_stable: str) -> None:
    serve(stack, "deploy", f"{model}@2", "--canary", str(SHARE))
    guard = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gpuplat"),
            "serve",
            "guard",
            model,
            "--guard-s",
            "120",
            "--stack-file",
            str(stack),
            "--registry-url",
            REGISTRY,
            "--prometheus-url",
            PROMETHEUS,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    answers: list[Answer] = []
    try:
        with sending(answers):
            time.sleep(3)
            failed_at = time.monotonic()
            node(INFER, "systemctl", "stop", "gpuplat-inference@canary.service")
            out, err = guard.communicate(timeout=ROLLBACK_BOUND_S + 60)
            rolled_back_at = time.monotonic()
            time.sleep(2)
    finally:
        if guard.poll() is None:
            guard.kill()
    after_fault = [a for a in answers if a.sent >= failed_at]
    failed = [a for a in after_fault if a.status != 200]
    seconds = rolled_back_at - failed_at
    print(
        f"guard: {err.strip()} | rollback {seconds:.1f} s after the canary failed; "
        f"{len(failed)} of {len(after_fault)} requests failed meanwhile"
    )
    assert guard.returncode == 1 and "rolled back: canary error rate" in err, (guard.returncode, out, err)
    assert seconds <= ROLLBACK_BOUND_S
    during = [a for a in after_fault if a.sent <= rolled_back_at]
    # Only the canary's draws can fail, and none sent after the rollback.
    assert len(failed) <= at_most_failed(len(during)), Counter(a.status for a in during)
    assert all(a.sent <= rolled_back_at for a in failed), [(a.sent - failed_at, a.status) for a in failed]
    assert canary_percent() == 0
    assert versions_answering(20) == {first_stable: 20}


def guard_state(model: str) -> dict[str, Any]:
    """The detached guard's state on the gateway's node (infra/serving/guard_service.py)."""
    found: dict[str, Any] = json.loads(node(HEAD, "cat", f"/var/lib/gpuplat-serve/guard/{model}.json"))
    return found


def test_a_detached_guard_carries_the_canary_after_the_cli_exits_resumes_after_a_restart_and_rolls_it_back(
    stack: Path, model: str, first_stable: str
) -> None:
    """`deploy --canary --detach` returns once the canary has its share; the service on the gateway's node
    (gpuplat-serve-guard@MODEL) carries the analysis, holds the release lock (a promote meets it), lets it go
    at once when systemd stops it, keeps its evidence across the stop and start, and when the canary fails
    takes its share to 0 at once: no request fails but the canary's own, none after the rollback; its unit
    is disabled once the release ended."""
    unit = f"gpuplat-serve-guard@{model}.service"
    started = time.monotonic()
    deployed = serve(stack, "deploy", f"{model}@2", "--canary", str(SHARE), "--guard-s", "600", "--detach")
    returned_s = time.monotonic() - started
    assert f"its guard runs on as {unit}" in deployed.out, deployed.out
    answers: list[Answer] = []
    try:
        with sending(answers):
            wait_for("the guard's second look", lambda: guard_state(model)["looks"] >= 2, 60)
            met = cli(stack, "serve", "promote", model)
            assert met.code == 1 and "(the detached guard by pid" in met.err, (met.code, met.err)
            before = guard_state(model)
            status = json.loads(serve(stack, "status", model, "--json").out)["release"]
            assert status["phase"] == "analysing" and status["guard"]["state"] == "running", status
            # systemd's stop: SIGTERM to the guard alone, whose handler saves its state, frees the release
            # lock at once (not at its lease's end, a minute later) and says in the record that it stopped.
            node(HEAD, "systemctl", "stop", unit)
            node(HEAD, "test", "!", "-e", f"/run/gpuplat-serve/{model}.lock")
            stopped = json.loads(node(HEAD, "cat", f"/var/lib/gpuplat-serve/{model}.json"))
            assert stopped["phase"] == "stopped" and f"systemctl start {unit}" in stopped["detail"], stopped
            node(HEAD, "systemctl", "start", unit)
            wait_for(
                "a look after the restart", lambda: guard_state(model)["looks"] > before["looks"] + 1, 60
            )
            after = guard_state(model)
            kept = before["guard"]["canary"]["total"]["requests"]
            assert after["guard"]["canary"]["total"]["requests"] >= kept > 0, (
                before["guard"],
                after["guard"],
            )
            assert after["guard"]["started_s"] == before["guard"]["started_s"]
            failed_at = time.monotonic()
            node(INFER, "systemctl", "stop", "gpuplat-inference@canary.service")
            seconds = wait_for("the guard's rollback", lambda: canary_percent() == 0, ROLLBACK_BOUND_S + 30)
            rolled_back_at = time.monotonic()
            time.sleep(2)
    finally:
        if canary_percent() > 0:
            cli(stack, "serve", "rollback", model)
    wait_for("the guard's end", lambda: guard_state(model)["phase"] == "done", 30)
    record = json.loads(serve(stack, "status", model, "--json").out)["release"]
    after_fault = [a for a in answers if a.sent >= failed_at]
    failed = [a for a in answers if a.status != 200]
    during = [a for a in after_fault if a.sent <= rolled_back_at]
    print(
        f"detached guard: deploy returned in {returned_s:.1f} s; evidence {kept} canary requests before the "
        f"restart, {after['guard']['canary']['total']['requests']} after; rollback {seconds:.1f} s after the "
        f"canary failed; {len(failed)} of {len(answers)} requests failed; record: {record['detail']}"
    )
    assert record["phase"] == "rolled back" and record["guard"]["verdict"]["action"] == "rollback", record
    assert f"`gpuplat serve rollback {model}` stops its slot" in record["detail"], record
    assert all(failed_at <= a.sent <= rolled_back_at for a in failed), [
        (a.sent - failed_at, a.status) for a in failed
    ]
    assert len(failed) <= at_most_failed(len(during))
    serve(stack, "rollback", model)  # what the guard left: the canary's slot, the challenger alias
    assert versions_answering(20) == {first_stable: 20}
    active = subprocess.run(
        ["podman", "exec", HEAD, "systemctl", "is-active", unit], capture_output=True, text=True, check=False
    )
    assert active.stdout.strip() == "inactive", (
        active.stdout
    )  # it ended (exit 0: systemd does not restart it)
    enabled = subprocess.run(
        ["podman", "exec", HEAD, "systemctl", "is-enabled", unit], capture_output=True, text=True, check=False
    )
    assert enabled.stdout.strip() == "disabled", enabled.stdout  # a boot of the node does not start it again


def test_a_slower_canary_is_rolled_back_by_the_guard_for_its_latency(
    latency_stack: Path, deeper: str, first_stable: str
) -> None:
    """A version that is slower by itself (four times the encoder layers, so four times the compute per
    request as its own server times it) deployed as a canary under a client's steady load: the guard rolls
    it back for its latency, not its errors (it answers every request), and no request fails."""
    answers: list[Answer] = []
    with sending(answers, LONG_INPUT):
        started = time.monotonic()
        run = subprocess.run(
            [
                str(Path(sys.executable).parent / "gpuplat"),
                "serve",
                "deploy",
                deeper,
                "--canary",
                str(SHARE),
                "--guard-s",
                "120",
                "--stack-file",
                str(latency_stack),
                "--registry-url",
                REGISTRY,
                "--prometheus-url",
                PROMETHEUS,
            ],
            capture_output=True,
            text=True,
            timeout=400,
            check=False,
        )
        seconds = time.monotonic() - started
    on_canary = [a for a in answers if a.version == deeper]
    on_stable = [a for a in answers if a.version == first_stable]
    mean_ms = {
        name: round(1000 * sum(a.at - a.sent for a in group) / max(len(group), 1))
        for name, group in (("canary", on_canary), ("stable", on_stable))
    }
    print(
        f"latency guard: {run.stderr.strip().splitlines()[-1:]} | deploy and guard {seconds:.1f} s; "
        f"{len(on_canary)} answers from the canary, {len(on_stable)} from the stable version, mean at the "
        f"client {mean_ms} ms"
    )
    assert run.returncode == 1, (run.returncode, run.stdout, run.stderr)
    verdict = run.stderr[run.stderr.index("rolled back: ") :]
    assert "latency" in verdict or "took longer than" in verdict, verdict
    assert "error rate" not in verdict, verdict
    assert on_canary and {a.status for a in answers} == {200}, Counter(a.status for a in answers)
    assert canary_percent() == 0
    assert versions_answering(20) == {first_stable: 20}


def test_promote_then_rollback_returns_to_the_previous_version(
    stack: Path, model: str, first_stable: str
) -> None:
    """Promote under steady load from clients that keep their connections open, the gateway reloaded
    before and after: not one request fails (the canary keeps its share while the stable replicas roll,
    each drained first; the canary drained before it stops; idle keep-alive connections closed only after
    an answer that says so)."""
    serve(stack, "deploy", f"{model}@2", "--canary", str(SHARE))
    answers: list[Answer] = []
    failures: list[str] = []
    with keeping_alive(answers, failures, clients=2):
        time.sleep(1)
        node(HEAD, "systemctl", "reload", "haproxy")
        promoted = serve(stack, "promote", model)
        node(HEAD, "systemctl", "reload", "haproxy")
        time.sleep(1)
    print(
        f"promote under keep-alive load: {len(answers)} answers, {len(failures)} failures; "
        f"{promoted.err.strip()}"
    )
    assert not failures and {a.status for a in answers} == {200}, (
        failures[:5],
        Counter(a.status for a in answers),
    )
    assert "keeps its 20 % while the stable replicas restart" in promoted.err + promoted.out
    assert len(answers) > 20
    assert versions_answering(20) == {f"{model}@2": 20}
    status = json.loads(serve(stack, "status", model, "--json").out)
    assert status["previous"] == first_stable and status["versions"][1]["version"] is None
    # What each replica's own server says it serves: the promoted version; the canary slot stopped.
    assert [(r["slot"], r["serves"]) for r in status["replicas"]] == [
        ("0", f"{model}@2"),
        ("1", f"{model}@2"),
        ("canary", "not answering"),
    ], status["replicas"]

    assert status["release"]["phase"] == "promoted", status["release"]  # promote's own record

    serve(stack, "rollback", model)
    assert versions_answering(20) == {first_stable: 20}
    status = json.loads(serve(stack, "status", model, "--json").out)
    assert status["release"]["phase"] == "rolled back", status["release"]
    again = cli(stack, "serve", "rollback", model)
    assert again.code == 1 and "no canary and no previous version" in again.err, again.err


@contextmanager
def sending(answers: list[Answer], text: str = "a canary release") -> Iterator[None]:
    """A client sending requests (of `text`) through the gateway, one after another, while the block runs."""
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            answers.append(ask(text))

    sender = threading.Thread(target=client)
    sender.start()
    try:
        yield
    finally:
        stop.set()
        sender.join()
