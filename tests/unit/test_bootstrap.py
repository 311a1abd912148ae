"""The boot script every AWS node runs: valid shell, and the one-host inventory Ansible really reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from infra.backends.aws.bootstrap import BootScript, bundle_digest, bundle_key, node_inventory
from infra.resolve import ResolvedPlatform

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_INVENTORY = Path(sys.executable).parent / "ansible-inventory"


def _script(platform: ResolvedPlatform, pool: str, node_name: str = "") -> str:
    return BootScript(
        stack=platform.name,
        region="us-east-1",
        bucket="aws-prod-bootstrap-123",
        bundle_key=bundle_key(ROOT),
        inventory=node_inventory(platform, platform.pool(pool)),
        node_name=node_name,
    ).render()


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
