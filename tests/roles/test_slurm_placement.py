"""Placement preferences on Slurm: a stack whose on-demand training pools hold two GPU types gets a default
partition over both, a partition per job class, node features per GPU type, and job_submit.lua, which
gives each job its team's (or its class's) order as a matching-OR constraint.

The script is rendered with Ansible's templating from infra.scheduling.slurm's values and run in Lua 5.1 (the
Lua of Debian's slurmctld: slurm-wlm-basic-plugins depends on liblua5.1-0) with the job_desc fields
job_submit_lua.c hands it. What Slurm does with the constraint is tested on real slurmctld in the
scheduler scenario (molecule/slurm_cluster/verify/placement.yml).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("ansible")
lua51 = pytest.importorskip("lupa.lua51")

from ansible.parsing.dataloader import DataLoader  # noqa: E402
from ansible.template import Templar, trust_as_template  # noqa: E402

from infra.platform.resolve import ResolvedPlatform, load_platform  # noqa: E402
from infra.scheduling import slurm  # noqa: E402
from tests.roles.test_slurm_templates import ROLES, line_fields, lines_starting, render_aws  # noqa: E402
from tests.unit.test_placement import two_gpu_types  # noqa: E402


def with_job_class(platform: dict[str, Any]) -> None:
    """aws-prod with an L40S pool: research performance-first, product L40S first (a list: cost first is
    H100 first too, by $ per step), eval none; a fastest job class."""
    two_gpu_types(platform)
    platform["scheduler"]["teams"][1]["placement"] = ["train-l40s"]
    platform["scheduler"]["job_classes"] = [{"name": "fastest", "placement": "performance"}]


@pytest.fixture
def mixed(write_stack: Callable[..., Path]) -> ResolvedPlatform:
    return load_platform(write_stack("aws-prod", with_job_class))


def test_a_default_partition_spans_the_on_demand_pools_and_each_job_class_gets_one(
    mixed: ResolvedPlatform,
) -> None:
    values = slurm.slurm_vars(mixed)
    assert [p["name"] for p in values["slurm_partitions"] if p["default"]] == []
    shared = {p["name"]: p for p in values["slurm_shared_partitions"]}
    assert list(shared) == ["gpus", "fastest"]
    assert shared["gpus"]["default"] and not shared["fastest"]["default"]
    assert shared["gpus"]["pools"] == ["train", "train-l40s"]  # spot pools keep their own partition
    assert slurm.default_partition(mixed) == "gpus"
    assert values["slurm_placement"] == {
        "gpus": {
            "accounts": {"research": ["gpu_h100", "gpu_l40s"], "product": ["gpu_l40s", "gpu_h100"]},
            "order": ["gpu_h100", "gpu_l40s"],  # the stack's order, for eval
        },
        "fastest": {"accounts": {}, "order": ["gpu_h100", "gpu_l40s"]},
    }


def test_one_gpu_type_needs_no_placement(shipped_platforms: dict[str, ResolvedPlatform]) -> None:
    values = slurm.slurm_vars(shipped_platforms["aws-prod"])
    assert values["slurm_shared_partitions"] == [] and values["slurm_placement"] == {}
    assert [p["name"] for p in values["slurm_partitions"] if p["default"]] == ["train"]


def test_slurm_conf_lists_the_shared_partitions_types_and_the_lua_plugin(mixed: ResolvedPlatform) -> None:
    values = slurm.slurm_vars(mixed)
    conf = render_aws("slurm.conf.j2", values=values)
    assert "JobSubmitPlugins=lua" in conf.splitlines()
    nodes = {line_fields(line)["NodeName"]: line_fields(line) for line in lines_starting(conf, "NodeName=")}
    assert nodes["train-l40s-0"]["Feature"] == "pool_train-l40s,gpu_l40s"
    assert nodes["train-0"]["Feature"] == "pool_train,gpu_h100"
    parts = {line_fields(p)["PartitionName"]: line_fields(p) for p in lines_starting(conf, "PartitionName=")}
    both = [*mixed.pool("train").node_names(), *mixed.pool("train-l40s").node_names()]
    assert parts["gpus"]["Nodes"].split(",") == both
    assert parts["gpus"]["Default"] == "YES" and parts["train"]["Default"] == "NO"
    assert parts["gpus"]["PreemptMode"] == "OFF" and parts["gpus"]["PriorityTier"] == "10"
    per_gpu = [int(parts[p]["DefMemPerGPU"]) for p in ("train", "train_l40s")]
    assert int(parts["gpus"]["DefMemPerGPU"]) == min(per_gpu)  # fits a GPU of either type
    assert parts["fastest"]["Nodes"] == parts["gpus"]["Nodes"]


def test_one_gpu_type_renders_no_lua_plugin() -> None:
    assert "JobSubmitPlugins" not in render_aws("slurm.conf.j2")


def job_submit(values: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    """The rendered job_submit.lua loaded in Lua 5.1; the returned function submits one job_desc and gives
    back the fields the script set."""
    loader = DataLoader()
    variables: dict[str, Any] = {}
    for part in ("defaults", "vars"):
        variables.update(
            loader.load_from_file(
                str(ROLES / "slurm_controller" / part / "main.yml"), trusted_as_template=True
            )
        )
    variables.update(values, ansible_managed="Ansible managed")
    text = (ROLES / "slurm_controller" / "templates" / "job_submit.lua.j2").read_text()
    script = str(Templar(loader=loader, variables=variables).template(trust_as_template(text)))
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    logged: list[str] = []
    lua.globals().slurm = lua.table_from(
        {"SUCCESS": 0, "ERROR": -1, "log_info": lambda fmt, *args: logged.append(str(fmt))}
    )
    assert lua.execute(script) == 0

    def submit(**fields: Any) -> dict[str, Any]:
        job_desc = lua.table_from(fields)
        assert lua.globals().slurm_job_submit(job_desc, lua.table(), 1000) == 0
        return dict(job_desc)

    def modify(job_rec: dict[str, Any], **fields: Any) -> dict[str, Any]:
        """scontrol update job: `fields` the change, `job_rec` the pending job as slurmctld has it."""
        job_desc = lua.table_from(fields)
        assert lua.globals().slurm_job_modify(job_desc, lua.table_from(job_rec), lua.table(), 0) == 0
        return dict(job_desc)

    submit.modify = modify  # type: ignore[attr-defined]
    submit.logged = logged  # type: ignore[attr-defined]
    return submit


def test_each_job_gets_its_teams_order_unless_it_chose(mixed: ResolvedPlatform) -> None:
    submit = job_submit(slurm.slurm_vars(mixed))
    # job_submit_lua.c: partition and account are nil when not given; default_account is the user's.
    assert submit(default_account="research")["features"] == "[gpu_h100|gpu_l40s]"
    assert submit(default_account="product", partition="gpus")["features"] == "[gpu_l40s|gpu_h100]"
    assert submit(default_account="research", account="product")["features"] == "[gpu_l40s|gpu_h100]"
    assert submit(default_account="eval")["features"] == "[gpu_h100|gpu_l40s]"
    assert submit(default_account="product", partition="fastest")["features"] == "[gpu_h100|gpu_l40s]"
    chose = [
        {"tres_per_node": "gres/gpu:l40s:2"},  # a GPU type (24.11 writes gres/, 22.05 gres:)
        {"tres_per_job": "gres:gpu:h100:8"},
        {"req_nodes": "train-0"},
        {"partition": "train_l40s"},  # a pool's own partition
        {"features": "[rack1|rack2]"},  # brackets of its own: one set per job
        {"features": "graphics*2"},  # a count: brackets would be needed
    ]
    for fields in chose:
        result = submit(default_account="product", **fields)
        assert result.get("features") == fields.get("features"), fields
    assert submit(tres_per_node="gres/gpu:2", default_account="product")["features"] == "[gpu_l40s|gpu_h100]"


def test_a_constraint_or_preference_of_the_jobs_own_is_anded_with_the_order(mixed: ResolvedPlatform) -> None:
    """Issue 51, item 10: --prefer (tried on its own first) or a non-GPU --constraint let a multi-node
    job span two GPU types. Now the order is ANDed in: every node still has one GPU type."""
    submit = job_submit(slurm.slurm_vars(mixed))
    result = submit(default_account="product", features="intel")
    assert result["features"] == "(intel)&[gpu_l40s|gpu_h100]"
    result = submit(default_account="product", prefer="intel")
    assert result["features"] == "[gpu_l40s|gpu_h100]"
    assert result["prefer"] == "(intel)&[gpu_l40s|gpu_h100]"
    result = submit(default_account="research", features="gpu_l40s")  # a type: only it matches
    assert result["features"] == "(gpu_l40s)&[gpu_h100|gpu_l40s]"


def test_a_partition_list_gets_the_order_of_its_first_placed_partition(mixed: ResolvedPlatform) -> None:
    submit = job_submit(slurm.slurm_vars(mixed))
    assert submit(default_account="product", partition="train,gpus")["features"] == "[gpu_l40s|gpu_h100]"
    assert submit(default_account="product", partition="fastest,gpus")["features"] == "[gpu_h100|gpu_l40s]"


def test_a_job_moved_to_another_partition_gets_that_ones_order(mixed: ResolvedPlatform) -> None:
    """`scontrol update job=N partition=fastest`: job_submit never sees it, job_modify does."""
    submit = job_submit(slurm.slurm_vars(mixed))
    modify = submit.modify  # type: ignore[attr-defined]
    pending = {"partition": "gpus", "account": "product", "features": "[gpu_l40s|gpu_h100]"}
    assert modify(pending, partition="fastest")["features"] == "[gpu_h100|gpu_l40s]"
    own = {"partition": "gpus", "account": "product", "features": "(intel)&[gpu_l40s|gpu_h100]"}
    assert modify(own, partition="fastest")["features"] == "(intel)&[gpu_h100|gpu_l40s]"
    assert modify(pending, account="research")["features"] == "[gpu_h100|gpu_l40s]"
    assert modify(pending, time_limit=60).get("features") is None  # nothing placement reads changed


def test_a_pending_jobs_new_constraint_or_preference_keeps_the_order(mixed: ResolvedPlatform) -> None:
    """`scontrol update job=N features=intel` (or prefer=) replaces the job's constraint: without the
    order ANDed in again a multi-node job could span two GPU types."""
    submit = job_submit(slurm.slurm_vars(mixed))
    modify = submit.modify  # type: ignore[attr-defined]
    pending = {"partition": "gpus", "account": "product", "features": "[gpu_l40s|gpu_h100]"}
    assert modify(pending, features="intel")["features"] == "(intel)&[gpu_l40s|gpu_h100]"
    assert modify(pending, features="")["features"] == "[gpu_l40s|gpu_h100]"
    moved = modify(pending, prefer="intel")
    assert moved["prefer"] == "(intel)&[gpu_l40s|gpu_h100]"
    assert moved["features"] == "[gpu_l40s|gpu_h100]"


def test_each_heterogeneous_component_gets_the_order_and_it_is_logged(mixed: ResolvedPlatform) -> None:
    submit = job_submit(slurm.slurm_vars(mixed))
    for offset in (0, 1):
        result = submit(default_account="product", het_job_offset=offset)
        assert result["features"] == "[gpu_l40s|gpu_h100]"
    assert any("heterogeneous job component" in line for line in submit.logged)  # type: ignore[attr-defined]


def test_the_scheduler_scenario_gives_the_roles_what_infra_gives_them(mixed: ResolvedPlatform) -> None:
    """molecule/slurm_cluster writes its placement by hand (its nodes are fixed containers): the same fields
    as infra.scheduling.slurm, so that what slurmctld is tested with there is what a stack renders."""
    scenario = yaml.safe_load((ROLES.parent / "molecule" / "slurm_cluster" / "molecule.yml").read_text())
    given = scenario["provisioner"]["inventory"]["group_vars"]["all"]
    values = slurm.slurm_vars(mixed)
    assert {frozenset(p) for p in given["slurm_shared_partitions"]} == {
        frozenset(p) for p in values["slurm_shared_partitions"]
    }
    assert {frozenset(rule) for rule in given["slurm_placement"].values()} == {
        frozenset(rule) for rule in values["slurm_placement"].values()
    }
    features = {f for rule in given["slurm_placement"].values() for f in rule["order"]}
    assert features == {"gpu_h100", "gpu_l40s"}


def test_a_job_class_gives_its_own_order_whatever_the_team(write_stack: Callable[..., Path]) -> None:
    """A class whose order is not the stack's (L40S before H100) sends every team's jobs in its partition
    that way, the performance-first team's too; each class keeps its own."""

    def two_classes(platform: dict[str, Any]) -> None:
        with_job_class(platform)
        platform["scheduler"]["job_classes"].append({"name": "cheapest", "placement": ["train-l40s"]})

    values = slurm.slurm_vars(load_platform(write_stack("aws-prod", two_classes)))
    assert values["slurm_placement"]["cheapest"] == {"accounts": {}, "order": ["gpu_l40s", "gpu_h100"]}
    assert values["slurm_placement"]["fastest"] == {"accounts": {}, "order": ["gpu_h100", "gpu_l40s"]}
    submit = job_submit(values)
    assert submit(default_account="research", partition="cheapest")["features"] == "[gpu_l40s|gpu_h100]"
    assert submit(default_account="product", partition="fastest")["features"] == "[gpu_h100|gpu_l40s]"
    assert submit(default_account="research")["features"] == "[gpu_h100|gpu_l40s]"  # its team's, elsewhere
