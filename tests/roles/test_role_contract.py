"""Static checks of the Ansible roles (fast, no containers).

- every role has meta/argument_specs.yml, and every default in defaults/main.yml
  is declared there (the specs mirror the defaults);
- the inventory contract variables are declared, never defaulted, by the roles
  that use them;
- nccl.conf renders for every fabric: RDMA forced on IB/RoCE/EFA, never a debug
  setting, TCP only where the fabric is "none".
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from infra.data.packages import package_facts, role_release_facts
from tests.roles.ansible_values import render_value

yaml = pytest.importorskip("yaml")
jinja2 = pytest.importorskip("jinja2")

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "roles"
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


ALL_ROLES = sorted(path.parent.parent.name for path in ROLES.glob("*/meta/argument_specs.yml"))


@pytest.mark.parametrize("role", ALL_ROLES)
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


def render_nccl_conf(fabric: str, nics: int = 8, release: str = "debian12", **overrides: Any) -> str:
    """nccl.conf as the role renders it: its defaults, then its vars, then the template."""
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=False, keep_trailing_newline=True)
    env.filters["comment"] = lambda text: "#\n# " + text + "\n#"
    env.filters["regex_escape"] = re.escape
    env.filters["basename"] = lambda path: path.rsplit("/", 1)[-1]
    env.filters["regex_replace"] = lambda text, pattern, replacement: re.sub(pattern, replacement, text)
    variables: dict[str, Any] = {
        "ansible_managed": "Ansible managed",
        "nvidia_common_release": role_release_facts(package_facts())[release],
        "nccl_version": "2.27.3",
        "nccl_cuda_version": "12.8",
        "gpuplat_fabric": fabric,
        "gpuplat_fabric_nics": nics,
    }
    defaults = load(ROLES / "nccl" / "defaults" / "main.yml")
    variables.update({k: v for k, v in defaults.items() if k not in overrides})
    variables.update(overrides)
    for key, value in load(ROLES / "nccl" / "vars" / "main.yml").items():
        variables[key] = render_value(env, value, variables)
    for key in defaults:
        variables[key] = render_value(env, variables[key], variables)
    template = env.from_string((ROLES / "nccl" / "templates" / "nccl.conf.j2").read_text())
    return template.render(**variables)


def settings(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_nccl_conf_infiniband_enables_ib_without_guessing_device_names() -> None:
    conf = settings(render_nccl_conf("infiniband", nics=4))
    assert conf["NCCL_IB_DISABLE"] == "0"
    # Inbox rdma-core names devices ibp<bus>s<slot>, not mlx5_N: a guessed list would match nothing.
    assert "NCCL_IB_HCA" not in conf
    assert "NCCL_NET" not in conf
    assert "NCCL_IB_GID_INDEX" not in conf


def test_nccl_conf_takes_an_explicit_hca_list_per_host() -> None:
    conf = settings(render_nccl_conf("infiniband", nccl_ib_hca="=mlx5_0,mlx5_3"))
    assert conf["NCCL_IB_HCA"] == "=mlx5_0,mlx5_3"


def test_nccl_conf_roce_sets_gid_index_and_traffic_class() -> None:
    conf = settings(render_nccl_conf("roce", nccl_ib_traffic_class="106"))
    assert conf["NCCL_IB_GID_INDEX"] == "3"
    assert conf["NCCL_IB_TC"] == "106"


def test_nccl_conf_efa_leaves_the_network_to_the_plugin() -> None:
    conf = settings(render_nccl_conf("efa"))
    assert conf["FI_PROVIDER"] == "efa"
    assert "FI_EFA_USE_DEVICE_RDMA" not in conf  # the plugin's, where the device has RDMA read
    assert "NCCL_NET" not in conf
    assert "NCCL_NET_PLUGIN" not in conf
    assert "NCCL_IB_HCA" not in conf


@pytest.mark.parametrize("release", ["debian12", "debian13", "ubuntu2204", "ubuntu2404"])
def test_efa_plugin_directory_is_the_multiarch_one(release: str) -> None:
    """The EFA installer (before 1.44) puts aws-ofi-nccl under lib/x86_64-linux-gnu on Debian/Ubuntu."""
    assert "(/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so)" in render_nccl_conf(
        "efa", release=release
    )


def test_the_renamed_plugin_of_newer_installers_is_named_to_nccl() -> None:
    """EFA installer 1.44.0 on: /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so, which NCCL loads by the name
    NCCL_NET_PLUGIN=ofi, not as its default libnccl-net.so."""
    conf = settings(render_nccl_conf("efa", nccl_efa_plugin="/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"))
    assert conf["NCCL_NET_PLUGIN"] == "ofi"


def test_nccl_conf_forces_a_network_only_when_asked() -> None:
    assert settings(render_nccl_conf("efa", nccl_net="AWS Libfabric"))["NCCL_NET"] == "AWS Libfabric"


def test_nccl_conf_without_fabric_uses_sockets_explicitly() -> None:
    conf = settings(render_nccl_conf("none"))
    assert conf["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_NET" not in conf


def test_stack_socket_interface_reaches_nccl_conf(shipped_platforms: dict[str, Any]) -> None:
    from infra.nodes.inventory import platform_vars

    values = platform_vars(shipped_platforms["onprem"])
    conf = settings(render_nccl_conf("infiniband", nccl_socket_ifname=values["nccl_socket_ifname"]))
    assert conf["NCCL_SOCKET_IFNAME"] == "bond0"
    assert "nccl_socket_ifname" not in platform_vars(shipped_platforms["local"])


@pytest.mark.parametrize("fabric", ["infiniband", "roce", "efa", "none"])
def test_nccl_conf_has_no_debug_settings(fabric: str) -> None:
    conf = settings(render_nccl_conf(fabric))
    assert not [k for k in conf if k.startswith("NCCL_DEBUG")]
