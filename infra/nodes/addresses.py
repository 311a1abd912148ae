"""Where nodes reach each other: the local platform's fixed addresses, and the model registry's address
as the nodes (and the jobs on them) reach it."""

from __future__ import annotations

import ipaddress
import zlib

from infra.platform.resolve import ResolvedPlatform


def stack_subnet(stack: str) -> ipaddress.IPv4Network:
    """A /24 per stack, stable across runs: the network has no DNS (CNI without dnsname), so nodes get
    fixed addresses and /etc/hosts entries for each other that survive container restarts."""
    return ipaddress.IPv4Network(f"10.213.{zlib.crc32(stack.encode()) % 200 + 20}.0/24")


def local_node_addresses(platform: ResolvedPlatform) -> dict[str, str]:
    """Every node a local stack's pools may have -> its fixed address (running or not)."""
    subnet = stack_subnet(platform.name)
    names = [node for pool in platform.pools for node in pool.node_names()]
    return {node: str(subnet.network_address + 10 + index) for index, node in enumerate(names)}


def http_url(address: str, port: int) -> str:
    """http://ADDRESS:PORT, an IPv6 address in brackets (RFC 3986 section 3.2.2: `IP-literal`): a stack
    file's host address may be one, and bare it would read as a host with a port of its own."""
    try:
        bracketed = ipaddress.ip_address(address).version == 6
    except ValueError:
        bracketed = False  # a DNS name or an IPv4 address
    return f"http://[{address}]:{port}" if bracketed else f"http://{address}:{port}"


def registry_address(platform: ResolvedPlatform) -> str | None:
    """The registry's URL as nodes reach it: an address, not a name (MLflow's server answers only the
    Host headers of --allowed-hosts, by default localhost and private addresses:
    mlflow/server/security_utils.py:172-190, mlflow 3.17.2). None where the stack runs no registry or
    its node's address is not known before it exists (aws)."""
    serving = platform.spec.serving
    if serving is None or serving.registry is None:
        return None
    pool = platform.gateway_pool
    node = pool.node_names()[0]
    if platform.spec.backend == "local":
        address = local_node_addresses(platform)[node]
    elif pool.spec.hosts:
        address = next(h.address for h in pool.spec.hosts if h.name == node)
    else:
        return None
    return http_url(address, serving.registry.port)
