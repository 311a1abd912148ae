"""Node images under the Pulumi mocks: one EC2 Image Builder image per GPU pool, built from the pool's plain
OS image by the bundle's GPU play and sealed; the pool's launch template boots it."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.backends.aws.node_image import BUILD_HOST, INSTALL_WITHOUT_GPU, component_version
from infra.plan.record import Recording, record
from infra.platform.resolve import ResolvedPlatform

ROOT = Path(__file__).resolve().parents[2]
INFRASTRUCTURE = "aws:imagebuilder/infrastructureConfiguration:InfrastructureConfiguration"


@pytest.fixture(scope="module")
def aws_prod(shipped_platforms: dict[str, ResolvedPlatform]) -> tuple[ResolvedPlatform, Recording]:
    platform = shipped_platforms["aws-prod"]
    return platform, record(platform)


def build_step(recording: Recording, pool: str) -> str:
    document = yaml.safe_load(recording.named(f"aws-prod-{pool}-component").inputs["data"])
    [phase] = document["phases"]
    [step] = phase["steps"]
    assert (phase["name"], step["action"], document["schemaVersion"]) == ("build", "ExecuteBash", 1.0)
    [script] = step["inputs"]["commands"]
    return str(script)


def test_every_gpu_pool_boots_its_own_image(aws_prod: tuple[ResolvedPlatform, Recording]) -> None:
    platform, recording = aws_prod
    gpu_pools = {p.name for p in platform.pools if p.node_type.gpu_count}
    images = {r.name for r in recording.of_type("aws:imagebuilder/image:Image")}
    assert images == {f"aws-prod-{p}-image" for p in gpu_pools}
    for pool in gpu_pools:
        template = recording.named(f"aws-prod-{pool}-lt").inputs
        assert template["imageId"] == f"ami-0aws-prod-{pool}-image"
    controller = platform.controller_pool.name
    assert not recording.of_type("aws:ec2/instance:Instance") or all(
        r.inputs["ami"] == "ami-0mockdeeplearning0" for r in recording.of_type("aws:ec2/instance:Instance")
    ), f"{controller} boots the plain image"


def test_the_build_installs_the_pools_gpu_software_without_a_gpu_and_seals(
    aws_prod: tuple[ResolvedPlatform, Recording],
) -> None:
    platform, recording = aws_prod
    script = build_step(recording, "train")
    assert "playbooks/gpu_nodes.yml" in script and f"--limit {BUILD_HOST}" in script
    variables: dict[str, Any] = yaml.safe_load(script.split("<<'VARIABLES'\n")[1].split("\nVARIABLES")[0])
    assert INSTALL_WITHOUT_GPU.items() <= variables.items()
    assert variables["gpu_driver_version"] == platform.software.driver_version
    assert variables["dcgm_cuda_major"] == platform.software.driver_cuda_major
    seal = (ROOT / "infra" / "backends" / "aws" / "image_seal.sh").read_text()
    assert seal in script and script.rstrip().endswith("bash seal.sh && rm -f seal.sh")
    inventory = yaml.safe_load(script.split("<<'INVENTORY'\n")[1].split("INVENTORY")[0])
    assert BUILD_HOST in inventory["all"]["children"]["pool_train"]["hosts"]


def test_the_component_text_is_pyyamls(aws_prod: tuple[ResolvedPlatform, Recording]) -> None:
    """The component is written by infra/backends/aws/yaml_text.py: its text is what yaml.safe_dump writes
    (a different folding of the script would change every deployed stack's components)."""
    platform, recording = aws_prod
    for pool in (p.name for p in platform.pools if p.node_type.gpu_count):
        data = recording.named(f"aws-prod-{pool}-component").inputs["data"]
        assert data == yaml.safe_dump(yaml.safe_load(data), sort_keys=False, width=1000)
        assert data.count("\\\n") > 3, "long lines fold, as PyYAML folds them"


def test_the_image_follows_the_bundle(aws_prod: tuple[ResolvedPlatform, Recording]) -> None:
    _, recording = aws_prod
    component = recording.named("aws-prod-train-component").inputs
    recipe = recording.named("aws-prod-train-recipe").inputs
    bundle_key = recording.named("aws-prod-bundle").inputs["key"]
    assert component["version"] == recipe["version"] == component_version(bundle_key)
    assert recipe["parentImage"] == "ami-0mockdeeplearning0"
    [mapping] = recipe["blockDeviceMappings"]
    assert mapping["deviceName"] == "/dev/sda1" and mapping["ebs"]["encrypted"] == "true"


def test_builds_run_without_a_gpu_under_imdsv2_with_their_own_role(
    aws_prod: tuple[ResolvedPlatform, Recording],
) -> None:
    _, recording = aws_prod
    configurations = recording.of_type(INFRASTRUCTURE)
    assert configurations
    for configuration in configurations:
        assert configuration.inputs["instanceMetadataOptions"]["httpTokens"] == "required"
        assert configuration.inputs["terminateInstanceOnFailure"] is True
        assert configuration.inputs["instanceTypes"] == ["m7i.2xlarge"]
    attachments = recording.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    managed = {
        r.inputs["policyArn"] for r in attachments if r.name.startswith("aws-prod-image-build-managed")
    }
    assert managed == {
        "arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder",
        "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
    }


@pytest.mark.parametrize("override", [{"bake_images": False}, {"image_id": "ami-0123456789abcdef0"}])
def test_no_build_without_baking_or_with_the_stacks_own_image(
    shipped_platforms: dict[str, ResolvedPlatform], override: dict[str, Any]
) -> None:
    platform = shipped_platforms["aws-prod"]
    spec = platform.spec.model_copy(update={"aws": platform.spec.aws.model_copy(update=override)})
    recording = record(replace(platform, spec=spec))
    assert not recording.of_type("aws:imagebuilder/image:Image")
    assert not [r for r in recording.of_type("aws:iam/role:Role") if "image-build" in r.name]


def test_the_build_script_is_valid_bash(aws_prod: tuple[ResolvedPlatform, Recording], tmp_path: Path) -> None:
    _, recording = aws_prod
    script = tmp_path / "build.sh"
    script.write_text(build_step(recording, "infer"))
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_each_pools_recipe_is_rebuilt_on_a_schedule_with_its_test_stage(
    aws_prod: tuple[ResolvedPlatform, Recording],
) -> None:
    """Beside the one-shot image: an Image Builder pipeline per GPU pool, weekly whatever the parent image
    (a fixed AMI never reports a dependency update), with image tests on; the one-shot build skips them."""
    platform, recording = aws_prod
    gpu_pools = {p.name for p in platform.pools if p.node_type.gpu_count}
    pipelines = {r.name: r.inputs for r in recording.of_type("aws:imagebuilder/imagePipeline:ImagePipeline")}
    assert set(pipelines) == {f"aws-prod-{p}-pipeline" for p in gpu_pools}
    for pool in gpu_pools:
        pipeline = pipelines[f"aws-prod-{pool}-pipeline"]
        assert pipeline["schedule"] == {
            "scheduleExpression": "cron(0 4 ? * SUN *)",
            "pipelineExecutionStartCondition": "EXPRESSION_MATCH_ONLY",
        }
        assert pipeline["imageTestsConfiguration"] == {"imageTestsEnabled": True, "timeoutMinutes": 60}
        assert pipeline["status"] == "ENABLED"
        image = recording.named(f"aws-prod-{pool}-image").inputs
        assert image["imageTestsConfiguration"]["imageTestsEnabled"] is False


def test_the_test_stage_checks_the_driver_for_the_booted_kernel_and_the_seal(
    aws_prod: tuple[ResolvedPlatform, Recording],
) -> None:
    _, recording = aws_prod
    recipe = recording.named("aws-prod-train-recipe").inputs
    assert len(recipe["components"]) == 2, "the build component and the test component"
    document = yaml.safe_load(recording.named("aws-prod-train-test").inputs["data"])
    [phase] = document["phases"]
    [step] = phase["steps"]
    assert (phase["name"], step["action"]) == ("test", "ExecuteBash")
    [script] = step["inputs"]["commands"]
    assert script == (ROOT / "infra" / "backends" / "aws" / "image_test.sh").read_text()
    for check in (
        'modinfo -k "$kernel" nvidia',
        "apt-mark showhold",
        "/etc/modules-load.d/gpuplat-nvidia.conf",
    ):
        assert check in script


def test_the_pipelines_images_are_pruned_and_the_pools_live_image_kept(
    aws_prod: tuple[ResolvedPlatform, Recording],
) -> None:
    """A lifecycle policy per pool on its recipe's images: the newest three kept, older ones deleted with
    their AMIs and snapshots, the one-shot image the launch template boots skipped by its tag; run by a role
    Image Builder assumes with AWS's lifecycle execution policy, created before the policy."""
    platform, recording = aws_prod
    gpu_pools = {p.name for p in platform.pools if p.node_type.gpu_count}
    policies = {r.name: r for r in recording.of_type("aws:imagebuilder/lifecyclePolicy:LifecyclePolicy")}
    assert set(policies) == {f"aws-prod-{p}-image-lifecycle" for p in gpu_pools}
    [grant] = [
        r
        for r in recording.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if r.inputs["policyArn"].endswith("service-role/EC2ImageBuilderLifecycleExecutionPolicy")
    ]
    [role] = [
        r for r in recording.of_type("aws:iam/role:Role") if r.name == "aws-prod-image-build-lifecycle-role"
    ]
    assert json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Principal"] == {
        "Service": "imagebuilder.amazonaws.com"
    }
    for pool in gpu_pools:
        policy = policies[f"aws-prod-{pool}-image-lifecycle"]
        recipe = recording.named(f"aws-prod-{pool}-recipe").inputs
        assert policy.inputs["resourceType"] == "AMI_IMAGE" and policy.inputs["status"] == "ENABLED"
        # Every version of the pool's recipe, whose name stays when a new bundle makes a new version.
        assert recipe["name"] == f"aws-prod-{pool}-recipe"
        assert policy.inputs["resourceSelection"] == {
            "recipes": [{"name": f"aws-prod-{pool}-recipe", "semanticVersion": "x.x.x"}]
        }
        [detail] = policy.inputs["policyDetails"]
        assert detail["action"] == {"type": "DELETE", "includeResources": {"amis": True, "snapshots": True}}
        assert detail["filter"] == {"type": "COUNT", "value": 3}
        assert detail["exclusionRules"] == {"tagMap": {"gpuplat:live-image": "true"}}
        live = recording.named(f"aws-prod-{pool}-image").inputs
        assert live["tags"]["gpuplat:live-image"] == "true"
        assert "gpuplat:live-image" not in recording.named(f"aws-prod-{pool}-pipeline").inputs["tags"]
        assert grant.urn in policy.dependencies
        assert policy.inputs["executionRole"] == "arn:aws:mock:::role/aws-prod-image-build-lifecycle-role"
