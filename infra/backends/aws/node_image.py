"""A node image per GPU pool, built by EC2 Image Builder, so that launched nodes only configure and join.

Installing the GPU stack at boot (driver DKMS build, CUDA toolkit, NCCL, DCGM, EFA) takes longer than a
node may take to register (infra/platform/boot_time.py). The image build runs the bundle's `gpu_nodes.yml`
on a build instance of the pool's plain OS image with the pool's versions, as one Image Builder component
(an ExecuteBash step), then seals it with image_seal.sh; the pool's launch template boots the result,
and the boot script's Ansible run finds everything installed and only configures.

- The build needs no GPU: the GPU roles install without one (`*_install_without_gpu`), and DKMS builds
  the module for the image's kernel. It runs on `BUILD_INSTANCE_TYPE` in the pool's subnet.
- The component's version follows the bundle's digest (Image Builder versions are immutable), so a
  changed role builds a new image and a new launch template version; running nodes keep theirs.
- The build instance's role may read the bootstrap bundle and use SSM (Image Builder runs components
  through the SSM agent): AWS's EC2InstanceProfileForImageBuilder and AmazonSSMManagedInstanceCore.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws
import yaml

from infra.backends.aws.bootstrap import NODE_BOTO3, VENV_STEP, WORK_DIR
from infra.backends.aws.iam import (
    bootstrap_statements,
    inline_policy,
    munge_key_denied_statements,
    service_trust_policy,
    serving_version_statements,
)
from infra.backends.aws.yaml_text import safe_dump
from infra.data.node_ansible_choice import node_ansible

# General purpose, no GPU: the roles install without one (see the module docstring).
BUILD_INSTANCE_TYPE = "m7i.2xlarge"
IMAGE_BUILDER_POLICIES = (
    "arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder",
    "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
)
BUILD_HOST = "imagebuild"
# The GPU roles skip on a node without GPUs unless told to install anyway (image builds).
INSTALL_WITHOUT_GPU = {
    f"{role}_install_without_gpu": True
    for role in ("gpu_driver", "fabric_manager", "cuda_toolkit", "nccl", "container_runtime", "dcgm")
}
_SEAL = Path(__file__).with_name("image_seal.sh")
_TEST = Path(__file__).with_name("image_test.sh")
# The pipeline that rebuilds each pool's image for patches: weekly, whether or not Image Builder sees a
# newer parent (the parent is a fixed AMI; the build's apt brings the archive's fixes, the held kernel and
# driver excepted). Image Builder cron: minutes hours day-of-month month day-of-week year
# (https://docs.aws.amazon.com/imagebuilder/latest/userguide/cron-expressions.html).
REBUILD_SCHEDULE = "cron(0 4 ? * SUN *)"
REBUILD_CONDITION = "EXPRESSION_MATCH_ONLY"
TEST_TIMEOUT_MINUTES = 60
# The pipeline's images pile up (an AMI and its snapshots a week). A lifecycle policy per pool deletes the
# recipe's images past the newest KEEP_PIPELINE_IMAGES, AMIs and snapshots with them; a COUNT filter's
# value is "the minimum number of resources to keep on hand" (EC2 Image Builder API reference,
# LifecyclePolicyDetailFilter). The one-shot image the launch template boots carries LIVE_IMAGE_TAG, which
# the policy's exclusion rule skips (LifecyclePolicyDetailExclusionRules, tagMap). Image Builder runs the
# policy with a role it may assume that holds AWS's EC2ImageBuilderLifecycleExecutionPolicy
# (https://docs.aws.amazon.com/imagebuilder/latest/userguide/image-lifecycle-prerequisites.html).
KEEP_PIPELINE_IMAGES = 3
ALL_RECIPE_VERSIONS = "x.x.x"
LIVE_IMAGE_TAG = "gpuplat:live-image"
LIFECYCLE_EXECUTION_POLICY = "arn:aws:iam::aws:policy/service-role/EC2ImageBuilderLifecycleExecutionPolicy"


@dataclass(frozen=True)
class ImageBuildScript:
    """What the build instance runs: the venv, the bundle, the GPU play against itself, the seal."""

    region: str
    bucket: str
    bundle_key: str
    inventory: dict[str, Any]  # the pool's one-host inventory, the host named NODE (bootstrap.node_inventory)
    variables: dict[str, Any]  # the platform's resolved values (no stack outputs: they may not exist yet)
    os_release: str

    def render(self) -> str:
        node = node_ansible(self.os_release)
        settings = {
            "GPUPLAT_REGION": self.region,
            "GPUPLAT_BUCKET": self.bucket,
            "GPUPLAT_BUNDLE_KEY": self.bundle_key,
            "GPUPLAT_WORK": WORK_DIR,
            "BOOT_PACKAGES": node.venv_package,
            "NODE_PIP_REQUIREMENTS": f"{node.requirement} {NODE_BOTO3}",
        }
        inventory = yaml.safe_dump(self.inventory, sort_keys=False).replace("NODE:", f"{BUILD_HOST}:")
        variables = json.dumps({**self.variables, **INSTALL_WITHOUT_GPU}, sort_keys=True)
        return (
            _BUILD.replace("@SETTINGS@", "\n".join(f"{k}={shlex.quote(v)}" for k, v in settings.items()))
            .replace("@VENV@", VENV_STEP)
            .replace("@INVENTORY@", inventory)
            .replace("@VARIABLES@", variables)
            .replace("@SEAL@", _SEAL.read_text())
        )


_BUILD = """#!/bin/bash
# gpu-platform node image build: the pool's GPU software from the bundle, then the seal.
set -euo pipefail
@SETTINGS@
export GPUPLAT_REGION GPUPLAT_BUCKET GPUPLAT_BUNDLE_KEY GPUPLAT_WORK
@VENV@
venv/bin/python3 -c 'import boto3, os; env = os.environ
boto3.client("s3", region_name=env["GPUPLAT_REGION"]).download_file(
    env["GPUPLAT_BUCKET"], env["GPUPLAT_BUNDLE_KEY"], "bundle.zip")'
cat >inventory.yml <<'INVENTORY'
@INVENTORY@INVENTORY
cat >image-vars.json <<'VARIABLES'
@VARIABLES@
VARIABLES
rm -rf bundle && venv/bin/python3 -m zipfile -e bundle.zip bundle
(cd bundle && ANSIBLE_CONFIG=ansible.cfg ../venv/bin/ansible-playbook -i ../inventory.yml \\
  -e @../image-vars.json -e gpuplat_gpu_hosts=gpu_nodes --limit imagebuild playbooks/gpu_nodes.yml)
rm -f image-vars.json
cat >seal.sh <<'SEAL'
@SEAL@SEAL
bash seal.sh && rm -f seal.sh
"""


def component_document(script: str) -> str:
    """The Image Builder component (schemaVersion 1.0): one build step that runs the script."""
    document = {
        "name": "gpuplat-node-image",
        "description": "gpu-platform GPU node software from the bootstrap bundle, then sealed",
        "schemaVersion": 1.0,
        "phases": [
            {
                "name": "build",
                "steps": [
                    {
                        "name": "InstallGpuStack",
                        "action": "ExecuteBash",
                        "inputs": {"commands": [script]},
                    }
                ],
            }
        ],
    }
    # yaml.safe_dump's text (the script holds every training node's Slurm line: PyYAML's own emitter took
    # most of a large stack's plan writing it one character at a time)
    return safe_dump(document, sort_keys=False, width=1000)


def test_component_document() -> str:
    """The Image Builder component (schemaVersion 1.0) whose test phase runs image_test.sh."""
    document = {
        "name": "gpuplat-node-image-test",
        "description": "gpu-platform node image test: the driver built for the booted kernel, held, sealed",
        "schemaVersion": 1.0,
        "phases": [
            {
                "name": "test",
                "steps": [
                    {
                        "name": "CheckGpuNodeImage",
                        "action": "ExecuteBash",
                        "inputs": {"commands": [_TEST.read_text()]},
                    }
                ],
            }
        ],
    }
    return safe_dump(document, sort_keys=False, width=1000)


def component_version(bundle_key: str) -> str:
    """Semantic version from the bundle's digest (bootstrap/<digest>/bundle.zip): a new bundle, a new
    component and image; the same bundle, the same version."""
    digest = bundle_key.split("/")[1]
    return f"1.0.{int(digest[:7], 16)}"


class ImageBuildIdentity(pulumi.ComponentResource):
    """The build instances' role and profile, one for all pools: SSM (Image Builder runs components
    through its agent), Image Builder's instance policy, and reading the bootstrap bundle; never the MUNGE
    key."""

    def __init__(
        self,
        name: str,
        bootstrap_bucket_arn: pulumi.Input[str],
        munge_parameter_arn: pulumi.Input[str],
        tags: dict[str, str],
        opts: pulumi.ResourceOptions | None = None,
        serving_record_arn: pulumi.Input[str] | None = None,
    ) -> None:
        super().__init__("gpu-platform:aws:ImageBuildIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        trust = service_trust_policy("ec2.amazonaws.com")
        role = aws.iam.Role(f"{name}-role", assume_role_policy=trust, tags=tags, opts=child)
        for index, policy in enumerate(IMAGE_BUILDER_POLICIES):
            aws.iam.RolePolicyAttachment(
                f"{name}-managed-{index}", role=role.name, policy_arn=policy, opts=child
            )
        inline_policy(f"{name}-bundle", role, bootstrap_bucket_arn, bootstrap_statements, child)
        # The build runs no munged, and its instance's SSM core policy would read the key.
        inline_policy(f"{name}-no-munge-key", role, munge_parameter_arn, munge_key_denied_statements, child)
        # Nor the serving version record (iam.serving_version_statements).
        if serving_record_arn is not None:
            inline_policy(f"{name}-no-serving-record", role, serving_record_arn, _no_serving_record, child)
        self.profile = aws.iam.InstanceProfile(f"{name}-profile", role=role.name, tags=tags, opts=child)
        lifecycle = aws.iam.Role(
            f"{name}-lifecycle-role",
            assume_role_policy=service_trust_policy("imagebuilder.amazonaws.com"),
            tags=tags,
            opts=child,
        )
        self.lifecycle_grant = aws.iam.RolePolicyAttachment(
            f"{name}-lifecycle", role=lifecycle.name, policy_arn=LIFECYCLE_EXECUTION_POLICY, opts=child
        )
        self.lifecycle_role_arn: pulumi.Output[str] = lifecycle.arn
        self.register_outputs(
            {"instance_profile_name": self.profile.name, "lifecycle_role_arn": self.lifecycle_role_arn}
        )


@dataclass(frozen=True)
class NodeImageArgs:
    parent_image_id: pulumi.Input[str]
    root_device: pulumi.Input[str]  # the parent image's; the image keeps it
    build_script: pulumi.Input[str]
    bundle_key: str
    instance_profile_name: pulumi.Input[str]
    lifecycle_role_arn: pulumi.Input[str]
    lifecycle_grant: pulumi.Resource  # the role's policy: the lifecycle policy waits for it
    subnet_id: pulumi.Input[str]
    security_group_id: pulumi.Input[str]
    root_volume_gib: int
    tags: dict[str, str]
    build_after: list[pulumi.Resource]


class NodeImage(pulumi.ComponentResource):
    """The image (`image_id`) of one pool; `pulumi up` waits for the build."""

    def __init__(self, name: str, args: NodeImageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-platform:aws:NodeImage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        component = aws.imagebuilder.Component(
            f"{name}-component",
            platform="Linux",
            version=component_version(args.bundle_key),
            data=pulumi.Output.from_input(args.build_script).apply(component_document),
            tags=args.tags,
            opts=child,
        )
        test = aws.imagebuilder.Component(
            f"{name}-test",
            platform="Linux",
            version=component_version(args.bundle_key),
            data=test_component_document(),
            tags=args.tags,
            opts=child,
        )
        # Named, not auto-named: each new bundle is a new version of the same recipe (a replacement would
        # otherwise get a new random name), so the lifecycle policy below selects every version's images.
        recipe = aws.imagebuilder.ImageRecipe(
            f"{name}-recipe",
            name=f"{name}-recipe",
            parent_image=args.parent_image_id,
            version=component_version(args.bundle_key),
            components=[
                aws.imagebuilder.ImageRecipeComponentArgs(component_arn=component.arn),
                aws.imagebuilder.ImageRecipeComponentArgs(component_arn=test.arn),
            ],
            block_device_mappings=[
                aws.imagebuilder.ImageRecipeBlockDeviceMappingArgs(
                    device_name=args.root_device,
                    ebs=aws.imagebuilder.ImageRecipeBlockDeviceMappingEbsArgs(
                        volume_size=args.root_volume_gib,
                        volume_type="gp3",
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            tags=args.tags,
            opts=child,
        )
        infrastructure = aws.imagebuilder.InfrastructureConfiguration(
            f"{name}-infrastructure",
            instance_profile_name=args.instance_profile_name,
            instance_types=[BUILD_INSTANCE_TYPE],
            subnet_id=args.subnet_id,
            security_group_ids=[args.security_group_id],
            instance_metadata_options=aws.imagebuilder.InfrastructureConfigurationInstanceMetadataOptionsArgs(
                http_tokens="required"
            ),
            terminate_instance_on_failure=True,
            tags=args.tags,
            opts=child,
        )
        image = aws.imagebuilder.Image(
            f"{name}-image",
            image_recipe_arn=recipe.arn,
            infrastructure_configuration_arn=infrastructure.arn,
            image_tests_configuration=aws.imagebuilder.ImageImageTestsConfigurationArgs(
                image_tests_enabled=False
            ),
            tags={**args.tags, LIVE_IMAGE_TAG: "true"},
            opts=pulumi.ResourceOptions(parent=self, depends_on=args.build_after),
        )
        # Beside the one-shot image the launch template boots: the same recipe rebuilt on a schedule, with
        # the test stage, for patches. Its images are not rolled into the pool by themselves: a new image
        # reaches the nodes through the plan (aws.image_id, or the next bundle's one-shot build).
        pipeline = aws.imagebuilder.ImagePipeline(
            f"{name}-pipeline",
            image_recipe_arn=recipe.arn,
            infrastructure_configuration_arn=infrastructure.arn,
            schedule=aws.imagebuilder.ImagePipelineScheduleArgs(
                schedule_expression=REBUILD_SCHEDULE,
                pipeline_execution_start_condition=REBUILD_CONDITION,
            ),
            image_tests_configuration=aws.imagebuilder.ImagePipelineImageTestsConfigurationArgs(
                image_tests_enabled=True, timeout_minutes=TEST_TIMEOUT_MINUTES
            ),
            status="ENABLED",
            tags=args.tags,
            opts=child,
        )
        # The recipe's images, of every version: "x.x.x" (EC2 Image Builder API reference,
        # LifecyclePolicyResourceSelectionRecipe: semanticVersion may be x in each part; pulumi-aws 7.51.1
        # imagebuilder LifecyclePolicyResourceSelectionRecipeArgs: "Wildcard semantic version is supported").
        # A new bundle's recipe version must not leave the older versions' pipeline images out of the
        # policy, kept and billed for ever. The one-shot image the launch template boots is never deleted.
        aws.imagebuilder.LifecyclePolicy(
            f"{name}-image-lifecycle",
            resource_type="AMI_IMAGE",
            execution_role=args.lifecycle_role_arn,
            resource_selection=aws.imagebuilder.LifecyclePolicyResourceSelectionArgs(
                recipes=[
                    aws.imagebuilder.LifecyclePolicyResourceSelectionRecipeArgs(
                        name=recipe.name, semantic_version=ALL_RECIPE_VERSIONS
                    )
                ]
            ),
            policy_details=[
                aws.imagebuilder.LifecyclePolicyPolicyDetailArgs(
                    action=aws.imagebuilder.LifecyclePolicyPolicyDetailActionArgs(
                        type="DELETE",
                        include_resources=aws.imagebuilder.LifecyclePolicyPolicyDetailActionIncludeResourcesArgs(
                            amis=True, snapshots=True
                        ),
                    ),
                    filter=aws.imagebuilder.LifecyclePolicyPolicyDetailFilterArgs(
                        type="COUNT", value=KEEP_PIPELINE_IMAGES
                    ),
                    exclusion_rules=aws.imagebuilder.LifecyclePolicyPolicyDetailExclusionRulesArgs(
                        tag_map={LIVE_IMAGE_TAG: "true"}
                    ),
                )
            ],
            status="ENABLED",
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[args.lifecycle_grant]),
        )
        self.image_id: pulumi.Output[str] = image.output_resources.apply(_first_ami)
        self.register_outputs({"image_id": self.image_id, "pipeline_arn": pipeline.arn})


def _first_ami(resources: Any) -> str:
    """The AMI of the build's output resources (Image Builder distributes to the build's own region)."""
    return str(resources[0].amis[0].image)


def _no_serving_record(record_arn: str) -> list[dict[str, Any]]:
    return serving_version_statements(record_arn, reader=False)
