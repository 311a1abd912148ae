"""The platform description: shipped stacks load; each kind of bad input names file, field and remedy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.errors import ExitCode, SpecError
from infra.platform.resolve import ResolvedPlatform, load_platform
from infra.spec.load import stack_file, stack_names


def test_shipped_stacks_are_listed() -> None:
    assert {"local", "aws-prod", "onprem"} <= set(stack_names())


def test_local_stack_matches_the_issue(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    local = shipped_platforms["local"]
    assert [(p.name, p.role, p.spec.min_nodes, p.spec.max_nodes, p.gpus_per_node) for p in local.pools] == [
        ("head", "service", 1, 1, 0),
        ("train", "train", 2, 3, 8),
        ("infer", "infer", 1, 1, 1),
    ]
    assert local.pool("train").node_type.gpu is not None
    assert local.pool("train").node_type.gpu.model == "H100"
    assert local.pool("infer").node_type.gpu is not None
    assert local.pool("infer").node_type.gpu.model == "L4"
    assert all(p.simulated for p in local.pools)


def test_aws_prod_has_efa_spot_and_inference(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    aws = shipped_platforms["aws-prod"]
    assert aws.spec.fabric.kind == "efa"
    assert {p.spec.capacity for p in aws.pools_with_role("train")} == {"on-demand", "spot"}
    assert aws.pool("infer").node_type.family == "g6e"
    assert aws.spec.storage.parallel_fs.kind == "fsx-lustre"


def test_onprem_lists_hosts_by_address(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    onprem = shipped_platforms["onprem"]
    assert onprem.spec.fabric.kind == "infiniband"
    assert onprem.pool("train").spec.max_nodes == len(onprem.pool("train").spec.hosts) == 4
    assert onprem.pool("train").node_type.provider == "onprem"


def _set(path: list[str | int], value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(platform: dict[str, Any]) -> None:
        target: Any = platform
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


BAD_CASES = {
    "unknown-key": (_set(["pools", 1, "gpus"], 8), "gpu-platform:platform.pools[1].gpus: unknown key"),
    "wrong-type": (_set(["pools", 1, "count"], "two"), "gpu-platform:platform.pools[1].count"),
    "unknown-instance-type": (
        _set(["pools", 1, "instance_type"], "p9.huge"),
        "gpu-platform:platform.pools[1].instance_type: unknown instance type 'p9.huge'",
    ),
    "pool-named-in-the-path": (
        _set(["pools", 1, "count"], -2),
        "pools[1].count: Input should be greater than or equal to 0 (got -2) (pool train)",
    ),
    "negative-count": (
        _set(["pools", 1, "count"], -1),
        "pools[1].count: Input should be greater than or equal to 0",
    ),
    "train-and-infer": (_set(["pools", 1, "role"], ["train", "infer"]), "never both"),
    "train-and-infer-string": (_set(["pools", 1, "role"], "train,infer"), "never both"),
    "incompatible-fabric-manager": (
        _set(["software"], {"fabric_manager": "570.86.15"}),
        "software.fabric_manager: fabric manager 570.86.15 must equal the driver version",
    ),
    "cuda-too-new-for-driver": (
        _set(["software"], {"driver_branch": 550, "cuda": "12.8"}),
        "software.cuda: CUDA 12.8 needs a newer driver than branch 550",
    ),
    "driver-too-old-for-gpu": (
        lambda platform: (
            _set(["pools", 1, "instance_type"], "p6-b200.48xlarge")(platform),
            _set(["software"], {"driver_branch": 535})(platform),
        ),
        "software.driver_branch: branch 535 does not support blackwell GPUs; use 570 or newer",
    ),
    "unknown-capacity": (_set(["pools", 1, "capacity"], "cheap"), "must be one of"),
    "two-heads-without-ha": (
        _set(["scheduler", "high_availability"], False),
        "pool 'head' (the Slurm controller pool) has 2 nodes",
    ),
    "ha-with-three-heads": (_set(["pools", 0, "count"], 3), "needs exactly 2 nodes, it has 3"),
    "elastic-controller": (
        lambda platform: (
            _set(["pools", 0, "count"], None)(platform),
            _set(["pools", 0, "min"], 1)(platform),
            _set(["pools", 0, "max"], 2)(platform),
        ),
        "give it a fixed count",
    ),
    "zone-outside-the-stack": (
        _set(["pools", 1, "zone"], "us-west-2a"),
        "zone 'us-west-2a' is not one of the stack's zones (us-east-1a, us-east-1b)",
    ),
    "reservation-without-zone": (
        lambda platform: (
            _set(["pools", 1, "capacity"], "reserved")(platform),
            _set(["pools", 1, "reservation"], {"kind": "capacity-block", "id": "cr-0123456789abcdef0"})(
                platform
            ),
        ),
        "a capacity-block exists in one availability zone; give the pool's zone",
    ),
    "nfs-on-aws": (
        _set(["storage", "parallel_fs", "kind"], "nfs"),
        "storage.parallel_fs.kind 'nfs' is not provided on backend aws; allowed: fsx-lustre",
    ),
    "dataset-cache-on-an-inference-pool": (
        _set(["pools", 3, "dataset_cache_path"], "/mnt/nvme/datasets"),
        "pools[3].dataset_cache_path: pool infer has role infer: only train pools cache datasets",
    ),
    "dataset-twice": (
        _set(["datasets"], [{"name": "web", "version": "v1", "source": "/fsx/web"}] * 2),
        "datasets[1].name: dataset 'web' is already datasets[0]",
    ),
    "dataset-from-s3-without-a-datasets-bucket": (
        lambda platform: (
            _set(["storage", "object_store", "buckets"], [{"purpose": "checkpoints"}])(platform),
            _set(["datasets"], [{"name": "web", "version": "v1", "source": "s3://datasets/web/v1"}])(
                platform
            ),
        ),
        "datasets[0].source: s3://datasets/web/v1 is read through the datasets bucket",
    ),
    "dataset-version-with-a-slash": (
        _set(["datasets"], [{"name": "web", "version": "v1/x", "source": "/fsx/web"}]),
        "datasets[0].version",
    ),
    "tag-key-the-platform-sets": (
        _set(["tags", "environment"], "prod"),
        "platform.tags: tag key 'environment': the platform sets 'environment' itself",
    ),
    "tag-value-with-odd-characters": (_set(["tags", "project"], "llm<pretrain>"), "tag 'project': may hold"),
    "source-on-aws": (
        _set(["storage", "parallel_fs", "source"], "fs@tcp:/x"),
        "storage.parallel_fs.source is only given on backend onprem",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_is_one_clear_paragraph(case: str, write_stack: Callable[..., Path]) -> None:
    mutate, expected = BAD_CASES[case]
    path = write_stack("aws-prod", mutate, name=case)
    with pytest.raises(SpecError) as raised:
        load_platform(path)
    message = raised.value.message
    assert message.startswith(str(path))
    assert expected in message
    assert raised.value.exit_code == ExitCode.BAD_INPUT


def test_every_problem_is_reported_at_once(write_stack: Callable[..., Path]) -> None:
    def two_problems(platform: dict[str, Any]) -> None:
        platform["pools"][1]["count"] = -1
        platform["pools"][2]["colour"] = "red"

    with pytest.raises(SpecError) as raised:
        load_platform(write_stack("aws-prod", two_problems))
    assert "2 problems" in raised.value.message
    assert "pools[1].count" in raised.value.message and "pools[2].colour" in raised.value.message


def test_missing_stack_file_names_known_stacks(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as raised:
        load_platform(tmp_path / "Pulumi.nope.yaml")
    assert "stack file not found" in raised.value.message and "local" in raised.value.message


def test_stack_without_platform_key(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.empty.yaml"
    path.write_text("config:\n  aws:region: us-east-1\n")
    with pytest.raises(SpecError, match="no `gpu-platform:platform` key"):
        load_platform(path)


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.broken.yaml"
    path.write_text("config: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_platform(path)


def test_spot_needs_a_spot_market(write_stack: Callable[..., Path]) -> None:
    def spot_p5e(platform: dict[str, Any]) -> None:
        platform["pools"][2]["instance_type"] = "p6-b200.48xlarge"

    with pytest.raises(SpecError, match="not offered as spot"):
        load_platform(write_stack("aws-prod", spot_p5e))


def test_onprem_pools_need_hosts(write_stack: Callable[..., Path]) -> None:
    with pytest.raises(SpecError, match="the list of hosts"):
        load_platform(write_stack("onprem", _set(["pools", 1, "hosts"], [])))


def test_reserved_capacity_needs_reservation(write_stack: Callable[..., Path]) -> None:
    with pytest.raises(SpecError, match="needs a reservation"):
        load_platform(write_stack("aws-prod", _set(["pools", 1, "capacity"], "reserved")))


def test_shipped_stack_path() -> None:
    assert stack_file("local").name == "Pulumi.local.yaml"


def test_team_principals_are_eks_access_entries_once_each(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]

    def variant(name: str, mutate: Any) -> Path:
        stack = yaml.safe_load((root / "stacks" / f"Pulumi.{name}.yaml").read_text())
        mutate(stack["config"]["gpu-platform:platform"])
        path = tmp_path / f"Pulumi.{name}-variant.yaml"
        path.write_text(yaml.safe_dump(stack))
        return path

    arn = "arn:aws:iam::123456789012:role/research-members"

    def on_slurm(spec: dict[str, Any]) -> None:
        spec["scheduler"]["teams"][0]["iam_principals"] = [arn]

    with pytest.raises(SpecError, match=r"teams\[0\]\.iam_principals.*distribution eks"):
        load_platform(variant("aws-prod", on_slurm))

    def twice(spec: dict[str, Any]) -> None:
        spec["kubernetes"]["admin_arns"] = [arn]

    with pytest.raises(SpecError, match=r"already in kubernetes\.admin_arns"):
        load_platform(variant("aws-k8s", twice))


def test_further_tags_reach_every_taggable_resource(write_stack: Callable[..., Path]) -> None:
    from infra.backends.aws.tags import base_tags

    path = write_stack("aws-prod", lambda spec: spec["tags"].update(project="llm-pretrain"), name="project")
    assert base_tags(load_platform(path))["project"] == "llm-pretrain"
