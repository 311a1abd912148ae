"""Converges of the serving scenario (the real roles, molecule converge) while a canary borrows a replica's
GPUs (serving.canary.gpus borrow; issue 48's vLLM canary on its own GPUs): the loan made and ended by
release.py's own steps on the scenario's infer node (two CPU replicas: the loan's record, drain, runtime
mask and stop are the same whatever the engine; the canary slot itself is not started, no GPU to run on).

Six converges prove what eleven did (issue 46: each costs about a minute of the 2-core machine's CPU), each
set up so that one run answers several claims:

- During the loan, a layout of fewer replicas is refused before any change (the role's first task on the
  node: a short converge), saying which loan and how to end it, nothing changed.
- During the loan, a converge that changes the settings (max_inflight_per_replica: the other replica rolls,
  the gateway reloads) leaves the lent replica stopped, masked and drained (before: the replicas' start task
  failed on the masked unit; the roll or the reload put it back). Check mode then, with the same settings:
  it passes during a loan, and reports nothing to change on either node, so a second converge changes nothing.
- A borrow killed between its record and its drain, or a reboot since the loan (the runtime mask lifted,
  the replica started): a converge leaves the running replica alone (not restarted), and a deploy takes it
  again; given back, it serves.
- Once the loan ended, fewer replicas retire the replica past the layout (drained, stopped, disabled, its
  files removed; before: it kept running on GPUs the layout gives the canary), and the layout grown back
  adds it on the version its peers serve, the champion a promote rolled out (before: the stack's own model).

The converges whose claims are about the replicas' units skip the `install` tasks: a converged node's
install changes nothing and starts no unit (the check-mode converge, every task, shows it).

scripts/test-serving.sh runs these between the scenario's verify and its destroy (GPUPLAT_SERVING_SCENARIO
set); elsewhere they skip, saying so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra.errors import GpuPlatError
from infra.nodes.role_templates import role_vars
from infra.serving import stopped_mark
from infra.serving.registry.mlflow import ModelVersion, to_wire_source
from infra.serving.release import CANARY_SLOT, KEEP, STABLE_BACKEND, Release, ServingLayout
from tests.serving.load import HEAD, INFER

ROOT = Path(__file__).resolve().parents[2]
UNIT = "gpuplat-inference@1.service"
# The roles a `gpuplat up` would apply to these nodes (the scenario's others are not in question).
TAGS = ("--tags", "inference_server,inference_gateway")
ONE_REPLICA = ("-e", json.dumps({"inference_replicas_per_node": 1, "inference_replica_gpus": [""]}))
# A change that rolls the replicas (their unit's --max-inflight) and reloads the gateway (its maxconn).
INFLIGHT = ("-e", "inference_max_inflight_per_replica=5")
# For the converges about the replicas' units: the install tasks, which change nothing on a converged node.
NO_INSTALL = ("--skip-tags", "install")
CONFIG_DIR = "/etc/gpuplat-inference"
VERSION = ModelVersion("embedder-loan", 3, to_wire_source("/shared/models/embedder-loan/3"), "READY")

pytestmark = pytest.mark.skipif(
    not os.environ.get("GPUPLAT_SERVING_SCENARIO"),
    reason="needs the converged serving scenario: scripts/test-serving.sh runs these",
)


class ScenarioNodes:
    """release.py's Nodes on the scenario's containers (podman exec)."""

    def exec(self, node: str, *command: str, timeout: float = 120) -> str:
        done = subprocess.run(
            ["podman", "exec", node, *command], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise GpuPlatError(f"{node}: {' '.join(command)[:80]} exited {done.returncode}: {done.stderr}")
        return done.stdout


def release() -> Release:
    """release.py's steps on the scenario's nodes, as a borrowing stack's `gpuplat serve` takes them."""
    driver = object.__new__(Release)
    driver.nodes = ScenarioNodes()
    driver.say = print
    driver.layout = ServingLayout(
        (HEAD,), (INFER,), {INFER: INFER, HEAD: HEAD}, "cpu-reference", 120.0, 40.0, canary_gpus="borrow"
    )
    return driver


def borrow() -> None:
    """The loan of replica 1, recorded, drained, masked and stopped (release.py `_borrow`)."""
    release()._borrow(VERSION, (INFER, 1, ""))


def give_back() -> None:
    """The loan ended as a rollback ends it (release.py `stop_canary`: the replica back on its own version,
    in service, then the record removed)."""
    release().stop_canary(KEEP)


def on(node: str, *command: str) -> str:
    return ScenarioNodes().exec(node, *command).strip()


def state(unit: str = UNIT) -> tuple[str, str]:
    """(is-active, is-enabled) of a unit on the infer node (both exit non-zero for most answers)."""
    answers = (
        subprocess.run(["podman", "exec", INFER, "systemctl", verb, unit], capture_output=True, text=True)
        for verb in ("is-active", "is-enabled")
    )
    active, enabled = (answer.stdout.strip() for answer in answers)
    return active, enabled


SERVERS = """import sys
sys.path.insert(0, "/usr/local/lib/gpuplat")
from gpuplat_gateway_targets import RuntimeApi
for slot in RuntimeApi("/run/haproxy/admin.sock").slots("inference"):
    print(slot.address, slot.port, int(slot.draining))
"""


def gateway_servers() -> dict[int, bool]:
    """The gateway's stable backend, as HAProxy holds it: the infer node's port -> whether it is in drain."""
    lines = on(HEAD, "python3", "-c", SERVERS).splitlines()
    return {int(port): flag == "1" for _, port, flag in (line.split() for line in lines if line.strip())}


def recap(stdout: str) -> dict[str, int]:
    """Each node's `changed` count in the play recap."""
    found = re.finditer(r"([\w.-]+)\s*:\s*ok=\d+\s+changed=(\d+)", stdout)
    return {m.group(1): int(m.group(2)) for m in found}


def started_at(unit: str = UNIT) -> str:
    """When the unit last became active (systemd's monotonic clock): unchanged unless it was (re)started."""
    return on(INFER, "systemctl", "show", "-p", "ActiveEnterTimestampMonotonic", "--value", unit)


PROMETHEUS = "http://127.0.0.1:19090"
STOPPED = f"{stopped_mark.METRIC} == 1"


def query(expression: str) -> list[dict[str, str]]:
    """The scenario's Prometheus asked `expression` now: each result's labels."""
    url = f"{PROMETHEUS}/api/v1/query?{urllib.parse.urlencode({'query': expression})}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return [found["metric"] for found in json.load(answer)["data"]["result"]]


def paged_for() -> list[str]:
    """The stable replicas Prometheus sees down that InferenceServerDown's expression still names (its `for`
    aside): those down, less those their node marks stopped on purpose (roles/monitoring's rule)."""
    down = query(f'up{{job="inference_server"}} == 0 unless on(host, replica) ({STOPPED})')
    return sorted(labels["replica"] for labels in down)


def wait_scraped(check: Callable[[], bool], what: str) -> None:
    """Until Prometheus' scrapes (every 5 s in the scenario) show `check`."""
    deadline = time.monotonic() + 40
    while not check():
        assert time.monotonic() < deadline, f"Prometheus did not see {what} within 40 s"
        time.sleep(1)


def marks() -> dict[str, str]:
    """The replicas the infer node marks stopped on purpose, as Prometheus scrapes them: replica -> reason."""
    return {labels["replica"]: labels["reason"] for labels in query(STOPPED)}


def converge(*extra: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run(
        ["molecule", "converge", "-s", "serving", "--", *TAGS, *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.monotonic() - started
    print(f"molecule converge {' '.join(extra)}: exit {done.returncode} in {took:.0f} s")
    return done


@pytest.fixture
def loan() -> Iterator[None]:
    """Replica 1 lent for the test; given back whatever the test found."""
    borrow()
    assert state() == ("inactive", "masked-runtime") and gateway_servers()[8001]
    try:
        yield
    finally:
        if on(INFER, "sh", "-c", "cat /etc/gpuplat-inference/version-canary.env 2>/dev/null || true"):
            give_back()


def test_during_a_loan_fewer_replicas_are_refused_and_a_rolling_change_leaves_the_lent_replica_alone(
    loan: None,
) -> None:
    refused = converge(*ONE_REPLICA)
    assert refused.returncode != 0
    assert "runs the canary embedder-loan@3" in refused.stdout, refused.stdout[-4000:]
    assert "`gpuplat serve rollback embedder-loan`" in refused.stdout
    assert recap(refused.stdout).get(INFER) == 0, "the refused converge changed the node"
    assert state() == ("inactive", "masked-runtime")
    assert on(INFER, "ls", CONFIG_DIR).split().count("replica-1.env") == 1

    rolled = converge(*INFLIGHT)
    assert rolled.returncode == 0, rolled.stdout[-4000:]
    assert "is lent to a canary" in rolled.stdout
    changed = recap(rolled.stdout)
    assert changed.get(INFER, 0) > 0 and changed.get(HEAD, 0) > 0, f"nothing rolled or reloaded: {changed}"
    assert state() == ("inactive", "masked-runtime"), "the converge (its roll) started the lent replica"
    assert gateway_servers() == {8000: False, 8001: True}, "the gateway's reload put the lent replica back"
    assert state("gpuplat-inference@0.service") == ("active", "enabled")
    # Down on purpose: Prometheus scrapes it down, and the node's mark keeps InferenceServerDown from paging.
    wait_scraped(lambda: bool(query('up{job="inference_server",replica="1"} == 0')), "the lent replica down")
    assert marks() == {"1": "loan"} and paged_for() == []

    checked = converge("--check", *INFLIGHT)
    assert checked.returncode == 0, checked.stdout[-4000:]
    print("recap of check mode after the converge", recap(checked.stdout))
    assert recap(checked.stdout) == {HEAD: 0, INFER: 0}, checked.stdout[-6000:]
    assert state() == ("inactive", "masked-runtime")
    assert gateway_servers() == {8000: False, 8001: True}

    give_back()
    assert state() == ("active", "enabled") and gateway_servers() == {8000: False, 8001: False}
    wait_scraped(lambda: marks() == {}, "the mark gone once the replica serves again")


def test_a_loan_whose_replica_runs_again_is_left_alone_by_a_converge_and_taken_again_by_a_deploy(
    loan: None,
) -> None:
    """A borrow killed between its record and its drain leaves the record and the replica serving; a reboot
    since the loan lifts the runtime mask and starts the replica at boot. Either way the node has the
    record and the replica running and in service, which this sets up from the loan, the boot's removal of
    the marks included (the role's tmpfiles.d line, as systemd-tmpfiles-setup.service applies it): the
    running replica must page if it dies, until a deploy stops it again."""
    on(INFER, "systemctl", "unmask", "--runtime", UNIT)
    on(
        INFER,
        "systemd-tmpfiles",
        "--remove",
        "--boot",
        role_vars("inference_server")["__inference_server_stopped_tmpfiles"],
    )
    wait_scraped(lambda: marks() == {}, "the loan's mark gone at boot")
    on(INFER, "systemctl", "start", UNIT)
    release()._on_gateways("ready", STABLE_BACKEND, f"{release().layout.addresses[INFER]}:8001")
    assert state() == ("active", "enabled") and gateway_servers() == {8000: False, 8001: False}
    before = started_at()
    # The settings back to the scenario's: replica 0 rolls again while the record names replica 1.
    done = converge(*NO_INSTALL)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "is lent to a canary" in done.stdout
    assert state() == ("active", "enabled") and started_at() == before, "the converge restarted the replica"
    borrow()  # a deploy's `_borrow`, the record there already
    assert state() == ("inactive", "masked-runtime") and gateway_servers() == {8000: False, 8001: True}
    wait_scraped(lambda: marks() == {"1": "loan"}, "the replica marked again once stopped")
    give_back()
    assert state() == ("active", "enabled") and gateway_servers() == {8000: False, 8001: False}


def serving_the_champion() -> None:
    """Both replicas on embedder-loan@3, as a promote leaves them: its archive on the node's /shared, each
    replica's version file (release.py `_write_version`), restarted."""
    archive = on(INFER, "find", "/opt/gpuplat-inference/venv", "-path", "*all_minilm_l6_v2/model.zip")
    on(
        INFER,
        "sh",
        "-c",
        f"mkdir -p /shared/models/embedder-loan/3 && cp {archive} /shared/models/embedder-loan/3/",
    )
    driver = release()
    for replica in (0, 1):
        driver._write_version(INFER, str(replica), VERSION)
        on(INFER, "systemctl", "restart", f"gpuplat-inference@{replica}.service")
        driver._wait_healthy(INFER, 8000 + replica)


def versions_served() -> dict[str, str | None]:
    """What each stable replica's server says it serves ("" the stack's own model), as `serve status` reads
    it."""
    return {r.slot: r.version for r in release().replicas_serving() if r.slot != CANARY_SLOT}


def test_once_the_loan_ended_fewer_replicas_retire_the_last_and_more_add_it_on_the_champion() -> None:
    serving_the_champion()
    assert versions_served() == {"0": "embedder-loan@3", "1": "embedder-loan@3"}
    try:
        done = converge(*ONE_REPLICA, *NO_INSTALL)
        assert done.returncode == 0, done.stdout[-4000:]
        assert state() == ("inactive", "disabled"), "the replica past the layout kept running"
        files = on(INFER, "ls", CONFIG_DIR).split()
        assert "replica-1.env" not in files and "version-1.env" not in files, files
        assert gateway_servers() == {8000: False}
        wait_scraped(lambda: marks() == {"1": "retired"}, "the retired replica's mark")
        grown = converge(*NO_INSTALL)
        assert grown.returncode == 0, grown.stdout[-4000:]
        assert state() == ("active", "enabled") and gateway_servers() == {8000: False, 8001: False}
        assert versions_served() == {"0": "embedder-loan@3", "1": "embedder-loan@3"}, (
            "not on its peers' version"
        )
        wait_scraped(lambda: marks() == {}, "the mark gone once the replica is back in the layout")
    finally:
        on(INFER, "rm", "-f", f"{CONFIG_DIR}/version-0.env", f"{CONFIG_DIR}/version-1.env")
        restored = (
            converge(*NO_INSTALL) if "replica-1.env" not in on(INFER, "ls", CONFIG_DIR).split() else None
        )
        for replica in (0, 1):
            on(INFER, "systemctl", "restart", f"gpuplat-inference@{replica}.service")
            release()._wait_healthy(INFER, 8000 + replica)
    assert restored is None or restored.returncode == 0, restored.stdout[-4000:]
    # Back on the stack's own model, as the scenario's other tests expect (its server names no version).
    assert set(versions_served().values()) <= {"", None}, versions_served()


ALERT_TEST = """rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{{job="inference_server",host="{node}",replica="0"}}'
        values: '1 1 0x10'
      - series: 'up{{job="inference_server",host="{node}",replica="1"}}'
        values: '1 1 0x10'
      - series: '{metric}{{job="node",host="{node}",replica="1",reason="loan"}}'
        values: '_ _ 1x10'
    alert_rule_test:
      - eval_time: 8m
        alertname: InferenceServerDown
        exp_alerts:
          - exp_labels: {{severity: page, job: inference_server, host: "{node}", replica: "0"}}
            exp_annotations:
              summary: "Model server on {node} is down; the gateway routes around it"
"""


def test_inference_server_down_pages_for_a_replica_that_died_not_for_one_lent() -> None:
    """The rule file the monitoring role installed, under Prometheus' own rule tester on the service node:
    both replicas stop answering; replica 1, lent (its node's mark), pages not; replica 0, dead, pages."""
    rules = "/etc/prometheus/rules/gpuplat-alerts.rules.yml"
    text = ALERT_TEST.format(rules=rules, node=INFER, metric=stopped_mark.METRIC)
    on(HEAD, "sh", "-c", 'printf %s "$1" > /tmp/gpuplat-alert-test.yml', "sh", text)
    print(on(HEAD, "promtool", "test", "rules", "/tmp/gpuplat-alert-test.yml"))
