"""`gpuplat serve deploy ... --canary P --detach`: the canary's guard handed to a service on the gateway's
node (infra/serving/guard_service.py), which carries the release on after this command ends.

The service runs the package's own modules, bundled by this command into one zip application (the
interpreter runs a zip archive holding a __main__.py directly: docs.python.org/3/library/zipapp.html,
Python 3.5 and later; Debian bookworm's python3 is 3.11) and copied to the node with the unit each time a
guard is started: the node runs exactly the analysis of the CLI that started it, with the node's own
Python (which the gateway's own programs use already), and no converge is needed for a newer analysis.
The modules it takes are the standard-library-only ones (the analysis, its statistics and counts, the
lock, the metrics' text, the state files and the service); tests/unit/test_canary_detached.py runs the
bundle on a Python without the CLI's dependencies.
"""

from __future__ import annotations

import base64
import io
import json
import time
import zipfile
from pathlib import Path
from typing import Any

from infra.errors import GpuPlatError
from infra.serving.analysis import Guard, RulesRead
from infra.serving.carry import equal_load_share, least_share, step_rules, steps_ahead, with_equal_load_step
from infra.serving.guard_follower import FOLLOWER, follower_unit
from infra.serving.guard_peers import PEER_PORT
from infra.serving.guard_service import SERVICE, STATE_DIR, initial_state, lock_heir, unit_name
from infra.serving.load import load_at
from infra.serving.release import (
    CANARY_BACKEND,
    CANARY_PORT,
    GATEWAY_PROGRAMS,
    REPLICA_PORT,
    STABLE_BACKEND,
    Release,
    ServeRefused,
    servers_up,
)

BUNDLE_DIR = "/usr/local/lib/gpuplat-serve"


def bundle_path(model: str) -> str:
    """Each model's guard its own bundle: a later `--detach` of another model, by a newer CLI, must not
    replace the code a running guard restarts with (its state was written for its own bundle)."""
    return f"{BUNDLE_DIR}/guard@{model}.pyz"


BUNDLED = (
    "__init__.py",
    "errors/__init__.py",
    "serving/__init__.py",
    "serving/analysis.py",
    "serving/counts.py",
    "serving/load.py",
    "serving/statistics.py",
    "serving/lock.py",
    "serving/metrics_text.py",
    "serving/guard_state.py",
    "serving/guard_service.py",
    "serving/guard_peers.py",
    "serving/guard_follower.py",
)
MAIN = "import sys\nfrom infra.serving.guard_follower import main\nsys.exit(main())\n"
# Restart=on-failure: a guard that failed (its gateway's program did not answer, the lock lost) starts again
# and resumes; one that ended (exit 0) stays ended, and so does a later start (its state says so).
# systemd.service(5), Restart=: on-failure restarts on an unclean exit code or signal, never after a stop or
# restart systemd itself was asked for (freedesktop.org/software/systemd/man/systemd.service.html#Restart=).
# A guard that fails at every start stops being started after the fifth start within half an hour: units
# "started more than burst times within an interval time span are not permitted to start any more", and this
# applies to the restarts Restart= makes (systemd.unit(5) of systemd 252, Debian 12's, StartLimitIntervalSec=,
# StartLimitBurst=, in [Unit]). The manager's default, 5 starts in 10 s (systemd-system.conf(5),
# DefaultStartLimitIntervalSec=), never stopped a guard restarted every 5 s. `deploy --detach` flushes the
# count (FLUSH_STARTS) before it starts a new release's guard.
# KillMode=mixed: a stop sends SIGTERM to the guard alone (its handler ends the look under way, saves its
# state and frees the release lock), not to the gateway program it may be running; what is left after the
# guard exited, or after TimeoutStopSec, gets SIGKILL (systemd.kill(5) of systemd 252, KillMode=).
_UNIT = """[Unit]
Description=gpuplat serve: {what} of %i
After=network-online.target haproxy.service
StartLimitIntervalSec=30min
StartLimitBurst=5

[Service]
Type=simple
ExecStart=/usr/bin/python3 {bundle} {arguments}%i
Restart=on-failure
RestartSec=5
KillMode=mixed

[Install]
WantedBy=multi-user.target
"""
UNIT = _UNIT.format(what="the detached canary guard", bundle=bundle_path("%i"), arguments="")
# The same on every other gateway of the stack, as the guard's follower (infra/serving/guard_follower.py).
FOLLOWER_UNIT = _UNIT.format(
    what="a follower of the detached canary guard", bundle=bundle_path("%i"), arguments="follow "
)
# A guard's start count flushed (systemctl reset-failed) before a release starts it; a unit that is not loaded
# has no count ("Unit ... not loaded": systemd drops the count when it unloads a unit, systemd.unit(5),
# StartLimitIntervalSec=), and only a failed unit that could not be reset is an error.
FLUSH_STARTS = 'systemctl reset-failed "$1" 2>/dev/null || ! systemctl is-failed --quiet "$1"'
WRITE = 'mkdir -p "$(dirname "$1")" && printf %s "$2" | base64 -d > "$1.tmp" && mv "$1.tmp" "$1"'


def bundle(modules: tuple[str, ...] = BUNDLED, main: str = MAIN) -> bytes:
    """The zip application of the guard's modules (the guard Job's: infra/serving/guard_job_objects.py),
    from this installation of the package."""
    package = Path(__file__).resolve().parents[1]  # infra/, this module being infra/serving/detach.py
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in modules:
            archive.write(package / name, f"infra/{name}")
        archive.writestr("__main__.py", main)
    return buffer.getvalue()


def check_detachable(release: Release) -> None:
    """Refuse --detach where the service could not carry the release: before `deploy` touches anything,
    not after the canary has its share and no guard. On several gateways the followers reach the first
    gateway at its address: each gateway needs one."""
    gateways = release.layout.gateways
    missing = [gateway for gateway in gateways if not release.layout.addresses.get(gateway)]
    if len(gateways) > 1 and missing:
        raise ServeRefused(
            f"stack '{release.platform.name}' has {len(gateways)} gateways and no address for "
            f"{', '.join(missing)}: --detach runs the guard on {gateways[0]} and a follower on each other "
            "gateway, which reaches it at its address; give each gateway host its address in the stack file"
        )


# The port the guard of a model answers its followers on: the first from PEER_PORT that no other model's
# guard, leading a release that has not ended on this node, has (its state's peer_port), nor another `deploy
# --detach` chose within PORT_HELD_S and has not written its state yet. Chosen and held under a lock on the
# node: two models deployed at once read the states before either wrote its own, both chose 8406, and the
# second guard failed at every start, its canary unwatched.
PORT_CHOSEN = """import fcntl, glob, json, os, sys, time
folder, model, first, held_s = sys.argv[1] + "/guard", sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
os.makedirs(folder, exist_ok=True)
with open(folder + "/.ports.lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    taken = set()
    for path in glob.glob(folder + "/*.json"):
        try:
            with open(path) as opened:
                state = json.load(opened)
        except (OSError, ValueError):
            continue
        leads = state.get("gateway") == state.get("leader") and state.get("addresses")
        if leads and state.get("model") != model and state.get("phase") != "done":
            taken.add(state.get("peer_port"))
    for path in glob.glob(folder + "/*.port"):
        try:
            if path != folder + "/" + model + ".port" and time.time() - os.path.getmtime(path) < held_s:
                with open(path) as opened:
                    taken.add(int(opened.read()))
        except (OSError, ValueError):
            continue
    port = next(port for port in range(first, first + len(taken) + 1) if port not in taken)
    with open(folder + "/" + model + ".port", "w") as chosen:
        chosen.write(str(port))
    print(port)
"""
PORT_HELD_S = 600
"""how long a port chosen by a `deploy --detach` is held for its state (written a few commands later)"""


def peer_port(release: Release, gateway: str, model: str) -> int:
    """The port the guard of `model` answers its followers on (PORT_CHOSEN)."""
    answer = release.nodes.exec(
        gateway, "python3", "-c", PORT_CHOSEN, STATE_DIR, model, str(PEER_PORT), str(PORT_HELD_S)
    )
    if not answer.strip().isdigit():
        raise GpuPlatError(f"the guard's port on {gateway}: the node answered {answer.strip()[-200:]!r}")
    return int(answer)


def _install(release: Release, node: str, model: str, service: str, unit_text: str) -> None:
    """The bundle and the unit's template on `node`."""
    for path, content in (
        (bundle_path(model), bundle()),
        (f"/etc/systemd/system/{service}@.service", unit_text.encode()),
    ):
        release.nodes.exec(node, "sh", "-c", WRITE, "sh", path, base64.b64encode(content).decode())


def _start(release: Release, node: str, unit: str) -> None:
    release.nodes.exec(node, "systemctl", "daemon-reload")
    release.nodes.exec(node, "systemctl", "enable", unit)
    release.nodes.exec(node, "sh", "-c", FLUSH_STARTS, "sh", unit)
    release.nodes.exec(node, "systemctl", "restart", unit)


def detach_guard(release: Release, model: str, candidate: str, share: int, duration_s: float | None) -> str:
    """Hand the analysis `deploy` began (release.canary_start) to the service on the gateway's node and
    start it; the unit's name. The caller holds the release lock and hands it to the service."""
    check_detachable(release)
    gateways = release.layout.gateways
    if release.canary_start is None:
        raise ServeRefused("--detach needs a canary that this deploy started (--canary PERCENT)")
    gateway, rules = gateways[0], release.rules
    look_s = 5.0
    started, stable, canary = release.canary_start
    histogram = release.latency_histogram_name()
    servers = {
        release.layout.addresses[node]: {
            "stable": [REPLICA_PORT + replica for replica in release.stable_replicas(node)],
            "canary": CANARY_PORT,
        }
        for node in release.layout.servers
    }
    # The share that loads both versions' servers alike is analysed for latency (infra/serving/load.py).
    up = servers_up(release.figures())
    ahead = with_equal_load_step(steps_ahead(rules.steps, share, False), share, equal_load_share(up))
    # The analysis added below the stack's smallest share has longer intervals (carry.step_rules): the
    # step carries them (guard_service.DetachedGuard.step_rules).
    least = least_share(rules.steps, share)
    steps: list[tuple[int, dict[str, Any]]] = []
    for number, step in ahead:
        step_at = step_rules(rules, number, step.percent, least, up)
        lengthened = {"interval_s": step_at.interval_s} if step_at is not rules else {}
        steps.append((number, {"percent": step.percent, "manual_gate": step.manual_gate, **lengthened}))
    unit = unit_name(model)
    addresses = {node: release.layout.addresses[node] for node in gateways} if len(gateways) > 1 else {}
    try:
        port = peer_port(release, gateway, model) if addresses else PEER_PORT
        for node in gateways:
            _install(
                release, node, model, *((SERVICE, UNIT) if node == gateway else (FOLLOWER, FOLLOWER_UNIT))
            )
        # The state last, just before `init` reads the node's clock: the start, given as seconds ago, is
        # not moved later by the time the copies took.
        state = initial_state(
            model=model,
            candidate=candidate,
            rules=RulesRead.of(rules),
            guard=Guard(rules, 0.0, stable, canary, load_ratio=load_at(share, up)),
            started_ago_s=time.monotonic() - started,
            share=share,
            steps=steps,
            steps_in_all=len(rules.steps),
            load_servers=up,
            return_share=share if ahead and not rules.steps else None,
            gateway=gateway,
            addresses=addresses,
            peer_port=port,
            gateway_programs=GATEWAY_PROGRAMS,
            backends={"stable": STABLE_BACKEND, "canary": CANARY_BACKEND},
            servers=servers,
            histogram=histogram,
            look_s=look_s,
            duration_s=duration_s or rules.initial_delay_s + rules.analysis_s + look_s,
        )
        for node in gateways:
            own = json.dumps({**state, "gateway": node})
            release.nodes.exec(node, "python3", bundle_path(model), "init", model, own)
        release.record(model, "analysing", f"the detached guard carries it ({unit} on {gateway})", share)
        # The lock passes to the service without ever being free: a promote started as this command exits
        # meets it (a guard that never starts leaves it to its lease).
        release.hand_over(model, lock_heir(model))
        # The followers first: each keeps its gateway's share until the guard answers.
        for node in (*gateways[1:], gateway):
            _start(release, node, follower_unit(model) if node != gateway else unit)
    except GpuPlatError as error:
        raise GpuPlatError(
            f"{error.message}. The detached guard of '{model}' did not start: its canary has {share} % of "
            f"the requests and nothing watches it. `gpuplat serve guard {model}` watches it from here, "
            f"`gpuplat serve rollback {model}` takes it out (within a minute: the lock's lease)",
            exit_code=error.exit_code,
        ) from None
    return unit
