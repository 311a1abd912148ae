"""The AWS gateway's slot configuration reloaded and restarted under load, on the serving scenario: Debian's
HAProxy run by systemd from the package's own unit, in front of the scenario's real model servers.

The gateway role's templates rendered for an aws stack (tests/roles/test_serving_templates.py renders them
as the role's other tests do): haproxy.cfg with its server slots named by host (slot-N.gpuplat.invalid,
`init-addr last,127.0.0.1 disabled`) and the server-state file, and the unit's drop-in
(gpuplat-server-state.conf: ExecReload and ExecStop save the state, KillSignal=SIGUSR1). They run as a
second gateway on the service node, `gpuplat-aws-gateway.service`: the package's haproxy.service copied
under that name, its configuration, pid file and master socket its own, beside the scenario's own gateway
(haproxy.service, untouched). The targets program fills two slots with infer-0's two replicas once
(`sync` with its health probe and its save of the state file; an EC2 that lists infer-0 as the pool's one
running instance, the only thing not real here), then never runs again: whatever the gateway serves after
`systemctl reload` and `systemctl restart`, it found in the state file, and the file the program saved is
removed before each, so that it is the one the drop-in's ExecReload and ExecStop saved.

Load: clients on keep-alive connections and clients sending `Connection: close`, from this host to the
service node's address on the scenario's network, all the time, counted as the promote test counts them
(tests/serving/load.py keeping_alive): anything but a complete 200 fails. Between the stop and the start of
a restart no process listens: a connection refused then sent nothing; the client connects again and the
test counts it apart, and only inside the restart.

Not modelled: EC2 itself, and the Auto Scaling group's scaling while the gateway restarts (the targets
program's tests against moto's EC2 cover those: tests/roles/test_serving_discovery.py).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from tests.roles.test_serving_templates import ROLES, render, role_vars
from tests.serving.load import HEAD, Answer, keeping_alive, node, wait_for

pytestmark = pytest.mark.skipif(
    not os.environ.get("GPUPLAT_SERVING_SCENARIO"),
    reason="needs the converged serving scenario: scripts/test-serving.sh runs these",
)

SCENARIO = ROLES.parent / "molecule" / "serving" / "molecule.yml"
TEMPLATES = ROLES / "inference_gateway" / "templates"
UNIT = "gpuplat-aws-gateway"
# The service node and infer-0 on the scenario's network (molecule/serving/molecule.yml platforms).
SERVICE_NODE, INFER_NODE = "10.213.48.10", "10.213.48.11"
PORT, METRICS_PORT = 8081, 8405  # beside the scenario's own gateway (8080, 8404)
# Four clients, each waiting this long after an answer: some 30 requests a second in all. Without a pause
# they took the two CPUs of the test machine, and a `podman exec` waited up to 17 s to start.
PAUSE_S = 0.1
CONFIG = f"/etc/haproxy/{UNIT}.cfg"
ADMIN_SOCKET = f"/run/haproxy/{UNIT}-admin.sock"
STATE_FILE = f"/run/{UNIT}/server-state"
TARGETS_DIR = "/usr/local/lib/gpuplat"  # where the role installed the targets program on the service node
# The package's unit runs $CONFIG with $PIDFILE and $EXTRAOPTS (Debian bookworm haproxy 2.6.12,
# /lib/systemd/system/haproxy.service: Environment="CONFIG=..." "PIDFILE=..." "EXTRAOPTS=-S ...").
UNIT_PATHS = (
    f'[Service]\nEnvironment="CONFIG={CONFIG}" "PIDFILE=/run/{UNIT}.pid" '
    f'"EXTRAOPTS=-S /run/{UNIT}-master.sock"\n'
)

# Run on the service node with its Python: the slots of the backend as HAProxy holds them.
SLOTS = f"""import sys
sys.path.insert(0, "{TARGETS_DIR}")
import gpuplat_gateway_targets as program
for slot in program.RuntimeApi("{ADMIN_SOCKET}").slots("inference", "slot-"):
    print(slot.name, slot.address, slot.port, int(slot.in_maintenance), slot.op_state)
"""
# One pass of the targets program: EC2 lists infer-0 as the pool's one running instance; the program probes
# each replica's health, sets the slots through the runtime API and saves the state file.
FILL = f"""import sys
from pathlib import Path
sys.path.insert(0, "{TARGETS_DIR}")
import gpuplat_gateway_targets as program
page = {{"Reservations": [{{"Instances": [
    {{"InstanceId": "i-infer-0", "State": {{"Name": "running"}}, "PrivateIpAddress": "{INFER_NODE}"}}]}}]}}
class Ec2:
    def get_paginator(self, name):
        assert name == "describe_instances"
        return self
    def paginate(self, **filters):
        return [page]
done = program.sync(Ec2(), program.RuntimeApi("{ADMIN_SOCKET}"), stack="molecule", role="infer", pools=[],
    base_port=int(sys.argv[1]), replicas=int(sys.argv[2]), backend="inference", prefix="slot-",
    healthy=program.http_health("/health"), state_file=Path("{STATE_FILE}"))
assert not done.unplaced and not done.unhealthy, done
"""


def scenario_vars() -> dict[str, Any]:
    """The inventory's values on the service node (molecule/serving/molecule.yml group vars)."""
    groups = yaml.safe_load(SCENARIO.read_text())["provisioner"]["inventory"]["group_vars"]
    return {**groups["all"], **groups["pool_head"]}


def aws_gateway_vars() -> dict[str, Any]:
    variables = role_vars(
        "inference_gateway",
        {
            **scenario_vars(),
            "gpuplat_backend": "aws",
            "gpuplat_region": "us-east-1",
            "inference_gateway_max_servers": 4,
            "inference_gateway_port": PORT,
            "inference_gateway_metrics_port": METRICS_PORT,
        },
    )
    # This gateway's own paths (set after role_vars: vars/main.yml wins there).
    variables.update(
        __inference_gateway_admin_socket=ADMIN_SOCKET,
        __inference_gateway_state_file=STATE_FILE,
        __inference_gateway_targets_dir=TARGETS_DIR,
        __inference_gateway_backends=[],
    )
    return variables


def slots() -> dict[str, tuple[str, int, bool, int]]:
    """slot name -> (address, port, in maintenance, operational state) on the running gateway."""
    rows = (line.split() for line in node(HEAD, "python3", "-c", SLOTS).splitlines() if line.strip())
    return {name: (address, int(port), maint == "1", int(op)) for name, address, port, maint, op in rows}


def serving() -> set[tuple[str, int]]:
    """The slots in service that HAProxy's checks count up (op state 2, SRV_ST_RUNNING)."""
    return {(address, port) for address, port, maint, op in slots().values() if not maint and op == 2}


def workers() -> set[str]:
    """The master's children: HAProxy's worker processes, old ones still finishing included."""
    main = f"$(systemctl show -P MainPID {UNIT})"
    return set(node(HEAD, "sh", "-c", f"cat /proc/{main}/task/{main}/children").split())


# Installs the unit and its configuration, checks the configuration as the role's template task does
# (haproxy -c) and starts it. Arguments: the unit, its drop-in folder, the paths drop-in, the role's drop-in's
# name and text, the configuration's path and text.
INSTALL = """set -e
cp /lib/systemd/system/haproxy.service "/etc/systemd/system/$1.service"
mkdir -p "$2"
printf %s "$3" > "$2/10-paths.conf"
printf %s "$5" > "$2/$4"
printf %s "$7" > "$6"
haproxy -c -q -f "$6"
systemctl daemon-reload
systemctl start "$1"
"""


@pytest.fixture
def aws_gateway() -> Iterator[dict[str, Any]]:
    """The aws configuration installed as its own unit on the service node and started; removed after."""
    variables = aws_gateway_vars()
    dropin = f"/etc/systemd/system/{UNIT}.service.d"
    server_state = PurePosixPath(str(variables["__inference_gateway_unit_dropin"])).name
    try:
        node(
            HEAD, "sh", "-c", INSTALL, "install", UNIT, dropin, UNIT_PATHS, server_state,
            render(TEMPLATES / "gpuplat-server-state.conf.j2", variables),
            CONFIG, render(TEMPLATES / "haproxy.cfg.j2", variables),
        )  # fmt: skip
        yield variables
    finally:
        files = f"/etc/systemd/system/{UNIT}.service {dropin} {CONFIG} {STATE_FILE}"
        node(HEAD, "sh", "-c", f"systemctl stop {UNIT}; rm -rf {files}; systemctl daemon-reload")


def test_the_aws_slots_survive_a_reload_and_a_restart_under_load_with_no_failed_request(
    aws_gateway: dict[str, Any],
) -> None:
    kill_signal = node(HEAD, "systemctl", "show", "-P", "KillSignal", UNIT).strip()
    assert kill_signal == "10", kill_signal  # SIGUSR1 from the role's drop-in: a graceful stop
    replicas = int(aws_gateway["inference_replicas_per_node"])
    port = int(aws_gateway["inference_gateway_server_port"])
    wanted = {(INFER_NODE, port + replica) for replica in range(replicas)}
    names = {f"slot-{n}" for n in range(1, 5)}
    assert set(slots()) == names and serving() == set()  # a first start: every slot disabled

    node(HEAD, "python3", "-c", FILL, str(port), str(replicas))
    saved = [line.split() for line in node(HEAD, "cat", STATE_FILE).splitlines()]  # the program's own save
    # `show servers state`: srv_name is the 4th field, srv_addr the 5th, srv_port the 19th.
    assert {(row[4], int(row[18])) for row in saved if row[3:4] and row[3].startswith("slot-")} >= wanted
    wait_for("both slots up on HAProxy's checks", lambda: serving() == wanted, 30, poll_s=0.2)

    keep_alive: list[Answer] = []
    close: list[Answer] = []
    failures: list[str] = []
    refused: list[float] = []
    gateway = (SERVICE_NODE, PORT)
    with (
        keeping_alive(keep_alive, failures, clients=2, gateway=gateway, refused=refused, pause_s=PAUSE_S),
        keeping_alive(
            close, failures, clients=2, close=True, gateway=gateway, refused=refused, pause_s=PAUSE_S
        ),
    ):
        time.sleep(1.5)
        reloaded_at = time.monotonic()
        before = workers()
        # Each time the file the targets program saved is removed first: what the new process finds is
        # what the unit's drop-in saved (ExecReload, then ExecStop), not the program's save of the fill.
        node(HEAD, "rm", STATE_FILE)
        node(HEAD, "systemctl", "reload", UNIT)
        wait_for("the reloaded worker", lambda: workers() - before, 10, poll_s=0.2)
        reloaded = serving()
        time.sleep(1.5)
        node(HEAD, "rm", STATE_FILE)
        restarted_at = time.monotonic()
        node(HEAD, "systemctl", "restart", UNIT)
        restarted_s = time.monotonic() - restarted_at
        # Before any check of the new process could count a server up (rise 2 x inter 2 s): the state file's.
        restarted = serving()
        time.sleep(1.5)
        ended_at = time.monotonic()
    answers = keep_alive + close
    print(
        f"aws gateway under load: {len(keep_alive)} keep-alive and {len(close)} close answers, "
        f"{len(failures)} failures, {Counter(a.status for a in answers)}; restart took {restarted_s:.2f} s, "
        f"{len(refused)} connects refused meanwhile"
    )
    assert reloaded == wanted and restarted == wanted, (reloaded, restarted)
    statuses = Counter(a.status for a in answers)
    assert not failures and set(statuses) == {200}, (failures[:5], statuses)
    assert all(restarted_at <= at <= restarted_at + restarted_s for at in refused), [
        round(at - restarted_at, 2) for at in refused
    ]
    for kind, group in (("keep-alive", keep_alive), ("close", close)):
        # Answered in every phase: before the reload, across it, and after the restart.
        phases = [(0.0, reloaded_at), (reloaded_at, restarted_at), (restarted_at + restarted_s, ended_at)]
        assert all(any(start <= a.sent < end for a in group) for start, end in phases), kind
