"""The Slurm roles' shared configuration, rendered with Ansible's own templating.

slurm.conf, gres.conf and cgroup.conf are rendered from the role's defaults and vars, an
inventory shaped like `gpuplat inventory` output (the slurm_* values come from
infra.scheduling.slurm for the shipped stacks) and the facts the role gathers on the nodes
(tasks/facts.yml): Slurm version, cgroup hierarchy, NVML plugin; node hardware facts.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("ansible")

from ansible.parsing.dataloader import DataLoader  # noqa: E402
from ansible.template import Templar, trust_as_template  # noqa: E402

from infra.platform.resolve import load_platform  # noqa: E402
from infra.scheduling import slurm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
OVERRIDES = {"trim_blocks": True, "lstrip_blocks": False}

# Facts as Ansible gathers them: a 2-socket, 48-core, 2-thread node (p5.48xlarge-like) and
# the 2-vCPU test host (what the podman containers see).
P5_FACTS = {
    "memtotal_mb": 2063844,
    "processor_vcpus": 192,
    "processor_count": 2,
    "processor_cores": 48,
    "processor_threads_per_core": 2,
    "distribution_release": "bookworm",
    "architecture": "x86_64",
}
SMALL_FACTS = {
    "memtotal_mb": 24105,
    "processor_vcpus": 2,
    "processor_count": 1,
    "processor_cores": 2,
    "processor_threads_per_core": 1,
    "distribution_release": "bookworm",
    "architecture": "x86_64",
}


def role_vars(role: str) -> dict[str, Any]:
    loader = DataLoader()
    values: dict[str, Any] = {}
    for part in ("defaults", "vars"):
        path = ROLES / role / part / "main.yml"
        if path.exists():
            values.update(loader.load_from_file(str(path), trusted_as_template=True) or {})
    return values


def render(
    template: str,
    *,
    version: str = "22.05.8-4+deb12u3",
    cgroup_fs: str = "tmpfs",
    nvml: bool = False,
    simulated: bool = True,
    facts: dict[str, Any] | None = None,
    slurm: dict[str, Any] | None = None,
    **overrides: Any,
) -> str:
    """Render a slurm_common template for a controller and two 8-GPU training nodes."""
    computes = ["train-0", "train-1"]
    node_vars = {
        "gpuplat_pool": "train",
        "gpuplat_role": "train",
        "gpuplat_gpu_model": "H100",
        "gpuplat_gpu_count": 8,
        "gpuplat_gpu_simulated": simulated,
        "ansible_facts": dict(facts or P5_FACTS),
    }
    hostvars = {host: dict(node_vars) for host in computes}
    hostvars["head-0"] = {"ansible_facts": dict(SMALL_FACTS), "gpuplat_gpu_count": 0}
    slurm = slurm or {
        "slurm_cluster_name": "test",
        "slurm_partitions": [
            {"name": "train", "pool": "train", "nodes": computes, "gpus_per_node": 8, "gpu_type": "h100",
             "priority_tier": 10, "preempt_mode": "OFF", "default": True, "spot": False,
             "allowed_qos": ["normal", "high", "spot"]},
        ],
        "slurm_accounts": [{"name": "research", "gpu_limit": 8, "fairshare": 1, "users": ["alice"]}],
        "slurm_qos": [
            {"name": "high", "priority": 1000, "preempt": ["spot"], "preempt_mode": "requeue",
             "grace_time": 0},
            {"name": "normal", "priority": 100, "preempt": ["spot"], "preempt_mode": "requeue",
             "grace_time": 0},
            {"name": "spot", "priority": 10, "preempt": [], "preempt_mode": "requeue", "grace_time": 120},
        ],
        "slurm_default_time_limit": "24:00:00",
    }  # fmt: skip
    variables = role_vars("slurm_common")
    variables.update(slurm)
    variables.update(
        ansible_managed="Ansible managed",
        gpuplat_stack="test",
        gpuplat_backend="aws",
        inventory_hostname="head-0",
        ansible_facts=dict(SMALL_FACTS),
        groups={"all": ["head-0", *computes], "slurm_controller": ["head-0"], "slurm_compute": computes,
                "pool_train": computes},
        hostvars=hostvars,
        __slurm_common_version_probe={"stdout": version},
        __slurm_common_node_probes={
            "results": [{"item": host, "stdout_lines": [cgroup_fs, "nvml" if nvml else "-"]}
                        for host in computes]
        },
    )  # fmt: skip
    variables.update(overrides)
    templar = Templar(loader=DataLoader(), variables=variables)
    text = (ROLES / "slurm_common" / "templates" / template).read_text()
    return str(templar.template(trust_as_template(text), escape_backslashes=False, overrides=OVERRIDES))


def settings(text: str) -> dict[str, str]:
    """key=value lines of a Slurm config file (the last one wins), comments dropped."""
    result = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line and " " not in line.split("=", 1)[0]:
            key, value = line.split("=", 1)
            result[key] = value
    return result


def lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def line_fields(line: str) -> dict[str, str]:
    return dict(field.split("=", 1) for field in line.split())


# --- 1. GPU isolation: explicit device files unless NVML autodetection is really there -----


@pytest.mark.parametrize("simulated", [True, False])
def test_gres_lists_one_device_file_per_gpu_without_nvml(simulated: bool) -> None:
    gres = render("gres.conf.j2", simulated=simulated)
    lines = lines_starting(gres, "NodeName=train-0")
    assert lines == [f"NodeName=train-0 Name=gpu Type=h100 File=/dev/nvidia{i}" for i in range(8)]
    assert not [line for line in gres.splitlines() if "AutoDetect" in line and not line.startswith("#")]


def test_gres_autodetects_only_where_the_nvml_plugin_is_installed() -> None:
    gres = render("gres.conf.j2", simulated=False, nvml=True)
    assert lines_starting(gres, "NodeName=train-0") == ["NodeName=train-0 AutoDetect=nvml"]
    # Simulated GPUs are never autodetected; "off" never autodetects.
    simulated = render("gres.conf.j2", simulated=True, nvml=True)
    assert not [
        line for line in simulated.splitlines() if line.startswith("NodeName") and "AutoDetect" in line
    ]
    off = render("gres.conf.j2", simulated=False, nvml=True, slurm_common_gpu_autodetect="off")
    assert "NodeName=train-0 Name=gpu Type=h100 File=/dev/nvidia7" in off
    assert not [line for line in off.splitlines() if line.startswith("NodeName") and "AutoDetect" in line]


def test_gpu_autodetect_default_is_not_nvml() -> None:
    assert role_vars("slurm_common")["slurm_common_gpu_autodetect"] == "auto"


# --- 2. Node lines: topology and memory from the node's facts --------------------------


def test_node_lines_carry_topology_and_real_memory_below_memtotal() -> None:
    conf = render("slurm.conf.j2")
    node = line_fields(lines_starting(conf, "NodeName=train-0")[0])
    assert (node["CPUs"], node["Sockets"], node["CoresPerSocket"], node["ThreadsPerCore"]) == (
        "192",
        "2",
        "48",
        "2",
    )
    real = int(node["RealMemory"])
    assert P5_FACTS["memtotal_mb"] * 0.98 <= real < P5_FACTS["memtotal_mb"]  # 1 % margin


def test_small_node_keeps_at_least_512_mib_margin() -> None:
    conf = render("slurm.conf.j2", facts=SMALL_FACTS)
    node = line_fields(lines_starting(conf, "NodeName=train-0")[0])
    assert int(node["RealMemory"]) == SMALL_FACTS["memtotal_mb"] - 512
    assert (node["CPUs"], node["Sockets"], node["CoresPerSocket"], node["ThreadsPerCore"]) == (
        "2",
        "1",
        "2",
        "1",
    )


def test_inconsistent_topology_falls_back_to_single_core_sockets() -> None:
    facts = dict(
        SMALL_FACTS, processor_vcpus=4, processor_count=1, processor_cores=1, processor_threads_per_core=1
    )
    node = line_fields(lines_starting(render("slurm.conf.j2", facts=facts), "NodeName=train-0")[0])
    assert (node["CPUs"], node["Sockets"], node["CoresPerSocket"], node["ThreadsPerCore"]) == (
        "4",
        "4",
        "1",
        "1",
    )


def test_memory_is_consumable_and_gpu_jobs_get_a_share_by_default() -> None:
    conf = render("slurm.conf.j2")
    assert settings(conf)["SelectTypeParameters"] == "CR_Core_Memory"
    partition = line_fields(lines_starting(conf, "PartitionName=train")[0])
    real = int(line_fields(lines_starting(conf, "NodeName=train-0")[0])["RealMemory"])
    assert int(partition["DefMemPerGPU"]) == real // 8


# --- 3. cgroup plugins from the nodes' cgroup hierarchy and the Slurm version -----------


def test_cgroup_v2_nodes_get_the_cgroup_plugins_and_device_constraints() -> None:
    conf = settings(render("slurm.conf.j2", cgroup_fs="cgroup2fs", version="24.11.5-4+deb13u1"))
    assert conf["ProctrackType"] == "proctrack/cgroup"
    assert conf["TaskPlugin"] == "task/cgroup,task/affinity"
    cgroup = settings(render("cgroup.conf.j2", cgroup_fs="cgroup2fs", version="24.11.5-4+deb13u1"))
    assert cgroup["CgroupPlugin"] == "cgroup/v2"
    assert cgroup["ConstrainDevices"] == "yes" and cgroup["ConstrainRAMSpace"] == "yes"
    assert "CgroupAutomount" not in cgroup


@pytest.mark.parametrize("backend", ["aws", "local"])
def test_cgroup_v1_or_hybrid_nodes_use_linuxproc_whatever_the_backend(backend: str) -> None:
    conf = settings(render("slurm.conf.j2", cgroup_fs="tmpfs", gpuplat_backend=backend))
    assert (conf["ProctrackType"], conf["TaskPlugin"]) == ("proctrack/linuxproc", "task/none")


def test_one_cgroup_v1_node_keeps_the_whole_cluster_off_cgroups() -> None:
    probes = {"results": [{"item": "train-0", "stdout_lines": ["cgroup2fs", "-"]},
                          {"item": "train-1", "stdout_lines": ["tmpfs", "-"]}]}  # fmt: skip
    conf = settings(render("slurm.conf.j2", __slurm_common_node_probes=probes))
    assert conf["ProctrackType"] == "proctrack/linuxproc"


def test_cgroup_conf_follows_the_slurm_version() -> None:
    old = settings(render("cgroup.conf.j2", version="22.05.8-4+deb12u3"))
    new = settings(render("cgroup.conf.j2", version="24.11.5-4+deb13u1"))
    assert old["CgroupPlugin"] == "autodetect"  # 22.05 has no "disabled"
    assert new["CgroupPlugin"] == "disabled"  # 24.11 would otherwise init a cgroup plugin in slurmd
    forced_v1 = settings(render("cgroup.conf.j2", version="22.05.8", slurm_common_cgroup_mode="cgroup"))
    assert forced_v1["CgroupPlugin"] == "cgroup/v1" and forced_v1["CgroupAutomount"] == "yes"
    forced_v1_new = settings(render("cgroup.conf.j2", version="24.11.5", slurm_common_cgroup_mode="cgroup"))
    assert "CgroupAutomount" not in forced_v1_new  # removed from newer Slurm


# --- 4. PMIx and the extern step -------------------------------------------------------


def test_slurmctld_pid_file_where_the_distros_unit_lets_it_write() -> None:
    assert settings(render("slurm.conf.j2", version="22.05.8"))["SlurmctldPidFile"] == "/run/slurmctld.pid"
    new = settings(render("slurm.conf.j2", version="24.11.5-4+deb13u1"))
    assert new["SlurmctldPidFile"] == "/run/slurmctld/slurmctld.pid"


def test_pmix_is_the_default_mpi_and_jobs_are_contained() -> None:
    conf = settings(render("slurm.conf.j2"))
    assert conf["MpiDefault"] == "pmix"
    assert conf["PrologFlags"] == "Contain"


def test_jobs_take_slurmds_unlimited_locked_memory_for_rdma() -> None:
    """Slurm propagates the submitting shell's limits by default (Slurm FAQ, memlock): a login shell's
    64 KiB memlock would make RDMA memory registration fail in srun steps."""
    assert settings(render("slurm.conf.j2"))["PropagateResourceLimitsExcept"] == "MEMLOCK"
    dropin = (ROLES / "slurm_compute" / "templates" / "slurmd-limits.conf.j2").read_text()
    assert "[Service]\nLimitMEMLOCK=infinity" in dropin


@pytest.mark.parametrize(
    ("release", "packages"), [("bookworm", ["libpmix-dev"]), ("trixie", ["libpmix2t64"]), ("jammy", [])]
)
def test_pmix_packages_per_release(release: str, packages: list[str]) -> None:
    variables = role_vars("slurm_common")
    variables["ansible_facts"] = {"distribution_release": release}
    templar = Templar(loader=DataLoader(), variables=variables)
    assert list(templar.template(trust_as_template("{{ slurm_common_pmix_packages }}"))) == packages


# --- 5. Preemption: one mode, grace period -----------------------------------------------


@pytest.mark.parametrize("mode", ["requeue", "cancel"])
def test_spec_preempt_mode_reaches_qos_partitions_and_slurm_conf(
    write_stack: Callable[..., Path], mode: str
) -> None:
    path = write_stack(
        "aws-prod", lambda platform: platform["scheduler"].__setitem__("spot_preempt_mode", mode)
    )
    values = slurm.slurm_vars(load_platform(path))
    spot_partitions = [p for p in values["slurm_partitions"] if p["spot"]]
    assert spot_partitions and {p["preempt_mode"] for p in spot_partitions} == {mode.upper()}
    qos = {q["name"]: q for q in values["slurm_qos"]}
    assert (
        qos["spot"]["preempt_mode"] == mode
        and qos["spot"].get("grace_time") == getattr(slurm, "SPOT_GRACE_TIME_S", None)
        and qos["spot"]["grace_time"] > 0
    )
    assert {q["preempt_mode"] for q in values["slurm_qos"]} == {mode}
    computes = ["train-0", "train-1"]
    for p in values["slurm_partitions"]:
        p["nodes"] = computes
        p["pool"] = "train"
    conf = render("slurm.conf.j2", slurm={**values, "slurm_cluster_name": "t"}, gpuplat_shared_path="/fsx")
    assert settings(conf)["PreemptMode"] == mode.upper()
    assert (
        f"PreemptMode={mode.upper()}"
        in lines_starting(conf, f"PartitionName={spot_partitions[0]['name']}")[0]
    )


def test_dbd_innodb_settings_follow_slurms_accounting_guide() -> None:
    variables = role_vars("slurm_dbd")
    variables.update(ansible_managed="Ansible managed", ansible_facts={"memtotal_mb": 65536})
    templar = Templar(loader=DataLoader(), variables=variables)
    text = (ROLES / "slurm_dbd" / "templates" / "60-slurmdbd.cnf.j2").read_text()
    cnf = settings(str(templar.template(trust_as_template(text), overrides=OVERRIDES)))
    assert cnf["innodb_buffer_pool_size"] == "4096M"
    assert cnf["innodb_log_file_size"] == "64M"
    assert cnf["innodb_lock_wait_timeout"] == "900"
    small = dict(variables, ansible_facts={"memtotal_mb": 2048})
    assert (
        Templar(loader=DataLoader(), variables=small).template(
            trust_as_template("{{ slurm_dbd_innodb_buffer_pool_size }}")
        )
        == "1024M"
    )  # never below what slurmdbd checks for


@pytest.mark.parametrize(
    ("runtime_dir", "pid_file"), [("", "/run/slurmdbd.pid"), ("slurmdbd", "/run/slurmdbd/slurmdbd.pid")]
)
def test_slurmdbd_pid_file_follows_the_unit(runtime_dir: str, pid_file: str) -> None:
    variables = role_vars("slurm_dbd")
    variables.update(ansible_managed="Ansible managed", inventory_hostname="head-0",
                     __slurm_dbd_unit={"status": {"RuntimeDirectory": runtime_dir}})  # fmt: skip
    text = (ROLES / "slurm_dbd" / "templates" / "slurmdbd.conf.j2").read_text()
    conf = Templar(loader=DataLoader(), variables=variables).template(
        trust_as_template(text), overrides=OVERRIDES
    )
    assert settings(str(conf))["PidFile"] == pid_file


# --- role contract --------------------------------------------------------------------


@pytest.mark.parametrize("role", ["slurm_common", "slurm_compute", "slurm_controller", "slurm_dbd", "munge"])
def test_slurm_role_defaults_are_declared(role: str) -> None:
    defaults_file = ROLES / role / "defaults" / "main.yml"
    defaults = yaml.safe_load(defaults_file.read_text()) if defaults_file.exists() else {}
    specs = yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options: dict[str, Any] = {}
    for entry in specs.values():
        options.update(entry.get("options", {}))
    assert not sorted(set(defaults or {}) - set(options))
    for template in (
        (ROLES / role / "templates").glob("*.j2") if (ROLES / role / "templates").exists() else []
    ):
        first = template.read_text().splitlines()
        assert any(line.startswith("{{ ansible_managed | comment") for line in first[:2]), template


def test_templates_have_no_leftover_backend_switches() -> None:
    text = (ROLES / "slurm_common" / "templates" / "slurm.conf.j2").read_text()
    assert not re.search(r"gpuplat_backend", text)


# --- 6. Elastic training pools on aws: power saving, CLOUD node lines, configless ------------

VERSIONS = {  # Slurm of Ubuntu 22.04, Debian 12, Ubuntu 24.04, Debian 13
    "21.08": "21.08.5-2ubuntu1",
    "22.05": "22.05.8-4+deb12u3",
    "23.11": "23.11.4-1.2ubuntu5",
    "24.11": "24.11.5-4+deb13u1",
}
# The aws inventory names hosts by instance id.
AWS_CONTROLLERS = ["i-0c0ffee0000000001", "i-0c0ffee0000000002"]


def stack_values(path_or_name: str | Path) -> dict[str, Any]:
    path = path_or_name if isinstance(path_or_name, Path) else ROOT / "stacks" / f"Pulumi.{path_or_name}.yaml"
    return slurm.slurm_vars(load_platform(path))


def render_aws(template: str, values: dict[str, Any] | None = None, **overrides: Any) -> str:
    """Render for an aws stack as the controller sees it: no training instance is running (the aws
    inventory lists running instances only, by instance id), the controllers are instance ids."""
    variables: dict[str, Any] = dict(
        slurm=values or stack_values("aws-prod"),
        gpuplat_shared_path="/fsx",
        inventory_hostname=AWS_CONTROLLERS[0],
        groups={"all": AWS_CONTROLLERS, "slurm_controller": AWS_CONTROLLERS, "slurm_compute": []},
        hostvars={host: {"ansible_facts": dict(SMALL_FACTS)} for host in AWS_CONTROLLERS},
        __slurm_common_node_probes={"results": []},
    )
    variables.update(overrides)
    return render(template, **variables)


@pytest.mark.parametrize("version", VERSIONS.values())
def test_aws_training_nodes_are_cloud_nodes_with_catalog_figures(version: str) -> None:
    conf = render_aws("slurm.conf.j2", version=version)
    nodes = {line_fields(line)["NodeName"]: line_fields(line) for line in lines_starting(conf, "NodeName=")}
    names = [f"train-{i}" for i in range(4)] + [f"train-spot-{i}" for i in range(4)]
    assert sorted(nodes) == sorted(names)  # every node a pool may have, none of them running
    real = slurm.cloud_real_memory_mb(2048)  # p5.48xlarge: 192 vCPU, 2048 GiB, 8 H100
    for name, node in nodes.items():
        pool = name.rsplit("-", 1)[0]
        assert node == {"NodeName": name, "CPUs": "192", "RealMemory": str(real), "Gres": "gpu:h100:8",
                        "Feature": f"pool_{pool},gpu_h100", "State": "CLOUD"}  # fmt: skip
    assert real < int(str(P5_FACTS["memtotal_mb"]))  # below what a p5.48xlarge reports: it can register
    partitions = {line_fields(line)["PartitionName"]: line_fields(line)
                  for line in lines_starting(conf, "PartitionName=")}  # fmt: skip
    assert partitions["train"]["Nodes"] == "train-0,train-1,train-2,train-3"
    assert partitions["train_spot"]["Nodes"] == "train-spot-0,train-spot-1,train-spot-2,train-spot-3"
    assert partitions["train"]["DefMemPerGPU"] == str(real // 8)


@pytest.mark.parametrize("version", VERSIONS.values())
def test_aws_power_saving_programs_timeouts_and_static_nodes(version: str) -> None:
    conf = settings(render_aws("slurm.conf.j2", version=version))
    assert conf["ResumeProgram"] == "/usr/local/sbin/gpuplat-slurm-resume"
    assert conf["SuspendProgram"] == "/usr/local/sbin/gpuplat-slurm-suspend"
    assert conf["ResumeFailProgram"] == "/usr/local/sbin/gpuplat-slurm-resume-fail"
    assert conf["SuspendTime"] == "600"  # scheduler.scale_down_idle_s default
    assert conf["ResumeTimeout"] == "1800" and int(conf["SuspendTimeout"]) > 0
    assert (conf["ResumeRate"], conf["SuspendRate"]) == ("0", "0")
    # train (count 4) is static: never suspended; train-spot (min 0) is all on demand.
    assert conf["SuspendExcNodes"] == "train-0,train-1,train-2,train-3"
    parameters = conf["SlurmctldParameters"].split(",")
    assert {"enable_configless", "idle_on_node_suspend"} <= set(parameters)
    old = version.startswith(("21.", "22."))
    # Parameters later releases dropped (their behaviour became the default): only where they exist.
    assert ("cloud_reg_addrs" in parameters) == old
    assert (conf.get("PrivateData") == "cloud") == old and ("PrivateData" in conf) == old
    assert (conf.get("CommunicationParameters") == "NoAddrCache") == old
    assert ("TreeWidth" in conf) == old and (not old or int(conf["TreeWidth"]) >= 8)


def test_aws_static_nodes_and_suspend_time_follow_the_spec(write_stack: Callable[..., Path]) -> None:
    def mutate(platform: dict[str, Any]) -> None:
        platform["scheduler"]["scale_down_idle_s"] = 900
        spot = next(p for p in platform["pools"] if p["name"] == "train-spot")
        spot["min"] = 1

    conf = settings(render_aws("slurm.conf.j2", stack_values(write_stack("aws-prod", mutate))))
    assert conf["SuspendTime"] == "900"
    assert conf["SuspendExcNodes"] == "train-0,train-1,train-2,train-3,train-spot-0"


@pytest.mark.parametrize("autodetect", ["auto", "nvml"])
def test_aws_gres_conf_lists_every_cloud_node(autodetect: str) -> None:
    gres = render_aws("gres.conf.j2", simulated=False, slurm_common_gpu_autodetect=autodetect)
    for name in ("train-0", "train-spot-3"):
        lines = lines_starting(gres, f"NodeName={name} ")
        if autodetect == "nvml":
            assert lines == [f"NodeName={name} AutoDetect=nvml"]
        else:  # nothing to probe on a node that does not exist: the catalog's 8 GPUs by device file
            assert lines == [f"NodeName={name} Name=gpu Type=h100 File=/dev/nvidia{i}" for i in range(8)]
    assert len(lines_starting(gres, "NodeName=")) == (8 if autodetect == "nvml" else 64)


def test_configless_files_are_written_on_controllers_only() -> None:
    variables = role_vars("slurm_common")
    variables.update(slurm_power_saving=True, groups={"slurm_controller": ["head-0"]})
    for host, configless in (("head-0", False), ("i-0abc", True)):
        templar = Templar(loader=DataLoader(), variables=dict(variables, inventory_hostname=host))
        assert (
            templar.template(trust_as_template("{{ __slurm_common_configless_node | bool }}")) is configless
        )
    local = Templar(
        loader=DataLoader(), variables=dict(variables, slurm_power_saving=False, inventory_hostname="x")
    )
    assert local.template(trust_as_template("{{ __slurm_common_configless_node | bool }}")) is False


def render_role_template(role: str, template: str, **variables: Any) -> str:
    values = role_vars(role)
    values.update(ansible_managed="Ansible managed", **variables)
    text = (ROLES / role / "templates" / template).read_text()
    return str(
        Templar(loader=DataLoader(), variables=values).template(trust_as_template(text), overrides=OVERRIDES)
    )


def test_configless_slurmd_gets_the_controllers_as_conf_servers() -> None:
    values = stack_values("aws-prod")
    default = render_role_template(
        "slurm_compute", "slurmd.default.j2", **values, slurm_common_controller_host=AWS_CONTROLLERS[0]
    )
    assert settings(default)["SLURMD_OPTIONS"] == '"--conf-server head-0,head-1"'
    # aws: the controllers' fixed addresses, where the backend gives them (no DNS needed).
    addresses = {"head-0": "10.64.0.10", "head-1": "10.64.16.11"}
    default = render_role_template(
        "slurm_compute", "slurmd.default.j2", **values, gpuplat_controller_addresses=addresses
    )
    assert settings(default)["SLURMD_OPTIONS"] == '"--conf-server 10.64.0.10,10.64.16.11"'
    dropin = render_role_template("slurm_compute", "slurmd-configless.conf.j2")
    # Debian's slurmd.service only starts with a local slurm.conf; the drop-in clears that condition.
    assert "\nConditionPathExists=\n" in dropin and "EnvironmentFile=-/etc/default/slurmd" in dropin
    variables = dict(
        role_vars("slurm_compute"), inventory_hostname="i-0abc", ansible_facts={"hostname": "train-2"}
    )
    for power_saving, name in ((True, "train-2"), (False, "i-0abc")):
        templar = Templar(loader=DataLoader(), variables=dict(variables, slurm_power_saving=power_saving))
        assert templar.template(trust_as_template("{{ __slurm_compute_node_name }}")) == name


def test_the_boxs_slurm_timers_are_its_own_and_an_aws_stack_keeps_the_defaults() -> None:
    """The box's group vars (tests/box/box.py box_substitutes) shorten Slurm's power-saving timers and
    pass the scheduler as often as the local platform, which is where most of the box tier's time goes;
    an aws stack keeps SuspendTime 600 (scheduler.scale_down_idle_s), SuspendTimeout 300 and Slurm's own
    scheduling intervals."""
    from tests.box.box import box_substitutes

    box_values = stack_values(ROOT / "tests" / "box" / "stack.yaml")
    box = settings(render_aws("slurm.conf.j2", box_values, **box_substitutes("http://box", 600)))
    assert box["SchedulerParameters"] == "bf_interval=5,sched_interval=10"
    assert (box["SuspendTime"], box["SuspendTimeout"], box["ResumeTimeout"]) == ("30", "15", "600")
    aws = settings(render_aws("slurm.conf.j2"))
    assert "SchedulerParameters" not in aws
    assert (aws["SuspendTime"], aws["SuspendTimeout"]) == ("600", "300")


def _fixed_train_pool(platform: dict[str, Any]) -> None:
    train = next(p for p in platform["pools"] if p["name"] == "train")
    train.pop("min"), train.pop("max")
    train["count"] = 2


def test_fixed_local_stack_renders_exactly_what_an_inventory_without_the_new_values_does(
    write_stack: Callable[..., Path],
) -> None:
    values = stack_values(write_stack("local", _fixed_train_pool))
    assert values["slurm_power_saving"] is False and values["slurm_cloud_nodes"] == []
    assert values["slurm_controllers"] == ["head-0"] and values["slurm_high_availability"] is False
    legacy = {k: v for k, v in values.items() if k not in {"slurm_controllers", "slurm_high_availability",
              "slurm_power_saving", "slurm_cloud_nodes", "slurm_suspend_time"}}  # fmt: skip
    for template in ("slurm.conf.j2", "gres.conf.j2"):
        assert render(template, slurm=values, gpuplat_backend="local") == render(
            template, slurm=legacy, gpuplat_backend="local"
        )
    conf = render("slurm.conf.j2", slurm=values, gpuplat_backend="local")
    for key in ("SuspendProgram", "ResumeProgram", "SuspendTime", "SlurmctldParameters", "SuspendExcNodes"):
        assert key not in settings(conf)
    assert "State=CLOUD" not in conf and lines_starting(conf, "SlurmctldHost=") == ["SlurmctldHost=head-0"]
    assert settings(conf)["StateSaveLocation"] == "/var/lib/slurm/slurmctld"


# --- 7. High availability: primary and backup slurmctld -----------------------------------


def test_ha_controllers_share_their_state_on_the_shared_filesystem() -> None:
    values = stack_values("aws-prod")  # scheduler.high_availability, head count 2
    assert values["slurm_controllers"] == ["head-0", "head-1"] and values["slurm_high_availability"] is True
    conf = render_aws("slurm.conf.j2", values)
    # Slurm names, primary first, not the inventory's instance ids.
    assert lines_starting(conf, "SlurmctldHost=") == ["SlurmctldHost=head-0", "SlurmctldHost=head-1"]
    assert settings(conf)["StateSaveLocation"] == "/fsx/slurm/aws_prod/state"
    assert settings(conf)["AccountingStorageHost"] == "head-0"
    addresses = {"head-0": "10.64.0.10", "head-1": "10.64.16.11"}
    with_addresses = render_aws("slurm.conf.j2", values, gpuplat_controller_addresses=addresses)
    assert lines_starting(with_addresses, "SlurmctldHost=") == [
        "SlurmctldHost=head-0(10.64.0.10)",
        "SlurmctldHost=head-1(10.64.16.11)",
    ]


def test_ha_on_static_nodes_keeps_facts_based_node_lines(write_stack: Callable[..., Path]) -> None:
    def mutate(platform: dict[str, Any]) -> None:
        platform["scheduler"]["high_availability"] = True
        next(p for p in platform["pools"] if p["name"] == "head")["count"] = 2
        _fixed_train_pool(platform)

    values = stack_values(write_stack("local", mutate))
    conf = render("slurm.conf.j2", slurm=values, gpuplat_backend="local", gpuplat_shared_path="/shared")
    assert lines_starting(conf, "SlurmctldHost=") == ["SlurmctldHost=head-0", "SlurmctldHost=head-1"]
    assert settings(conf)["StateSaveLocation"] == f"/shared/slurm/{values['slurm_cluster_name']}/state"
    assert "State=CLOUD" not in conf and "State=UNKNOWN" in lines_starting(conf, "NodeName=train-0")[0]
    single = dict(values, slurm_controllers=["head-0"], slurm_high_availability=False)
    assert lines_starting(render("slurm.conf.j2", slurm=single), "SlurmctldHost=") == ["SlurmctldHost=head-0"]


@pytest.mark.parametrize(
    ("host", "hostname", "enabled"),
    [("i-0aaa", "head-0", True), ("i-0bbb", "head-1", False), ("head-0", "x", True), ("head-1", "x", False)],
)
def test_ha_runs_slurmdbd_on_the_primary_only(host: str, hostname: str, enabled: bool) -> None:
    variables = role_vars("slurm_dbd")
    variables.update(ansible_managed="Ansible managed", inventory_hostname=host,
                     ansible_facts={"hostname": hostname}, slurm_controllers=["head-0", "head-1"],
                     slurm_high_availability=True, __slurm_dbd_unit={"status": {}})  # fmt: skip
    templar = Templar(loader=DataLoader(), variables=variables)
    assert templar.template(trust_as_template("{{ __slurm_dbd_enabled | bool }}")) is enabled
    text = (ROLES / "slurm_dbd" / "templates" / "slurmdbd.conf.j2").read_text()
    assert (
        settings(str(templar.template(trust_as_template(text), overrides=OVERRIDES)))["DbdHost"] == "head-0"
    )
    single = Templar(loader=DataLoader(), variables=dict(variables, slurm_high_availability=False))
    assert single.template(trust_as_template("{{ __slurm_dbd_enabled | bool }}")) is True


def test_the_local_platform_schedules_often_so_a_requeued_job_starts_soon_after_its_begin_time() -> None:
    """A requeued job may start at its BeginTime, which no event marks: only the next scheduling pass
    starts it (sched_interval, 60 s by default; bf_interval, 30 s). Cloud and on-premises stacks keep
    Slurm's defaults."""
    local = settings(render("slurm.conf.j2", gpuplat_backend="local"))
    assert local["SchedulerParameters"] == "bf_interval=5,sched_interval=10"
    assert "SchedulerParameters" not in settings(render("slurm.conf.j2", gpuplat_backend="aws"))


def test_slurmd_starts_after_gdrdrv_where_the_health_check_looks_for_it() -> None:
    """slurmd runs the health program as it starts (SchedMD/slurm src/slurmd/slurmd/slurmd.c,
    run_script_health_check() before registration): on a GDRCopy node started before gdrdrv.service, the
    gdrcopy check would drain a healthy node at every boot."""
    with_gdrcopy = render_role_template("slurm_compute", "slurmd-order.conf.j2", gpuplat_gdrcopy=True)
    unit = [line for line in with_gdrcopy.splitlines() if line and not line.startswith("#")]
    assert unit == ["[Unit]", "After=gdrdrv.service"]
    without = render_role_template("slurm_compute", "slurmd-order.conf.j2", gpuplat_gdrcopy=False)
    assert "After=" not in without
    tasks = yaml.safe_load((ROLES / "slurm_compute" / "tasks" / "service.yml").read_text())
    [order] = [t for t in tasks if t.get("ansible.builtin.template", {}).get("src") == "slurmd-order.conf.j2"]
    assert order["ansible.builtin.template"]["dest"] == "{{ __slurm_compute_order_dropin }}"
    assert role_vars("slurm_compute")["__slurm_compute_order_dropin"].startswith(
        "/etc/systemd/system/slurmd.service.d/"
    )
    units = [t["ansible.builtin.systemd_service"] for t in tasks if "ansible.builtin.systemd_service" in t]
    [reload] = [u for u in units if "daemon_reload" in u]
    assert "__slurm_compute_order_file is changed" in reload["daemon_reload"]
