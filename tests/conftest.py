from __future__ import annotations

import copy
import importlib.util
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from infra.k8s.facts import ClusterFacts, SharedVolume
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import CONFIG_KEY, stack_file

FIXTURES = Path(__file__).parent / "fixtures"

pytest_plugins = [
    "tests.skip_policy",
    "tests.cpu_report",
    "tests.long_first",
    "tests.xdist_workers",
    "pytester",
]


@pytest.fixture(autouse=True)
def no_unforeseen_crash(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The CLI's crash logs go to a directory of the test's own, and a test fails when the CLI it ran
    crashed (wrote a crash log), even if its exit code looked right. A test that wants a crash points
    XDG_STATE_HOME elsewhere itself."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    yield
    logs = sorted((state / "gpuplat" / "logs").glob("gpuplat-crash-*.log"))
    assert not logs, "the CLI crashed (a gpuplat bug):\n" + logs[0].read_text()[-2000:] if logs else ""


class CountedPace:
    """The retries' clock in tests (infra/k8s/api_retry.py Pace): a wait advances it and is counted, nothing
    sleeps; the jitter is its middle."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        return self.now

    def draw(self) -> float:
        return 0.5


@pytest.fixture(autouse=True)
def api_retries_sleep_not(monkeypatch: pytest.MonkeyPatch) -> CountedPace:
    """Every Kubernetes API client a test makes waits between its retries by a counted clock, not the
    real one; a test that reads the waits asks for this fixture."""
    from infra.k8s import api_retry

    counted = CountedPace()
    monkeypatch.setattr(
        api_retry,
        "default_pace",
        lambda: api_retry.Pace(counted.sleep, counted.monotonic, counted.draw),
    )
    return counted


def stack_document(name: str) -> dict[str, Any]:
    return yaml.safe_load(stack_file(name).read_text())


@pytest.fixture
def write_stack(tmp_path: Path) -> Callable[..., Path]:
    """Write a variant of a shipped stack: `mutate` edits the platform mapping in place."""

    def write(base: str, mutate: Callable[[dict[str, Any]], None], name: str = "variant") -> Path:
        document = copy.deepcopy(stack_document(base))
        mutate(document["config"][CONFIG_KEY])
        path = tmp_path / f"Pulumi.{name}.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        return path

    return write


@pytest.fixture(scope="session")
def shipped_platforms() -> dict[str, ResolvedPlatform]:
    return {
        name: load_platform(stack_file(name))
        for name in ("local", "aws-prod", "onprem", "aws-k8s", "onprem-k8s")
    }


def fsx_facts(cluster_name: Any = "aws-k8s") -> ClusterFacts:
    """What an EKS stack knows of its cluster once AWS created it (an FSx file system, the cluster name)."""
    volume = SharedVolume(
        "fsx-csi",
        "/fsx",
        48,
        {"file_system_id": "fs-0123456789abcdef0", "dns_name": "fs-0123.fsx.example", "mount_name": "abcdef"},
    )
    return ClusterFacts(shared_volume=volume, cluster_name=cluster_name, region="us-east-1")


ROOT = Path(__file__).resolve().parents[1]


def load_script(path: Path) -> ModuleType:
    """A stand-alone program (an example, a node program) imported as a module named after its path in the
    repository (`roles.slurm_compute.files.gpuplat_dataset_cache`): the name mutmut gives the functions it
    mutates there, by which it matches them to the tests that call them (scripts/mutation/run.py)."""
    name = ".".join(path.resolve().relative_to(ROOT).with_suffix("").parts)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as an import does: dataclasses resolve their annotations there.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def empty_moto_account(endpoint: str) -> None:
    """Every resource of every moto backend of this process gone (moto's POST /moto-api/reset: moto 5.2.6
    moto/moto_api/_internal/urls.py line 13, responses.py reset_response). moto's backends are one per
    process, whichever server asks them: instances a test of another module left running on the same
    xdist worker are otherwise found by a test that lists a stack's instances."""
    reset = urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(reset, timeout=10).close()


def moto_image(ec2: Any) -> str:
    """An AMI to launch test instances from, registered by the test (moto's register_image): listing
    moto's own to pick one (`describe_images(Owners=["amazon"])`: 1,366 AMIs in moto 5.2.6, from its
    moto/ec2/resources/amis.json.gz and latest_amis/) cost 0.7 to 1.7 CPU-s a call, the server rendering
    them and botocore parsing them, against 5 ms for this."""
    return str(ec2.register_image(Name="gpuplat-test-node", RootDeviceName="/dev/xvda")["ImageId"])


def launch_tagged(ec2: Any, **tags: str) -> tuple[str, str]:
    """A running instance of the test's own image with these tags: its id and private address."""
    specification = {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
    [instance] = ec2.run_instances(
        ImageId=moto_image(ec2),
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[specification],
    )["Instances"]
    return str(instance["InstanceId"]), str(instance["PrivateIpAddress"])
