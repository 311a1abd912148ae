"""Static checks of the Ansible roles (fast, no containers).

- every role has meta/argument_specs.yml, and every default in defaults/main.yml
  is declared there (the specs mirror the defaults);
- the inventory contract variables are declared, never defaulted, by the roles
  that use them;
- nccl.conf renders for every fabric: RDMA forced on IB/RoCE/EFA, never a debug
  setting, TCP only where the fabric is "none".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
jinja2 = pytest.importorskip("jinja2")

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
NODE_ROLES = [
    "gpu_driver",
    "fabric_manager",
    "cuda_toolkit",
    "nccl",
    "rdma",
    "container_runtime",
    "dcgm",
    "node_exporter",
    "nvidia_common",
]
CONTRACT = {
    "gpu_driver": [
        "gpu_driver_branch",
        "gpu_driver_version",
        "gpu_driver_open_kernel_modules",
        "gpuplat_gpu_architecture",
        "gpuplat_gpu_count",
        "gpuplat_gpu_simulated",
    ],
    "fabric_manager": ["fabric_manager_version", "gpu_driver_version", "gpuplat_nvswitch"],
    "cuda_toolkit": ["cuda_toolkit_version", "cuda_toolkit_package_version"],
    "nccl": ["nccl_version", "nccl_cuda_version", "gpuplat_fabric", "gpuplat_fabric_nics"],
    "rdma": ["gpuplat_fabric", "gpuplat_backend"],
}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def spec_options(role: str) -> dict[str, Any]:
    specs = load(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]
    options: dict[str, Any] = {}
    for entry in specs.values():
        options.update(entry.get("options", {}))
    return options


@pytest.mark.parametrize("role", NODE_ROLES)
def test_defaults_are_declared_in_argument_specs(role: str) -> None:
    defaults = (
        load(ROLES / role / "defaults" / "main.yml")
        if (ROLES / role / "defaults" / "main.yml").exists()
        else {}
    )
    options = spec_options(role)
    undeclared = sorted(set(defaults or {}) - set(options))
    assert not undeclared, f"{role}: defaults missing from meta/argument_specs.yml: {undeclared}"
    assert all(k.startswith(role + "_") for k in defaults or {}), f"{role}: unprefixed defaults"


@pytest.mark.parametrize(("role", "names"), CONTRACT.items())
def test_contract_variables_are_required_not_defaulted(role: str, names: list[str]) -> None:
    options = spec_options(role)
    defaults = load(ROLES / role / "defaults" / "main.yml") or {}
    for name in names:
        assert options.get(name, {}).get("required") is True, f"{role}: {name} must be a required option"
        assert name not in defaults, f"{role}: {name} comes from the inventory and must have no default"


def render_nccl_conf(fabric: str, nics: int = 8, **overrides: Any) -> str:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=False, keep_trailing_newline=True)
    env.filters["comment"] = lambda text: "#\n# " + text + "\n#"
    variables: dict[str, Any] = dict(load(ROLES / "nccl" / "defaults" / "main.yml"))
    variables.update(
        ansible_managed="Ansible managed",
        nccl_version="2.27.3",
        nccl_cuda_version="12.8",
        gpuplat_fabric=fabric,
        gpuplat_fabric_nics=nics,
    )
    variables.update(overrides)
    # The role's computed values, as in roles/nccl/vars/main.yml.
    variables["__nccl_ib_hca"] = variables["nccl_ib_hca"] or "=" + ",".join(f"mlx5_{i}" for i in range(nics))
    variables["__nccl_net"] = variables["nccl_net"] or {
        "infiniband": "IB",
        "roce": "IB",
        "efa": "AWS Libfabric",
    }.get(fabric, "")
    template = env.from_string((ROLES / "nccl" / "templates" / "nccl.conf.j2").read_text())
    return template.render(**variables)


def settings(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_nccl_conf_infiniband_forces_ib_on_every_hca() -> None:
    conf = settings(render_nccl_conf("infiniband", nics=4))
    assert conf["NCCL_NET"] == "IB"
    assert conf["NCCL_IB_DISABLE"] == "0"
    assert conf["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1,mlx5_2,mlx5_3"
    assert "NCCL_IB_GID_INDEX" not in conf


def test_nccl_conf_roce_sets_gid_index_and_traffic_class() -> None:
    conf = settings(render_nccl_conf("roce", nccl_ib_traffic_class="106"))
    assert conf["NCCL_NET"] == "IB"
    assert conf["NCCL_IB_GID_INDEX"] == "3"
    assert conf["NCCL_IB_TC"] == "106"


def test_nccl_conf_efa_uses_libfabric_plugin() -> None:
    conf = settings(render_nccl_conf("efa"))
    assert conf["FI_PROVIDER"] == "efa"
    assert conf["NCCL_NET_PLUGIN"] == "/opt/amazon/ofi-nccl/lib/libnccl-net.so"
    assert conf["NCCL_NET"] == "AWS Libfabric"
    assert "NCCL_IB_HCA" not in conf


def test_nccl_conf_without_fabric_uses_sockets_explicitly() -> None:
    conf = settings(render_nccl_conf("none"))
    assert conf["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_NET" not in conf


@pytest.mark.parametrize("fabric", ["infiniband", "roce", "efa", "none"])
def test_nccl_conf_has_no_debug_settings(fabric: str) -> None:
    conf = settings(render_nccl_conf(fabric))
    assert not [k for k in conf if k.startswith("NCCL_DEBUG")]
