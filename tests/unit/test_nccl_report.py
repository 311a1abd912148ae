"""`gpuplat nccl-report` and infra/validate: NCCL logs and nccl-tests tables read and judged by the gates.

Test data: the real samples in tests/data/upstream/nccl-samples/ (SOURCES.md gives their sources) and logs
written here from the message formats NCCL and aws-ofi-nccl print (infra/validate/nccl_log.py cites each one).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import infra.validate.gates as gates_module
from infra.errors import SpecError
from infra.validate.gates import fabric_gates
from infra.validate.nccl_log import parse_nccl_log
from infra.validate.nccl_tests import parse_results
from infra.validate.report import FabricReport, fabric_report
from tests.unit.test_cli import gpuplat
from tests.upstream import NCCL_SAMPLES

REPO = Path(__file__).resolve().parents[2]


def sample(name: str) -> Path:
    """A stored sample (tests/data/upstream/nccl-samples/SOURCES.md)."""
    path = NCCL_SAMPLES / name
    if not path.is_file():
        pytest.fail(f"NCCL sample {name} not found in {NCCL_SAMPLES}")
    return path


def report(text: str, node_type: str | None = None, nodes: int | None = None) -> FabricReport:
    return fabric_report(text, source="test.log", node_type=node_type, nodes=nodes)


def checks(result: FabricReport) -> dict[str, str]:
    return {check.name: check.status for check in result.verdict.checks}


def reason(result: FabricReport, name: str) -> str:
    return next(check.reason for check in result.verdict.checks if check.name == name)


# ------------------------------------------------------------------------------------ logs from the formats

# NCCL 2.22: no net plugin ("Could not find"), no IB device, so TCP sockets between two nodes.
PLUGIN_NOT_FOUND_SOCKET = """\
node-a:1001:1001 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.11<0>
node-a:1001:1001 [0] NCCL INFO NCCL version 2.22.3+cuda12.4
node-a:1001:1001 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
node-a:1001:1001 [0] NCCL INFO NET/IB : No device found.
node-a:1001:1001 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.11<0>
node-a:1001:1001 [0] NCCL INFO Using network Socket
node-a:1001:1050 [0] NCCL INFO comm 0x55d1c0 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
node-a:1001:1060 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Socket/0
node-a:1001:1060 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0
node-b:2001:2001 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.12<0>
node-b:2001:2001 [0] NCCL INFO Using network Socket
node-b:2001:2060 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [receive] via NET/Socket/0
"""

# NCCL 2.19/2.20 wording of the same failure, with the dlerror.
PLUGIN_DLERROR_2_19 = (
    "h1:10:10 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: "
    "No such file or directory No plugin found (libnccl-net.so), using internal implementation\n"
    "h1:10:10 [0] NCCL INFO NET/IB : No device found.\n"
    "h1:10:10 [0] NCCL INFO NET/Socket : Using [0]ens5:172.31.0.5<0>\n"
    "h1:10:10 [0] NCCL INFO Using network Socket\n"
    "h1:10:20 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0\n"
)

# NCCL 2.27: the plugin is there but one of its libraries is not (plugin_open.cc "<lib>: <dlerror>").
PLUGIN_LOAD_ERROR = (
    "h1:10:10 [0] NCCL INFO NET/Plugin: libnccl-net.so: libfabric.so.1: cannot open shared object file: "
    "No such file or directory\n"
    "h1:10:10 [0] NCCL INFO NET/IB : No device found.\n"
    "h1:10:10 [0] NCCL INFO NET/Socket : Using [0]ens5:172.31.0.5<0>\n"
    "h1:10:10 [0] NCCL INFO Using network Socket\n"
    "h1:10:20 [0] NCCL INFO comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0\n"
)

# NCCL 2.27 with aws-ofi-nccl 1.14.0 whose init fails (nccl_ofi_rdma.c / nccl_ofi_net.c warnings).
PLUGIN_INIT_FAILED = """\
h1:11:11 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.0
h1:11:11 [0] NCCL INFO NET/OFI Using Libfabric version 1.22
h1:11:11 [0] nccl_net_ofi_rdma_init:7978 NCCL WARN NET/OFI OFI fi_getinfo() call failed: No data available
h1:11:11 [0] nccl_net_ofi_create_plugin:262 NCCL WARN NET/OFI Unable to find a protocol that \
worked.  Failing \
initialization.
h1:11:11 [0] NCCL INFO Failed to initialize NET plugin Libfabric
h1:11:11 [0] NCCL INFO NET/IB : No device found.
h1:11:11 [0] NCCL INFO NET/Socket : Using [0]ens5:172.31.1.10<0>
h1:11:11 [0] NCCL INFO Using network Socket
h1:11:30 [0] NCCL INFO comm 0x2 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
h1:11:40 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0
"""

# aws-ofi-nccl 1.14 loaded and used, but on libfabric's tcp provider: TCP all the same.
OFI_TCP_PROVIDER = """\
h1:12:12 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v8)
h1:12:12 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.0
h1:12:12 [0] NCCL INFO NET/OFI Selected provider is tcp, fabric is 10.0.0.0/16 (found 1 nics)
h1:12:12 [0] NCCL INFO Using network Libfabric
h1:12:30 [0] NCCL INFO comm 0x3 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
h1:12:40 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Libfabric/0
h1:12:40 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Libfabric/0
"""


def ib_log(*, hcas: int = 8, gdr: bool = True, link: str = "IB") -> str:
    """NCCL 2.21 on two InfiniBand nodes, internal IB verbs (no plugin installed)."""
    devices = " ".join(f"[{i}]mlx5_{i}:1/{link}" for i in range(hcas))
    suffix = "/GDRDMA" if gdr else ""
    state = "Enabled" if gdr else "Disabled"
    relation = "<=" if gdr else ">"
    return f"""\
gpu1:500:500 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
gpu1:500:500 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)
gpu1:500:500 [0] NCCL INFO NET/IB : Using {devices} [RO]; OOB ibp0:10.1.0.1<0>
gpu1:500:500 [0] NCCL INFO Using network IB
gpu1:500:520 [0] NCCL INFO comm 0x7f rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0
gpu1:500:530 [0] NCCL INFO GPU Direct RDMA {state} for GPU 1b000 / HCA 0 (distance 5 {relation} 4), read 1
gpu1:500:530 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0{suffix}
gpu1:500:530 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0{suffix}
gpu1:500:530 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/0(1){suffix}
gpu2:600:630 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [receive] via NET/IB/0{suffix}
"""


# One node fell back to sockets, the other uses IB: transports differ across ranks.
MIXED_TRANSPORTS = """\
gpu1:500:500 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.0.1<0>
gpu1:500:500 [0] NCCL INFO Using network IB
gpu1:500:530 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
gpu2:600:600 [0] NCCL INFO NET/IB : No device found.
gpu2:600:600 [0] NCCL INFO NET/Socket : Using [0]eth0:10.1.0.2<0>
gpu2:600:600 [0] NCCL INFO Using network Socket
gpu2:600:630 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [send] via NET/Socket/0
"""


def p4d_run(busbw_1g: float) -> str:
    """Two p4d nodes on EFA (NCCL 2.19.4, aws-ofi-nccl 1.7.4-aws), an nccl-tests 2.13.8 table via mpirun."""
    rows = [(268435456, 67108864, 11234.0, 23.90, 44.80), (1073741824, 268435456, 44023.0, 24.39, busbw_1g)]
    table = "\n".join(
        f"[1,0]<stdout>:{size:12d}  {count:12d}     float     sum      -1"
        f"  {t:7.0f}  {alg:6.2f}  {bus + 1:6.2f}      0  {t:7.0f}  {alg:6.2f}  {bus:6.2f}      0"
        for size, count, t, alg, bus in rows
    )
    head = (
        "[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong"
    )
    return f"""\
[1,0]<stdout>:ip-10-0-0-1:12001:12001 [0] NCCL INFO NCCL version 2.19.4+cuda12.2
[1,0]<stdout>:ip-10-0-0-1:12001:12050 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.7.4-aws
[1,0]<stdout>:ip-10-0-0-1:12001:12050 [0] NCCL INFO NET/OFI Selected Provider is efa (found 4 nics)
[1,0]<stdout>:ip-10-0-0-1:12001:12050 [0] NCCL INFO Using network AWS Libfabric
[1,0]<stdout>:ip-10-0-0-1:12001:12050 [0] NCCL INFO comm 0x9 rank 0 nRanks 16 nNodes 2 localRanks 8 \
localRank 0 \
MNNVL 0
[1,0]<stdout>:ip-10-0-0-1:12001:12060 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via \
NET/AWS Libfabric/0/GDRDMA
[1,0]<stdout>:ip-10-0-0-1:12001:12060 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS \
Libfabric/0/GDRDMA
[1,0]<stdout>:# Using devices
[1,0]<stdout>:#  Rank  0 Group  0 Pid  12001 on ip-10-0-0-1 device  0 [0x10] NVIDIA A100-SXM4-40GB
[1,0]<stdout>:#  Rank  8 Group  0 Pid  13001 on ip-10-0-0-2 device  0 [0x10] NVIDIA A100-SXM4-40GB
[1,0]<stdout>:#
[1,0]<stdout>:#                                                              out-of-place           \
            in-place
{head}     time   algbw   busbw #wrong
[1,0]<stdout>:#        (B)    (elements)                               (us)  (GB/s)  (GB/s)         \
   (us)  (GB/s)
{table}
[1,0]<stdout>:# Out of bounds values : 0 OK
[1,0]<stdout>:# Avg bus bandwidth    : 35.2
"""


# One p5 node: NVLink only, with wrong results in the table (nccl-tests 2.19.6 wording).
INTRA_NODE_WRONG = """\
p5a:700:700 [0] NCCL INFO NCCL version 2.27.5+cuda12.9
p5a:700:720 [0] NCCL INFO comm 0x5 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0
p5a:700:730 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
# Collective test starting: all_reduce_perf
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   \
algbw   busbw #wrong
   134217728      33554432     float     sum      -1    436.1  307.77  538.60      0    431.5  \
311.04  544.32     12
# Out of bounds values : 12 FAILED
# Avg bus bandwidth    : 541.46
"""

# nccl-tests 2.19.6 with per-iteration statistics after each group (util.cu writeBenchmarkLineBody).
PER_ITERATION_TABLE = (
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max"
    "    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%\n"
    "   1073741824     268435456     float     sum      -1   4581.2  234.38  439.46       0   4570.1   4601.0"
    "   4600.2     0.21   4579.9  234.45  439.59       0   4569.0   4599.9   4599.1     0.20\n"
)

# nccl-tests 2.10 (no root column, "error" as a max delta), as ParallelCluster's test quotes it.
OLD_ERROR_COLUMN = (
    "#       size         count      type   redop     time   algbw   busbw  error"
    "     time   algbw   busbw  error\n"
    " 1073741824     268435456     float     sum    79531   13.50   26.58  2e-06"
    "    79371   13.53   26.63  2e-06\n"
)

# alltoall_perf rows as mpirun tags them (bottlerocket-kernel-kit PR 313): redop none, in-place N/A.
ALLTOALL_ROWS = (
    "[1,0]<stdout>:        2048            32     float    none      -1"
    "   106.88    0.02    0.02       0   111.25    0.02    0.02    N/A\n"
    "[1,0]<stdout>:        4096            64     float    none      -1"
    "   108.09    0.04    0.04       0   116.71    0.04    0.03    N/A\n"
)


# ------------------------------------------------------------------------------------------ shared samples


def test_efa_sample_is_aws_libfabric_with_gdr_on_32_nics_and_passes_on_p5() -> None:
    result = report(sample("efa-p5-gdrdma.log").read_text(), "p5.48xlarge")
    log = result.run.log
    [transport] = log.transports.values()
    assert (transport.kind, transport.network) == ("plugin", "AWS Libfabric")
    assert "aws-ofi-nccl 1.9.2-aws" in transport.label and "provider efa" in transport.label
    assert not transport.over_tcp
    assert log.gdr.state == "on"
    assert log.nics is not None and log.nics.count == 32
    assert (log.ranks, log.nodes, log.channels) == (16, 2, 16)
    assert log.rank_networks == {0: ("AWS Libfabric",)}
    assert checks(result) == {
        "transport": "pass",
        "gpudirect-rdma": "pass",
        "nics": "pass",
        "busbw": "skip",
        "errors": "skip",
    }
    assert result.verdict.passed


def test_roce_sample_is_ib_verbs_over_roce_after_the_ofi_plugin_failed() -> None:
    result = report(sample("ib-roce-gdrdma.log").read_text())
    log = result.run.log
    assert [(t.kind, t.links) for t in log.transports.values()] == [("ib", ("RoCE",))]
    assert log.gdr.state == "on" and log.gdr.with_gdr == log.gdr.connections == 6
    assert log.nics is not None and log.nics.count == 8 and log.nics.names[-1] == "mlx5_11"
    [failure] = log.plugin_failures
    assert (failure.plugin, failure.problem) == ("AWS Libfabric", "not used")
    assert failure.reason == "Invalid type of PCI bus returned 0"
    assert result.verdict.passed, result.verdict.failures


def test_ibext_plugin_is_ib_verbs_with_its_nics_counted() -> None:
    """InfiniBand clusters run NCCL through NVIDIA's IBext (SHARP) plugin: same devices line, another
    network name. It used to count as an unknown plugin with no NICs, skipping the NIC check."""
    text = sample("ib-roce-gdrdma.log").read_text()
    text = text.replace("Using network IB\n", "Using network IBext_v8\n").replace(
        "via NET/IB/", "via NET/IBext_v8/"
    )
    log = report(text).run.log
    assert [(t.kind, t.links) for t in log.transports.values()] == [("ib", ("RoCE",))]
    assert "through the IBext_v8 plugin" in log.transports["IBext_v8"].label
    assert log.nics is not None and log.nics.count == 8
    assert checks(report(text, "hgx-h100"))["nics"] == "pass"  # 8 NICs, as the node type has


def test_roce_sample_fails_on_an_infiniband_node_type() -> None:
    result = report(sample("ib-roce-gdrdma.log").read_text(), "hgx-h100")
    assert checks(result)["transport"] == "fail"
    assert "RoCE" in reason(result, "transport") and "NCCL_IB_HCA" in reason(result, "transport")
    assert checks(result)["nics"] == "pass"


@pytest.mark.parametrize("node_type", [None, "p4d.24xlarge"])
def test_socket_sample_fails(node_type: str | None) -> None:
    result = report(sample("socket-ec2.log").read_text(), node_type)
    log = result.run.log
    assert [t.kind for t in log.tcp_transports] == ["socket"]
    assert log.rank_networks == {7: ("Socket",), 15: ("Socket",)}
    assert log.gdr.state == "off"
    assert log.nics is not None and log.nics.count == 1 and log.nics.names == ("ens5",)
    assert (log.nodes, log.ranks) == (2, 16)
    assert not result.verdict.passed
    assert "Only EFA provider is supported" in reason(result, "transport")
    assert ("gpudirect-rdma" in " ".join(result.verdict.failures)) == (node_type is not None)


def test_busbw_sample_peak_collapse_and_gate() -> None:
    text = sample("busbw-poor-crossrack.txt").read_text()
    [table] = parse_results(text)
    assert table.peak is not None
    assert (table.peak.size_bytes, table.peak.best_busbw_gbps) == (33554432, 29.50)
    row = table.row_at(536870912)
    assert row is not None and row.busbw("out-of-place") == 5.31 and row.busbw("in-place") == 5.33
    assert table.wrong_elements == 0 and table.avg_busbw_gbps is None
    result = report(text, "p5.48xlarge", nodes=2)
    assert checks(result)["busbw"] == "fail"
    assert "5.33 GB/s (in-place) at 536870912 bytes" in reason(result, "busbw")
    assert "250 GB/s" in reason(result, "busbw")
    assert checks(result)["transport"] == "fail"  # a bare table cannot show the transport


def test_three_nodes_without_a_gate_are_judged_by_their_one_node_figure() -> None:
    """The cross-rack collapse (3 x 8 H100, NVIDIA/nccl#1453) has no published gate for its node type or
    node count: judged against what one node of the class reaches (NVIDIA/nccl-tests#347: 480.14 GB/s),
    capped by the network (hgx-h100: 8 x 400 Gb/s = 400 GB/s), it fails; without that figure it is
    skipped, saying how to judge it."""
    crossrack = sample("busbw-poor-crossrack.txt").read_text()
    alone = ("one-node.txt", sample("busbw-one-node-h100.txt").read_text())
    result = fabric_report(crossrack, source="x", node_type="hgx-h100", nodes=3, one_node=alone)
    assert checks(result)["busbw"] == "fail"
    assert reason(result, "busbw").startswith(
        "3 nodes reach 5.33 GB/s at 536870912 bytes, 1% of the 400.00 GB/s these nodes should reach (their "
        "network, 8 x 400 Gb/s, below their one-node figure 480.14 GB/s): bandwidth collapses across the "
        "nodes; the peak is 29.50 GB/s at 33554432 bytes."
    )
    unjudged = report(crossrack, "hgx-h100", nodes=3)
    assert checks(unjudged)["busbw"] == "skip" and "--one-node LOG" in reason(unjudged, "busbw")
    # No node type: the one-node figure alone is the measure.
    bare = fabric_report(crossrack, source="x", nodes=3, one_node=alone)
    assert "of the 480.14 GB/s these nodes should reach (their one-node figure" in reason(bare, "busbw")
    # A run that holds its one-node figure across nodes passes; two nodes may reach twice the network.
    healthy = alone[1]
    assert (
        checks(fabric_report(healthy, source="x", node_type="hgx-h100", nodes=3, one_node=alone))["busbw"]
        == "pass"
    )
    two = fabric_report(crossrack, source="x", node_type="hgx-h100", nodes=2, one_node=alone)
    assert "(x2 with trees on two nodes)" not in reason(two, "busbw")  # 800 > 480.14: the node's figure


def test_one_node_runs_that_are_not_one_node_or_have_no_table_are_refused() -> None:
    crossrack = sample("busbw-poor-crossrack.txt").read_text()
    with pytest.raises(SpecError, match="no all_reduce_perf result table"):
        fabric_report(crossrack, source="x", nodes=3, one_node=("empty.txt", "nothing here\n"))
    small = "\n".join(crossrack.splitlines()[:6])  # up to 32 MiB: latency-bound, no bandwidth verdict
    alone = ("one-node.txt", sample("busbw-one-node-h100.txt").read_text())
    result = fabric_report(small, source="x", node_type="hgx-h100", nodes=3, one_node=alone)
    assert checks(result)["busbw"] == "skip" and "run with -e 1G" in reason(result, "busbw")


def test_cli_one_node_option(tmp_path: Path) -> None:
    result = gpuplat(
        "nccl-report", str(sample("busbw-poor-crossrack.txt")), "--node-type", "hgx-h100", "--nodes", "3",
        "--one-node", str(sample("busbw-one-node-h100.txt")), "--json",
    )  # fmt: skip
    assert result.returncode == 1
    busbw = next(c for c in json.loads(result.stdout)["checks"] if c["name"] == "busbw")
    assert busbw["status"] == "fail" and "collapses across the nodes" in busbw["reason"]


def test_bare_table_without_node_count_is_not_gated() -> None:
    result = report(sample("busbw-poor-crossrack.txt").read_text(), "p5.48xlarge")
    assert checks(result)["busbw"] == "skip" and "--nodes" in reason(result, "busbw")


# --------------------------------------------------------------------------------- logs from the formats


def test_missing_plugin_means_sockets_and_fails_on_p4d() -> None:
    result = report(PLUGIN_NOT_FOUND_SOCKET, "p4d.24xlarge")
    log = result.run.log
    assert log.rank_networks == {0: ("Socket",), 8: ("Socket",)}
    assert [(f.plugin, f.problem, f.processes) for f in log.plugin_failures] == [
        ("libnccl-net.so", "not found", 1)
    ]
    assert checks(result)["transport"] == "fail" and checks(result)["gpudirect-rdma"] == "fail"
    assert "libnccl-net.so not found" in reason(result, "transport")


def test_socket_transport_passes_on_an_ethernet_node_type() -> None:
    result = report(PLUGIN_NOT_FOUND_SOCKET, "g6.2xlarge")
    assert checks(result)["transport"] == "pass" and result.verdict.passed


def test_plugin_dlerror_of_nccl_2_19_is_the_reason() -> None:
    [failure] = parse_nccl_log(PLUGIN_DLERROR_2_19).plugin_failures
    assert (failure.plugin, failure.problem) == ("libnccl-net.so", "not found")
    assert failure.reason == "libnccl-net.so: cannot open shared object file: No such file or directory"


def test_plugin_load_error_names_the_missing_library() -> None:
    result = report(PLUGIN_LOAD_ERROR, "p5.48xlarge")
    [failure] = result.run.log.plugin_failures
    assert failure.problem == "load error" and "libfabric.so.1" in failure.reason
    assert "libfabric.so.1" in reason(result, "transport")


def test_plugin_init_failure_carries_the_plugins_last_warning() -> None:
    [failure] = parse_nccl_log(PLUGIN_INIT_FAILED).plugin_failures
    assert (failure.plugin, failure.problem) == ("Libfabric", "init failed")
    assert failure.reason.startswith("Unable to find a protocol that worked")


def test_ofi_on_the_tcp_provider_counts_as_tcp() -> None:
    result = report(OFI_TCP_PROVIDER, "p5.48xlarge")
    [transport] = result.run.log.transports.values()
    assert transport.kind == "plugin" and transport.over_tcp and "provider tcp" in transport.label
    assert result.run.log.plugin_failures == ()
    assert checks(result)["transport"] == "fail"


def test_ib_with_gdr_on_passes_on_hgx() -> None:
    result = report(ib_log(), "hgx-h100")
    log = result.run.log
    assert [t.label for t in log.transports.values()] == ["IB verbs (InfiniBand)"]
    assert log.gdr.state == "on" and log.gdr.connections == 4
    assert log.rank_networks == {0: ("IB",), 8: ("IB",)}
    assert result.verdict.passed, result.verdict.failures


def test_gdr_off_fails_where_the_gates_expect_it() -> None:
    result = report(ib_log(gdr=False), "hgx-h100")
    assert result.run.log.gdr.state == "off"
    assert checks(result) == {
        "transport": "pass",
        "gpudirect-rdma": "fail",
        "nics": "pass",
        "busbw": "skip",
        "errors": "skip",
    }
    assert "nvidia-peermem" in reason(result, "gpudirect-rdma")


def test_gdr_off_without_an_expectation_is_not_judged() -> None:
    result = report(ib_log(gdr=False), None)
    assert checks(result)["gpudirect-rdma"] == "skip" and result.verdict.passed


def test_fewer_hcas_than_the_catalog_fails() -> None:
    result = report(ib_log(hcas=4), "hgx-h100")
    assert checks(result)["nics"] == "fail"
    assert "4 (mlx5_0, mlx5_1, mlx5_2, mlx5_3) of the 8 NICs" in reason(result, "nics")


def test_mixed_transports_are_reported_per_rank_and_fail() -> None:
    result = report(MIXED_TRANSPORTS, "hgx-h100")
    log = result.run.log
    assert log.rank_networks == {0: ("IB",), 8: ("Socket",)}
    assert {t.network for t in log.tcp_transports} == {"Socket"}
    assert log.gdr.state == "partial"
    assert "(ranks 8)" in reason(result, "transport")
    assert checks(result)["gpudirect-rdma"] == "fail"


@pytest.mark.parametrize(("busbw", "verdict"), [(27.5, "pass"), (20.1, "fail")])
def test_p4d_two_node_busbw_against_the_parallelcluster_gate(busbw: float, verdict: str) -> None:
    result = report(p4d_run(busbw), "p4d.24xlarge")
    [table] = result.run.tables
    assert table.nodes == 2 and table.avg_busbw_gbps == 35.2 and table.out_of_bounds == 0
    row = table.row_at(1073741824)
    assert row is not None and row.busbw("in-place") == busbw and row.busbw("out-of-place") == busbw + 1
    assert checks(result)["busbw"] == verdict
    assert "26 GB/s at 1073741824 bytes" in reason(result, "busbw")
    assert checks(result)["transport"] == checks(result)["gpudirect-rdma"] == checks(result)["nics"] == "pass"
    assert result.verdict.passed == (verdict == "pass")


def test_wrong_elements_fail_and_one_node_has_no_published_gate() -> None:
    result = report(INTRA_NODE_WRONG, "p5.48xlarge")
    assert checks(result) == {
        "transport": "pass",
        "gpudirect-rdma": "skip",
        "nics": "skip",
        "busbw": "skip",
        "errors": "fail",
    }
    assert "no published figure for p5.48xlarge intra-node" in reason(result, "busbw")
    assert "12 wrong elements" in reason(result, "errors")


def test_per_iteration_columns_do_not_shift_the_in_place_group() -> None:
    [table] = parse_results(PER_ITERATION_TABLE)
    [row] = table.rows
    assert (row.busbw("out-of-place"), row.busbw("in-place")) == (439.46, 439.59)


@pytest.mark.parametrize("with_header", [True, False])
def test_old_error_column_without_root(with_header: bool) -> None:
    text = OLD_ERROR_COLUMN if with_header else OLD_ERROR_COLUMN.splitlines()[1]
    [table] = parse_results(text)
    [row] = table.rows
    assert (row.busbw("out-of-place"), row.busbw("in-place")) == (26.58, 26.63)
    assert row.in_place is not None and row.in_place.wrong is None
    assert report(text, "p4d.24xlarge", nodes=2).verdict.checks[-1].status == "skip"


def test_tables_of_other_collectives_are_not_gated() -> None:
    [table] = parse_results(ALLTOALL_ROWS)
    assert table.is_all_reduce is False and table.rows[0].in_place is not None
    assert table.rows[0].in_place.wrong is None
    assert checks(report(ALLTOALL_ROWS, "p5.48xlarge", nodes=2))["busbw"] == "skip"


def test_nodes_flag_cannot_contradict_the_log() -> None:
    with pytest.raises(SpecError, match="--nodes 3 contradicts the log: NCCL reports nNodes 2"):
        report(PLUGIN_NOT_FOUND_SOCKET, "p4d.24xlarge", nodes=3)


def test_text_without_nccl_output_is_refused() -> None:
    with pytest.raises(SpecError, match="is not an NCCL log"):
        report("Epoch 1: loss 2.3\nall good\n")


# ------------------------------------------------------------------------------------------------ the gates


def test_gates_cover_catalog_node_types_with_sources() -> None:
    gates = fabric_gates()
    p5 = gates.get("p5.48xlarge")
    assert p5 is not None and p5.gpudirect_rdma is not None and p5.gpudirect_rdma.expected
    gate = p5.busbw_gate("two-node")
    assert gate is not None and (gate.min_busbw_gbps, gate.message_bytes, gate.column) == (
        250.0,
        1073741824,
        "in-place",
    )
    for entry in gates.node_types:
        for busbw in entry.busbw:
            assert busbw.source.startswith("https://"), entry.node_type


def test_gates_naming_an_unknown_node_type_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = yaml.safe_load(gates_module.GATES_FILE.read_text())
    document["node_types"][0]["node_type"] = "p9.imaginary"
    path = tmp_path / "fabric_gates.yaml"
    path.write_text(yaml.safe_dump(document))
    monkeypatch.setattr(gates_module, "GATES_FILE", path)
    fabric_gates.cache_clear()
    try:
        with pytest.raises(SpecError, match=r"p9\.imaginary"):
            fabric_gates()
    finally:
        fabric_gates.cache_clear()


def test_analysis_imports_no_pulumi() -> None:
    code = (
        "import sys, infra.validate.report, infra.validate.scaling; "
        "print(sorted(m for m in sys.modules if m.startswith(('pulumi', 'ansible'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert result.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------------------- the CLI


def test_cli_json_and_exit_codes(tmp_path: Path) -> None:
    passing = gpuplat("nccl-report", str(sample("efa-p5-gdrdma.log")), "--node-type", "p5.48xlarge", "--json")
    assert passing.returncode == 0, passing.stderr
    data = json.loads(passing.stdout)
    assert data["verdict"] == "pass" and data["nics"] == {
        "used": 32,
        "names": [],
        "source": "aws-ofi-nccl, provider efa",
        "expected": 32,
    }
    assert data["gpudirect_rdma"]["state"] == "on"
    failing = gpuplat("nccl-report", str(sample("socket-ec2.log")))
    assert failing.returncode == 1
    assert "verdict: FAIL" in failing.stdout and "TCP sockets" in failing.stdout


def test_cli_bad_input_exits_2_with_one_message(tmp_path: Path) -> None:
    unknown = gpuplat("nccl-report", str(sample("efa-p5-gdrdma.log")), "--node-type", "p7.huge")
    assert unknown.returncode == 2 and "allowed: p4d.24xlarge" in unknown.stderr
    assert "cpu-server" not in unknown.stderr
    missing = gpuplat("nccl-report", str(tmp_path / "absent.log"))
    assert missing.returncode == 2 and "cannot read the log" in missing.stderr
    not_nccl = tmp_path / "train.log"
    not_nccl.write_text("step 1 loss 2.0\n")
    refused = gpuplat("nccl-report", str(not_nccl))
    assert refused.returncode == 2 and "is not an NCCL log" in refused.stderr
    assert all("Traceback" not in r.stderr for r in (unknown, missing, refused))


@pytest.mark.parametrize(("share", "verdict"), [(0.49, "fail"), (0.51, "pass")])
def test_the_one_node_judgement_turns_at_half_the_nodes_own_figure(share: float, verdict: str) -> None:
    """Three nodes without a gate or a node type: judged against their one-node figure (480.14 GB/s), a run
    just under half of it is a collapse across the nodes and one just over passes (ONE_NODE_SHARE)."""
    alone_text = sample("busbw-one-node-h100.txt").read_text()
    busbw = f"{480.14 * share:.2f}"
    across = alone_text.replace("479.41", busbw).replace("480.14      0", f"{busbw}      0")
    assert across.count(busbw) == 2
    result = fabric_report(across, source="x", nodes=3, one_node=("one-node.txt", alone_text))
    assert checks(result)["busbw"] == verdict, reason(result, "busbw")
    assert f"{share:.0%} of the 480.14 GB/s these nodes should reach" in reason(result, "busbw")
