"""The boot script every AWS node runs: valid shell, and the one-host inventory Ansible really reads."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from infra.backends.aws import node_join
from infra.backends.aws.bootstrap import (
    POWER_OFF_STEP,
    USER_DATA_MAX_BYTES,
    BootScript,
    bundle_digest,
    bundle_key,
    node_inventory,
    serving_replicas,
    settings_digest,
)
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.defaults import os_release

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_INVENTORY = Path(sys.executable).parent / "ansible-inventory"


def _script(platform: ResolvedPlatform, pool: str, node_name: str = "") -> str:
    return BootScript(
        stack=platform.name,
        region="us-east-1",
        bucket="aws-prod-bootstrap-123",
        bundle_key=bundle_key(ROOT),
        inventory=node_inventory(platform, platform.pool(pool)),
        os_release=os_release(platform.spec),
        node_name=node_name,
        serving_replicas=serving_replicas(platform, platform.pool(pool)),
    ).render()


def test_the_serving_pools_nodes_boot_on_the_recorded_version(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """The serving pool's boot names the stack's version record and its replicas (node_join writes the
    record's version file for each before Ansible starts them); other pools read nothing of it."""
    platform = shipped_platforms["aws-prod"]
    settings = {
        pool: dict(
            line.split("=", 1)
            for line in _script(platform, pool).splitlines()
            if line.startswith("GPUPLAT_SERVING")
        )
        for pool in ("infer", "train")
    }
    assert settings["infer"] == {
        "GPUPLAT_SERVING_PARAMETER": "/gpuplat/aws-prod/serving/version",
        "GPUPLAT_SERVING_REPLICAS": "1",
        "GPUPLAT_SERVING_DIR": "/etc/gpuplat-inference",
    }
    assert (
        settings["train"]["GPUPLAT_SERVING_PARAMETER"] == "''"
        and settings["train"]["GPUPLAT_SERVING_REPLICAS"] == "0"
    )
    joined = node_join.JoinSettings.from_environment(
        {
            **{
                key: "x"
                for key in ("GPUPLAT_STACK", "GPUPLAT_REGION", "GPUPLAT_BUCKET", "GPUPLAT_BUNDLE_KEY")
            },
            **{key: "x" for key in ("GPUPLAT_GROUP_VARS_KEY", "GPUPLAT_MUNGE_PARAMETER", "GPUPLAT_WORK")},
            "GPUPLAT_NAME_WAIT_S": "1",
            "GPUPLAT_FETCH_WAIT_S": "1",
            **settings["infer"],
        }
    )
    assert (joined.serving_parameter, joined.serving_replicas, str(joined.serving_dir)) == (
        "/gpuplat/aws-prod/serving/version",
        1,
        "/etc/gpuplat-inference",
    )


def test_boot_script_is_valid_bash(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    script = _script(shipped_platforms["aws-prod"], "train-spot")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_the_node_is_alone_in_its_pool_and_role_groups(
    shipped_platforms: dict[str, ResolvedPlatform], tmp_path: Path
) -> None:
    script = _script(shipped_platforms["aws-prod"], "train-spot")
    start = script.index("cat >inventory.yml")
    end = script.index("\n", script.index('sed -i "s/'))
    subprocess.run(
        ["bash", "-c", script[start:end]], cwd=tmp_path, check=True, env={"NODE_NAME": "train-spot-3"}
    )
    listed = subprocess.run(
        [str(ANSIBLE_INVENTORY), "-i", str(tmp_path / "inventory.yml"), "--list"],
        capture_output=True,
        text=True,
        check=True,
    )
    inventory = json.loads(listed.stdout)
    assert inventory["pool_train_spot"]["hosts"] == ["train-spot-3"]
    for group in ("train", "slurm_compute", "gpu_nodes"):
        assert inventory[group]["children"] == ["pool_train_spot"]
    assert "slurm_controller" not in inventory
    host = inventory["_meta"]["hostvars"]["train-spot-3"]
    assert host["ansible_connection"] == "local" and host["gpuplat_pool"] == "train-spot"


def test_controllers_boot_under_their_fixed_name(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    assert "NODE_NAME=head-1\n" in _script(shipped_platforms["aws-prod"], "head", "head-1")


def test_bundle_digest_follows_the_roles(tmp_path: Path) -> None:
    for directory in ("playbooks", "roles/a/tasks"):
        (tmp_path / directory).mkdir(parents=True)
    (tmp_path / "playbooks/site.yml").write_text("---\n")
    (tmp_path / "roles/a/tasks/main.yml").write_text("---\n")
    before = bundle_digest(tmp_path)
    (tmp_path / "roles/a/tasks/main.yml").write_text("--- # changed\n")
    assert bundle_digest(tmp_path) != before


# --- the node side (infra/backends/aws/node_join.py) ------------------------------------------------


class FakeImds:
    """Instance metadata whose tags appear after `tag_after` reads of the tag list."""

    def __init__(self, tags: dict[str, str], tag_after: int = 0) -> None:
        self.tags = tags
        self.reads = 0
        self.tag_after = tag_after

    def get(self, path: str) -> str | None:
        if path == "instance-id":
            return "i-0123"
        if path == "tags/instance":
            self.reads += 1
            return "\n".join(self.tags) if self.reads > self.tag_after else "gpuplat:stack"
        return self.tags.get(path.removeprefix("tags/instance/"))


def _join_settings(
    tmp_path: Path, node_name: str = "", wait_s: float = 60, bundle_key: str = "bootstrap/x/bundle.zip"
) -> node_join.JoinSettings:
    return node_join.JoinSettings(
        stack="s", region="us-east-1", bucket="box-bucket", bundle_key=bundle_key,
        group_vars_key="bootstrap/group_vars/all.json", munge_parameter="/gpuplat/s/munge-key",
        node_name=node_name, name_wait_s=wait_s, fetch_wait_s=wait_s, work=tmp_path,
    )  # fmt: skip


def test_a_launched_node_waits_for_the_name_the_resume_program_tags_it_with(tmp_path: Path) -> None:
    imds = FakeImds({"gpuplat:stack": "s", "gpuplat:node": "train-3"}, tag_after=3)
    sleeps: list[float] = []
    assert node_join.node_name(_join_settings(tmp_path), imds, sleeps.append) == "train-3"  # type: ignore[arg-type]
    assert len(sleeps) == 3


def test_auto_scaling_instances_are_named_after_their_id(tmp_path: Path) -> None:
    imds = FakeImds({"aws:autoscaling:groupName": "g"})
    assert node_join.node_name(_join_settings(tmp_path), imds, lambda _: None) == "i-0123"  # type: ignore[arg-type]


def test_a_node_never_tagged_gives_up_with_the_reason(tmp_path: Path) -> None:
    imds = FakeImds({"gpuplat:stack": "s"})
    with pytest.raises(node_join.BootError, match="gpuplat:node tag of i-0123: gave up after 0 s"):
        node_join.node_name(_join_settings(tmp_path, wait_s=0), imds, lambda _: None)  # type: ignore[arg-type]


def test_controllers_take_their_fixed_name_without_asking(tmp_path: Path) -> None:
    assert node_join.node_name(_join_settings(tmp_path, "head-1"), None, lambda _: None) == "head-1"  # type: ignore[arg-type]


def test_the_group_vars_written_after_the_node_booted_are_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    moto = pytest.importorskip("moto")
    for key, value in {
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    with moto.mock_aws():
        import boto3

        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="box-bucket")
        s3.put_object(Bucket="box-bucket", Key="bootstrap/x/bundle.zip", Body=b"zip")
        boto3.client("ssm", region_name="us-east-1").put_parameter(
            Name="/gpuplat/s/munge-key", Type="SecureString", Value="a2V5"
        )
        rounds: list[float] = []

        def publish_later(seconds: float) -> None:
            rounds.append(seconds)
            if len(rounds) == 2:  # pulumi up writes the group vars once the filesystem exists
                s3.put_object(Bucket="box-bucket", Key="bootstrap/group_vars/all.json", Body=b'{"a": 1}')

        node_join.fetch(_join_settings(tmp_path), publish_later, tmp_path / "munge.key")
    assert len(rounds) == 2
    assert json.loads((tmp_path / "all.json").read_text()) == {"a": 1}
    assert (tmp_path / "munge.key").read_bytes() == b"key"


@pytest.mark.parametrize("group_vars", [{"gpuplat_bundle_key": "bootstrap/y/bundle.zip"}, {"a": 1}])
def test_a_controller_boots_from_the_bundle_the_group_vars_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group_vars: dict[str, str]
) -> None:
    """A controller's boot script names no bundle (its user data must not change with the roles): the
    group vars name the stack's current one; group vars that name none stop the boot with the reason."""
    moto = pytest.importorskip("moto")
    for key, value in {
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    with moto.mock_aws():
        import boto3

        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="box-bucket")
        s3.put_object(Bucket="box-bucket", Key="bootstrap/y/bundle.zip", Body=b"current")
        s3.put_object(
            Bucket="box-bucket", Key="bootstrap/group_vars/all.json", Body=json.dumps(group_vars).encode()
        )
        boto3.client("ssm", region_name="us-east-1").put_parameter(
            Name="/gpuplat/s/munge-key", Type="SecureString", Value="a2V5"
        )
        settings = _join_settings(tmp_path, "head-0", bundle_key="")
        if "gpuplat_bundle_key" not in group_vars:
            with pytest.raises(node_join.BootError, match="names no bundle"):
                node_join.fetch(settings, lambda _: None, tmp_path / "munge.key")
            return
        node_join.fetch(settings, lambda _: None, tmp_path / "munge.key")
    assert (tmp_path / "bundle.zip").read_bytes() == b"current"


def test_every_shipped_boot_script_fits_ec2_user_data(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    for platform in shipped_platforms.values():
        if platform.spec.backend != "aws" or platform.spec.scheduler.kind != "slurm":
            continue
        for pool in platform.pools:
            assert len(_script(platform, pool.name).encode()) <= USER_DATA_MAX_BYTES


def test_nodes_install_the_ansible_their_own_python_runs(
    shipped_platforms: dict[str, ResolvedPlatform],
) -> None:
    """Ubuntu 22.04's Python 3.10 cannot run ansible-core 2.19 (ansible 12): its nodes get ansible 10."""
    platform = shipped_platforms["aws-prod"]
    assert os_release(platform.spec) == "ubuntu2204"
    script = _script(platform, "train")
    assert "NODE_PIP_REQUIREMENTS='ansible==10.7.0 " in script
    assert "BOOT_PACKAGES=python3-venv" in script


@pytest.mark.parametrize(
    ("power_off", "step", "slurmd_active", "powered_off"),
    [
        ("1", "false", False, True),
        ("1", "true", False, False),
        ("", "false", False, False),
        # the script run again on a live node, or a step after slurmd started: the node stays up
        ("1", "false", True, False),
    ],
)
def test_a_failed_bootstrap_powers_off_where_asked(
    tmp_path: Path, power_off: str, step: str, slurmd_active: bool, powered_off: bool
) -> None:
    """The boot script's failure trap (bootstrap.POWER_OFF_STEP) under the script's own shell options:
    `poweroff` after a step fails, only where GPUPLAT_POWER_OFF_ON_FAILURE is set and slurmd is not
    running."""
    (tmp_path / "poweroff").write_text(f"#!/bin/sh\ntouch {tmp_path}/powered-off\n")
    active = 0 if slurmd_active else 3  # systemctl is-active: 3 for inactive
    (tmp_path / "systemctl").write_text(
        f'#!/bin/sh\n[ "$*" = "is-active --quiet slurmd.service" ] || exit 9\nexit {active}\n'
    )
    for program in ("poweroff", "systemctl"):
        (tmp_path / program).chmod(0o755)
    script = (
        f"set -euo pipefail\nGPUPLAT_POWER_OFF_ON_FAILURE={power_off}\n{POWER_OFF_STEP}{step}\necho done\n"
    )
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    ran = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=False)
    assert (ran.returncode != 0) == (step == "false")
    assert (tmp_path / "powered-off").exists() == powered_off
    assert ("gpuplat bootstrap failed (exit 1)" in ran.stdout) == (step == "false" and power_off == "1")
    assert ("powering off" in ran.stdout) == powered_off


def test_a_change_of_the_stacks_values_is_a_change_of_the_training_nodes_user_data() -> None:
    """The values reach a booting node through the group vars, not the bundle: before, a changed Slurm
    setting or driver left the training templates' user data as it was, so the nodes in service were
    neither configured again (`gpuplat up` leaves them out) nor drained (outdated.py compares user
    data) and kept taking jobs on the old values until they idled out."""
    stack = ROOT / "stacks" / "Pulumi.aws-prod.yaml"
    platform = load_platform(stack)
    changed = load_platform(stack, ["scheduler.scale_down_idle_s=1234"])
    assert settings_digest(load_platform(stack)) == settings_digest(platform)
    assert settings_digest(changed) != settings_digest(platform)

    def training(of: ResolvedPlatform) -> str:
        base = BootScript(
            stack=of.name, region="us-east-1", bucket="b", bundle_key=bundle_key(ROOT),
            inventory=node_inventory(of, of.pool("train")), os_release=os_release(of.spec),
        )  # fmt: skip
        return replace(base, settings_digest=settings_digest(of)).render()

    assert training(changed) != training(platform)
    assert f"GPUPLAT_SETTINGS_DIGEST={settings_digest(platform)}\n" in training(platform)
    assert "GPUPLAT_SETTINGS_DIGEST" not in _script(platform, "head", node_name="head-0")
