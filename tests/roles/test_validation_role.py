"""The gpu_validation role (playbooks/validate.yml) without a cluster: its contract, the decisions its vars
make (drains, ready nodes, skips, srun command lines) rendered with Ansible's own templating, the fio
script it writes, and the two programs it installs on the nodes, run for real."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("ansible")

from ansible.parsing.dataloader import DataLoader  # noqa: E402
from ansible.template import Templar, trust_as_template  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "gpu_validation"
PLAYBOOK = ROOT / "playbooks" / "validate.yml"
SIMULATED = "the node's 8 H100 GPUs are simulated (gpuplat_gpu_simulated=true, the local podman cluster)"
BUILT = {
    "binary": "/opt/gpuplat/nccl-tests-2.19.6/build/all_reduce_perf",
    "library_path": "/opt/amazon/openmpi/lib64:/opt/amazon/openmpi/lib",
}
PARTITION = {"name": "train", "pool": "train", "nodes": ["train-0", "train-1", "train-2"], "gpus_per_node": 8}
# `srun --mpi=list` of Debian 12's Slurm 22.05 (the scheduler Molecule scenario's controller).
MPI_LIST_2205 = (
    "MPI plugin types are...\n\tnone\n\tcray_shasta\n\tpmi2\n\tpmix\n"
    "specific pmix plugin versions available: pmix_v4\n"
)


def load_program(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROLE / "files" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


node_check = load_program("gpuplat_node_check")
checkpoint_probe = load_program("gpuplat_checkpoint_probe")


def role_vars() -> dict[str, Any]:
    loader = DataLoader()
    values: dict[str, Any] = {}
    for part in ("defaults", "vars"):
        values.update(loader.load_from_file(str(ROLE / part / "main.yml"), trusted_as_template=True) or {})
    return values


def report(node: str, *reasons: str, absent: str = "") -> dict[str, Any]:
    return {
        "node": node,
        "pool": "train",
        "checks": [],
        "drain_reasons": list(reasons),
        "gpu_absent_reason": absent,
    }


def templar(
    sinfo: list[str],
    reports: dict[str, dict[str, Any]],
    *,
    inventory_nodes: tuple[str, ...] = ("train-0", "train-1"),
    backend: str = "local",
    **overrides: Any,
) -> Templar:
    """The controller's view in entry point `cluster`: the role's vars, an inventory of one controller and
    the running training nodes (each with the report `main` left), sinfo's answer and the loop's partition."""
    hostvars: dict[str, Any] = {"head-0": {"inventory_hostname": "head-0"}}
    for node in inventory_nodes:
        hostvars[node] = {"inventory_hostname": node}
        if node in reports:
            hostvars[node]["gpu_validation_node_report"] = reports[node]
            hostvars[node]["gpu_validation_gpu_absent_reason"] = reports[node]["gpu_absent_reason"]
            if not reports[node]["gpu_absent_reason"]:  # what nccl_tests.yml records where it built
                hostvars[node]["gpu_validation_nccl_tests"] = BUILT
    variables = role_vars()
    variables.update(
        groups={"slurm_compute": list(inventory_nodes), "slurm_controller": ["head-0"]},
        hostvars=hostvars,
        inventory_hostname="head-0",
        gpuplat_backend=backend,
        gpuplat_fabric="none",
        gpuplat_shared_path="/shared",
        gpuplat_checkpoint_path="/shared/checkpoints",
        gpuplat_gpu_architecture="hopper",
        cuda_toolkit_version="12.8",
        ansible_facts={"processor_vcpus": 192},
        slurm_partitions=[PARTITION],
        __gpu_validation_sinfo={"stdout_lines": sinfo},
        __gpu_validation_partition=PARTITION,
        __gpu_validation_run="20261201T000000Z",
        __gpu_validation_mpi="pmix",
        __gpu_validation_mpi_list={"stdout": "", "stderr": MPI_LIST_2205},
    )
    variables.update(overrides)
    return Templar(loader=DataLoader(), variables=variables)


def resolve(templar_: Templar, name: str) -> Any:
    return templar_.template(trust_as_template(f"{{{{ {name} }}}}"))


def with_plan(templar_: Templar) -> Templar:
    """The facts drain.yml and pool.yml set, in their order."""
    templar_.available_variables = {
        **templar_.available_variables,
        "__gpu_validation_drains": resolve(templar_, "__gpu_validation_drain_plan"),
    }
    templar_.available_variables = {
        **templar_.available_variables,
        "__gpu_validation_pool": resolve(templar_, "__gpu_validation_pool_plan"),
    }
    return templar_


# --- Contract --------------------------------------------------------------------------------------------


def specs() -> dict[str, Any]:
    result: dict[str, Any] = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())[
        "argument_specs"
    ]
    return result


@pytest.mark.parametrize("entry", ["main", "cluster"])
def test_every_default_is_declared_with_its_value(entry: str) -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    options = specs()[entry]["options"]
    assert sorted(set(defaults) - set(options)) == []
    assert all(name.startswith("gpu_validation_") for name in defaults)
    wrong = {
        k: (options[k]["default"], v)
        for k, v in defaults.items()
        if "default" in options[k] and options[k]["default"] != v
    }
    assert wrong == {}


def test_inventory_contract_is_required_not_defaulted() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    node = [
        "gpuplat_pool",
        "gpuplat_backend",
        "gpuplat_fabric",
        "gpuplat_shared_path",
        "gpuplat_checkpoint_path",
        "gpuplat_gpu_count",
        "gpuplat_gpu_simulated",
        "gpuplat_gpu_architecture",
        "gpu_driver_version",
        "cuda_toolkit_version",
    ]
    cluster = ["gpuplat_backend", "gpuplat_shared_path", "gpuplat_checkpoint_path", "slurm_partitions"]
    for entry, names in (("main", node), ("cluster", cluster)):
        options = specs()[entry]["options"]
        assert [n for n in names if options.get(n, {}).get("required") is not True] == [], entry
        assert not set(names) & set(defaults)


def test_playbook_checks_nodes_before_the_controller_drains_and_measures() -> None:
    plays = yaml.safe_load(PLAYBOOK.read_text())
    assert [play["hosts"] for play in plays] == ["slurm_compute", "slurm_controller[0]"]
    assert plays[0]["roles"] == [{"role": "gpu_validation"}]
    assert plays[0]["gather_facts"] is True  # nvidia_common reads the OS release, the build the vCPUs
    include = plays[1]["tasks"][0]["ansible.builtin.include_role"]
    assert include == {"name": "gpu_validation", "tasks_from": "cluster"}


def test_playbook_passes_ansible_syntax_check() -> None:
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "--syntax-check",
            "-i",
            "localhost,",
            str(PLAYBOOK),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_task_is_fqcn_and_named() -> None:
    for path in (ROLE / "tasks").glob("*.yml"):
        for task in yaml.safe_load(path.read_text()):
            tasks = [task, *task.get("block", []), *task.get("always", [])]
            for item in tasks:
                assert item.get("name"), f"{path.name}: unnamed task {item}"
                modules = [k for k in item if "." in k and not k.startswith("__")]
                assert modules or "block" in item, f"{path.name}: {item['name']} has no FQCN module"


def test_download_urls_are_variables_with_a_pinned_version() -> None:
    values = role_vars()
    assert values["gpu_validation_nccl_tests_version"] == "2.19.6"
    assert "{{ gpu_validation_nccl_tests_version }}" in values["gpu_validation_nccl_tests_url"]
    tasks = (ROLE / "tasks" / "nccl_tests.yml").read_text()
    assert 'url: "{{ gpu_validation_nccl_tests_url }}"' in tasks
    assert "https://" not in tasks


@pytest.mark.parametrize(
    ("release", "version"), [("debian12", "3.33-3"), ("debian13", "3.39-1"), ("ubuntu2204", "")]
)
def test_fio_is_pinned_where_the_release_version_is_known(release: str, version: str) -> None:
    assert resolve(templar([], {}, nvidia_common_release_id=release), "gpu_validation_fio_version") == version


@pytest.mark.parametrize(
    ("backend", "read_mib", "checkpoint_mib"), [("local", 256, 64), ("aws", 32768, 16384)]
)
def test_sizes_are_small_only_on_the_local_cluster(backend: str, read_mib: int, checkpoint_mib: int) -> None:
    rendered = templar([], {}, backend=backend)
    assert int(resolve(rendered, "gpu_validation_storage_file_mib")) == read_mib
    assert int(resolve(rendered, "gpu_validation_checkpoint_mib")) == checkpoint_mib


# --- Drains ----------------------------------------------------------------------------------------------


def test_failing_idle_node_is_drained_with_a_prefixed_reason() -> None:
    rendered = templar(
        ["train-0|idle|none", "train-1|idle|none"],
        {
            "train-0": report("train-0"),
            "train-1": report("train-1", "xid: fatal XID since boot: XID 79 on PCI:0000:3b:00"),
        },
    )
    plan = resolve(rendered, "__gpu_validation_drain_plan")
    assert plan["drained"] == {
        "train-1": "gpuplat-validate: xid: fatal XID since boot: XID 79 on PCI:0000:3b:00"
    }
    assert plan["already_drained"] == {} and plan["resumed"] == [] and plan["unchecked"] == []


def test_a_drained_node_keeps_its_reason_and_only_own_drains_are_lifted() -> None:
    rendered = templar(
        [
            "train-0|drain|gpuplat-health: /dev/nvidia3 missing",
            "train-1|drain|gpuplat-validate: ecc: 2 errors",
            "train-2|drain|gpuplat-health: /shared not mounted",
        ],
        {
            "train-0": report("train-0", "health-program: /dev/nvidia3 missing"),
            "train-1": report("train-1"),
            "train-2": report("train-2"),
        },
        inventory_nodes=("train-0", "train-1", "train-2"),
    )
    plan = resolve(rendered, "__gpu_validation_drain_plan")
    assert plan["drained"] == {}
    assert plan["already_drained"] == {"train-0": "gpuplat-health: /dev/nvidia3 missing"}
    # train-2 passes now, but the health program drained it: that program lifts its own drains.
    assert plan["resumed"] == ["train-1"]


def test_reasons_are_cut_to_what_slurm_shows_and_drain_can_be_off() -> None:
    long = "dcgm-diag: " + "memtest: GPU 0: page retirement " * 20
    rendered = templar(
        ["train-0|idle|none"], {"train-0": report("train-0", long)}, gpu_validation_drain=False
    )
    plan = resolve(rendered, "__gpu_validation_drain_plan")
    assert plan["drained"] == {}
    assert len(plan["failing_not_drained"]["train-0"]) == 250
    assert plan["failing_not_drained"]["train-0"].startswith("gpuplat-validate: dcgm-diag: memtest")
    assert plan["unchecked"] == ["train-1"]


def test_sinfo_reasons_may_contain_the_separator() -> None:
    rendered = templar(["train-0|drain|gpuplat-health: a|b", "train-1|idle~|none"], {})
    states = resolve(rendered, "__gpu_validation_slurm_states")
    assert states == {
        "train-0": {"state": "drain", "reason": "gpuplat-health: a|b"},
        "train-1": {"state": "idle~", "reason": "none"},
    }


# --- Ready nodes and skips ---------------------------------------------------------------------------------


def test_ready_nodes_exclude_failing_down_and_powered_down_ones() -> None:
    rendered = with_plan(
        templar(
            ["train-0|idle|none", "train-1|mix|none", "train-2|down*|Not responding"],
            {n: report(n) for n in ("train-0", "train-1", "train-2")},
            inventory_nodes=("train-0", "train-1", "train-2"),
        )
    )
    pool = resolve(rendered, "__gpu_validation_pool")
    assert pool["ready"] == ["train-0", "train-1"]
    assert pool["not_ready"] == {"train-2": "Slurm state down*: Not responding"}
    failing = with_plan(
        templar(["train-0|idle|none", "train-1|idle|none"], {"train-0": report("train-0", "x")})
    )
    pool = resolve(failing, "__gpu_validation_pool")
    assert pool["ready"] == []
    assert pool["not_ready"] == {
        "train-0": "failed its health checks",
        "train-1": "its health checks did not run",
        "train-2": "not running (not in the inventory)",
    }


def test_a_node_resumed_by_this_run_takes_the_steps() -> None:
    rendered = with_plan(
        templar(
            ["train-0|idle|none", "train-1|drain|gpuplat-validate: health-program: /shared/x missing"],
            {"train-0": report("train-0"), "train-1": report("train-1")},
        )
    )
    assert resolve(rendered, "__gpu_validation_pool")["ready"] == ["train-0", "train-1"]


def test_simulated_gpus_skip_both_nccl_shapes_with_the_reason() -> None:
    reports = {n: report(n, absent=SIMULATED) for n in ("train-0", "train-1")}
    rendered = with_plan(templar(["train-0|idle|none", "train-1|idle|none"], reports))
    plan = resolve(rendered, "__gpu_validation_nccl_plan")
    assert plan["nccl_1node"]["skip"] == plan["nccl_2node"]["skip"] == SIMULATED
    skipped = resolve(rendered, "__gpu_validation_skipped_steps")
    assert skipped == {
        "nccl_1node": {"status": "skipped", "detail": SIMULATED},
        "nccl_2node": {"status": "skipped", "detail": SIMULATED},
    }


def test_one_ready_node_runs_the_intra_node_test_only() -> None:
    rendered = with_plan(
        templar(
            ["train-0|idle|none", "train-1|drain|maintenance"],
            {"train-0": report("train-0"), "train-1": report("train-1")},
        )
    )
    plan = resolve(rendered, "__gpu_validation_nccl_plan")
    assert (plan["nccl_1node"]["nodes"], plan["nccl_1node"]["skip"]) == (["train-0"], "")
    assert plan["nccl_2node"]["skip"] == "needs two ready nodes; the pool has 1"


def test_a_node_without_the_nccl_tests_build_skips_them() -> None:
    reports = {n: report(n) for n in ("train-0", "train-1")}
    rendered = templar(["train-0|idle|none", "train-1|idle|none"], reports)
    del rendered.available_variables["hostvars"]["train-0"]["gpu_validation_nccl_tests"]
    plan = resolve(with_plan(rendered), "__gpu_validation_nccl_plan")
    assert plan["nccl_1node"]["skip"] == "nccl-tests were not built on train-0"


def test_no_mpi_plugin_skips_nccl_and_says_how_to_set_one() -> None:
    reports = {n: report(n) for n in ("train-0", "train-1")}
    rendered = with_plan(
        templar(["train-0|idle|none", "train-1|idle|none"], reports, __gpu_validation_mpi="")
    )
    assert (
        "set gpu_validation_mpi_plugin"
        in resolve(rendered, "__gpu_validation_nccl_plan")["nccl_2node"]["skip"]
    )


@pytest.mark.parametrize(
    ("listing", "expected"),
    [
        (MPI_LIST_2205, ["none", "cray_shasta", "pmi2", "pmix"]),
        ("MPI plugin types are...\n\tnone\n\tpmi2\n", ["none", "pmi2"]),
    ],
)
def test_mpi_plugins_are_read_from_srun(listing: str, expected: list[str]) -> None:
    rendered = templar([], {}, __gpu_validation_mpi_list={"stdout": "", "stderr": listing})
    assert resolve(rendered, "__gpu_validation_mpi_offered") == expected
    chosen = resolve(
        rendered, "__gpu_validation_mpi_preference | select('in', __gpu_validation_mpi_offered) | first"
    )
    assert chosen == ("pmix" if "pmix" in expected else "pmi2")


# --- Command lines -----------------------------------------------------------------------------------------


def test_two_node_all_reduce_runs_one_rank_per_gpu_with_the_mpi_plugin() -> None:
    nodes = ["train-0", "train-1"]
    rendered = templar([], {n: report(n) for n in nodes}, __gpu_validation_step_nodes=nodes)
    argv = resolve(rendered, "__gpu_validation_nccl_step")
    assert argv[:2] == ["srun", "--partition=train"]
    for flag in (
        "--nodelist=train-0,train-1",
        "--nodes=2",
        "--exclusive",
        "--ntasks-per-node=8",
        "--gres=gpu:8",
        "--mpi=pmix",
        "--immediate=300",
    ):
        assert flag in argv
    binary = argv.index("/opt/gpuplat/nccl-tests-2.19.6/build/all_reduce_perf")
    assert argv[binary + 1 :] == ["-b", "8", "-e", "8G", "-f", "2", "-g", "1", "-n", "20", "-w", "5"]
    assert resolve(rendered, "__gpu_validation_nccl_env") == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "LD_LIBRARY_PATH": "/opt/amazon/openmpi/lib64:/opt/amazon/openmpi/lib",
    }


def test_checkpoint_step_passes_paths_as_arguments_not_shell_text() -> None:
    argv = resolve(
        templar([], {}, __gpu_validation_step_nodes=["train-0"]), "__gpu_validation_checkpoint_step"
    )
    assert "--ntasks-per-node=1" in argv
    assert argv[-6:] == [
        "sh",
        "-c",
        'exec python3 "$0" --dir "$1/$SLURMD_NODENAME" --bytes "$2"',
        "/usr/local/libexec/gpuplat/gpuplat_checkpoint_probe.py",
        "/shared/checkpoints/.gpuplat-validate/20261201T000000Z/train",
        str(64 * 2**20),
    ]


@pytest.mark.parametrize(
    ("fabric", "architecture", "mpi_home", "gencode"),
    [
        ("efa", "hopper", "/opt/amazon/openmpi", "-gencode=arch=compute_90,code=sm_90"),
        (
            "infiniband",
            "ampere",
            "/usr/lib/x86_64-linux-gnu/openmpi",
            "-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_86,code=sm_86",
        ),
    ],
)
def test_nccl_tests_build_for_the_pools_gpus_and_mpi(
    fabric: str, architecture: str, mpi_home: str, gencode: str
) -> None:
    rendered = templar([], {}, gpuplat_fabric=fabric, gpuplat_gpu_architecture=architecture)
    make = resolve(rendered, "__gpu_validation_make")
    assert make[:3] == ["make", "-j", "192"]
    assert f"MPI_HOME={mpi_home}" in make and "MPI=1" in make and "CUDA_HOME=/usr/local/cuda-12.8" in make
    assert make[-1] == f"NVCC_GENCODE={gencode}"
    packages = resolve(rendered, "gpu_validation_build_packages")
    assert ("libopenmpi-dev" in packages) is (fabric != "efa")


def test_node_check_command_skips_gpu_checks_only_with_a_reason() -> None:
    real = resolve(templar([], {}, gpu_validation_gpu_absent_reason=""), "__gpu_validation_node_check")
    assert "--gpu-absent-reason" not in real
    assert real[real.index("--fatal-xids") + 1] == "48,64,74,79,95,119,120,140"
    assert real[real.index("--warn-xids") + 1] == "94"
    simulated = resolve(
        templar([], {}, gpu_validation_gpu_absent_reason=SIMULATED), "__gpu_validation_node_check"
    )
    assert simulated[-2:] == ["--gpu-absent-reason", SIMULATED]


def render_storage_script(tmp_path: Path) -> Path:
    rendered = templar([], {}, ansible_managed="Ansible managed")
    text = (ROLE / "templates" / "storage-read.sh.j2").read_text()
    script = tmp_path / "storage-read.sh"
    script.write_text(
        str(
            rendered.template(
                trust_as_template(text), escape_backslashes=False, overrides={"trim_blocks": True}
            )
        )
    )
    return script


def test_storage_script_reads_with_o_direct_from_every_job(tmp_path: Path) -> None:
    script = render_storage_script(tmp_path)
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    for option in (
        "--rw=read",
        "--direct=1",
        "--numjobs=4",
        "--size=64M",
        "--ioengine=libaio",
        "--group_reporting",
        "--runtime=5",
        "--output-format=json",
    ):
        assert option in text
    assert '--output=/shared/.gpuplat-validate/20261201T000000Z/train/fio-"$node".json' in text


def test_storage_script_lays_out_then_reads_with_fio(tmp_path: Path) -> None:
    """The script runs for real; the fio it finds on PATH records its arguments (no fio on the test host)."""
    script = render_storage_script(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fio").write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$FIO_ARGS"\n')
    (bin_dir / "fio").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURMD_NODENAME": "train-0",
        "FIO_ARGS": str(tmp_path / "args"),
    }
    text = script.read_text().replace("/shared/.gpuplat-validate", str(tmp_path / "shared"))
    script.write_text(text)
    for mode, expected in (("layout", "--create_only=1"), ("read", "--time_based")):
        subprocess.run(["bash", str(script), mode], check=True, env=env)
        args = (tmp_path / "args").read_text().splitlines()
        assert expected in args
        assert f"--directory={tmp_path}/shared/20261201T000000Z/train/data/train-0" in args
    assert (tmp_path / "shared/20261201T000000Z/train/data/train-0").is_dir()
    bad = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "usage" in bad.stderr
    outside = subprocess.run(
        ["bash", str(script), "read"], env={"PATH": env["PATH"]}, capture_output=True, check=False
    )
    assert outside.returncode != 0


# --- The node check ---------------------------------------------------------------------------------------

KERNEL_LOG = """\
[  12.345678] nvidia-nvlink: Nvlink Core is being initialized
[ 812.000001] NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics SM Warp Exception
[ 913.500000] NVRM: Xid (PCI:0000:86:00): 79, pid=1234, GPU has fallen off the bus.
"""


def test_xids_are_read_from_the_kernel_log_and_only_fatal_ones_fail() -> None:
    assert [(x.pci, x.xid) for x in node_check.parse_xids(KERNEL_LOG)] == [
        ("0000:3b:00", 13),
        ("0000:86:00", 79),
    ]
    check = node_check.xid_check(KERNEL_LOG, {48, 79})
    assert check.status == "fail"
    assert "XID 79 on PCI:0000:86:00 (pid=1234, GPU has fallen off the bus.)" in check.detail
    assert "13" not in check.detail
    lenient = node_check.xid_check(KERNEL_LOG, {48})
    assert (lenient.status, lenient.detail) == (
        "pass",
        "no fatal XID since boot (non-fatal XIDs seen: 13, 79)",
    )
    assert node_check.xid_check("", {79}).detail == "no XID since boot"


def test_a_contained_error_xid_warns_without_draining() -> None:
    """DCGM's always-watched XIDs: 94 (contained ECC error) is WARN, not FAIL (DcgmHealthWatch.cpp)."""
    log = KERNEL_LOG + "[ 990.000000] NVRM: Xid (PCI:0000:3b:00): 94, pid=77, Contained: SM (0x1)\n"
    check = node_check.xid_check(log, {48}, frozenset({94}))
    assert (check.status, check.detail) == (
        "warn",
        "XID since boot that needs a look: XID 94 on PCI:0000:3b:00 (pid=77, Contained: SM (0x1))",
    )
    assert node_check.xid_check(log, {48, 79}, frozenset({94})).status == "fail"  # a fatal one wins
    report = node_check.Report()
    report.add(check)
    assert report.drain_reasons == []


def test_uncorrectable_ecc_and_row_remapping_fail() -> None:
    ecc = "0, 00000000:18:00.0, 0\n1, 00000000:2A:00.0, 3\n2, 00000000:3A:00.0, [N/A]\n"
    remap = "00000000:18:00.0, No, No\n00000000:2A:00.0, Yes, No\n00000000:3A:00.0, No, Yes\n"
    assert node_check.ecc_problems(ecc, remap) == [
        "GPU 1 (00000000:2A:00.0): 3 uncorrectable ECC error(s) since the driver loaded",
        "GPU 00000000:2A:00.0: row remapping pending (the GPU needs a reset)",
        "GPU 00000000:3A:00.0: row remapping failed (no spare rows left)",
    ]
    assert node_check.ecc_problems("0, 00000000:18:00.0, 0\n", "") == []


# The layout dcgmi diag -j writes (NVIDIA/DCGM dcgmi/Diag.cpp: "DCGM Diagnostic" / test_categories / tests /
# results with entity_group, entity_id, status and warnings[].warning).
DCGM_FAILED = {
    "DCGM Diagnostic": {
        "test_categories": [
            {"category": "Deployment", "tests": [{"name": "software", "results": [{"status": "Pass"}]}]},
            {
                "category": "Hardware",
                "tests": [
                    {
                        "name": "memory",
                        "results": [
                            {"entity_group": "GPU", "entity_id": 0, "status": "Pass"},
                            {
                                "entity_group": "GPU",
                                "entity_id": 3,
                                "status": "Fail",
                                "warnings": [{"warning": "DBE errors detected on GPU 3", "error_id": 31}],
                            },
                        ],
                    }
                ],
            },
        ]
    },
    "Overall Result": "Fail",
}


def test_dcgm_diag_exit_status_and_json_decide() -> None:
    text = "Successfully ran diagnostic\n" + json.dumps(DCGM_FAILED)
    assert node_check.dcgm_failures(text) == ["memory: GPU 3: DBE errors detected on GPU 3"]
    failed = node_check.dcgm_check(226, text, 2)  # DCGM_ST_NVVS_ERROR (-30)
    assert (failed.status, failed.detail) == ("fail", "memory: GPU 3: DBE errors detected on GPU 3")
    assert node_check.dcgm_check(205, "{}", 3).detail == "dcgmi diag -r 3 reported a failure (exit 205)"
    assert node_check.dcgm_check(0, "{}", 2).status == "pass"
    broken = node_check.dcgm_check(255, "Error: unable to connect to host engine", 2)
    assert broken.status == "error" and "could not run (exit 255)" in broken.detail


def health_program(tmp_path: Path, exit_code: int, message: str = "") -> Path:
    program = tmp_path / "gpuplat-node-health"
    program.write_text(f'#!/bin/sh\n[ "$1" = --dry-run ] || exit 9\necho "{message}" >&2\nexit {exit_code}\n')
    program.chmod(0o755)
    return program


def run_node_check(*args: str, path: str = "/usr/bin:/bin") -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(ROLE / "files" / "gpuplat_node_check.py"), *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PATH": path},
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_node_check_drains_on_the_health_program_and_skips_gpu_checks_saying_why(tmp_path: Path) -> None:
    program = health_program(tmp_path, 1, "gpuplat-health: /dev/nvidia3 missing")
    result = run_node_check("--health-program", str(program), "--gpu-absent-reason", SIMULATED)
    checks = {c["name"]: (c["status"], c["detail"]) for c in result["checks"]}
    assert checks["health-program"] == ("fail", "/dev/nvidia3 missing")
    assert checks["xid"] == checks["ecc"] == checks["dcgm-diag"] == ("skip", SIMULATED)
    assert result["drain_reasons"] == ["health-program: /dev/nvidia3 missing"]


def test_node_check_passes_a_healthy_node_and_says_a_missing_program(tmp_path: Path) -> None:
    healthy = run_node_check(
        "--health-program", str(health_program(tmp_path, 0)), "--gpu-absent-reason", "no GPUs"
    )
    assert healthy["drain_reasons"] == []
    missing = run_node_check("--health-program", str(tmp_path / "absent"), "--gpu-absent-reason", "no GPUs")
    assert missing["checks"][0]["status"] == "skip" and "is not installed" in missing["checks"][0]["detail"]


def tools(tmp_path: Path, squeue_jobs: str) -> tuple[str, Path]:
    """squeue answering `squeue_jobs`, and a dcgmi that records its calls: a PATH and the record."""
    bin_dir, record = tmp_path / "bin", tmp_path / "dcgmi-calls"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\nprintf '{squeue_jobs}'\n")
    (bin_dir / "dcgmi").write_text(f'#!/bin/sh\necho "$@" >> {record}\necho "{{}}"\n')
    for tool in ("squeue", "dcgmi"):
        (bin_dir / tool).chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin", record


@pytest.mark.parametrize(("jobs", "runs"), [("", True), ("412\\n413\\n", False)])
def test_the_dcgm_diagnostic_runs_only_where_no_job_holds_the_node(
    tmp_path: Path, jobs: str, runs: bool
) -> None:
    """A level-2 diagnostic stresses every GPU: on GPUs a job uses it can fail, drain a healthy node and
    disturb the job. Nodes in `mix` or `alloc` state are left to a later, idle run."""
    path, record = tools(tmp_path, jobs)
    result = run_node_check(
        "--health-program", str(health_program(tmp_path, 0)), "--slurm-node", "train-0", path=path
    )
    [dcgm] = [c for c in result["checks"] if c["name"] == "dcgm-diag"]
    assert record.exists() is runs
    if not runs:
        assert dcgm["status"] == "skip" and "train-0 runs jobs 412,413" in dcgm["detail"]
        assert result["drain_reasons"] == []


# --- The checkpoint probe ---------------------------------------------------------------------------------


def test_checkpoint_probe_commits_like_a_training_job_and_cleans_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "ckpt" / "train-0"
    assert (
        checkpoint_probe.main(["--dir", str(target), "--bytes", str(3 * 2**20 + 5), "--block-mib", "1"]) == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["bytes"] == 3 * 2**20 + 5
    assert result["seconds"] >= result["write_s"] + result["fsync_s"] - 1e-3
    assert list(target.iterdir()) == []
    assert checkpoint_probe.main(["--dir", str(target), "--bytes", "1000", "--keep"]) == 0
    kept = target / "checkpoint-probe.bin"
    assert kept.stat().st_size == 1000 and not list(target.glob(".*tmp*"))


def test_checkpoint_probe_reports_a_filesystem_that_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert checkpoint_probe.main(["--dir", str(blocker / "sub"), "--bytes", "10"]) == 1
    assert "error" in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("code", "output", "status", "detail"),
    [
        (0, "0, 00000000:18:00.0, None\n1, 00000000:2A:00.0, None\n", "pass", "no recovery action"),
        (
            0,
            "0, 00000000:18:00.0, None\n1, 00000000:2A:00.0, Reset\n",
            "fail",
            "GPU 1 (00000000:2A:00.0): Reset",
        ),
        (0, "0, 00000000:18:00.0, Drain and Reset\n", "fail", "Drain and Reset"),
        (0, "0, 00000000:18:00.0, Drain P2P\n", "warn", "GPU 0 (00000000:18:00.0): Drain P2P"),
        (0, "0, 00000000:18:00.0, [N/A]\n", "pass", "no recovery action"),
        (2, 'Field "gpu_recovery_action" is not a valid field to query.\n', "skip", "no gpu_recovery_action"),
        (
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            "error",
            "could not",
        ),
    ],
)
def test_the_drivers_recovery_action_drains_or_warns(
    code: int, output: str, status: str, detail: str
) -> None:
    """XID 154 says the driver's recovery action changed; the action itself (reset, reboot, drain and
    reset) is what decides whether the node can take work: DCGM's health watch fails on those."""
    check = node_check.recovery_check_from(code, output)
    assert (check.name, check.status) == ("recovery", status) and detail in check.detail


def test_a_gpu_asking_for_a_reboot_is_drained(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    answers = {
        "--query-gpu=index,pci.bus_id,gpu_recovery_action": "0, 00000000:18:00.0, Reboot",
        "--query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total": "0, 00000000:18:00.0, 0",
    }
    cases = "\n".join(f'  "{flag}") echo "{answer}";;' for flag, answer in answers.items())
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\ncase "$1" in\n{cases}\n  *) exit 6;;\nesac\n')
    (bin_dir / "dmesg").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("nvidia-smi", "dmesg"):
        (bin_dir / tool).chmod(0o755)
    result = run_node_check(
        "--health-program", str(health_program(tmp_path, 0)), path=f"{bin_dir}:/usr/bin:/bin"
    )
    assert result["drain_reasons"] == [
        "recovery: the driver asks for a recovery action: GPU 0 (00000000:18:00.0): Reboot"
    ]


@pytest.mark.parametrize(("checkpoint_gib", "dcgm_level"), [(None, 2), (0.25, 4)])
def test_what_gpuplat_validate_passes_is_what_the_role_accepts(
    tmp_path: Path, checkpoint_gib: float | None, dcgm_level: int
) -> None:
    """A stand-in for playbooks/validate.yml, run by the real ansible-playbook with the command line
    `gpuplat validate` builds: the role's own argument spec validates exactly those extra vars (strings
    from -e key=value), and a name the role does not declare would be ignored by it, so none may be."""
    from infra.nodes.playbook_run import ansible_playbook_binary
    from infra.validate.run import ValidateOptions, extra_vars

    values = extra_vars(
        ValidateOptions(checkpoint_gib=checkpoint_gib, dcgm_level=dcgm_level), tmp_path / "raw"
    )
    declared = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"][
        "options"
    ]
    assert set(values) <= set(declared), f"not declared by the role: {set(values) - set(declared)}"
    seen = tmp_path / "seen.json"
    play = [
        {
            "name": "Stand-in for validate.yml",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Validate the extra vars as the role does",
                    "ansible.builtin.validate_argument_spec": {
                        "argument_spec": {name: declared[name] for name in values}
                    },
                },
                {
                    "name": "Record them",
                    "ansible.builtin.copy": {
                        "dest": str(seen),
                        "content": "{{ {" + ", ".join(f"'{n}': {n}" for n in values) + "} | to_json }}",
                        "mode": "0644",
                    },
                },
            ],
        }
    ]
    playbook = tmp_path / "validate.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    command = [ansible_playbook_binary(), "-i", "localhost,", "-c", "local", str(playbook)]
    command += ["-e", f"ansible_python_interpreter={sys.executable}"]
    for key, value in values.items():
        command += ["-e", f"{key}={value}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads(seen.read_text()) == values
