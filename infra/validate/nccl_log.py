"""Read NCCL's own log (NCCL_DEBUG=INFO): the network transport each rank uses, net plugins and why they
failed, GPUDirect RDMA, the NICs NCCL opened, channels, ranks and nodes.

Every pattern cites the file and release of NCCL (github.com/NVIDIA/nccl) or aws-ofi-nccl
(github.com/aws/aws-ofi-nccl) that prints it; older releases' wordings are matched where they differ.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

# src/debug.cc (v2.4.8-1 .. v2.30.7-1): "<host>:<pid>:<tid> [<cudaDev>] NCCL INFO <message>"; WARN lines put
# "<file>:<line>" or "<func>:<line>" (and "(<function>)" in later releases) before "NCCL WARN". Whatever a
# launcher prepends (mpirun --tag-output "[1,0]<stdout>:", srun --label "0: ", timestamps) is skipped.
_PREFIXED = re.compile(
    r"(?P<host>[A-Za-z0-9][\w.-]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:.*? )?NCCL (?P<level>INFO|WARN) (?P<message>.*?)\s*$"
)
_BARE = re.compile(r"NCCL (?P<level>INFO|WARN) (?P<message>.*?)\s*$")

# src/init.cc showVersion: "NCCL version 2.22.3+cuda12.2"
_VERSION = re.compile(r"NCCL version (?P<version>\S+)")
# src/init.cc (v2.6.4-1 ..): "Using network %s"
_USING_NETWORK = re.compile(r"^Using network (?P<name>.+)$")
# src/transport/net_ib.cc (v2.4.8-1 .. v2.22) and src/transport/net_ib/init.cc (v2.30.7-1):
# "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.0.0.1<0>" (":<rail>" / "::<plane>" after
# the port in recent releases); "NET/IB : No device found."
_IB_USING = re.compile(r"^NET/IB ?: Using(?P<devices>.*?); OOB")
_IB_DEVICE = re.compile(r"\[\d+\](?P<name>[^\s:\[\]]+):\d+(?::[\d:]*)?/(?P<link>IB|RoCE|UNSPECIFIED)")
_IB_NONE = re.compile(r"^NET/IB ?: No device found")
# src/transport/net_socket.cc: "NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:..."
_SOCKET_USING = re.compile(r"^NET/Socket ?: Using(?P<devices>(?: \[\d+\][^\s:]+:\S+)+)")
_SOCKET_DEVICE = re.compile(r"\[\d+\](?P<name>[^\s:]+):")
# aws-ofi-nccl include/nccl_ofi_log.h prefixes every line with "NET/OFI ". src/nccl_ofi_net.c(pp):
# "Using aws-ofi-nccl 1.6.0" (v1.6.0), "Initializing aws-ofi-nccl 1.9.2-aws" (v1.9.2-aws .. v1.21.1),
# "Using Libfabric version 1.21", "Selected Provider is efa (found 32 nics)" (.. v1.9.2-aws),
# "Selected provider is efa, fabric is efa-direct (found 16 nics)" (v1.14.0 .. v1.21.1).
_OFI = "NET/OFI "
_OFI_VERSION = re.compile(r"^NET/OFI (?:Using|Initializing) aws-ofi-nccl (?P<version>\S+)")
_OFI_LIBFABRIC = re.compile(r"^NET/OFI Using Libfabric version (?P<version>\S+)")
_OFI_PROVIDER = re.compile(
    r"^NET/OFI Selected [Pp]rovider is (?P<provider>[^,(]+?)(?:, fabric is [^(]+?)? "
    r"\(found (?P<nics>\d+) nics\)"
)
# src/transport/net.cc "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s" (name, netDev,
# "(proxyRank)" with PXN, "/GDRDMA", "(PCI)", "/Shared"); [receive] is printed by the receiving rank.
# Intra-node: src/transport/p2p.cc "via P2P/IPC", "via P2P/CUMEM", "via P2P/direct pointer"; shm.cc
# "via SHM/direct/direct". Releases before 2.5 print "Ring %02d : %d -> %d [send] via NET/%s/%d" or
# "Ring 00 : 11[3] -> 10[2] via P2P/IPC"; v2.7 prints the busId in the brackets.
_CHANNEL = re.compile(
    r"^(?:Channel|Ring) (?P<channel>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)(?:\[[0-9a-fA-F]+\])? -> "
    r"(?P<dst>\d+)(?:\[[0-9a-fA-F]+\])? (?:\[(?P<direction>send|receive)\] )?via (?P<path>.+)$"
)
_NET_PATH = re.compile(r"^NET/(?P<net>.+?)/(?P<dev>\d+)(?:\(\d+\))?(?P<gdr>/GDRDMA)?")
# src/init.cc (v2.19 ..): "comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL %d"
_COMM = re.compile(r"comm \S+ rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+)")
# src/init.cc: "[ncclCommInitRank ]comm %p rank %d nranks %d cudaDev %d ... - Init COMPLETE"
_INIT_COMPLETE = re.compile(
    r"comm \S+ rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev \d+.* - Init COMPLETE"
)
# src/init.cc (v2.19 ..): "%d coll channels, %d collnet channels, ..."
_COLL_CHANNELS = re.compile(r"^(?P<count>\d+) coll channels")
# src/transport/generic.cc (v2.24 ..): "Connected all rings, use ring PXN %d GDR %d"
_RINGS_GDR = re.compile(r"^Connected all rings, use ring PXN \d+ GDR (?P<gdr>[01])")
# src/graph/paths.cc ncclTopoCheckGdr (INFO to v2.27, TRACE in v2.30): "GPU Direct RDMA Enabled for GPU ..."
_PATH_GDR = re.compile(r"^GPU Direct RDMA (?P<state>Enabled|Disabled) for GPU")
# src/include/checks.h NCCLCHECK: "<file>:<line> -> <result>" on the way out of a failed call.
_ERROR_TRACE = re.compile(r"^\S+\.(?:cc|cu|c|h):\d+ -> \d+")

# Net plugin loading, by NCCL release:
#   v2.5-v2.18 src/net.cc "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation",
#              "NET/Plugin : Plugin load (%s) returned %d : %s"
#   v2.19-v2.20 src/net.cc "NET/Plugin : dlerror=%s No plugin found (%s), using internal implementation",
#              "NET/Plugin : Plugin load returned %d : %s."
#   v2.21 src/net.cc "NET/Plugin: No plugin found (%s)",
#              "NET/Plugin: Plugin load returned %d : %s when loading %s"
#   v2.22-v2.23 src/net.cc "NET/Plugin: Could not find: %s. Using internal network plugin.",
#              "NET/Plugin: <dlerror>"
#   v2.24.. src/plugin/plugin_open.cc "NET/Plugin: Could not find: <names>", "NET/Plugin: <lib>: <dlerror>"
#   loaded: "NET/Plugin: Loaded net plugin %s (v%d)" (.. v2.23); src/plugin/net.cc (v2.24 ..)
#   "Initialized NET plugin %s", "Failed to initialize NET plugin %s",
#   "External network plugin %s is unsupported"
_PLUGIN_NOT_FOUND = re.compile(
    r"^NET/Plugin ?: (?:dlerror=(?P<dlerror>.+?) )?(?:No plugin found \((?P<lib>[^)]+)\)|"
    r"Could not find:(?P<names>.+?)(?:\. Using internal network plugin\.)?$)"
)
_PLUGIN_LOAD_ERROR = re.compile(
    r"^NET/Plugin ?: (?:Plugin load (?:\(\S+\) )?returned \d+ : (?P<returned>.+?)\.?$|"
    r"(?P<dlerror>\S+\.so\S*: .+))"
)
_PLUGIN_LOADED = re.compile(
    r"^(?:NET/Plugin ?: Loaded net plugin (?P<old>.+?) \(v\d+\)|Initialized NET plugin (?P<new>.+))$"
)
_PLUGIN_INIT_FAILED = re.compile(r"^Failed to initialize NET plugin (?P<name>.+)$")
_PLUGIN_UNSUPPORTED = re.compile(
    r"^(?:External network plugin (?P<name>\S+) is unsupported|"
    r"NET/Plugin ?: (?P<symbol>Failed to find ncclNetPlugin symbol .*))$"
)

# libfabric providers that carry traffic over the kernel TCP/UDP stack (fi_tcp, fi_sockets, fi_udp).
_TCP_PROVIDERS = ("tcp", "sockets", "udp")
# NVIDIA's nccl-rdma-sharp-plugins (Mellanox/nccl-rdma-sharp-plugins src/ib_plugin.c, ".name =
# "IBext_v11" .. "IBext_v6"; "IBext" before): IB verbs as a net plugin, SHARP-capable, logging its
# devices with NCCL's own "NET/IB : Using ..." line (src/p2p_plugin.c).
_IBEXT = re.compile(r"^IBext(?:_v\d+)?$")

TransportKind = Literal["ib", "plugin", "socket"]
PluginProblem = Literal["not found", "load error", "unsupported", "init failed", "not used"]
GdrState = Literal["on", "off", "partial", "unknown", "not-applicable"]


@dataclass(frozen=True)
class LogLine:
    host: str | None
    pid: int | None
    level: Literal["INFO", "WARN"]
    message: str

    @property
    def process(self) -> tuple[str, int] | None:
        return None if self.host is None or self.pid is None else (self.host, self.pid)


@dataclass(frozen=True)
class Connection:
    """One network connection NCCL set up ("Channel ... via NET/..."), seen from the rank that printed it."""

    rank: int
    network: str
    device: int
    gdr: bool


@dataclass(frozen=True)
class Transport:
    network: str
    kind: TransportKind
    label: str
    over_tcp: bool
    links: tuple[str, ...] = ()  # link layers of NCCL's IB verbs devices: "IB", "RoCE"


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    problem: PluginProblem
    reason: str
    processes: int


@dataclass(frozen=True)
class Gdr:
    state: GdrState
    connections: int
    with_gdr: int
    evidence: str


@dataclass(frozen=True)
class Nics:
    count: int | None
    names: tuple[str, ...]
    source: str


@dataclass
class _Ofi:
    version: str | None = None
    libfabric: str | None = None
    provider: str | None = None
    nics: int | None = None


@dataclass
class _Process:
    networks: set[str] = field(default_factory=set)
    plugin_loaded: str | None = None
    plugin_events: list[tuple[str, PluginProblem, str]] = field(
        default_factory=list
    )  # plugin, problem, reason
    ofi_messages: list[str] = field(default_factory=list)
    ofi_warnings: list[str] = field(default_factory=list)
    reason_before_trace: str | None = None


@dataclass(frozen=True)
class NcclLog:
    lines: int
    nccl_version: str | None
    ranks: int | None
    reported_nodes: int | None  # nNodes of NCCL's comm line, where the release prints it
    hosts: tuple[str, ...]
    transports: dict[str, Transport]
    rank_networks: dict[int, tuple[str, ...]]
    connections: tuple[Connection, ...]
    intra_node_paths: tuple[str, ...]
    nics: Nics | None
    channels: int | None
    gdr: Gdr
    plugin_failures: tuple[PluginFailure, ...]
    warnings: tuple[str, ...]

    @property
    def has_nccl_lines(self) -> bool:
        return self.lines > 0

    @property
    def nodes(self) -> int | None:
        """nNodes where NCCL reports it, else the hosts that wrote to the log (at least that many nodes)."""
        return self.reported_nodes or (len(self.hosts) or None)

    @property
    def tcp_transports(self) -> list[Transport]:
        return [t for t in self.transports.values() if t.over_tcp]


def read_lines(text: str) -> list[LogLine]:
    result: list[LogLine] = []
    for raw in text.splitlines():
        prefixed = _PREFIXED.search(raw)
        if prefixed:
            level: Literal["INFO", "WARN"] = "WARN" if prefixed["level"] == "WARN" else "INFO"
            result.append(LogLine(prefixed["host"], int(prefixed["pid"]), level, prefixed["message"]))
            continue
        bare = _BARE.search(raw)
        if bare:
            result.append(LogLine(None, None, "WARN" if bare["level"] == "WARN" else "INFO", bare["message"]))
    return result


def parse_nccl_log(text: str) -> NcclLog:
    lines = read_lines(text)
    version = next((m["version"] for m in map(_VERSION.search, text.splitlines()) if m), None)
    processes: dict[tuple[str, int] | None, _Process] = defaultdict(_Process)
    ib_links: set[str] = set()
    ib_devices: list[tuple[str, ...]] = []
    socket_devices: list[tuple[str, ...]] = []
    ofi = _Ofi()
    connections: list[Connection] = []
    intra: set[str] = set()
    nranks: list[int] = []
    nnodes: list[int] = []
    seen_ranks: set[int] = set()
    coll_channels: list[int] = []
    channel_ids: set[int] = set()
    ring_gdr: list[bool] = []
    path_gdr: list[bool] = []
    warnings: list[str] = []

    for line in lines:
        message, process = line.message, processes[line.process]
        if line.level == "WARN" and message not in warnings:
            warnings.append(message)
        if match := _USING_NETWORK.match(message):
            process.networks.add(match["name"].strip())
        elif match := _IB_USING.match(message):
            devices = _IB_DEVICE.findall(match["devices"])
            ib_devices.append(tuple(name for name, _ in devices))
            ib_links.update(link for _, link in devices)
        elif match := _SOCKET_USING.match(message):
            socket_devices.append(tuple(_SOCKET_DEVICE.findall(match["devices"])))
        elif match := _CHANNEL.match(message):
            channel_ids.add(int(match["channel"]))
            rank = int(match["dst"] if match["direction"] == "receive" else match["src"])
            seen_ranks.update({int(match["src"]), int(match["dst"])})
            net = _NET_PATH.match(match["path"])
            if net:
                connections.append(Connection(rank, net["net"], int(net["dev"]), bool(net["gdr"])))
                process.networks.add(net["net"])
            else:
                intra.add(match["path"].split("/")[0])
        elif match := _COMM.search(message):
            nranks.append(int(match["nranks"]))
            nnodes.append(int(match["nnodes"]))
        elif match := _INIT_COMPLETE.search(message):
            nranks.append(int(match["nranks"]))
        elif match := _COLL_CHANNELS.match(message):
            coll_channels.append(int(match["count"]))
        elif match := _RINGS_GDR.match(message):
            ring_gdr.append(match["gdr"] == "1")
        elif match := _PATH_GDR.match(message):
            path_gdr.append(match["state"] == "Enabled")
        elif message.startswith(_OFI):
            _read_ofi(message, line.level, ofi, process)
        elif _ERROR_TRACE.match(message):
            if process.plugin_loaded and process.reason_before_trace is None and process.ofi_messages:
                process.reason_before_trace = process.ofi_messages[-1]
        else:
            _read_plugin(message, process)

    hosts = tuple(sorted({line.host for line in lines if line.host}))
    networks = {n for p in processes.values() for n in p.networks}
    transports = {name: _transport(name, ib_links, ofi) for name in sorted(networks)}
    rank_networks: dict[int, set[str]] = defaultdict(set)
    for connection in connections:
        rank_networks[connection.rank].add(connection.network)
    ranks = max(nranks) if nranks else (max(seen_ranks) + 1 if seen_ranks else None)
    return NcclLog(
        lines=len(lines),
        nccl_version=version,
        ranks=ranks,
        reported_nodes=max(nnodes) if nnodes else None,
        hosts=hosts,
        transports=transports,
        rank_networks={rank: tuple(sorted(nets)) for rank, nets in sorted(rank_networks.items())},
        connections=tuple(connections),
        intra_node_paths=tuple(sorted(intra)),
        nics=_nics(transports, ib_devices, socket_devices, ofi),
        channels=max(coll_channels) if coll_channels else (len(channel_ids) or None),
        gdr=_gdr(connections, ring_gdr, path_gdr),
        plugin_failures=_plugin_failures(processes.values(), networks),
        warnings=tuple(warnings[:10]),
    )


def _read_ofi(message: str, level: str, ofi: _Ofi, process: _Process) -> None:
    if match := _OFI_VERSION.match(message):
        ofi.version = match["version"]
    elif match := _OFI_LIBFABRIC.match(message):
        ofi.libfabric = match["version"]
    elif match := _OFI_PROVIDER.match(message):
        ofi.provider = match["provider"].strip()
        ofi.nics = max(ofi.nics or 0, int(match["nics"]))
    text = message.removeprefix(_OFI)
    process.ofi_messages.append(text)
    if level == "WARN":
        process.ofi_warnings.append(text)


def _read_plugin(message: str, process: _Process) -> None:
    if match := _PLUGIN_LOADED.match(message):
        process.plugin_loaded = (match["old"] or match["new"]).strip()
    elif match := _PLUGIN_NOT_FOUND.match(message):
        library = (match["lib"] or match["names"] or "libnccl-net.so").strip()
        reason = match["dlerror"] or f"no {library} on the library path"
        process.plugin_events.append((library, "not found", reason))
    elif match := _PLUGIN_LOAD_ERROR.match(message):
        process.plugin_events.append(
            ("libnccl-net", "load error", (match["returned"] or match["dlerror"]).strip())
        )
    elif match := _PLUGIN_INIT_FAILED.match(message):
        reason = (
            process.ofi_warnings[-1] if process.ofi_warnings else "the plugin's init() or devices() failed"
        )
        process.plugin_events.append((match["name"].strip(), "init failed", reason))
    elif match := _PLUGIN_UNSUPPORTED.match(message):
        process.plugin_events.append(
            (match["name"] or "libnccl-net", "unsupported", match["symbol"] or message)
        )


def _transport(network: str, ib_links: set[str], ofi: _Ofi) -> Transport:
    if network == "IB" or _IBEXT.match(network):
        names = {"IB": "InfiniBand", "RoCE": "RoCE"}
        links = ", ".join(names.get(link, link) for link in sorted(ib_links)) or "link layer not logged"
        through = "" if network == "IB" else f" through the {network} plugin"
        return Transport(network, "ib", f"IB verbs{through} ({links})", False, tuple(sorted(ib_links)))
    if network == "Socket":
        return Transport(network, "socket", "TCP sockets (NCCL's socket transport)", True)
    details = [f"aws-ofi-nccl {ofi.version}"] if ofi.version else []
    if ofi.provider:
        details.append(f"provider {ofi.provider}")
    over_tcp = ofi.provider is not None and ofi.provider.split(";")[0] in _TCP_PROVIDERS
    label = f"net plugin {network}" + (f" ({', '.join(details)})" if details else "")
    return Transport(network, "plugin", label + (", which runs over TCP" if over_tcp else ""), over_tcp)


def _nics(
    transports: dict[str, Transport],
    ib_devices: list[tuple[str, ...]],
    socket_devices: list[tuple[str, ...]],
    ofi: _Ofi,
) -> Nics | None:
    kinds = {t.kind for t in transports.values()}
    if "plugin" in kinds and ofi.nics is not None:
        return Nics(ofi.nics, (), f"aws-ofi-nccl, provider {ofi.provider}")
    if "ib" in kinds and ib_devices:
        widest = max(ib_devices, key=len)
        return Nics(len(widest), widest, "NET/IB")
    if "socket" in kinds and socket_devices:
        widest = max(socket_devices, key=len)
        return Nics(len(widest), widest, "NET/Socket")
    return None


def _gdr(connections: list[Connection], ring_gdr: list[bool], path_gdr: list[bool]) -> Gdr:
    if connections:
        with_gdr = sum(c.gdr for c in connections)
        state: GdrState = "on" if with_gdr == len(connections) else ("off" if with_gdr == 0 else "partial")
        return Gdr(state, len(connections), with_gdr, "/GDRDMA on the network channel connections")
    for flags, evidence in (
        (ring_gdr, "'Connected all rings ... GDR' lines"),
        (path_gdr, "topology GDR checks"),
    ):
        if flags:
            state = "on" if all(flags) else ("off" if not any(flags) else "partial")
            return Gdr(state, 0, 0, evidence)
    return Gdr("unknown", 0, 0, "no network connection in the log")


def _plugin_failures(processes: Iterable[_Process], networks: set[str]) -> tuple[PluginFailure, ...]:
    counts: dict[tuple[str, PluginProblem, str], int] = defaultdict(int)
    for process in processes:
        events = list(process.plugin_events)
        used = process.networks or networks
        plugin = process.plugin_loaded or ("aws-ofi-nccl" if process.ofi_messages else None)
        plugin_used = plugin is not None and any(
            net == process.plugin_loaded or (process.plugin_loaded is None and "Libfabric" in net)
            for net in used
        )
        if plugin and not plugin_used and not any(e[1] == "init failed" for e in events):
            reason = process.reason_before_trace or next(reversed(process.ofi_warnings), None)
            chosen = ", ".join(sorted(used)) or "no network"
            events.append((plugin, "not used", reason or f"loaded, but NCCL chose {chosen}"))
        for event in events:
            counts[event] += 1
    return tuple(
        PluginFailure(plugin, problem, reason, n) for (plugin, problem, reason), n in sorted(counts.items())
    )
