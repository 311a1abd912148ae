"""Serving that follows the infer pool as it scales (AWS), and stays static elsewhere.

- Prometheus on aws finds its targets through EC2 (ec2_sd_configs filtered on the stack's tags),
  every replica port of every infer instance, relabelled to the private address; local and onprem
  keep their static targets.
- The gateway on aws has a fixed number of disabled server slots, filled at run time by
  files/gpuplat_gateway_targets.py; several gateways split the per-server and queue limits.
- The targets program against EC2 emulated by moto (server mode, loopback) and a fake HAProxy
  runtime API on a UNIX socket that answers as HAProxy does and records the commands.
"""

from __future__ import annotations

import importlib.util
import re
import socketserver
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import empty_moto_account
from tests.roles.test_serving_templates import (
    INFER_HOST,
    ROLES,
    cluster,
    defaults,
    gateway_backends,
    render,
    role_vars,
)
from tests.threaded_server import serve_in_thread

yaml = pytest.importorskip("yaml")

STACK = "prod-east"
REGION = "us-east-1"
PROMETHEUS = ROLES / "monitoring" / "templates" / "prometheus.yml.j2"
HAPROXY = ROLES / "inference_gateway" / "templates" / "haproxy.cfg.j2"


# --- Prometheus -----------------------------------------------------------------------------------


def prometheus(backend: str, replicas: int = 4) -> dict[str, Any]:
    variables = {
        **defaults("monitoring"),
        **cluster(replicas=replicas, tp=1),
        "__monitoring_rules_dir": "/etc/prometheus/rules",
        "gpuplat_stack": STACK,
        "gpuplat_backend": backend,
    }
    if backend == "aws":
        variables["gpuplat_region"] = REGION
    config = yaml.safe_load(render(PROMETHEUS, variables))
    return {job["job_name"]: job for job in config["scrape_configs"]}


def filters(sd_config: dict[str, Any]) -> dict[str, list[str]]:
    return {f["name"]: f["values"] for f in sd_config["filters"]}


def relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str]:
    """Prometheus's `replace` relabelling (the default action): anchored regex over the source labels
    joined by the separator, $n expanded in the replacement, written to target_label on a match."""
    labels = dict(labels)
    for rule in rules:
        assert rule.get("action", "replace") == "replace"
        value = rule.get("separator", ";").join(labels.get(name, "") for name in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if match is None:
            continue
        # Prometheus writes groups as $1 or ${1}; Python's template syntax is \g<1>.
        template = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", rule.get("replacement", "$1"))
        labels[rule["target_label"]] = match.expand(template)
    return labels


def test_aws_prometheus_discovers_the_stack_and_scrapes_every_replica_port() -> None:
    jobs = prometheus("aws", replicas=4)
    server = jobs["inference_server"]
    assert "static_configs" not in server
    sd = server["ec2_sd_configs"]
    assert [c["port"] for c in sd] == [8000, 8001, 8002, 8003]
    for config in sd:
        assert config["region"] == REGION
        assert filters(config) == {
            "tag:gpuplat:stack": [STACK],
            "tag:gpuplat:role": ["infer"],
            "instance-state-name": ["running"],
        }
    # A target as EC2 discovery hands it over (port of the sd config that found it): scraped on the
    # private address, labelled like the static targets (host, pool, replica).
    discovered = {
        "__address__": "10.40.2.77:8002",
        "__meta_ec2_private_ip": "10.40.2.77",
        "__meta_ec2_public_ip": "54.1.2.3",
        "__meta_ec2_instance_id": "i-0abc",
        "__meta_ec2_tag_gpuplat_pool": "infer",
        "__meta_ec2_instance_type": "p5.48xlarge",
    }
    labels = relabel(server["relabel_configs"], discovered)
    assert labels["__address__"] == "10.40.2.77:8002"
    assert (labels["host"], labels["pool"], labels["replica"]) == ("i-0abc", "infer", "2")

    node = jobs["node"]["ec2_sd_configs"]
    assert [c["port"] for c in node] == [9100]
    assert filters(node[0]) == {"tag:gpuplat:stack": [STACK], "instance-state-name": ["running"]}
    dcgm = jobs["dcgm"]["ec2_sd_configs"]
    assert [c["port"] for c in dcgm] == [9400]
    assert filters(dcgm[0])["tag:gpuplat:role"] == ["train", "infer"]
    assert filters(dcgm[0])["tag:gpuplat:stack"] == [STACK]
    gateway = jobs["inference_gateway"]["ec2_sd_configs"]
    assert filters(gateway[0])["tag:gpuplat:pool"] == ["head"]  # the gateway group's pool
    for job in ("node", "dcgm", "inference_gateway"):
        assert relabel(jobs[job]["relabel_configs"], discovered)["host"] == "i-0abc"
    # A node with a name (gpuplat:node tag, the inventory's host name) is labelled with it.
    named = relabel(server["relabel_configs"], {**discovered, "__meta_ec2_tag_gpuplat_node": "infer-3"})
    assert named["host"] == "infer-3"


def test_static_backends_keep_their_inventory_targets_only_aws_discovers() -> None:
    for backend in ("local", "onprem"):
        jobs = prometheus(backend, replicas=4)
        assert not [name for name, job in jobs.items() if "ec2_sd_configs" in job], backend
        targets = jobs["inference_server"]["static_configs"]
        assert [t["targets"] for t in targets] == [[f"10.40.2.21:{8000 + i}"] for i in range(4)]
        assert {t["labels"]["host"] for t in targets} == {INFER_HOST}
        assert [t["targets"] for t in jobs["node"]["static_configs"]] == [
            ["10.40.2.21:9100"],  # gpu-21
            ["10.40.0.10:9100"],  # head-0
        ]
    aws = prometheus("aws")
    assert not [name for name, job in aws.items() if name != "prometheus" and "static_configs" in job]


# --- Gateway --------------------------------------------------------------------------------------


def haproxy(backend: str, gateways: int = 1, max_servers: int = 6, infer_hosts: bool = True) -> str:
    inventory = cluster(replicas=2, tp=4)
    if not infer_hosts:  # an infer pool scaled to zero: the aws_ec2 inventory finds no host
        inventory["groups"]["inference_server"] = []
    variables = role_vars(
        "inference_gateway",
        {
            **inventory,
            "gpuplat_backend": backend,
            "gpuplat_stack": STACK,
            "gpuplat_region": REGION,
            "inference_gateway_max_servers": max_servers,
            "inference_gateway_instances": gateways,
        },
    )
    return render(HAPROXY, {**variables, "__inference_gateway_backends": gateway_backends(variables)})


def servers(config: str) -> list[str]:
    return re.findall(r"^\s+server (.+)$", config, re.MULTILINE)


def test_aws_gateway_has_disabled_slots_the_targets_program_fills() -> None:
    config = haproxy("aws", max_servers=6, infer_hosts=False)
    # Named by host, so that HAProxy 2.6 restores their addresses from the state file (init-addr last);
    # 127.0.0.1 and disabled only where there is no state (test_gateway_reload.py runs it).
    # The canary backend: one slot per instance the pool may have (6 slots / 2 replicas per instance), at the
    # instance's canary port, filled the same way (test_gateway_aws_canary.py).
    assert servers(config) == [
        f"slot-{i} slot-{i}.gpuplat.invalid:8000 init-addr last,127.0.0.1 disabled" for i in range(1, 7)
    ] + [f"canary-{i} canary-{i}.gpuplat.invalid:8100 init-addr last,127.0.0.1 disabled" for i in range(1, 4)]
    assert "use_backend %[rand(100),map_int(/etc/haproxy/gpuplat-versions.map,inference)]" in config
    assert "stats socket /run/haproxy/admin.sock mode 660 level admin expose-fd listeners" in config
    for backend in ("aws", "local"):
        assert "load-server-state-from-file global" in haproxy(backend), backend
    # The agent check asks each node's scaling agent (spot interruption, termination): aws only.
    assert " agent-check agent-port 8090 " in config
    assert "agent-check" not in haproxy("local")
    # Elsewhere: the inventory's replicas, enabled, as before.
    local = haproxy("local", max_servers=6)
    assert servers(local) == [f"{INFER_HOST}-{i} 10.40.2.21:{8000 + i}" for i in range(2)]


def limits(config: str) -> tuple[int, int]:
    maxconn = re.search(r"^\s+default-server .* maxconn (\d+)\b", config, re.MULTILINE)
    queue = re.search(r"acl queue_full queue\(inference\) ge (\d+)$", config, re.MULTILINE)
    assert maxconn is not None and queue is not None
    return int(maxconn.group(1)), int(queue.group(1))


def test_gateways_split_the_per_server_and_queue_limits() -> None:
    # The inventory: max_inflight_per_replica 32, max_queue 64.
    assert limits(haproxy("local", gateways=1)) == (32, 64)
    assert limits(haproxy("aws", gateways=2)) == (16, 32)
    assert limits(haproxy("aws", gateways=3)) == (10, 21)
    assert limits(haproxy("onprem", gateways=100)) == (1, 1)  # never 0: at least 1 each
    assert "One of 2 gateways" in haproxy("aws", gateways=2)


def spec_options(role: str) -> dict[str, Any]:
    specs = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return dict(specs["main"]["options"])


def test_discovery_inputs_are_declared_by_the_roles() -> None:
    gateway = spec_options("inference_gateway")
    for name in ("gpuplat_backend", "gpuplat_stack", "gpuplat_region", "inference_gateway_max_servers"):
        assert name in gateway, name
    # aws-only inputs cannot be required: local and onprem inventories never write them.
    assert not gateway["gpuplat_region"].get("required")
    assert not gateway["inference_gateway_max_servers"].get("required")
    assert (
        gateway["inference_gateway_instances"]["default"]
        == defaults("inference_gateway")["inference_gateway_instances"]
    )
    monitoring = spec_options("monitoring")
    assert {"gpuplat_backend", "gpuplat_stack", "gpuplat_region"} <= set(monitoring)
    for role in ("inference_gateway", "monitoring"):
        assert set(defaults(role)) <= set(spec_options(role)), role


# --- The targets program: moto (EC2) and a fake HAProxy runtime API ---------------------------------


def targets_program() -> ModuleType:
    path = ROLES / "inference_gateway" / "files" / "gpuplat_gateway_targets.py"
    spec = importlib.util.spec_from_file_location("gpuplat_gateway_targets", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


STATE_HEADER = (
    "# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight "
    "srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state "
    "srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl "
    "srv_check_port srv_check_addr srv_agent_addr srv_agent_port"
)


class FakeHAProxy:
    """HAProxy's runtime API for one backend of `disabled` slots (srv_admin_state 5: CMAINT|FMAINT).

    Answers `show servers state [<backend>]`, `set server <b>/<s> addr <ip> port <port>` and `set
    server <b>/<s> state ready|maint` the way HAProxy does, and records every `set` command.
    """

    def __init__(self, path: Path, backend: str, slots: int, port: int) -> None:
        self.backend = backend
        self.path = str(path)
        self.slots: list[dict[str, Any]] = [
            {"id": i, "name": f"slot-{i}", "addr": "127.0.0.1", "port": port, "admin": 5, "op": 0}
            for i in range(1, slots + 1)
        ]
        self.commands: list[str] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline().decode().strip()
                self.wfile.write(fake.answer(line).encode())

        self.server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self.thread = serve_in_thread(self.server)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, line: str) -> str:
        with self.lock:
            if line in ("show servers state", f"show servers state {self.backend}"):
                rows = [
                    f"3 {self.backend} {s['id']} {s['name']} {s['addr']} {s['op']} {s['admin']} 1 1 5 "
                    f"{6 if s['op'] else 1} {3 if s['op'] else 0} {4 if s['op'] else 0} 6 0 0 0 - "
                    f"{s['port']} - 0 0 - - 0"
                    for s in self.slots
                ]
                return "1\n" + STATE_HEADER + "\n" + "\n".join(rows) + "\n\n"
            words = line.split()
            if words[:2] != ["set", "server"] or len(words) < 5:
                return "Unknown command.\n"
            self.commands.append(line)
            backend, _, name = words[2].partition("/")
            slot = next((s for s in self.slots if s["name"] == name), None)
            if backend != self.backend or slot is None:
                return "No such server.\n"
            if words[3] == "addr" and len(words) == 7 and words[5] == "port":
                old_addr, old_port = slot["addr"], slot["port"]
                slot["addr"], slot["port"] = words[4], int(words[6])
                return (
                    f"IP changed from '{old_addr}' to '{slot['addr']}', port changed from '{old_port}' "
                    f"to '{slot['port']}' by 'stats socket command'\n"
                )
            if words[3] == "state" and words[4] == "ready":
                slot["admin"] &= ~0x01  # CMAINT (0x04) stays, as in HAProxy
                slot["op"] = 2
                return "\n"
            if words[3] == "state" and words[4] == "maint":
                slot["admin"] |= 0x01
                slot["op"] = 0
                return "\n"
            return "Require 'backend/server'.\n"

    def serving(self) -> set[tuple[str, int]]:
        with self.lock:
            return {(s["addr"], s["port"]) for s in self.slots if not s["admin"] & 0x23}

    def take_commands(self) -> list[str]:
        with self.lock:
            commands, self.commands = self.commands, []
        return commands


@pytest.fixture
def ec2_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    # moto's backends live in this process: start from, and leave, an empty account.
    empty_moto_account(endpoint)
    try:
        yield endpoint
    finally:
        empty_moto_account(endpoint)
        server.stop()


@pytest.fixture
def fake_haproxy() -> Iterator[FakeHAProxy]:
    # A short path: UNIX socket paths are limited to ~107 bytes (pytest's tmp_path can be longer).
    with tempfile.TemporaryDirectory(prefix="hap") as directory:
        haproxy = FakeHAProxy(Path(directory) / "admin.sock", "inference", slots=6, port=8000)
        try:
            yield haproxy
        finally:
            haproxy.close()


def ec2_client(endpoint: str) -> Any:
    import boto3  # type: ignore[import-untyped]

    return boto3.client("ec2", region_name=REGION, endpoint_url=endpoint)


# One of the AMIs moto registers in every region (moto/ec2/resources/amis.json.gz); listing them
# through describe_images takes seconds.
MOTO_AMI = "ami-03cf127a"


def launch(ec2: Any, stack: str = STACK, role: str = "infer", pool: str = "infer") -> tuple[str, str]:
    tags = [
        {"Key": "gpuplat:stack", "Value": stack},
        {"Key": "gpuplat:role", "Value": role},
        {"Key": "gpuplat:pool", "Value": pool},
    ]
    instance = ec2.run_instances(
        ImageId=MOTO_AMI,
        InstanceType="g5.xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )["Instances"][0]
    return instance["InstanceId"], instance["PrivateIpAddress"]


def run(program: ModuleType, endpoint: str, haproxy: FakeHAProxy) -> int:
    """One pass of `sync`, every replica healthy (moto's instances have no address to probe)."""
    ec2, autoscaling, _ = program.aws_clients(REGION, endpoint)
    result = program.sync(
        ec2,
        program.RuntimeApi(haproxy.path),
        stack=STACK,
        role="infer",
        pools=[],
        base_port=8000,
        replicas=2,
        backend="inference",
        prefix="slot-",
        autoscaling=autoscaling,
        healthy=lambda target: True,
    )
    return 3 if result.unplaced else 0


def test_targets_follow_the_pool_from_zero_to_two_to_one_instance(
    ec2_endpoint: str, fake_haproxy: FakeHAProxy
) -> None:
    program = targets_program()
    ec2 = ec2_client(ec2_endpoint)
    # Never routed to: another stack's infer node, this stack's training node.
    launch(ec2, stack="other-stack")
    launch(ec2, role="train", pool="train")

    assert run(program, ec2_endpoint, fake_haproxy) == 0
    assert fake_haproxy.take_commands() == []  # no instance: the disabled slots stay as they are

    first_id, first = launch(ec2)
    _, second = launch(ec2)
    assert run(program, ec2_endpoint, fake_haproxy) == 0
    commands = fake_haproxy.take_commands()
    wanted = {(address, port) for address in (first, second) for port in (8000, 8001)}
    assert fake_haproxy.serving() == wanted
    assert len(commands) == 8  # addr + ready for each of the 4 replicas, nothing else
    assert sum(c.endswith("state ready") for c in commands) == 4
    assert {tuple(c.split()[4:7:2]) for c in commands if " addr " in c} == {(a, str(p)) for a, p in wanted}

    assert run(program, ec2_endpoint, fake_haproxy) == 0
    assert fake_haproxy.take_commands() == []  # idempotent

    ec2.terminate_instances(InstanceIds=[first_id])
    slots_before = {s["name"]: (s["addr"], s["port"]) for s in fake_haproxy.slots}
    assert run(program, ec2_endpoint, fake_haproxy) == 0
    commands = fake_haproxy.take_commands()
    removed = sorted(name for name, target in slots_before.items() if target[0] == first)
    assert sorted(commands) == [f"set server inference/{name} state maint" for name in removed]
    assert fake_haproxy.serving() == {(second, 8000), (second, 8001)}

    assert run(program, ec2_endpoint, fake_haproxy) == 0
    assert fake_haproxy.take_commands() == []


def test_targets_beyond_the_slots_are_reported_and_live_slots_kept(
    ec2_endpoint: str, fake_haproxy: FakeHAProxy
) -> None:
    program = targets_program()
    ec2 = ec2_client(ec2_endpoint)
    addresses = [launch(ec2)[1] for _ in range(4)]  # 8 replicas for 6 slots
    assert run(program, ec2_endpoint, fake_haproxy) == 3
    serving = fake_haproxy.serving()
    assert len(serving) == 6 and serving <= {(a, p) for a in addresses for p in (8000, 8001)}
    fake_haproxy.take_commands()
    # Still too many: the 6 live slots keep their targets, nothing is shuffled.
    assert run(program, ec2_endpoint, fake_haproxy) == 3
    assert fake_haproxy.take_commands() == []
    assert fake_haproxy.serving() == serving


def test_instances_are_listed_across_pages_and_by_pool(ec2_endpoint: str) -> None:
    program = targets_program()
    ec2 = ec2_client(ec2_endpoint)
    addresses = sorted(launch(ec2)[1] for _ in range(7))  # one reservation each: moto pages by those
    other_pool = launch(ec2, pool="infer-batch")[1]
    found = program.running_addresses(ec2, STACK, "infer", page_size=5)
    assert sorted(found) == sorted([*addresses, other_pool])
    assert sorted(program.running_addresses(ec2, STACK, "infer", ["infer"], page_size=5)) == addresses


def test_the_units_run_the_program_with_the_inventory_values() -> None:
    program = targets_program()
    variables = role_vars(
        "inference_gateway",
        {
            **cluster(replicas=4, tp=2),
            "gpuplat_backend": "aws",
            "gpuplat_stack": STACK,
            "gpuplat_region": REGION,
            "inference_gateway_max_servers": 8,
            "inference_gateway_discovery_pools": ["infer"],
        },
    )
    templates = ROLES / "inference_gateway" / "templates"
    unit = render(templates / "gpuplat-gateway-targets.service.j2", variables).replace("\\\n", " ")
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = exec_start.split()[2:]  # after the interpreter and the program
    args = program.parse_args(argv)
    assert (args.region, args.stack, args.role, args.pool) == (REGION, STACK, "infer", ["infer"])
    assert (args.port, args.replicas, args.backend) == (8000, 4, "inference")
    # The slots and the socket the program drives are those haproxy.cfg declares.
    config = render(HAPROXY, {**variables, "__inference_gateway_backends": []})
    assert f"stats socket {args.socket} " in config
    assert servers(config)[0].startswith(f"{args.slot_prefix}1 ")
    # The canary backend's slots: the backend, prefix and port the configuration gives them.
    assert (args.canary_backend, args.canary_port) == ("inference_canary", 8100)
    assert f"backend {args.canary_backend}\n" in config
    assert f"    server {args.canary_slot_prefix}1 {args.canary_slot_prefix}1.gpuplat.invalid:8100 " in config
    timer = render(templates / "gpuplat-gateway-targets.timer.j2", variables)
    assert "OnUnitActiveSec=15s" in timer and "OnActiveSec=" in timer
    # It saves the state where HAProxy loads it from, in a directory systemd creates under /run.
    assert f"server-state-file {args.state_file}\n" in config
    assert f"RuntimeDirectory={args.state_file.parent.name}\n" in unit
    assert args.state_file.parent.parent == Path("/run")


def test_a_pass_that_changes_the_slots_saves_the_state_for_the_next_haproxy(
    ec2_endpoint: str, fake_haproxy: FakeHAProxy, tmp_path: Path
) -> None:
    """A HAProxy that starts again without the unit's ExecStop (a crash, Restart=always) finds the slots
    of the last pass in the state file."""
    program = targets_program()
    ec2, autoscaling, _ = program.aws_clients(REGION, ec2_endpoint)
    state = tmp_path / "run" / "server-state"

    def sync() -> None:
        program.sync(
            ec2,
            program.RuntimeApi(fake_haproxy.path),
            stack=STACK,
            role="infer",
            pools=[],
            base_port=8000,
            replicas=1,
            backend="inference",
            prefix="slot-",
            autoscaling=autoscaling,
            state_file=state,
        )

    sync()  # no instance, no change: the file is written once all the same (there was none)
    assert state.read_text().startswith("1\n")
    _, address = launch(ec2_client(ec2_endpoint))
    sync()
    saved = program.parse_servers_state(state.read_text(), "inference", "slot-")
    assert {slot.target for slot in saved if not slot.in_maintenance} == {(address, 8000)}
    state.write_text("stale")
    sync()  # nothing changed: the file is left alone
    assert state.read_text() == "stale"


def test_plan_reuses_a_slot_that_already_points_at_a_returning_target() -> None:
    program = targets_program()
    slot = program.Slot
    slots = [
        slot(1, "slot-1", "10.0.0.5", 8000, 5),  # in maintenance, pointing at 10.0.0.5:8000
        slot(2, "slot-2", "10.0.0.9", 8000, 4),  # live (CMAINT only), its instance gone
        slot(3, "slot-3", "10.0.0.7", 8000, 4),  # live, wanted
    ]
    result = program.plan(slots, [("10.0.0.5", 8000), ("10.0.0.7", 8000)], "inference")
    assert result.commands == [
        "set server inference/slot-2 state maint",
        "set server inference/slot-1 state ready",
    ]
    assert result.unplaced == []


def test_a_slot_leaves_maintenance_only_once_its_replica_is_healthy() -> None:
    program = targets_program()
    slot = program.Slot
    slots = [slot(1, "slot-1", "-", 8000, 5), slot(2, "slot-2", "10.0.0.5", 8001, 5)]
    wanted = [("10.0.0.5", 8000), ("10.0.0.5", 8001)]
    loading = program.plan(slots, wanted, "inference", healthy=lambda target: False)
    # The address is set, the slot stays in maintenance; HAProxy would count it up before any check.
    assert loading.commands == ["set server inference/slot-1 addr 10.0.0.5 port 8000"]
    assert sorted(loading.unhealthy) == sorted(wanted) and loading.unplaced == []
    up = program.plan(slots, wanted, "inference", healthy=lambda target: target[1] == 8001)
    assert up.commands == [
        "set server inference/slot-2 state ready",
        "set server inference/slot-1 addr 10.0.0.5 port 8000",
    ]


def test_the_slots_of_an_instance_being_terminated_are_drained_not_cut() -> None:
    program = targets_program()
    slot = program.Slot
    slots = [
        slot(1, "slot-1", "10.0.0.5", 8000, 4),  # live, its instance in Terminating:Wait
        slot(2, "slot-2", "10.0.0.7", 8000, 4),  # live, kept
        slot(3, "slot-3", "10.0.0.5", 8001, 4 | 0x08),  # already draining
        slot(4, "slot-4", "-", 8000, 5),  # free
    ]
    # The terminating instance is still running: listed, but never given a new slot.
    wanted = [("10.0.0.5", 8000), ("10.0.0.5", 8001), ("10.0.0.7", 8000)]
    result = program.plan(slots, wanted, "inference", draining={"10.0.0.5"})
    assert result.commands == ["set server inference/slot-1 state drain"]
    assert result.unplaced == [] and result.unhealthy == []


def test_the_gateways_publish_their_backlog_per_serving_instance_of_each_group() -> None:
    """What the infer group's target tracking follows: requests the gateways queue because every
    replica is at its limit, per instance. Each of 2 gateways sees about half of it."""
    program = targets_program()
    instance = program.Instance
    serving = [instance("10.0.0.5", "prod-infer-asg"), instance("10.0.0.6", "prod-infer-asg")]
    [datum] = program.backlog_metric_data(serving, backlog=3, gateways=2)
    assert datum["MetricName"] == "GatewayBacklogPerInstance" and datum["Value"] == 3.0
    assert datum["Dimensions"] == [{"Name": "AutoScalingGroupName", "Value": "prod-infer-asg"}]
    # An instance outside any group (a stray) is not capacity of one: nothing to publish for it.
    assert program.backlog_metric_data([instance("10.0.0.9", "")], backlog=5, gateways=1) == []


def test_two_saves_of_the_state_at_once_both_land_whole(
    fake_haproxy: FakeHAProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timer's pass and the unit's ExecReload save the state file from two processes: the second one
    writing while the first renames its copy into place must not take the first's temporary file (the
    first would then find none to rename, and HAProxy could read a half-written file)."""
    program = targets_program()
    api = program.RuntimeApi(fake_haproxy.path)
    state = tmp_path / "server-state"
    rename = program.os.replace
    interleaved: list[str] = []

    def replace_after_the_other_writer(source: Any, target: Any) -> None:
        if not interleaved:  # the other process saves between this one's write and its rename
            interleaved.append("other")
            assert program.save_state(api, state) == 0
        rename(source, target)

    monkeypatch.setattr(program.os, "replace", replace_after_the_other_writer)
    assert program.save_state(api, state) == 0 and interleaved == ["other"]
    assert state.read_text() == api.send("show servers state")
    assert [path.name for path in tmp_path.iterdir()] == ["server-state"]  # no temporary file left
