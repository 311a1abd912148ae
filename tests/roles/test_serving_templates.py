"""Serving templates rendered as the roles render them (no containers): one model-server replica per
GPU group behind the gateway and in Prometheus, load (not GPU memory) as the scaling signal, XID
alerts on new events, HAProxy series grouped by their real labels."""

from __future__ import annotations

import ast
import importlib.util
import json
import posixpath
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
jinja2 = pytest.importorskip("jinja2")

from tests.roles.ansible_values import render_value  # noqa: E402
from tests.threaded_server import serve_in_thread  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
INFER_HOST = "gpu-21"


def environment() -> Any:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=False, keep_trailing_newline=True)
    env.filters["comment"] = lambda text: "#\n# " + text + "\n#"
    env.filters["urlencode"] = lambda text: text
    env.filters["bool"] = lambda value: str(value).lower() in ("true", "yes", "1")
    env.filters["dirname"] = posixpath.dirname
    env.filters["basename"] = posixpath.basename
    env.tests["match"] = lambda value, pattern: re.match(pattern, str(value)) is not None
    return env


def render(path: Path, variables: dict[str, Any]) -> str:
    return environment().from_string(path.read_text()).render(ansible_managed="Ansible managed", **variables)


def defaults(role: str) -> dict[str, Any]:
    return dict(yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()))


def cluster(replicas: int, tp: int) -> dict[str, Any]:
    """An 8-GPU inference node as `gpuplat inventory` describes it, and a head node."""
    gpus = [",".join(str(g) for g in range(i * tp, (i + 1) * tp)) for i in range(replicas)]
    serving = {
        "inference_engine": "vllm",
        "inference_model": "/lustre/models/Llama-3.1-70B-Instruct",
        "inference_vllm_version": "0.16.0",
        "inference_max_inflight_per_replica": 32,
        "inference_max_model_len": 8192,
        "inference_gpu_memory_fraction": 0.9,
        "inference_gateway_timeout_s": 60.0,
        "inference_gateway_max_queue": 64,
        "inference_gateway_queue_timeout_s": 2.0,
        "inference_ttft_p95_target_ms": 2000,
        "inference_itl_p95_target_ms": 100,
        "inference_tensor_parallel_size": tp,
        "inference_replicas_per_node": replicas,
        "inference_replica_gpus": gpus,
    }
    hostvars = {
        "head-0": {**serving, "ansible_host": "10.40.0.10", "gpuplat_pool": "head", "gpuplat_gpu_count": 0},
        INFER_HOST: {
            **serving,
            "ansible_host": "10.40.2.21",
            "gpuplat_pool": "infer",
            "gpuplat_gpu_count": 8,
            "gpuplat_gpu_simulated": False,
        },
    }
    groups = {
        "all": ["head-0", INFER_HOST],
        "inference_server": [INFER_HOST],
        "inference_gateway": ["head-0"],
        "gpu_nodes": [INFER_HOST],
    }
    return {**serving, "hostvars": hostvars, "groups": groups}


def gateway_backends(variables: dict[str, Any]) -> list[dict[str, Any]]:
    tasks = yaml.safe_load((ROLES / "inference_gateway" / "tasks" / "preflight.yml").read_text())
    expression = tasks[0]["ansible.builtin.set_fact"]["__inference_gateway_backends"]
    text = environment().from_string(expression).render(**variables)
    return list(ast.literal_eval(text.strip()))


def test_gateway_lists_every_replica_of_every_node() -> None:
    variables = {**defaults("inference_gateway"), **cluster(replicas=4, tp=2)}
    backends = gateway_backends(variables)
    assert [(b["name"], b["address"], b["port"]) for b in backends] == [
        (f"{INFER_HOST}-{i}", "10.40.2.21", 8000 + i) for i in range(4)
    ]
    config = render(
        ROLES / "inference_gateway" / "templates" / "haproxy.cfg.j2",
        {**variables, "__inference_gateway_backends": backends},
    )
    servers = re.findall(r"^\s+server (\S+) (\S+)$", config, re.MULTILINE)
    assert servers == [(f"{INFER_HOST}-{i}", f"10.40.2.21:{8000 + i}") for i in range(4)]


def inference_targets(variables: dict[str, Any], job_name: str = "inference_server") -> list[dict[str, Any]]:
    monitoring = role_vars(
        "monitoring",
        {**variables, "__monitoring_rules_dir": "/etc/prometheus/rules", "gpuplat_stack": "onprem"},
    )
    config = yaml.safe_load(render(ROLES / "monitoring" / "templates" / "prometheus.yml.j2", monitoring))
    job = next(j for j in config["scrape_configs"] if j["job_name"] == job_name)
    return list(job["static_configs"])


def test_prometheus_scrapes_every_replica() -> None:
    targets = inference_targets(cluster(replicas=8, tp=1))
    assert [t["targets"] for t in targets] == [[f"10.40.2.21:{8000 + i}"] for i in range(8)]
    assert [t["labels"]["replica"] for t in targets] == [str(i) for i in range(8)]
    assert {t["labels"]["host"] for t in targets} == {INFER_HOST}


def test_prometheus_scrapes_each_canary_slot_as_a_job_of_its_own() -> None:
    """The guard's p95 of the canary (infra/serving/release.py) is this job's; the model-server-down alert
    watches job inference_server only, so an empty slot pages nobody."""
    targets = inference_targets(cluster(replicas=8, tp=1), "inference_canary")
    assert [t["targets"] for t in targets] == [["10.40.2.21:8100"]]
    rules = (ROLES / "monitoring" / "templates" / "gpuplat-alerts.rules.yml.j2").read_text()
    assert 'up{job="inference_canary"}' not in rules


def role_vars(role: str, variables: dict[str, Any]) -> dict[str, Any]:
    """defaults + vars/main.yml of a role, the vars rendered once against the inventory."""
    # The facts the vars read (the interpreter that makes a virtual environment), as Debian 12 has them.
    merged = {"ansible_facts": {"python": {"executable": "/usr/bin/python3"}}, **defaults(role), **variables}
    for name, value in yaml.safe_load((ROLES / role / "vars" / "main.yml").read_text()).items():
        if isinstance(value, str):
            value = environment().from_string(value).render(**merged).strip()
            # Ansible turns a rendered list or dict back into one.
            value = ast.literal_eval(value) if value[:1] in ("[", "{") else value
        merged[name] = value
    return merged


def infer_node_vars(replicas: int, tp: int) -> dict[str, Any]:
    """What the infer node sees: the inventory's all vars and its pool vars, then the role's vars."""
    inventory = cluster(replicas=replicas, tp=tp)
    host = {**inventory["hostvars"][INFER_HOST], "inventory_hostname": INFER_HOST}
    return role_vars("inference_server", {**inventory, **host})


def unit_and_replica_env(replicas: int, tp: int, replica: int) -> tuple[str, str]:
    variables = infer_node_vars(replicas, tp)
    variables["inventory_hostname"] = INFER_HOST
    templates = ROLES / "inference_server" / "templates"
    unit = render(templates / "gpuplat-inference@.service.j2", variables)
    env = render(templates / "replica.env.j2", {**variables, "item": replica})
    return unit, env


def test_vllm_unit_is_a_template_with_tensor_parallel_and_per_replica_port() -> None:
    unit, env = unit_and_replica_env(replicas=4, tp=2, replica=1)
    assert "EnvironmentFile=/etc/gpuplat-inference/replica-%i.env" in unit
    assert "--tensor-parallel-size 2" in unit
    assert "--port ${GPUPLAT_INFERENCE_PORT}" in unit
    settings = dict(line.split("=", 1) for line in env.splitlines() if line and not line.startswith("#"))
    assert settings == {"GPUPLAT_INFERENCE_PORT": "8001", "CUDA_VISIBLE_DEVICES": "2,3"}


def test_eight_gpu_node_never_serves_on_gpu0_alone() -> None:
    seen: list[str] = []
    for replica in range(8):
        _, env = unit_and_replica_env(replicas=8, tp=1, replica=replica)
        seen += [
            line.split("=", 1)[1] for line in env.splitlines() if line.startswith("CUDA_VISIBLE_DEVICES=")
        ]
    assert seen == [str(g) for g in range(8)]


def canary_env(engine: str, canary_gpus: str) -> dict[str, str]:
    """The canary slot's env file (replica-canary.env) as the role's tasks/service.yml writes it."""
    tasks = yaml.safe_load((ROLES / "inference_server" / "tasks" / "service.yml").read_text())
    task = next(t for t in tasks if t.get("name", "").startswith("Write the canary slot's port"))
    variables = {
        **defaults("inference_server"),
        "inventory_hostname": INFER_HOST,
        "inference_engine": engine,
        "inference_canary_gpus": canary_gpus,
    }
    text = environment().from_string(task["ansible.builtin.copy"]["content"]).render(**variables)
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_a_spare_canary_starts_on_the_gpu_group_its_node_keeps_and_nowhere_else() -> None:
    """Issue 48 item 7: the canary's env file had only its port, so a vLLM canary started on GPU 0 beside
    replica 0. With serving.canary.gpus spare it names the node's spare group; where the canary borrows a
    replica's GPUs `gpuplat serve` writes them into its version file, and the CPU engine uses none."""
    assert canary_env("vllm", "6,7") == {"GPUPLAT_INFERENCE_PORT": "8100", "CUDA_VISIBLE_DEVICES": "6,7"}
    assert canary_env("vllm", "") == {"GPUPLAT_INFERENCE_PORT": "8100"}
    assert canary_env("cpu-reference", "") == {"GPUPLAT_INFERENCE_PORT": "8100"}


def test_no_role_pins_a_vllm_version_of_its_own() -> None:
    for role in ("inference_server", "inference_gateway", "monitoring"):
        assert not [k for k in defaults(role) if "vllm_version" in k], role


def rules(template: str, engine: str = "vllm") -> list[dict[str, Any]]:
    variables = role_vars(
        "monitoring",
        {
            "inference_engine": engine,
            "inference_ttft_p95_target_ms": 2000,
            "inference_itl_p95_target_ms": 100,
        },
    )
    text = render(ROLES / "monitoring" / "templates" / template, variables)
    return [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


HAPROXY_LABELS = {
    "haproxy_frontend_": {"proxy", "code"},
    "haproxy_backend_": {"proxy", "code"},
    "haproxy_server_": {"proxy", "server", "code"},
}


@pytest.mark.parametrize("engine", ["vllm", "cpu-reference"])
def test_haproxy_series_are_grouped_by_their_real_labels(engine: str) -> None:
    checked = 0
    for rule in rules("gpuplat-recording.rules.yml.j2", engine):
        expr = rule["expr"]
        for prefix, labels in HAPROXY_LABELS.items():
            if prefix not in expr:
                continue
            for grouping in re.findall(r"\bby \(([^)]*)\)", expr):
                used = {label.strip() for label in grouping.split(",")}
                assert used <= labels, f"{rule['record']}: groups {prefix}* by {used - labels}"
                checked += 1
    per_server = next(
        r
        for r in rules("gpuplat-recording.rules.yml.j2", engine)
        if r.get("record", "").endswith("inference_server_requests:rate1m")
    )
    assert "server" in per_server["expr"]
    assert checked >= 2


def test_xid_alert_fires_on_new_events_not_on_the_held_gauge() -> None:
    xid = next(r for r in rules("gpuplat-alerts.rules.yml.j2") if r.get("alert") == "GpuXidError")
    assert "changes(DCGM_FI_DEV_XID_ERRORS[" in xid["expr"] or "delta(DCGM_FI_DEV_XID_ERRORS[" in xid["expr"]
    assert "max_over_time" not in xid["expr"]


def test_vllm_kv_cache_usage_is_recorded() -> None:
    records = {r["record"]: r["expr"] for r in rules("gpuplat-recording.rules.yml.j2") if "record" in r}
    assert "vllm:kv_cache_usage_perc" in records["gpuplat:inference_kv_cache_usage:ratio"]
    cpu = {r["record"] for r in rules("gpuplat-recording.rules.yml.j2", "cpu-reference") if "record" in r}
    assert "gpuplat:inference_kv_cache_usage:ratio" not in cpu


def scaling_agent() -> ModuleType:
    path = ROLES / "inference_server" / "files" / "gpuplat_scaling_agent.py"
    spec = importlib.util.spec_from_file_location("gpuplat_scaling_agent", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


VLLM_METRICS = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {done}
"""


def test_scaling_agent_publishes_load_not_gpu_memory() -> None:
    agent = scaling_agent()
    sample = agent.node_sample(
        [VLLM_METRICS.format(kv=0.2, waiting=1, done=10), VLLM_METRICS.format(kv=0.6, waiting=3, done=5)]
    )
    assert sample.kv_cache_percent == pytest.approx(40.0)
    assert sample.waiting == 4 and sample.requests == 15
    names = [m["MetricName"] for m in agent.metric_data("asg", 2.0, sample.kv_cache_percent, sample.waiting)]
    assert names == ["RequestsPerSecond", "KVCacheUtilization", "RequestsWaiting"]
    assert "nvidia-smi" not in (ROLES / "inference_server" / "files" / "gpuplat_scaling_agent.py").read_text()


def test_scaling_agent_reads_the_older_vllm_kv_metric_name() -> None:
    agent = scaling_agent()
    text = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
    assert agent.kv_cache_usage(text) == pytest.approx(0.5)


def test_scaling_agent_unit_reads_every_replica() -> None:
    variables = infer_node_vars(replicas=4, tp=2)
    variables.update(inference_server_scaling_asg_name="asg", inference_server_scaling_region="r")
    unit = render(ROLES / "inference_server" / "templates" / "gpuplat-scaling-agent.service.j2", variables)
    assert re.findall(r"--metrics-url (\S+)", unit) == [
        f"http://127.0.0.1:{8000 + i}/metrics" for i in range(4)
    ]


@pytest.mark.parametrize(
    "template", ["prometheus.yml.j2", "gpuplat-recording.rules.yml.j2", "gpuplat-alerts.rules.yml.j2"]
)
def test_a_stack_that_serves_nothing_gets_node_and_gpu_monitoring_only(template: str) -> None:
    """A Slurm stack without a serving section: the inventory sets no inference_* (the controller's
    converge failed on the role's required arguments before)."""
    spec = yaml.safe_load((ROLES / "monitoring" / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert not options["inference_engine"].get("required") and not options[
        "inference_ttft_p95_target_ms"
    ].get("required")
    inventory = {k: v for k, v in cluster(replicas=1, tp=1).items() if not k.startswith("inference_")}
    variables = role_vars(
        "monitoring", {**inventory, "gpuplat_stack": "box", "__monitoring_rules_dir": "/etc/prometheus/rules"}
    )
    document = yaml.safe_load(render(ROLES / "monitoring" / "templates" / template, variables))
    text = json.dumps(document)
    assert "inference" not in text.replace("gpuplat:", "")
    if template == "prometheus.yml.j2":
        assert {j["job_name"] for j in document["scrape_configs"]} >= {"node", "dcgm"}
    else:
        assert document["groups"] and all(group["rules"] for group in document["groups"])


def booting_infer_node_vars(platform: Any) -> dict[str, Any]:
    """The variables a booting aws-prod inference node has: the group vars it fetches (the program's
    node_group_vars) and its pool's vars (bootstrap.node_inventory); no aws_ec2 plugin variables."""
    from infra.backends.aws.bootstrap import node_group_vars, node_inventory

    pool = platform.pool("infer")
    inventory = node_inventory(platform, pool)
    pool_vars = inventory["all"]["children"][f"pool_{pool.name}"]["vars"]
    return {
        **node_group_vars(platform, "fs@tcp:/mnt", {"head-0": "10.0.0.10"}, {}, {}, "bootstrap/0/bundle.zip"),
        **pool_vars,
    }


def test_the_scaling_agent_configures_on_a_node_that_boots_alone(
    shipped_platforms: dict[str, Any],
) -> None:
    """A node of the infer Auto Scaling group configures itself from its one-node inventory: the
    agent's region comes from the stack, its group from the instance's own metadata at start."""
    platform = shipped_platforms["aws-prod"]
    variables = booting_infer_node_vars(platform)
    assert "tags" not in variables and "placement" not in variables
    role = defaults("inference_server")
    env = environment()
    # Ansible's undefined variables chain (`placement.region | default(...)` on an undefined `placement`
    # gives the default), as Jinja's ChainableUndefined does.
    env.undefined = jinja2.ChainableUndefined
    region = render_value(env, role["inference_server_scaling_region"], variables)
    group = render_value(env, role["inference_server_scaling_asg_name"], variables)
    assert (region, group) == (platform.spec.region, "")
    unit = render(
        ROLES / "inference_server" / "templates" / "gpuplat-scaling-agent.service.j2",
        {
            **variables,
            "inference_server_scaling_region": region,
            "inference_server_scaling_asg_name": group,
            "inference_server_scaling_interval_s": 60,
            "inference_server_service": "gpuplat-inference",
            "inference_server_user": "gpuplat-inference",
            "inference_server_install_dir": "/opt/gpuplat-inference",
            "inference_server_port": 8000,
            "__inference_server_venv": "/opt/gpuplat-inference/venv",
            "__inference_server_replicas": [0],
        },
    )
    assert f"--region {platform.spec.region}" in unit and "--asg" not in unit


def test_the_scaling_agent_reads_its_group_from_instance_metadata() -> None:
    """IMDSv2 (token, then tags/instance/aws:autoscaling:groupName), against the box's instance
    metadata emulator on loopback; EC2 answers 404 where the launch template keeps tags out."""
    from tests.box.imds import InstanceMetadata

    instance = {
        "InstanceId": "i-0infer",
        "Tags": [{"Key": "aws:autoscaling:groupName", "Value": "aws-prod-infer-asg-1234"}],
        "MetadataOptions": {"InstanceMetadataTags": "enabled"},
    }
    metadata = InstanceMetadata(lambda address: instance, port=0, address="127.0.0.1")
    try:
        endpoint = f"http://127.0.0.1:{metadata.server.server_address[1]}"
        agent = scaling_agent()
        assert agent.own_autoscaling_group(endpoint) == "aws-prod-infer-asg-1234"
        instance["MetadataOptions"] = {"InstanceMetadataTags": "disabled"}
        metadata._described.clear()
        with pytest.raises(OSError):
            agent.own_autoscaling_group(endpoint)
    finally:
        metadata.stop()


def test_down_alerts_page_only_for_targets_that_answered_before() -> None:
    """A node an Auto Scaling group or Slurm just launched is discovered while it boots and loads its
    model (up == 0 for many minutes): no page for it, only for a target that was up and went away."""
    alerts = {r["alert"]: r["expr"] for r in rules("gpuplat-alerts.rules.yml.j2") if "alert" in r}
    for name, job in (("NodeDown", "node"), ("InferenceServerDown", "inference_server")):
        assert alerts[name].startswith(
            f'(up{{job="{job}"}} == 0) and (max_over_time(up{{job="{job}"}}[6h]) == 1)'
        )


def test_no_page_for_a_replica_the_platform_stopped_on_purpose() -> None:
    """A replica lent to a canary or retired carries its node's mark (the role's template, release.py's
    text: the same gauge), and InferenceServerDown leaves out exactly the (host, replica) it names."""
    from infra.serving import stopped_mark

    alerts = {r["alert"]: r["expr"] for r in rules("gpuplat-alerts.rules.yml.j2") if "alert" in r}
    assert alerts["InferenceServerDown"].endswith(
        f" unless on(host, replica) ({stopped_mark.METRIC} == 1)"
    ), alerts["InferenceServerDown"]
    assert "unless" not in alerts["NodeDown"]
    held = {"__inference_server_replica": 3, "__inference_server_stopped_reason": "retired"}
    variables = {**infer_node_vars(4, 2), **held}
    written = render(ROLES / "inference_server" / "templates" / "replica-stopped.prom.j2", variables)
    assert written.splitlines()[3:] == stopped_mark.mark(3, "retired").splitlines(), written
    assert stopped_mark.mark_file(3) == "gpuplat-inference-replica-3.prom"


def _tasks(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load((ROLES / "inference_server" / "tasks" / name).read_text()))


def _task(tasks: list[dict[str, Any]], starts: str) -> int:
    return next(i for i, task in enumerate(tasks) if task["name"].startswith(starts))


def test_the_marks_of_replicas_stopped_on_purpose_go_at_boot(tmp_path: Path) -> None:
    """A reboot lifts the loan's runtime mask and starts the lent replica: its mark must not outlive the boot
    (a replica that runs and dies pages). The role's tmpfiles.d line, run by Debian 12's own systemd-tmpfiles
    as systemd-tmpfiles-setup.service runs it at boot (--create --remove --boot), removes every replica's mark
    and nothing else of the textfile collector's directory, and only at boot: a package upgrade applies
    tmpfiles.d without --boot, while a loan stands. Before: no such line, the mark stayed on disk."""
    tool = shutil.which("systemd-tmpfiles")
    if tool is None:
        pytest.skip("systemd-tmpfiles is not installed here")
    from infra.serving import stopped_mark

    variables = infer_node_vars(2, 4)
    variables["inference_server_textfile_dir"] = "/var/lib/prometheus/node-exporter"
    config = tmp_path / "gpuplat-inference-stopped.conf"
    template = ROLES / "inference_server" / "templates" / "replica-stopped.tmpfiles.j2"
    config.write_text(render(template, variables))
    textfile = tmp_path / "root/var/lib/prometheus/node-exporter"
    textfile.mkdir(parents=True)
    names = [stopped_mark.mark_file(n) for n in (0, 1, 12)]
    for name in [*names, "apt.prom", "gpuplat-inference-replica.prom.keep"]:
        (textfile / name).write_text("x 1\n")
    upgrade = [tool, "--create", "--remove", f"--root={tmp_path / 'root'}", str(config)]
    subprocess.run(upgrade, check=True)
    assert len(list(textfile.iterdir())) == 5, "removed without --boot"
    subprocess.run([*upgrade, "--boot"], check=True)
    assert sorted(p.name for p in textfile.iterdir()) == ["apt.prom", "gpuplat-inference-replica.prom.keep"]
    service = _tasks("service.yml")
    installed = service[_task(service, "Forget the replicas stopped on purpose")]
    assert installed["ansible.builtin.template"]["dest"] == "{{ __inference_server_stopped_tmpfiles }}"
    assert variables["__inference_server_stopped_tmpfiles"].startswith("/etc/tmpfiles.d/")
    assert variables["__inference_server_stopped_tmpfiles"].endswith(".conf")


def test_a_replica_is_marked_stopped_only_once_it_stopped() -> None:
    """A converge killed between a retire's mark and its stop would leave a running replica marked (not
    paged for if it dies): the role marks it after the stop, as release.py marks a lent one. Before: the
    mark came first."""
    retire = _tasks("retire.yml")
    stop = _task(retire, "Stop the retired replica")
    assert retire[stop]["ansible.builtin.systemd_service"]["state"] == "stopped"
    assert stop < _task(retire, "Say that the platform stopped the retired replica")


def test_the_role_marks_where_node_exporter_reads_and_records_it_for_gpuplat_serve() -> None:
    """One setting for node_exporter's textfile collector directory: inference_server_textfile_dir follows
    node_exporter_textfile_dir (its fallback is node_exporter's default), and the role records it on the
    node where release.py reads it (stopped_mark.RECORD) rather than a default of its own. Before: the two
    defaults were independent, and release.py used the inference role's whatever the node had."""
    from infra.serving import stopped_mark

    declared = defaults("inference_server")["inference_server_textfile_dir"]
    env = environment()
    assert render_value(env, declared, {}) == defaults("node_exporter")["node_exporter_textfile_dir"]
    assert render_value(env, declared, {"node_exporter_textfile_dir": "/srv/textfile"}) == "/srv/textfile"
    specs = yaml.safe_load((ROLES / "inference_server" / "meta" / "argument_specs.yml").read_text())
    assert specs["argument_specs"]["main"]["options"]["inference_server_textfile_dir"]["default"] == declared
    service = _tasks("service.yml")
    record = service[_task(service, "Record where the role marks")]["ansible.builtin.copy"]
    variables = {**infer_node_vars(2, 4), "inference_server_textfile_dir": "/srv/textfile"}
    assert render_value(env, record["dest"], variables) == stopped_mark.RECORD
    assert render_value(env, record["content"], variables).strip() == "/srv/textfile"


class ReplicaMetrics:
    """A replica's /metrics on loopback: vLLM's exposition with `running` requests in flight."""

    def __init__(self) -> None:
        import http.server

        self.running = 0
        replica = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = VLLM_METRICS.format(kv=0.1, waiting=0, done=1)
                body += f'vllm:num_requests_running{{engine="0",model_name="m"}} {replica.running}\n'
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body.encode())

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        serve_in_thread(self.server)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def agent_check_reply(port: int) -> str:
    """What HAProxy's agent check reads on connecting to the node's agent port."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        return connection.makefile().readline()


LIFECYCLE_ACTION = {
    "LifecycleHookName": "gpuplat-drain",
    "AutoScalingGroupName": "aws-prod-infer-asg",
    "LifecycleActionResult": "CONTINUE",
    "InstanceId": "i-0infer",
}


def test_a_node_the_group_terminates_lets_go_only_once_its_requests_ended() -> None:
    """The group's termination hook holds the instance (its metadata: target-lifecycle-state
    Terminated); the agent drains it through the agent check, waits for its replicas' requests to end,
    then completes the lifecycle action, through the SDK's own stubber."""
    import threading

    import boto3  # type: ignore[import-untyped]
    from botocore.stub import Stubber  # type: ignore[import-untyped]

    from tests.box.imds import InstanceMetadata

    agent = scaling_agent()
    instance = {"InstanceId": "i-0infer", "Tags": []}
    metadata = InstanceMetadata(lambda address: instance, port=0, address="127.0.0.1")
    replica = ReplicaMetrics()
    check = agent.AgentCheck(0, "127.0.0.1")
    autoscaling = boto3.client(
        "autoscaling", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    try:
        endpoint = f"http://127.0.0.1:{metadata.server.server_address[1]}"
        assert not agent.leaving(endpoint)  # no lifecycle transition yet: EC2 answers 404
        metadata.transition("i-0infer", "InService")
        assert not agent.leaving(endpoint) and agent.wait_or_leave(0.3, endpoint, poll_s=0.1) is None
        metadata.transition("i-0infer", "Terminated")
        why = agent.wait_or_leave(5.0, endpoint, poll_s=0.1)
        assert agent.leaving(endpoint) and why is not None and why.held_by_hook

        replica.running = 2
        threading.Timer(0.6, lambda: setattr(replica, "running", 0)).start()
        drain = agent.Drain("gpuplat-drain", grace_s=0.1, timeout_s=10.0, poll_s=0.05)
        plan = agent.Leaving(drain, "aws-prod-infer-asg", [replica.url], endpoint, check, autoscaling)
        assert agent_check_reply(check.port) == "up\n"
        with Stubber(autoscaling) as stub:
            stub.add_response("complete_lifecycle_action", {}, LIFECYCLE_ACTION)
            started = time.monotonic()
            left = agent.leave(plan, why)
            stub.assert_no_pending_responses()
        assert left == 0 and time.monotonic() - started >= 0.6  # not before the requests ended
        assert agent_check_reply(check.port) == "drain\n"

        replica.running = 1  # a request that never ends: the agent lets go at its timeout
        short = agent.Leaving(
            agent.Drain("gpuplat-drain", grace_s=0.0, timeout_s=0.3, poll_s=0.05),
            "aws-prod-infer-asg",
            [replica.url],
            endpoint,
            autoscaling=autoscaling,
        )
        with Stubber(autoscaling) as stub:
            stub.add_response("complete_lifecycle_action", {}, LIFECYCLE_ACTION)
            assert agent.leave(short, why) == 1
            stub.assert_no_pending_responses()
    finally:
        check.close()
        replica.stop()
        metadata.stop()


def test_a_spot_interruption_drains_the_node_through_the_agent_check() -> None:
    """EC2's notice in the instance metadata (spot/instance-action: 404 until then, then the action and
    its time, about two minutes ahead): the agent answers "drain" to the gateways' agent check at once,
    waits for its replicas' requests to end, and completes the group's hook only once the group holds
    the instance (target lifecycle state Terminated), never before."""
    import datetime
    import threading

    import boto3
    from botocore.stub import Stubber

    from tests.box.imds import InstanceMetadata

    agent = scaling_agent()
    instance = {"InstanceId": "i-0infer", "Tags": []}
    metadata = InstanceMetadata(lambda address: instance, port=0, address="127.0.0.1")
    replica = ReplicaMetrics()
    check = agent.AgentCheck(0, "127.0.0.1")
    autoscaling = boto3.client(
        "autoscaling", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    try:
        endpoint = f"http://127.0.0.1:{metadata.server.server_address[1]}"
        metadata.transition("i-0infer", "InService")
        assert agent.spot_interruption(endpoint) is None  # 404: no notice
        assert agent.wait_or_leave(0.3, endpoint, poll_s=0.1) is None
        when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=2)
        metadata.interrupt("i-0infer", when)
        why = agent.wait_or_leave(5.0, endpoint, poll_s=0.1)
        assert why is not None and not why.held_by_hook
        assert why.reason == f"spot terminate at {when.strftime('%Y-%m-%dT%H:%M:%SZ')}"

        replica.running = 1
        threading.Timer(0.5, lambda: setattr(replica, "running", 0)).start()
        threading.Timer(1.0, lambda: metadata.transition("i-0infer", "Terminated")).start()
        plan = agent.Leaving(
            agent.Drain("gpuplat-drain", grace_s=0.0, timeout_s=10.0, poll_s=0.05),
            "aws-prod-infer-asg",
            [replica.url],
            endpoint,
            check,
            autoscaling,
        )
        with Stubber(autoscaling) as stub:
            stub.add_response("complete_lifecycle_action", {}, LIFECYCLE_ACTION)
            started = time.monotonic()
            assert agent.leave(plan, why, poll_s=0.05) == 0
            stub.assert_no_pending_responses()
        assert time.monotonic() - started >= 1.0  # completed once the group held the instance
        assert agent_check_reply(check.port) == "drain\n"
    finally:
        check.close()
        replica.stop()
        metadata.stop()


def test_the_agent_program_answers_drain_once_a_spot_notice_appears() -> None:
    """The agent as its unit runs it (main(), --agent-port): its loop watches the instance metadata and
    its agent check turns from "up" to "drain" once EC2 posts the notice; the functions alone proving
    it would leave a loop that never looks untested."""
    import datetime
    import socket
    import subprocess

    from tests.box.imds import InstanceMetadata

    instance = {"InstanceId": "i-0infer", "Tags": []}
    metadata = InstanceMetadata(lambda address: instance, port=0, address="127.0.0.1")
    replica = ReplicaMetrics()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    endpoint = f"http://127.0.0.1:{metadata.server.server_address[1]}"
    program = ROLES / "inference_server" / "files" / "gpuplat_scaling_agent.py"
    process = subprocess.Popen(
        [
            sys.executable,
            str(program),
            "--dry-run",
            "--asg",
            "aws-prod-infer-asg",
            "--interval",
            "1",
            "--metrics-url",
            replica.url,
            "--imds-endpoint",
            endpoint,
            "--agent-port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def reply() -> str:
        try:
            return agent_check_reply(port)
        except OSError:
            return ""

    try:
        deadline = time.monotonic() + 10
        while reply() != "up\n" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert reply() == "up\n"
        time.sleep(1.5)  # a pass of the loop with no notice (404) changes nothing
        assert reply() == "up\n" and process.poll() is None
        metadata.interrupt("i-0infer", datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=2))
        deadline = time.monotonic() + 10  # the loop looks every 5 s (EC2's advice)
        while reply() != "drain\n" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert reply() == "drain\n"
    finally:
        process.kill()
        _, errors = process.communicate(timeout=10)
        replica.stop()
        metadata.stop()
    assert "this instance is leaving: spot terminate at " in errors


def test_the_agent_completes_the_hook_the_group_declares() -> None:
    from infra.backends.aws.node_pool import DRAIN_HOOK

    variables = infer_node_vars(replicas=1, tp=1)
    variables.update(
        gpuplat_backend="aws",
        inference_server_scaling_asg_name="",
        inference_server_scaling_region="us-east-1",
    )
    variables = role_vars("inference_server", variables)
    for name in ("inference_server_lifecycle_hook", "inference_server_drain_timeout_s"):  # templated defaults
        variables[name] = environment().from_string(variables[name]).render(**variables)
    unit = render(ROLES / "inference_server" / "templates" / "gpuplat-scaling-agent.service.j2", variables)
    assert f"--lifecycle-hook {DRAIN_HOOK} " in unit.replace("\\\n", " ")
    assert "--drain-timeout-s 60" in unit  # the gateway's request timeout (inventory: 60 s)
    # The port the gateways' agent check asks (roles/inference_gateway) is the one the agent answers on,
    # and the one the infer nodes' security group opens to the gateways.
    from infra.backends.aws.network import NODE_AGENT_PORT

    assert defaults("inference_gateway")["inference_gateway_agent_port"] == NODE_AGENT_PORT
    assert f" --agent-port {NODE_AGENT_PORT} " in unit.replace("\\\n", " ")


def test_the_registry_runs_no_server_side_jobs_unless_asked() -> None:
    """MLflow's server starts a job runner and four huey consumers by default (each a Python process with
    MLflow imported); the registry uses none of their jobs."""
    unit = ROLES / "model_registry" / "templates" / "gpuplat-registry.service.j2"
    variables = {
        **defaults("model_registry"),
        "__model_registry_venv": "/opt/gpuplat-registry/venv",
        "__model_registry_artifacts_dir": "/shared/registry/artifacts",
    }
    assert "Environment=MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false\n" in render(unit, variables)
    variables["model_registry_job_execution"] = True
    assert "Environment=MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true\n" in render(unit, variables)


def test_the_canary_backend_routes_to_each_model_server_nodes_canary_slot() -> None:
    variables = role_vars("inference_gateway", cluster(replicas=4, tp=2))
    tasks = yaml.safe_load((ROLES / "inference_gateway" / "tasks" / "preflight.yml").read_text())
    expression = tasks[0]["ansible.builtin.set_fact"]["__inference_gateway_canary_backends"]
    canary = list(ast.literal_eval(environment().from_string(expression).render(**variables).strip()))
    assert canary == [{"name": f"{INFER_HOST}-canary", "address": "10.40.2.21", "port": 8100}]
    assert defaults("inference_server")["inference_server_canary_port"] == 8100
    config = render(
        ROLES / "inference_gateway" / "templates" / "haproxy.cfg.j2",
        {
            **variables,
            "__inference_gateway_backends": gateway_backends(variables),
            "__inference_gateway_canary_backends": canary,
        },
    )
    backend = config.split("backend inference_canary", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^\s+server (\S+) (\S+)$", backend, re.MULTILINE) == [
        (f"{INFER_HOST}-canary", "10.40.2.21:8100")
    ]


@pytest.mark.parametrize("engine", ["vllm", "cpu-reference"])
def test_a_replica_serves_what_its_version_file_names_else_the_stacks_model(engine: str) -> None:
    variables = infer_node_vars(replicas=2, tp=4)
    if engine == "cpu-reference":
        variables.update(inference_engine=engine, inference_model="sentence-transformers/all-MiniLM-L6-v2")
    unit = render(ROLES / "inference_server" / "templates" / "gpuplat-inference@.service.j2", variables)
    lines = unit.splitlines()
    version_file = lines.index("EnvironmentFile=-/etc/gpuplat-inference/version-%i.env")
    default = next(
        i for i, line in enumerate(lines) if line.startswith("Environment=") and "GPUPLAT_MODEL_" in line
    )
    # systemd.exec(5): settings from an EnvironmentFile override Environment= lines, wherever they stand.
    assert default < version_file
    if engine == "vllm":
        assert lines[default] == "Environment=GPUPLAT_MODEL_PATH=/lustre/models/Llama-3.1-70B-Instruct"
        assert any(line.endswith("/bin/vllm serve ${GPUPLAT_MODEL_PATH} \\") for line in lines)
    else:
        assert lines[default] == 'Environment="GPUPLAT_MODEL_ARGS=--model-package all_minilm_l6_v2"'
        # Unbraced: systemd splits the value at whitespace into separate arguments.
        assert "  $GPUPLAT_MODEL_ARGS \\" in lines


def stopped_marks_refused(variables: dict[str, Any]) -> list[str]:
    """The conditions of inference_server's preflight check of the stopped marks' directory that fail."""
    tasks = yaml.safe_load((ROLES / "inference_server" / "tasks" / "preflight.yml").read_text())
    check = next(t for t in tasks if t["name"] == "Check the stopped marks go where node_exporter reads them")
    env = environment()
    return [
        condition
        for condition in check["ansible.builtin.assert"]["that"]
        if env.from_string("{{ (" + condition + ") }}").render(**variables) != "True"
    ]


@pytest.mark.parametrize(
    ("mine", "node_exporters", "refused"),
    [
        ("/var/lib/prometheus/node-exporter", None, False),
        ("/var/lib/prometheus/node-exporter", "/var/lib/prometheus/node-exporter", False),
        ("/var/lib/prometheus/node-exporter", "/srv/textfiles", True),  # marks where nothing reads them
        ("var/lib/prometheus/node-exporter", None, True),  # relative
        ("/var/lib/node exporter", None, True),  # a blank splits the marking command's words
        ("/srv/a%qb", None, True),  # systemd-tmpfiles reads % as a specifier: the boot removal fails
        ("/srv/text*", None, True),  # a glob in the directory the marking command tests with [ -d ]
    ],
)
def test_the_stopped_marks_directory_must_be_the_one_node_exporter_reads(
    mine: str, node_exporters: str | None, refused: bool
) -> None:
    variables: dict[str, Any] = {"inference_server_textfile_dir": mine}
    if node_exporters is not None:
        variables["node_exporter_textfile_dir"] = node_exporters
    assert bool(stopped_marks_refused(variables)) is refused, stopped_marks_refused(variables)
