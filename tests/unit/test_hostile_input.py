"""Hostile input (issue 16): each defect found by trying the CLI as a careless or malicious user would.

Every command ends with a documented exit code (0 ok, 1 policy violation, 2 bad input, 3 missing tool or
host setting, 4 failure) and at most one paragraph, never a traceback; contradictions are refused at the
field that is wrong, naming what is allowed; the policy config and rules leave no escape; messages use
the user's words (YAML paths, flag names). The CLI runs in this process through its real entry point.
"""

from __future__ import annotations

import copy
import errno
import io
import json
import os
import resource
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi_aws
import pytest
import yaml

from infra.cli.app import main
from infra.cli.commands.size import MAX_PARAMS
from infra.data.load import catalog
from infra.errors import SpecError
from infra.platform.resolve import load_platform
from infra.policy.config import parse_policy_config
from infra.policy.rules import RULES, PolicyContext
from infra.policy.rules.security import check_required_tags
from infra.policy.rules.spot import check_spot_training_recovery
from infra.policy.settings import PolicyConfig
from infra.policy.view import ResourceIndex, ResourceView
from infra.spec.aws_regions import AWS_REGIONS
from infra.spec.load import CONFIG_KEY, stack_file
from infra.spec.models import MAX_NODES
from tests.conftest import stack_document
from tests.pulumi.test_policy_rules import _all
from tests.unit.test_cli import gpuplat

EXIT_CODES = {0, 1, 2, 3, 4}
Mutate = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class CliRun:
    code: int
    out: str
    err: str
    seconds: float
    peak_growth_mib: float
    """How far the run raised this process's peak memory (resident set), in MiB."""

    @property
    def clean(self) -> bool:
        """A documented exit code and no traceback anywhere."""
        return self.code in EXIT_CODES and "Traceback" not in self.out + self.err


@contextmanager
def environment(changes: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_cli(*args: str, env: dict[str, str] | None = None, stdout: io.StringIO | None = None) -> CliRun:
    """`gpuplat ARGS` through `infra.cli.app.main` in this process, stdout and stderr captured."""
    out, err = stdout or io.StringIO(), io.StringIO()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    start = time.monotonic()
    code: Any = None
    with environment(env or {}), redirect_stdout(out), redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code
    seconds = time.monotonic() - start
    growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    return CliRun(code, out.getvalue(), err.getvalue(), seconds, growth)


def refused(run: CliRun, *expected: str) -> None:
    """Exit 2 with one error paragraph holding every expected text."""
    assert run.code == 2, (run.code, run.err)
    assert run.clean and run.err.startswith("error:"), run.err
    for text in expected:
        assert text in run.err, (text, run.err)


def write_variant(directory: Path, base: str, mutate: Mutate, name: str = "variant") -> Path:
    document = copy.deepcopy(stack_document(base))
    mutate(document["config"][CONFIG_KEY])
    path = directory / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _set(*path: str | int, value: Any) -> Mutate:
    def mutate(spec: dict[str, Any]) -> None:
        target: Any = spec
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


# ---------------------------------------------------------------------------------------------------
# Tracebacks: files that are not UTF-8 text, --output onto a file, sizes that exhaust memory, bugs


def _latin1(text: str) -> bytes:
    return text.replace("platform-team", "plätform-team").encode("latin-1")


UNDECODABLE = {
    "latin-1": (_latin1, "byte 0xe4 is not UTF-8"),
    "utf-16": (lambda text: text.encode("utf-16"), "UTF-16 text"),
    "utf-32": (lambda text: text.encode("utf-32"), "UTF-32 text"),
    "binary": (lambda text: bytes(range(256)) * 4, "NUL byte"),
}


@pytest.mark.parametrize("encoding", sorted(UNDECODABLE))
def test_undecodable_stack_files_exit_2_naming_file_and_problem(tmp_path: Path, encoding: str) -> None:
    encode, expected = UNDECODABLE[encoding]
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_bytes(encode(stack_file("local").read_text()))
    (tmp_path / "Pulumi.local.yaml").write_text(stack_file("local").read_text())
    refused(run_cli("check", "--stack-file", str(bad)), str(bad), expected)
    listing = run_cli("stacks", env={"GPUPLAT_STACKS_DIR": str(tmp_path)})
    refused(listing, str(bad), expected)
    assert "local" in listing.out and "$" in listing.out  # the valid stack is still listed


def test_stacks_exits_2_naming_file_and_field_and_lists_the_valid_ones(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.local.yaml").write_text(stack_file("local").read_text())
    bad = write_variant(tmp_path, "onprem", _set("pools", 1, "count", value=-1), name="broken")
    listing = run_cli("stacks", "--json", env={"GPUPLAT_STACKS_DIR": str(tmp_path)})
    refused(listing, "1 stack file is invalid", str(bad), "gpu-platform:platform.pools[1].count")
    rows = {row["stack"]: row for row in yaml.safe_load(listing.out)}
    assert rows["local"]["backend"] == "local" and "pools[1].count" in rows["broken"]["error"]


def test_inventory_output_onto_an_existing_file_is_bad_input(tmp_path: Path) -> None:
    existing = tmp_path / "inventory"
    existing.write_text("keep me\n")
    refused(
        run_cli("inventory", "--stack", "onprem", "--output", str(existing)), "--output", "not a directory"
    )
    assert existing.read_text() == "keep me\n"


def test_a_billion_nodes_is_refused_at_the_field_in_bounded_time_and_memory(tmp_path: Path) -> None:
    path = write_variant(tmp_path, "aws-prod", _set("pools", 1, "count", value=10**9))
    tracemalloc.start()
    try:
        run = run_cli("inventory", "--stack-file", str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    refused(run, "gpu-platform:platform.pools[1].count: at most 5000 nodes", "Kubernetes supports")
    assert run.seconds < 10 and peak < 100 * 2**20


def test_the_platform_total_is_bounded_too(tmp_path: Path) -> None:
    def big(spec: dict[str, Any]) -> None:
        spec["pools"][1]["count"] = MAX_NODES
        spec["pools"][2]["max"] = MAX_NODES

    path = write_variant(tmp_path, "aws-prod", big)
    refused(run_cli("plan", "--stack-file", str(path)), "gpu-platform:platform.pools: the pools add up to")


def test_an_unforeseen_error_exits_4_with_one_line_naming_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> Any:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr("infra.cli.commands.stacks.stacks_summary", broken)
    run = run_cli("stacks", env={"XDG_STATE_HOME": str(tmp_path)})
    assert run.code == 4 and run.clean, run.err
    assert len(run.err.strip().splitlines()) == 1 and "RuntimeError: boom second line" in run.err
    (log,) = (tmp_path / "gpuplat" / "logs").iterdir()
    assert str(log) in run.err
    assert (
        "Traceback" in log.read_text() and "boom" in log.read_text() and "gpuplat stacks" in log.read_text()
    )


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def test_a_stdout_whose_reader_left_ends_the_command_with_its_own_verdict() -> None:
    """Also when stdout has no file descriptor behind it (an embedding program's stream)."""
    run = run_cli("stacks", "--json", stdout=_ClosedPipe())
    assert run.code == 0 and run.err == "", run.err
    invalid = run_cli("plan", "--stack", "no-such-stack", stdout=_ClosedPipe())
    assert invalid.code == 2 and invalid.err.startswith("error:"), invalid.err


def test_usage_errors_exit_2_and_help_exits_0() -> None:
    assert run_cli("plan", "--no-such-flag").code == 2
    assert run_cli("size", "--params", "many").code == 2
    assert run_cli("--help").code == 0


# ---------------------------------------------------------------------------------------------------
# YAML: the file and line of an error, keys given twice, nesting, non-finite numbers, size, names


def test_yaml_errors_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.broken.yaml"
    path.write_text("config:\n  gpu-platform:platform:\n    name: [unclosed\n")
    run = run_cli("plan", "--stack-file", str(path))
    refused(run, f"{path}, line 4", "not valid YAML")
    assert "<unicode string>" not in run.err


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    text = stack_file("local").read_text().replace("    name: local\n", "    name: local\n    name: other\n")
    path = tmp_path / "Pulumi.twice.yaml"
    path.write_text(text)
    refused(run_cli("plan", "--stack-file", str(path)), str(path), "key 'name' given twice (first on line")


def test_deep_nesting_and_huge_files_are_refused(tmp_path: Path) -> None:
    deep = tmp_path / "Pulumi.deep.yaml"
    deep.write_text("config: " + "[" * 50_000 + "]" * 50_000 + "\n")
    refused(run_cli("plan", "--stack-file", str(deep)), str(deep))
    huge = tmp_path / "Pulumi.huge.yaml"
    huge.write_text(stack_file("local").read_text() + "#" * (2 * 2**20) + "\n")
    refused(run_cli("plan", "--stack-file", str(huge)), str(huge), "larger than 1024 KiB")


def test_non_finite_numbers_are_refused_at_the_field(tmp_path: Path) -> None:
    path = write_variant(
        tmp_path, "aws-prod", _set("storage", "parallel_fs", "capacity_tib", value=float("inf"))
    )
    refused(
        run_cli("plan", "--stack-file", str(path)),
        "gpu-platform:platform.storage.parallel_fs.capacity_tib: Input should be a finite number",
    )


def test_yaml_booleans_in_a_text_field_say_to_quote_them(tmp_path: Path) -> None:
    path = write_variant(tmp_path, "local", _set("tags", "team", value=False))
    refused(run_cli("plan", "--stack-file", str(path)), "tags.team: must be text, not true/false", "quotes")


def test_a_stack_name_is_a_name_not_a_path() -> None:
    refused(run_cli("plan", "--stack", "../stacks/Pulumi.local"), "a stack name holds letters, digits")


# ---------------------------------------------------------------------------------------------------
# Contradictions: refused at the field that is wrong, with what is allowed there


CONTRADICTIONS: dict[str, tuple[str, Mutate, str]] = {
    "zone-outside-the-region": (
        "aws-prod",
        _set("zones", value=["eu-west-1a", "us-east-1b"]),
        "zones[0]: 'eu-west-1a' is not a zone of region us-east-1: its zones are named us-east-1 and a "
        "letter",
    ),
    "zone-twice": (
        "aws-prod",
        _set("zones", value=["us-east-1a", "us-east-1a"]),
        "zones[1]: zone 'us-east-1a'",
    ),
    "no-such-region": (
        "aws-prod",
        _all(_set("region", value="us-nowhere-9"), _set("zones", value=["us-nowhere-9a"])),
        "region: 'us-nowhere-9' is not an AWS region; regions: af-south-1",
    ),
    "region-on-prem": (
        "onprem",
        _set("region", value="us-east-1"),
        "region: region is only given on backend aws",
    ),
    "gpus-in-a-service-pool": (
        "aws-prod",
        _set("pools", 0, "instance_type", value="p5.48xlarge"),
        "pools[0].instance_type: p5.48xlarge has 8 GPUs, but a service pool runs no GPU work",
    ),
    "host-name-twice": (
        "onprem",
        _set("pools", 2, "hosts", 0, "name", value="gpu-01"),
        "pools[2].hosts[0].name: host name 'gpu-01' is already pools[1].hosts[0]",
    ),
    "host-address-twice": (
        "onprem",
        _set("pools", 2, "hosts", 0, "address", value="10.40.1.11"),
        "pools[2].hosts[0].address: host address '10.40.1.11' is already pools[1].hosts[0]",
    ),
    "fsx-on-prem": (
        "onprem",
        _set("storage", "parallel_fs", "kind", value="fsx-lustre"),
        "gpu-platform:platform.storage.parallel_fs.kind 'fsx-lustre' is not provided on backend onprem; "
        "allowed: lustre, nfs",
    ),
    "quota-above-the-stack": (
        "onprem",
        _set("scheduler", "teams", 0, "gpu_quota", value=100_000),
        "scheduler.teams[0].gpu_quota: 100000 GPUs is more than the 32 training GPUs the stack has at full "
        "size (train 32) and more than its budget of 40 GPUs (budget.max_gpus), so the team could never "
        "reach it: at most 40",
    ),
    "only-training-pools-empty": (
        "aws-prod",
        _all(_set("pools", 1, "count", value=0), _set("pools", 2, "max", value=0)),
        "pools[2].max: the stack's train pools have no nodes at full size",
    ),
    "tensor-parallel-beyond-the-node": (
        "aws-prod",
        _set("serving", "tensor_parallel", value=16),
        "serving.tensor_parallel: 16 is more than the 1 GPU of a g6e.xlarge node (pool 'infer'); tensor "
        "parallelism stays inside one node: at most 1",
    ),
    "tensor-parallel-beyond-a-simulated-node": (
        "local",
        _all(_set("serving", "engine", value="vllm"), _set("serving", "tensor_parallel", value=8)),
        "serving.tensor_parallel: 8 is more than the 1 GPU of a g6.xlarge node",
    ),
    "tensor-parallel-on-the-cpu": (
        "local",
        _set("serving", "tensor_parallel", value=2),
        "serving.tensor_parallel: the cpu-reference engine runs on the CPU",
    ),
    "serving-on-a-service-pool": (
        "aws-prod",
        _set("serving", "pool", value="head"),
        "gpu-platform:platform.serving.pool 'head' must name an infer pool of this stack; infer pools: infer",
    ),
    "gateway-on-no-pool": (
        "aws-prod",
        _set("serving", "gateway_pool", value="nope"),
        "serving.gateway_pool: 'nope' is not a service pool of this stack; service pools: head",
    ),
    "controller-on-an-infer-pool": (
        "onprem",
        _set("scheduler", "controller_pool", value="infer"),
        "scheduler.controller_pool: 'infer' is not a service pool of this stack; service pools: head",
    ),
    "team-twice": (
        "onprem",
        _set("scheduler", "teams", 1, "name", value="research"),
        "scheduler.teams[1].name: team 'research' is already teams[0]",
    ),
    "min-above-max": (
        "local",
        _set("pools", 1, "min", value=5),
        "pools[1].min: min (5) is larger than max (3)",
    ),
    "blank-tag": ("aws-prod", _set("tags", "owner", value="   "), "tags.owner: must not be empty or blank"),
}


@pytest.mark.parametrize("case", sorted(CONTRADICTIONS))
def test_contradictions_are_refused_at_the_field(tmp_path: Path, case: str) -> None:
    base, mutate, expected = CONTRADICTIONS[case]
    path = write_variant(tmp_path, base, mutate)
    with pytest.raises(SpecError) as raised:
        load_platform(path)
    assert f"gpu-platform:platform.{expected.removeprefix('gpu-platform:platform.')}" in raised.value.message


def test_the_provider_region_and_the_platform_region_agree(tmp_path: Path) -> None:
    document = stack_document("aws-prod")
    document["config"]["aws:region"] = "eu-west-1"
    path = tmp_path / "Pulumi.regions.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    refused(run_cli("plan", "--stack-file", str(path)), "aws:region: 'eu-west-1' differs from")


def test_the_region_list_is_the_providers(tmp_path: Path) -> None:
    """The regions are data copied from pulumi-aws (infra/spec/aws_regions.py names the release)."""
    assert {region.value for region in pulumi_aws.Region} == AWS_REGIONS


def test_a_local_zone_of_the_region_is_a_zone(tmp_path: Path) -> None:
    path = write_variant(tmp_path, "aws-prod", _set("zones", value=["us-east-1a", "us-east-1-bos-1a"]))
    assert load_platform(path).spec.zones == ["us-east-1a", "us-east-1-bos-1a"]


# ---------------------------------------------------------------------------------------------------
# Policy escapes: paths through `..`, blank tags, tags the stack cannot set, properties across rules


def test_a_checkpoint_path_leaving_the_filesystem_through_dotdot_is_caught(tmp_path: Path) -> None:
    escaping = load_platform(
        write_variant(tmp_path, "aws-prod", _set("storage", "checkpoint_path", value="/fsx/../var/ckpt"))
    )
    findings = check_spot_training_recovery(ResourceIndex([]), PolicyContext(escaping))
    assert any(
        "checkpoint_path /fsx/../var/ckpt (= /var/ckpt) is not on the shared" in f.message for f in findings
    )
    staying = load_platform(
        write_variant(
            tmp_path, "aws-prod", _set("storage", "checkpoint_path", value="/fsx/./a/../ckpt"), "in"
        )
    )
    findings = check_spot_training_recovery(ResourceIndex([]), PolicyContext(staying))
    assert findings and not any("checkpoint_path" in f.message for f in findings)


def test_a_blank_tag_value_is_a_missing_tag() -> None:
    bucket = ResourceView(
        "aws:s3/bucket:Bucket", "b", {"tags": {"owner": " \t", "team": "ml", "cost-center": "c"}}
    )
    (message,) = check_required_tags(bucket, PolicyContext(None))
    assert message.startswith("missing tag owner")


def test_a_required_tag_the_stack_lacks_is_the_stacks_violation_not_a_bad_config(
    write_stack: Callable[..., Path], tmp_path: Path
) -> None:
    """An organisation's policy config requires `project`: a stack without it breaks the rule (exit 1, each
    taggable resource named); the same stack with `tags.project` set passes; the config itself is fine."""
    config = tmp_path / "org-policy.json"
    config.write_text(json.dumps({"security-required-tags": {"requiredTags": ["owner", "project"]}}))
    lacking = gpuplat("check", "--stack", "aws-prod", "--policy-config", str(config), "--json")
    assert lacking.returncode == 1, lacking.stderr
    (verdicts,) = [r["verdicts"] for r in json.loads(lacking.stdout)]
    assert verdicts and {v["rule"] for v in verdicts} == {"security-required-tags"}
    assert all("missing tag project" in v["message"] for v in verdicts)
    tagged = write_stack("aws-prod", lambda spec: spec["tags"].update(project="llm-pretrain"), name="tagged")
    result = gpuplat("check", "--stack-file", str(tagged), "--policy-config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            {"budget-gpus": {"minSpotShare": 0.9}},
            "budget-gpus.minSpotShare: rule budget-gpus has no property 'minSpotShare'; it takes only "
            "enforcementLevel",
        ),
        (
            {"spot-training-share": {"minSpotShar": 0.9}},
            "spot-training-share.minSpotShar: rule spot-training-share has no property 'minSpotShar' (did "
            "you mean minSpotShare?); it takes minSpotShare, enforcementLevel",
        ),
        (
            {"all": {"enforcementLevel": "advisory", "isolateSubnets": True}},
            "all.isolateSubnets: all sets only",
        ),
        (
            {"isolation-shared-resources": {"isolateSubnets": "yes"}},
            "isolateSubnets: Input should be a valid boolean",
        ),
        (
            {"budget-gpus": "strict"},
            "budget-gpus.enforcementLevel: must be one of mandatory, advisory, disabled",
        ),
        ({"budget-gpu": "advisory"}, "unknown rule 'budget-gpu' (did you mean budget-gpus?)"),
    ],
)
def test_policy_config_is_validated_rule_by_rule(document: dict[str, Any], expected: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_policy_config(document)
    assert expected in raised.value.message


OPTION_SAMPLES: dict[str, Any] = {
    "min_spot_share": 0.7,
    "isolate_subnets": True,
    "inference_label": "workload=inference",
    "required_tags": ["owner", "team"],
}


def test_each_rule_sees_only_its_own_properties_as_in_crossguard() -> None:
    owners = [option for rule in RULES for option in rule.options]
    assert len(owners) == len(set(owners)), "a property read by two rules would leak between them"
    for rule in RULES:
        if not rule.options:
            continue
        properties = {PolicyConfig.property_name(o): OPTION_SAMPLES[o] for o in rule.options}
        offline = parse_policy_config({rule.id: properties})
        crossguard = PolicyConfig.from_properties(properties)  # what infra/policy/pack.py builds per policy
        for option in rule.options:
            assert getattr(offline, option) == getattr(crossguard, option) != getattr(PolicyConfig(), option)


def test_policy_config_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes("spot-training-share:\n  minSpotShare: 0.5 # ä\n".encode("latin-1"))
    refused(run_cli("check", "--stack", "local", "--policy-config", str(path)), str(path), "is not UTF-8")


# ---------------------------------------------------------------------------------------------------
# Messages in the user's words


def test_an_unknown_key_lists_the_allowed_keys(tmp_path: Path) -> None:
    path = write_variant(tmp_path, "local", _set("pools", 1, "instnce_type", value="x"))
    refused(
        run_cli("plan", "--stack-file", str(path)),
        "pools[1].instnce_type: unknown key (did you mean instance_type?); allowed: name, role, "
        "instance_type",
    )


def test_a_bad_name_says_what_a_valid_name_looks_like(tmp_path: Path) -> None:
    path = write_variant(tmp_path, "local", _set("pools", 1, "name", value="Train_1"))
    run = run_cli("plan", "--stack-file", str(path))
    refused(run, "pools[1].name: must be a lower-case name: a letter, then at most 30 letters", "'Train_1'")
    assert "^[a-z]" not in run.err


def test_a_platform_that_is_not_a_mapping_is_named_in_yaml_words(tmp_path: Path) -> None:
    document = stack_document("local")
    document["config"][CONFIG_KEY] = ["pools"]
    path = tmp_path / "Pulumi.list.yaml"
    path.write_text(yaml.safe_dump(document))
    run = run_cli("plan", "--stack-file", str(path))
    refused(run, "gpu-platform:platform: must be a mapping of keys to values, not a list")
    assert "PlatformSpec" not in run.err


def test_size_names_its_flags() -> None:
    run = run_cli("size", "--params", "7e9", "--gpu-memory", "-5")
    refused(run, "--gpu-memory: Input should be greater than 0")
    assert "gpu_memory_gib" not in run.err and "flags." not in run.err
    refused(
        run_cli("size", "--params", "7e9", "--seq-len", "2048"), "missing --micro-batch, --hidden, --layers"
    )


def test_size_refuses_tensor_parallelism_beyond_any_node() -> None:
    largest = max(n.gpu_count for n in catalog().node_types)
    refused(run_cli("size", "--params", "70e9", "--tp", str(2 * largest)), f"use --tp {largest} or less")


def test_size_advice_never_asks_for_more_tensor_parallelism_than_a_node_has() -> None:
    largest = max(n.gpu_count for n in catalog().node_types)
    run = run_cli("size", "--params", "2e12", "--tp", str(largest))
    (advice,) = [line for line in run.out.splitlines() if "No catalog node type fits" in line]
    assert run.code == 0 and "--tp" not in advice and "--pp" in advice


def test_size_bounds_the_parameter_count() -> None:
    refused(run_cli("size", "--params", "1e308"), "--params: at most 1e+15")


def test_the_parameter_bound_is_beyond_the_largest_platform() -> None:
    """MAX_PARAMS parameters' training states (16 bytes each) exceed the memory of MAX_NODES largest nodes."""
    largest_node = max(n.gpu_count * n.gpu_memory_gib for n in catalog().node_types) * 2**30
    assert MAX_NODES * largest_node < MAX_PARAMS * 16
