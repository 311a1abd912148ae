"""`gpuplat serve` on an AWS stack (issue 48, "every backend"): its nodes are the stack's running instances,
found by their tags as Ansible's inventory finds them and reached through SSM (infra/serving/reach.py); the
stable version is kept in an SSM parameter that an inference instance booted later reads
(infra/serving/version_record.py, infra/backends/aws/node_join.py). EC2 and SSM are moto's server (its
parameters and instances; what the SSM agent runs on a node is not modelled here: the commands' arrival is
tests/unit/test_serve_reach.py's, with botocore's Stubber). Not modelled: IAM (moto allows every call; the
policy is checked in tests/pulumi/test_aws_serving_record.py), an instance's real boot."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.backends.aws.bootstrap import serving_version_parameter
from infra.backends.aws.node_join import JoinSettings, serve_recorded_version
from infra.errors import ExitCode, GpuPlatError
from infra.nodes.remote import SsmNodes
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.serving.reach import stack_reach
from infra.serving.registry.mlflow import ModelVersion, to_wire_source
from infra.serving.release import Release, ServeRefused, ServingLayout, serving_layout, version_environment
from infra.serving.version_record import VersionRecord
from infra.spec.models import Canary
from tests.conftest import launch_tagged as launch
from tests.unit.test_hostile_input import run_cli
from tests.unit.test_serving_release import CutShortNodes, RecordingNodes, _at

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

STACK = "aws-serve"


@pytest.fixture
def aws_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """moto's server; boto3's default clients (the CLI's) reach it through AWS_ENDPOINT_URL."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    for key, value in {
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_ENDPOINT_URL": url,
    }.items():
        monkeypatch.setenv(key, value)
    yield url
    server.stop()


def client(service: str, url: str) -> Any:
    return boto3.client(service, region_name="us-east-1", endpoint_url=url)


@pytest.fixture
def aws_stack(write_stack: Callable[..., Path], request: pytest.FixtureRequest) -> Path:
    """A stack of its own per test (moto's EC2 is one per process: the instances of other tests stay)."""
    name = f"{STACK}-{abs(hash(request.node.name)) % 10**6}"

    def renamed(platform: dict[str, Any]) -> None:
        platform["name"] = name
        platform["serving"]["registry"] = {}
        # The CPU reference server, as the serving scenario runs (the shipped stack's vLLM: below).
        platform["serving"]["engine"] = "cpu-reference"

    return write_stack("aws-prod", renamed, name=name)


@pytest.mark.parametrize("command", [("status", "embedder"), ("rollback", "embedder")])
def test_a_vllm_stack_on_aws_is_served_status_and_rollback_needing_no_free_gpu(
    aws_url: str, write_stack: Callable[..., Path], command: tuple[str, ...]
) -> None:
    """The shipped aws-prod stack serves vLLM on g6e.xlarge (one GPU, one replica per node): `serve` refused
    it before any command ("no GPU left for a canary"), status and rollback included. Now its canary
    borrows a replica's GPUs and every command goes on to the stack's nodes (moto's SSM runs no agent: its
    answer is empty, exit 4)."""
    name = f"{STACK}-vllm-{command[0]}"

    def with_registry(platform: dict[str, Any]) -> None:
        platform["name"] = name
        platform["serving"]["registry"] = {}

    stack = write_stack("aws-prod", with_registry, name=name)
    platform = load_platform(stack)
    ec2 = client("ec2", aws_url)
    launch(ec2, **{"gpuplat:stack": name, "gpuplat:node": "head-0", "gpuplat:pool": "head"})
    for _ in range(2):
        launch(ec2, **{"gpuplat:stack": name, "gpuplat:pool": "infer"})
    reach = stack_reach(platform, ec2, client("ssm", aws_url))
    assert serving_layout(platform, reach.instances).canary_gpus == "borrow"
    run = run_cli("serve", *command, "--stack-file", str(stack), "--registry-url", "http://127.0.0.1:9")
    assert "no GPU left" not in run.err and "Traceback" not in run.err, run.err
    assert run.code == 4 and "head-0's answer through SSM is empty" in run.err, (run.code, run.err)


def test_an_aws_stack_is_served_on_its_running_instances_through_ssm(aws_url: str, aws_stack: Path) -> None:
    """The gateways are the gateway pool's running instances (by gpuplat:node), the model servers the
    serving pool's (an Auto Scaling group's: by instance id), each by the private address the gateways'
    slots route to; another stack's and another pool's instances are not touched."""
    platform = load_platform(aws_stack)
    ec2 = client("ec2", aws_url)
    stack = {"gpuplat:stack": platform.name}
    for head in ("head-0", "head-1"):
        launch(ec2, **stack, **{"gpuplat:node": head, "gpuplat:pool": "head"})
    servers = dict(launch(ec2, **stack, **{"gpuplat:pool": "infer"}) for _ in range(2))
    launch(ec2, **stack, **{"gpuplat:node": "train-0", "gpuplat:pool": "train"})
    launch(ec2, **{"gpuplat:stack": "other", "gpuplat:pool": "infer"})
    reach = stack_reach(platform, ec2, client("ssm", aws_url))
    layout = serving_layout(platform, reach.instances)
    assert layout.gateways == ("head-0", "head-1")
    assert sorted(layout.servers) == sorted(servers)
    # The servers by the address the gateways' slots route to, the gateways by the one their detached guard's
    # followers reach the first at (infra/serving/guard_peers.py).
    assert {node: layout.addresses[node] for node in layout.servers} == servers
    assert set(layout.addresses) == {*servers, "head-0", "head-1"} and all(layout.addresses.values())
    assert layout.slots_follow_instances and layout.versions_from_object_store
    assert isinstance(reach.nodes, SsmNodes) and set(layout.servers) < set(reach.nodes.instances)
    assert (
        reach.version_record is not None
        and reach.version_record.name == f"/gpuplat/{platform.name}/serving/version"
    )


def test_an_aws_stack_without_a_running_model_server_is_refused_in_one_paragraph(
    aws_url: str, aws_stack: Path
) -> None:
    ec2 = client("ec2", aws_url)
    name = load_platform(aws_stack).name
    launch(ec2, **{"gpuplat:stack": name, "gpuplat:node": "head-0", "gpuplat:pool": "head"})
    run = run_cli(
        "serve", "status", "embedder", "--stack-file", str(aws_stack), "--registry-url", "http://127.0.0.1:9"
    )
    assert run.code == ExitCode.POLICY_VIOLATION, (run.code, run.err)
    assert run.err.startswith(f"error: stack '{name}' has no running instance of its pool 'infer'"), run.err
    assert run.clean and "Traceback" not in run.err


MODELS_BUCKET = "aws-serve-models"


def embedder(number: int) -> ModelVersion:
    """A version registered from the stack's models bucket (on aws the model servers copy it from there)."""
    return ModelVersion("embedder", number, f"s3://{MODELS_BUCKET}/embedder/{number}", "READY")


@pytest.fixture
def copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the nodes keep their copies of object-store versions: under the test's directory."""
    folder = tmp_path / "versions"
    monkeypatch.setattr("infra.serving.release.VERSIONS_DIR", str(folder))
    return folder


def upload(s3: Any, number: int) -> None:
    """embedder@NUMBER in the models bucket: a model folder of two files."""
    s3.create_bucket(Bucket=MODELS_BUCKET)
    for name, body in (("config.json", b"{}"), ("weights/model.safetensors", b"weights")):
        s3.put_object(Bucket=MODELS_BUCKET, Key=f"embedder/{number}/{name}", Body=body)


def release_on(nodes: RecordingNodes, record: VersionRecord, aliases: dict[str, ModelVersion]) -> Release:
    """A release of an AWS stack's infer-0 (two gateways), its registry's aliases `aliases`."""
    release = object.__new__(Release)
    release.nodes = nodes
    release.rules = Canary()
    release.say = lambda line: None
    release.layout = ServingLayout(
        ("gw-0", "gw-1"),
        ("infer-0",),
        {"infer-0": "10.0.3.7"},
        "vllm",
        1.0,
        slots_follow_instances=True,
        versions_from_object_store=True,
    )
    release.version_record = record
    release.aliased = lambda model, alias: aliases.get(alias)  # type: ignore[method-assign]
    release._wait_healthy = lambda node, port: None  # type: ignore[method-assign]

    class Registry:
        def set_alias(self, model: str, alias: str, number: int) -> None:
            aliases[alias] = embedder(number)

        def delete_alias(self, model: str, alias: str) -> None:
            aliases.pop(alias, None)

    release.registry = Registry()  # type: ignore[assignment]
    return release


class OrderedRecord(VersionRecord):
    """The version record, noting in the nodes' command list when it was written."""

    def __init__(self, ssm: Any, nodes: RecordingNodes) -> None:
        super().__init__(STACK, ssm)
        self.nodes = nodes

    def write(self, environment: str | None) -> None:
        self.nodes.done.append(("record", ("write", environment or "")))
        super().write(environment)


def boot(ssm: Any, directory: Path, replicas: int, s3: Any = None) -> dict[str, str]:
    """An inference instance the group starts now: the version files its boot writes before Ansible runs."""
    settings = JoinSettings(
        stack=STACK, region="us-east-1", bucket="b", bundle_key="k", group_vars_key="g", munge_parameter="",
        node_name="", name_wait_s=1, fetch_wait_s=1, work=directory / "work",
        serving_parameter=serving_version_parameter(STACK), serving_replicas=replicas, serving_dir=directory,
    )  # fmt: skip
    serve_recorded_version(settings, ssm, s3)
    return {path.name: path.read_text() for path in sorted(directory.glob("version-*.env"))}


def test_an_instance_started_after_a_promote_serves_the_promoted_version(
    aws_url: str, tmp_path: Path, copies: Path
) -> None:
    """The record is written before the first replica restarts (an instance booted while they roll serves
    the version they roll to) and holds the very file the promote wrote on the running replicas; each
    running node copied the version from the models bucket before its replicas took it, and a new
    instance's boot copies it the same way and writes the file for each of its replicas."""
    ssm, s3 = client("ssm", aws_url), client("s3", aws_url)
    upload(s3, 3)
    nodes = RecordingNodes(replicas=2, share=20)
    record = OrderedRecord(ssm, nodes)
    aliases = {"champion": embedder(2), "challenger": embedder(3)}
    assert boot(ssm, tmp_path / "before", 2, s3) == {}  # no record: the stack's own model, no version file
    release_on(nodes, record, aliases).promote("embedder")
    promoted = version_environment(embedder(3), "vllm", object_store=True)
    local = f"{copies}/embedder/3"
    assert promoted.splitlines()[1:] == [
        f"# gpuplat source: s3://{MODELS_BUCKET}/embedder/3 {local}",
        f"GPUPLAT_MODEL_PATH={local}",
    ]
    [written] = _at(nodes, "record", "write")
    first_restart = _at(nodes, "infer-0", "systemctl restart")[0]
    assert written < first_restart and nodes.done[written][1][1] == promoted
    # Each running node copies the version (the role's AWS CLI) before a replica of it restarts on it.
    copied = _at(nodes, "infer-0", "s3 sync", f"s3://{MODELS_BUCKET}/embedder/3", local)
    assert copied and copied[0] < first_restart
    # What the promote wrote on the running replicas, and what the new instance writes for its own.
    on_replicas = {c[-2] for n, c in nodes.done if n == "infer-0" and c[-1].endswith("version-0.env")}
    assert on_replicas == {promoted}
    assert boot(ssm, tmp_path / "after", 2, s3) == {"version-0.env": promoted, "version-1.env": promoted}
    assert (copies / "embedder/3/config.json").read_text() == "{}"
    assert (copies / "embedder/3/weights/model.safetensors").read_bytes() == b"weights"
    assert Release.booted_version(release_on(nodes, record, aliases)) == "embedder@3"


def test_a_rollback_of_a_promote_cut_short_records_the_champion_again(
    aws_url: str, tmp_path: Path, copies: Path
) -> None:
    """A promote killed mid-roll left the record on the candidate (written first); the rollback that puts
    every replica back on the champion puts the record back too, before any replica restarts."""
    ssm, s3 = client("ssm", aws_url), client("s3", aws_url)
    upload(s3, 2)
    nodes = CutShortNodes()
    record = OrderedRecord(ssm, nodes)
    record.write(version_environment(embedder(3), "vllm", object_store=True))
    aliases = {"champion": embedder(2), "challenger": embedder(3)}
    release_on(nodes, record, aliases).rollback("embedder")
    champion = version_environment(embedder(2), "vllm", object_store=True)
    assert ssm.get_parameter(Name=record.name)["Parameter"]["Value"] == champion
    written = _at(nodes, "record", "write")[-1]  # the rollback's (the first: the promote cut short)
    assert written < _at(nodes, "infer-0", "systemctl restart")[0]
    assert boot(ssm, tmp_path, 1, s3) == {"version-0.env": champion}


def test_a_rollback_to_the_stacks_own_model_removes_the_record(aws_url: str, tmp_path: Path) -> None:
    ssm = client("ssm", aws_url)
    nodes = RecordingNodes(replicas=1, share=0)
    record = OrderedRecord(ssm, nodes)
    record.write(version_environment(embedder(3), "vllm", object_store=True))
    release = release_on(nodes, record, {"challenger": embedder(3)})
    release.rollback("embedder")
    assert record.read() is None and boot(ssm, tmp_path, 1) == {}
    assert release.booted_version() == ""  # `serve status`: a new instance serves the stack's own model
    record.write(None)  # again: nothing to delete is no error


def test_on_aws_a_version_on_the_shared_filesystem_is_refused_before_any_change() -> None:
    """The AWS inference nodes mount no shared filesystem: a version registered at a path is refused,
    saying where to register it from."""
    shared = ModelVersion("embedder", 3, to_wire_source("/shared/models/embedder/3"), "READY")
    with pytest.raises(ServeRefused, match=r"on aws the model servers mount no shared filesystem"):
        version_environment(shared, "vllm", object_store=True)
    # A key of the bucket that would land outside the node's copy is refused at boot, not written.
    from infra.backends.aws.node_join import BootError, copy_version

    class Listing:
        def get_paginator(self, name: str) -> Listing:
            return self

        def paginate(self, **_: Any) -> list[dict[str, Any]]:
            return [{"Contents": [{"Key": "embedder/3/../../etc/cron.d/x"}]}]

    with pytest.raises(BootError, match="would land outside"):
        copy_version(Listing(), "s3://b/embedder/3", Path("/nonexistent/copy"))


def test_a_record_that_cannot_be_written_stops_before_any_replica_and_says_what_is_needed() -> None:
    from botocore.stub import Stubber

    ssm = boto3.client("ssm", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")
    nodes = RecordingNodes(replicas=2, share=20)
    with Stubber(ssm) as stub:
        stub.add_client_error(
            "put_parameter", "AccessDeniedException", "not authorized to perform ssm:PutParameter"
        )
        with pytest.raises(GpuPlatError) as failed:
            release_on(nodes, VersionRecord(STACK, ssm), {"challenger": embedder(3)}).promote("embedder")
    message = failed.value.message
    assert message.startswith(f"cannot write the stack's version record (SSM parameter /gpuplat/{STACK}/")
    assert "ssm:PutParameter" in message and "\n" not in message
    assert not _at(nodes, "infer-0", "systemctl restart")


def test_a_boot_that_cannot_read_the_record_fails_rather_than_serve_another_version(tmp_path: Path) -> None:
    from botocore.stub import Stubber

    from infra.backends.aws.node_join import BootError

    ssm = boto3.client("ssm", region_name="us-east-1", aws_access_key_id="t", aws_secret_access_key="t")
    with Stubber(ssm) as stub, pytest.raises(BootError, match="cannot read the version record"):
        stub.add_client_error("get_parameter", "AccessDeniedException", "denied")
        boot(ssm, tmp_path, 1)


def test_kubernetes_stacks_have_no_node_layout_their_release_goes_through_the_api(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    for stack in ("aws-k8s", "onprem-k8s"):
        platform = shipped_platforms[stack]
        if platform.spec.serving is None:
            continue
        with pytest.raises(GpuPlatError, match="drives through the cluster's API"):
            serving_layout(platform)


def test_serving_layout_on_aws_needs_the_running_instances(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    with pytest.raises(GpuPlatError, match="its running instances"):
        serving_layout(shipped_platforms["aws-prod"])
    with pytest.raises(ServeRefused, match="no running instance of its pool 'infer'"):
        serving_layout(shipped_platforms["aws-prod"], [])


def test_a_canary_started_on_aws_gets_its_slots_at_once_on_every_gateway() -> None:
    """The slots follow the instances on a timer; `deploy` runs one pass of the targets unit on each gateway
    once the canaries answer, before taking them out of drain, instead of waiting up to a timer's period."""
    nodes = RecordingNodes(replicas=1, share=0)
    release = release_on(nodes, VersionRecord(STACK, object()), {})
    release.start_canary(embedder(3))
    for gateway in ("gw-0", "gw-1"):
        [filled] = _at(nodes, gateway, "systemctl start gpuplat-gateway-targets.service")
        assert filled < _at(nodes, gateway, "--backend inference_canary ready", "10.0.3.7:8100")[0]
    assert _at(nodes, "infer-0", "systemctl restart", "@canary.service")[0] < filled


def test_an_instance_started_during_a_release_is_rolled_by_its_promote(aws_url: str, aws_stack: Path) -> None:
    """A guard carries a release through its steps for many minutes; an instance the Auto Scaling group
    starts meanwhile boots on the record of that moment (the champion). The promote lists the instances
    again once it wrote the record: the new one's replicas are rolled with the others, and the SSM nodes
    reach it (without that it kept the champion for good, while the record named the candidate)."""
    platform = load_platform(aws_stack)
    ec2, ssm = client("ec2", aws_url), client("ssm", aws_url)
    stack = {"gpuplat:stack": platform.name}
    launch(ec2, **stack, **{"gpuplat:node": "head-0", "gpuplat:pool": "head"})
    first, _ = launch(ec2, **stack, **{"gpuplat:pool": "infer"})
    reach = stack_reach(platform, ec2, ssm)
    nodes = RecordingNodes(replicas=1, share=20)
    release = release_on(
        nodes, VersionRecord(platform.name, ssm), {"champion": embedder(2), "challenger": embedder(3)}
    )
    release.platform = platform
    release.layout = serving_layout(platform, reach.instances)
    release.relist = reach.relist
    assert release.layout.servers == (first,)
    joined, _ = launch(ec2, **stack, **{"gpuplat:pool": "infer"})  # a scale-out while the canary is judged
    release.promote("embedder")
    assert _at(nodes, joined, "systemctl restart") and _at(nodes, first, "systemctl restart")
    assert isinstance(reach.nodes, SsmNodes) and {first, joined} <= set(reach.nodes.instances)


def test_the_boot_fetch_of_an_inference_node_writes_the_recorded_version(
    aws_url: str, tmp_path: Path, copies: Path
) -> None:
    """node_join.fetch, as an instance's boot runs it (boto3's default clients): after the bundle, the
    record's version is copied and its file written for each replica, before Ansible runs."""
    from infra.backends.aws import node_join

    ssm, s3 = client("ssm", aws_url), client("s3", aws_url)
    upload(s3, 3)
    s3.create_bucket(Bucket="boot")
    s3.put_object(Bucket="boot", Key="g", Body=b"{}")
    s3.put_object(Bucket="boot", Key="k", Body=b"bundle")
    promoted = version_environment(embedder(3), "vllm", object_store=True)
    VersionRecord(STACK, ssm).write(promoted)
    settings = JoinSettings(
        stack=STACK, region="us-east-1", bucket="boot", bundle_key="k", group_vars_key="g",
        munge_parameter="", node_name="", name_wait_s=1, fetch_wait_s=1, work=tmp_path / "work",
        serving_parameter=serving_version_parameter(STACK), serving_replicas=2, serving_dir=tmp_path / "etc",
    )  # fmt: skip
    node_join.fetch(settings, sleep=lambda _: None)
    assert {p.name: p.read_text() for p in (tmp_path / "etc").glob("version-*.env")} == {
        "version-0.env": promoted,
        "version-1.env": promoted,
    }
    assert (copies / "embedder/3/config.json").read_text() == "{}"


def test_a_boot_whose_recorded_version_is_gone_from_the_bucket_fails(
    aws_url: str, tmp_path: Path, copies: Path
) -> None:
    """The record names a version whose objects were deleted (a bucket's lifecycle rule, a clean-up): the
    boot fails rather than start replicas on an empty folder. A version at the bucket's top is copied whole,
    as `aws s3 sync s3://BUCKET DIR` copies it on the running nodes."""
    from infra.backends.aws.node_join import BootError, copy_version

    ssm, s3 = client("ssm", aws_url), client("s3", aws_url)
    upload(s3, 3)
    VersionRecord(STACK, ssm).write(version_environment(embedder(4), "vllm", object_store=True))
    with pytest.raises(BootError, match="holds no object"):
        boot(ssm, tmp_path / "etc", 1, s3)
    assert not (tmp_path / "etc").exists()
    copy_version(s3, f"s3://{MODELS_BUCKET}", tmp_path / "whole")
    assert (tmp_path / "whole/embedder/3/config.json").read_text() == "{}"


def test_a_running_nodes_copy_of_a_version_gone_from_the_bucket_fails(tmp_path: Path) -> None:
    """The running nodes' copy (release.FETCH, through `sh -c`): `aws s3 sync` of a prefix with no object
    exits 0 having copied nothing; the copy fails then, before any replica restarts on an empty folder."""
    import subprocess

    from infra.serving.release import FETCH

    def fetch(sync: str, local: Path) -> int:
        cli = tmp_path / "aws"
        cli.write_text(f"#!/bin/sh\n{sync}\n")
        cli.chmod(0o755)
        return subprocess.run(
            ["sh", "-c", FETCH, "fetch", str(cli), "s3://b/embedder/4", str(local)]
        ).returncode

    assert fetch("exit 0", tmp_path / "gone") != 0
    # The CLI's arguments: s3 sync --only-show-errors SRC DST.
    assert fetch('mkdir -p "$5" && echo {} > "$5/config.json"', tmp_path / "there") == 0
    assert fetch("exit 1", tmp_path / "there") != 0


def test_the_golden_set_is_read_from_the_nodes_copy_of_an_object_store_version(copies: Path) -> None:
    """On aws the probe reads the version's golden set from each node's copy, not at its s3:// location (a
    path no node's python can open)."""
    from infra.serving.release import GOLDEN_FILE

    class NoGoldenSet(RecordingNodes):
        def exec(self, node: str, *command: str, timeout: float = 120) -> str:
            answer = super().exec(node, *command, timeout=timeout)
            return '{"absent": true}' if command[:2] == ("python3", "-c") else answer

    nodes = NoGoldenSet(replicas=1, share=0)
    release_on(nodes, VersionRecord(STACK, None), {}).probe_golden(embedder(3))
    [probe] = [c for n, c in nodes.done if n == "infer-0" and c[:2] == ("python3", "-c")]
    assert probe[3] == f"{copies}/embedder/3/{GOLDEN_FILE}"
