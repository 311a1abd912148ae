"""The AWS gateway's canary release with the real HAProxy (Debian's 2.6): the configuration the role renders
for aws, its canary backend's slots filled by the targets program from the running instances (each
instance's canary port, in service only where a canary answers), the share set by the canary program, kept
through a reload and a restart under load.

Two instances on loopback (127.0.0.1 and 127.0.0.2) run a stable replica each; only the second runs a canary
(as on the instances `gpuplat serve deploy` started one on). The targets program runs once, with the health
probe it runs on the gateway; whatever HAProxy serves after the reload and the restart it found in its state
file and version map. Not modelled: EC2 (a fixed listing), the agent check (no agent answers: HAProxy does
not count that as a failure), several gateways.

Needs /usr/sbin/haproxy (scripts/setup-host.sh installs Debian's package); skips saying so without it.
"""

from __future__ import annotations

import time

import pytest

from tests.roles.test_gateway_reload import (
    HAPROXY,
    MODEL_SERVERS,
    FakeEc2,
    Gateway,
    Load,
    ModelServer,
    canary_program,
    gateway,
    serving,
    wait_for,
)
from tests.roles.test_serving_discovery import STACK, targets_program

pytestmark = pytest.mark.skipif(
    HAPROXY is None, reason="no haproxy binary: scripts/setup-host.sh installs Debian's package"
)
__all__ = ["gateway"]  # the fixture, used by name

SHARE = 20


def canary_slots(gateway: Gateway) -> dict[str, tuple[str, bool]]:
    """Each canary slot's address and whether HAProxy's checks count it up (in service and running)."""
    program = targets_program()
    slots = program.RuntimeApi(gateway.admin_socket).slots("inference_canary", "canary-")
    return {
        slot.name: (slot.address, not slot.in_maintenance and slot.op_state == program.OP_RUNNING)
        for slot in slots
    }


def answered(gateway: Gateway, canary: ModelServer) -> tuple[int, int]:
    """Requests the stable replicas and the canary answered so far."""
    return sum(replica.requests for replica in gateway.replicas), canary.requests


def test_the_aws_gateway_gives_the_canary_its_share_through_a_reload_and_a_restart(gateway: Gateway) -> None:
    program, versions = targets_program(), canary_program()
    # The second instance runs the canary: the first's address (127.0.0.1) is also the slots' placeholder
    # (init-addr last,127.0.0.1), which a slot that lost its address would fall back to unnoticed.
    canary = ModelServer(MODEL_SERVERS[1], gateway.canary_port)
    load = None
    try:
        gateway.start()
        api = program.RuntimeApi(gateway.admin_socket)
        assert canary_slots(gateway) and not any(up for _, up in canary_slots(gateway).values())
        probe = program.http_health("/health")

        def one_pass(canary_answers: bool) -> None:
            """A pass as the timer runs it (the canary slots too, probed before they take traffic)."""
            program.sync(
                FakeEc2(MODEL_SERVERS),
                api,
                stack=STACK,
                role="infer",
                pools=[],
                base_port=gateway.server_port,
                replicas=1,
                backend="inference",
                prefix="slot-",
                healthy=lambda target: (canary_answers or target[1] != gateway.canary_port) and probe(target),
                state_file=gateway.directory / "state" / "server-state",
                canary=program.CanarySlots("inference_canary", "canary-", gateway.canary_port),
            )

        # The timer's passes before `deploy` started the canary, then deploy's own: it changes only the
        # canary's slot, and the restart below finds that change in the state file too.
        one_pass(canary_answers=False)
        one_pass(canary_answers=True)
        wait_for(lambda: len(serving(program, gateway)) == 2, "both stable slots up")
        wait_for(
            lambda: [address for address, up in canary_slots(gateway).values() if up] == [MODEL_SERVERS[1]],
            "the canary slot of the instance that runs a canary up",
        )
        # The other instance's canary slot has its address, in maintenance: nothing answers there (HAProxy
        # would count a slot out of maintenance up before its first check).
        # (Its address, 127.0.0.1, is the placeholder's too: every slot but the canary's is in maintenance.)
        idle = [s for s in api.slots("inference_canary", "canary-") if s.address != MODEL_SERVERS[1]]
        assert idle and all(slot.in_maintenance for slot in idle)

        map_file = gateway.directory / "versions.map"
        shown = versions.share(api, map_file, SHARE)
        assert shown["canary_percent"] == SHARE and shown["backends"]["inference_canary"]["servers_up"] == 1

        load = Load(gateway.port)
        time.sleep(2.0)
        before_reload = answered(gateway, canary)
        gateway.reload()
        time.sleep(2.0)
        after_reload = answered(gateway, canary)
        gateway.stop()
        gateway.start()
        # The new process: the canary slot and the share from the state file and the map, no pass since.
        assert [address for address, up in canary_slots(gateway).values() if up] == [MODEL_SERVERS[1]]
        time.sleep(2.0)
        load.stop()
        after_restart = answered(gateway, canary)
        shown = versions.show(program.RuntimeApi(gateway.admin_socket), map_file)
        assert shown["canary_percent"] == SHARE
    finally:
        if load is not None:
            load.stop()
        canary.stop()
    failures = {kind: tally.failures[:5] for kind, tally in load.tally.items() if tally.failures}
    assert not failures, (failures, load.counts())
    # The canary's share of the requests in each phase: 20 % of the draws. With n requests its count is
    # binomial (sd sqrt(n x 0.2 x 0.8)); the bounds are 5 sd either side at the smallest phase's n.
    previous = (0, 0)
    for phase, (stable, canary_count) in (
        ("before the reload", before_reload),
        ("across the reload", after_reload),
        ("across the restart", after_restart),
    ):
        stable_n, canary_n = stable - previous[0], canary_count - previous[1]
        total = stable_n + canary_n
        expected = total * SHARE / 100
        spread = 5 * (total * 0.2 * 0.8) ** 0.5
        assert total >= 100, (phase, total)
        assert abs(canary_n - expected) <= spread, (phase, canary_n, total)
        previous = (stable, canary_count)
    print(f"\nstable and canary answered: {previous}; clients: {load.counts()}")
