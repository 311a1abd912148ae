#!/usr/bin/env python3
"""Is this training node fit to take work? The health checks `gpuplat validate` runs on every node.

  gpuplat-node-check [--gpu-absent-reason TEXT] [--health-program PATH] [--dcgm-level 2]
                     [--dcgm-timeout 1800] [--fatal-xids 48,64,...] [--warn-xids 94] [--nvswitch] [--gdrcopy]
  gpuplat-node-check --periodic [--nvswitch] [--gdrcopy] [--fatal-xids ...] [--warn-xids ...]

Checks, each reported as pass, fail, skip (with the reason) or error (the check could not run):

  health-program  the pool's Slurm health program (roles/slurm_compute) with --dry-run
  xid             XID errors since boot in the kernel log (the journal's `journalctl -k -b` and
                  dmesg's ring buffer), against the fatal list
  ecc             uncorrectable volatile ECC errors and row-remapping state (nvidia-smi)
  recovery        the GPU recovery action the driver asks for (nvidia-smi gpu_recovery_action)
  fabric          on NVSwitch systems (--nvswitch): nvidia-fabricmanager active, every GPU's fabric
                  registration completed with success (nvidia-smi fabric.state, fabric.status)
  gdrcopy         on GPU nodes of an RDMA fabric (--gdrcopy): GDRCopy's kernel module gdrdrv loaded and
                  /dev/gdrdrv there
  dcgm-health     DCGM's health watches (`dcgmi health -c`), set first where nv-hostengine has none
  dcgm-diag       `dcgmi diag -r LEVEL -j` where DCGM is installed and no Slurm job holds the node

--periodic runs the cheap checks only (xid, ecc, recovery, fabric, gdrcopy, dcgm-health: seconds,
nothing that disturbs a running job) for the Slurm health program (roles/slurm_compute), and prints each
drain reason on a line of its own instead of the JSON document.

GPU checks skip when --gpu-absent-reason is given (no GPU, simulated GPUs, driver not loaded).
A failing check adds a drain reason; an error does not (the tool failed, not the node).
Prints one JSON document: {"checks": [...], "drain_reasons": [...]}. Exit 0 unless the usage is wrong.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# `NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`: the line format DCGM's kernel
# log reader matches (NVIDIA/DCGM dcgmlib/src/DcgmKmsgReader.cpp, ParseKmsgLineForXid).
_XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[^)]*)\): (?P<xid>\d+),?(?P<text>.*)$")
# dcgmi returns its dcgmReturn_t as exit status: DCGM_ST_NVVS_ERROR (-30) when the diagnostic ran and a
# test failed, DCGM_ST_NVVS_ISOLATE_ERROR (-51) when the failure calls for isolating the GPU
# (NVIDIA/DCGM dcgmi/Diag.cpp, dcgmlib/dcgm_structs.h).
DCGM_DIAG_FAILED = {-30 & 0xFF, -51 & 0xFF}
# XIDs that drain a node: the ones DCGM's health watch always treats as failures (48 double-bit ECC,
# 64 row-remap failure, 74 NVLink, 79 fallen off the bus, 95 uncontained ECC, 119/120 GSP, 140 ECC
# unrecovered); 94, a contained ECC error, is its warning (NVIDIA/DCGM modules/health/DcgmHealthWatch.cpp,
# BuildXidMappings, master 72fa3fea, 2026-07-06, after v4.6.0). The defaults of --fatal-xids and
# --warn-xids, and of gpu_validation_fatal_xids / gpu_validation_warn_xids (a test holds them equal).
FATAL_XIDS = (48, 64, 74, 79, 95, 119, 120, 140)
WARN_XIDS = (94,)
_SET = {"yes", "1", "true"}


@dataclass
class Check:
    name: str
    status: str  # pass | fail | warn | skip | error
    detail: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    drain_reasons: list[str] = field(default_factory=list)

    def add(self, check: Check) -> None:
        self.checks.append(check)
        if check.status == "fail":
            self.drain_reasons.append(f"{check.name}: {check.detail}")


@dataclass(frozen=True)
class Xid:
    pci: str
    xid: int
    text: str


def parse_xids(kernel_log: str) -> list[Xid]:
    found = []
    for line in kernel_log.splitlines():
        match = _XID.search(line)
        if match:
            found.append(Xid(match["pci"], int(match["xid"]), match["text"].strip(" ,")))
    return found


def _listed(xids: list[Xid]) -> str:
    """Each XID once per GPU (its first occurrence): the drain reason stays the same from one health run
    to the next while the same XID repeats, instead of growing with every occurrence."""
    first: dict[tuple[int, str], Xid] = {}
    for x in xids:
        first.setdefault((x.xid, x.pci), x)
    return "; ".join(
        f"XID {x.xid} on PCI:{x.pci}" + (f" ({x.text})" if x.text else "") for x in first.values()
    )


def xid_check(kernel_log: str, fatal: set[int], warn: frozenset[int] = frozenset()) -> Check:
    """fail on a fatal XID (the node is drained), warn on one that needs a look but not a drain."""
    xids = parse_xids(kernel_log)
    bad = [x for x in xids if x.xid in fatal]
    if bad:
        return Check("xid", "fail", f"fatal XID since boot: {_listed(bad)}")
    noted = [x for x in xids if x.xid in warn]
    if noted:
        return Check("xid", "warn", f"XID since boot that needs a look: {_listed(noted)}")
    if xids:
        seen = ", ".join(sorted({str(x.xid) for x in xids}, key=int))
        return Check("xid", "pass", f"no fatal XID since boot (non-fatal XIDs seen: {seen})")
    return Check("xid", "pass", "no XID since boot")


def _rows(text: str) -> Iterator[list[str]]:
    for row in csv.reader(text.strip().splitlines()):
        if row:
            yield [cell.strip() for cell in row]


def ecc_problems(ecc_csv: str, remap_csv: str) -> list[str]:
    """Uncorrectable volatile ECC errors (index, bus id, count) and row remapping that is pending (the
    GPU needs a reset) or failed (no spare rows left) from nvidia-smi's CSV output without header."""
    problems = []
    for index, bus_id, count in (r for r in _rows(ecc_csv) if len(r) == 3):
        if count.isdigit() and int(count) > 0:
            problems.append(
                f"GPU {index} ({bus_id}): {count} uncorrectable ECC error(s) since the driver loaded"
            )
    for bus_id, pending, failure in (r for r in _rows(remap_csv) if len(r) == 3):
        if failure.lower() in _SET:
            problems.append(f"GPU {bus_id}: row remapping failed (no spare rows left)")
        elif pending.lower() in _SET:
            problems.append(f"GPU {bus_id}: row remapping pending (the GPU needs a reset)")
    return problems


def dcgm_failures(output: str) -> list[str]:
    """'test: GPU n: message' for every failed result in `dcgmi diag -j` output (DCGM 3 and 4 layout:
    test_categories[].tests[].results[] with status and warnings)."""
    try:
        document = json.loads(output[output.find("{") :]) if "{" in output else {}
    except json.JSONDecodeError:
        return []
    failures = []
    for category in document.get("DCGM Diagnostic", {}).get("test_categories", []):
        for test in category.get("tests", []):
            for result in test.get("results", []):
                if result.get("status") != "Fail":
                    continue
                entity = result.get("entity_id", result.get("gpu_id", "?"))
                where = f"{result.get('entity_group', 'GPU')} {entity}"
                messages = [w.get("warning", "") for w in result.get("warnings", []) if isinstance(w, dict)]
                failures.append(
                    f"{test.get('name', '?')}: {where}: {'; '.join(m for m in messages if m) or 'failed'}"
                )
    return failures


def dcgm_check(returncode: int, output: str, level: int) -> Check:
    if returncode == 0:
        return Check("dcgm-diag", "pass", f"dcgmi diag -r {level} passed")
    if returncode in DCGM_DIAG_FAILED:
        failures = dcgm_failures(output) or [f"dcgmi diag -r {level} reported a failure (exit {returncode})"]
        return Check("dcgm-diag", "fail", "; ".join(failures))
    tail = " ".join(output.strip().splitlines()[-3:])[-300:]
    return Check("dcgm-diag", "error", f"dcgmi diag -r {level} could not run (exit {returncode}): {tail}")


# Fabric registration of a GPU on an NVSwitch system: "Not Started", "In Progress", then "Completed", and
# only then a status ("Success" or the probe's error) (NVML nvmlGpuFabricInfo_t: state, and status "must
# be checked only if state returns complete", https://docs.nvidia.com/deploy/nvml-api/
# structnvmlGpuFabricInfo__t.html; nvidia-smi's fields fabric.state and fabric.status, NVIDIA/NVSentinel
# issue 883). GPUs without fabric registration (before Hopper) answer N/A: the service check remains.
FABRIC_NO_INFO = frozenset({"N/A", "[N/A]", "Not Supported", "[Not Supported]"})


def fabric_check_from(service_state: str, code: int, output: str) -> Check:
    """service_state: `systemctl is-active nvidia-fabricmanager`; code and output: nvidia-smi's query of
    index, pci.bus_id, fabric.state, fabric.status (CSV without header)."""
    problems = []
    if service_state.strip() != "active":
        problems.append(f"nvidia-fabricmanager is {service_state.strip() or 'not running'}")
    if code != 0 and "not a valid field" not in output:
        problems.append(f"nvidia-smi could not read the fabric state: {output.strip()[:200]}")
    elif code == 0:
        for row in _rows(output):
            if len(row) != 4:
                continue
            index, bus, state, status = row
            if state in FABRIC_NO_INFO:
                continue
            if state != "Completed":
                problems.append(f"GPU {index} ({bus}): fabric registration {state}")
            elif status not in ("Success", *FABRIC_NO_INFO):
                problems.append(f"GPU {index} ({bus}): fabric registration failed: {status}")
    if problems:
        return Check("fabric", "fail", "; ".join(problems))
    return Check("fabric", "pass", "nvidia-fabricmanager active, every GPU's fabric registration completed")


def fabric_check() -> Check:
    _, service_state = run(["systemctl", "is-active", "nvidia-fabricmanager"])
    return fabric_check_from(
        service_state,
        *run(
            ["nvidia-smi", "--query-gpu=index,pci.bus_id,fabric.state,fabric.status", "--format=csv,noheader"]
        ),
    )


# `dcgmi health -c` prints "Overall Health" as Healthy, Warning or Failure, then each GPU's incidents
# (NVIDIA/DCGM dcgmi/Health.cpp, CheckWatches and HelperHealthToString); with no watch set it answers
# "Health watches not enabled" (exit status non-zero). Watches live in nv-hostengine: a restarted host
# engine has none until they are set again (`dcgmi health -s a`, every system).
_DCGM_OVERALL = re.compile(r"Overall Health\W+(?:value\W+)?(Healthy|Warning|Failure|Internal error)")
DCGM_WATCHES_UNSET = "Health watches not enabled"


def dcgm_health_check_from(code: int, output: str) -> Check:
    match = _DCGM_OVERALL.search(output)
    if match is None:
        tail = " ".join(output.strip().splitlines()[-3:])[-300:]
        return Check("dcgm-health", "error", f"dcgmi health -c gave no overall health (exit {code}): {tail}")
    incidents = []
    for line in output[match.end() :].splitlines():
        cells = [cell.strip().removeprefix("-> ") for cell in line.strip().strip("|").split("|")]
        cells = [cell for cell in cells if cell and not cell.startswith("+-")]
        if cells and not (len(cells) == 1 and cells[0] in ("GPU", "Errors", "Switch")):
            incidents.append(": ".join(cells))
    detail = "; ".join(incidents) or match[1]
    if match[1] == "Failure":
        return Check("dcgm-health", "fail", f"DCGM health watches report a failure: {detail}")
    if match[1] == "Warning":
        return Check("dcgm-health", "warn", f"DCGM health watches report a warning: {detail}")
    if match[1] == "Internal error":
        return Check("dcgm-health", "error", "DCGM health watches answered an internal error")
    return Check("dcgm-health", "pass", "DCGM health watches report healthy")


def dcgm_health_check() -> Check:
    if shutil.which("dcgmi") is None:
        return Check("dcgm-health", "skip", "DCGM is not installed on this node (dcgmi not found)")
    # Short: a host engine that does not answer is an error of the tool, within the health program's
    # time for the GPU checks (slurm_compute_health_check_gpu_timeout), past which the node is drained.
    code, output = run(["dcgmi", "health", "-c"], timeout=10)
    if DCGM_WATCHES_UNSET in output:
        set_code, set_output = run(["dcgmi", "health", "-s", "a"], timeout=10)
        if set_code != 0:
            return Check(
                "dcgm-health", "error", f"could not set DCGM's health watches: {set_output.strip()[:200]}"
            )
        return Check(
            "dcgm-health", "skip", "DCGM's health watches were not set: set now, checked from the next run"
        )
    return dcgm_health_check_from(code, output)


def run(command: Sequence[str], timeout: float = 120) -> tuple[int, str]:
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, f"{command[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(command)}: no answer in {timeout:.0f} s"
    return done.returncode, done.stdout + done.stderr


def health_program_check(program: str) -> Check:
    if not program or shutil.which(program) is None:
        return Check(
            "health-program", "skip", f"{program or 'no health program'} is not installed on this node"
        )
    code, output = run([program, "--dry-run"])
    message = output.strip().replace("gpuplat-health: ", "") or f"exit {code}"
    if code == 0:
        return Check("health-program", "pass", f"{program} --dry-run found nothing")
    return Check("health-program", "fail", message)


# What the kernel log reads may take of the periodic run's time (slurm_compute_health_check_gpu_timeout,
# 40 s by default, past which the node is drained as hung): a journal of weeks of a chatty kernel is read
# for seconds, and what it holds is kept only where it is an XID line.
JOURNAL_TIMEOUT = 8
RING_TIMEOUT = 5


def xid_lines(command: Sequence[str], timeout: float) -> tuple[int, str]:
    """The XID lines of a kernel log command's output, read as it comes (a log of gigabytes is never held),
    and its error output where it fails. Stopped at the timeout, it keeps the lines it read (the log is in
    time order, so those are the oldest) and exits 124."""
    try:
        process = subprocess.Popen(
            list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace"
        )
    except FileNotFoundError:
        return 127, f"{command[0]}: not found"
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    try:
        assert process.stdout is not None and process.stderr is not None
        kept = [line for line in process.stdout if "NVRM: Xid" in line]
        errors = process.stderr.read()
        code = process.wait()
    finally:
        timer.cancel()
    if code == -9:
        return 124, "".join(kept) or f"{' '.join(command)}: no answer in {timeout:.0f} s"
    return code, "".join(kept) if code == 0 else errors + "".join(kept)


def kernel_log() -> tuple[int, str]:
    """This boot's XID lines from its kernel log: the journal's copy (`journalctl -k -b`) where journald
    keeps one, and the kernel's ring buffer (dmesg). The ring has the size the kernel was built with
    (CONFIG_LOG_BUF_SHIFT) and wraps on a chatty node, so an XID from days ago may be only in the journal;
    the journal may lack the newest lines (journald reads /dev/kmsg as they come), not exist (a node
    without journald, a container) or be too long to read in JOURNAL_TIMEOUT (what was read counts).
    Both are read; an XID in either counts, once (`_listed`)."""
    journal_code, journal = xid_lines(
        ["journalctl", "-k", "-b", "-q", "--no-pager", "-o", "cat"], JOURNAL_TIMEOUT
    )
    ring_code, ring = xid_lines(["dmesg"], RING_TIMEOUT)
    usable = {0, 124}
    if journal_code not in usable and ring_code not in usable:
        return ring_code, f"{ring.strip()[:150]}; {journal.strip()[:150]}"
    return 0, (journal if journal_code in usable else "") + "\n" + (ring if ring_code in usable else "")


def ecc_check() -> Check:
    code, ecc = run(
        ["nvidia-smi", "--query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total",
         "--format=csv,noheader,nounits"]
    )  # fmt: skip
    if code != 0:
        return Check("ecc", "error", f"nvidia-smi could not read the ECC counters: {ecc.strip()[:200]}")
    # Row remapping exists from Ampere on; older GPUs answer "not supported" and only ECC counts.
    remap_code, remap = run(
        ["nvidia-smi", "--query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure",
         "--format=csv,noheader"]
    )  # fmt: skip
    problems = ecc_problems(ecc, remap if remap_code == 0 else "")
    if problems:
        return Check("ecc", "fail", "; ".join(problems))
    remap_note = "" if remap_code == 0 else " (row remapping not reported by this GPU)"
    return Check("ecc", "pass", f"no uncorrectable ECC error, no pending or failed row remapping{remap_note}")


# The driver's recovery action (NVML field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 230, from R565; XID 154
# announces a change): nvidia-smi's `gpu_recovery_action` query field prints None, Reset, Reboot, Drain P2P
# or Drain and Reset. DCGM's health watch fails a GPU on reset, reboot and drain-and-reset and warns on
# drain P2P (NVIDIA/DCGM modules/health/DcgmHealthWatch.cpp, MonitorGpuRecoveryAction); here any other
# action than none warns.
RECOVERY_FAIL = frozenset({"Reset", "Reboot", "Drain and Reset"})
RECOVERY_NONE = frozenset({"None", "[N/A]", "N/A", "[Not Supported]"})


def recovery_check_from(code: int, output: str) -> Check:
    if code != 0:
        if "not a valid field" in output:
            return Check(
                "recovery",
                "skip",
                "this driver's nvidia-smi has no gpu_recovery_action query field (the XID check still sees "
                "XID 154)",
            )
        return Check(
            "recovery", "error", f"nvidia-smi could not read the recovery action: {output.strip()[:200]}"
        )
    fail, warn = [], []
    for row in csv.reader(line for line in output.splitlines() if line.strip()):
        index, bus, action = (cell.strip() for cell in row)
        where = f"GPU {index} ({bus}): {action}"
        if action in RECOVERY_FAIL:
            fail.append(where)
        elif action not in RECOVERY_NONE:
            warn.append(where)
    if fail:
        return Check("recovery", "fail", "the driver asks for a recovery action: " + "; ".join(fail + warn))
    if warn:
        return Check("recovery", "warn", "recovery action that needs a look: " + "; ".join(warn))
    return Check("recovery", "pass", "the driver asks for no recovery action")


def recovery_check() -> Check:
    return recovery_check_from(
        *run(["nvidia-smi", "--query-gpu=index,pci.bus_id,gpu_recovery_action", "--format=csv,noheader"])
    )


# Where a configless slurmd keeps the configuration it fetched (Slurm 22.05's client commands do not
# look there themselves).
CONFIGLESS_SLURM_CONF = Path("/run/slurm/conf/slurm.conf")


def jobs_on(node: str) -> tuple[int, list[str]]:
    """Slurm jobs holding a share of this node: (squeue's exit status, job ids). 127: not a Slurm node."""
    if shutil.which("squeue") is None:
        return 127, []
    env = dict(os.environ)
    if "SLURM_CONF" not in env and CONFIGLESS_SLURM_CONF.exists():
        env["SLURM_CONF"] = str(CONFIGLESS_SLURM_CONF)
    argv = [
        "squeue",
        "--noheader",
        f"--nodelist={node}",
        "--states=RUNNING,SUSPENDED,COMPLETING",
        "--format=%i",
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)
    except subprocess.TimeoutExpired:
        return 124, []
    return done.returncode, done.stdout.split()


def dcgm_guard(node: str) -> Check | None:
    """A DCGM diagnostic stresses every GPU: on GPUs in use it can fail (and drain a healthy node) and it
    disturbs the jobs. It runs only where no job holds the node; None means it may run."""
    code, jobs = jobs_on(node)
    if code == 127:
        return None
    if code != 0:
        return Check("dcgm-diag", "error", f"cannot tell whether jobs run on {node} (squeue exit {code})")
    if jobs:
        return Check(
            "dcgm-diag",
            "skip",
            f"{node} runs jobs {','.join(jobs)}: the diagnostic would stress GPUs in use; validate it idle",
        )
    return None


def gdrcopy_check(module: Path = Path("/sys/module/gdrdrv"), device: Path = Path("/dev/gdrdrv")) -> Check:
    """On a GPU node of an RDMA fabric (--gdrcopy): GDRCopy's kernel module gdrdrv loaded and its device
    node there (roles/rdma). Without them libgdrapi cannot open, and libfabric and NCCL fall back to slower
    copies through the CUDA API without saying so: a node with the wrong kernel for its DKMS build, say."""
    if not module.is_dir():
        return Check(
            "gdrcopy",
            "fail",
            f"gdrdrv is not loaded ({module} missing): `dkms status gdrdrv` and `systemctl status gdrdrv` "
            "say why",
        )
    if not device.exists():
        return Check("gdrcopy", "fail", f"gdrdrv is loaded but {device} is missing: restart gdrdrv.service")
    return Check("gdrcopy", "pass", f"gdrdrv loaded, {device} present")


def add_cheap_checks(report: Report, args: argparse.Namespace) -> None:
    """What the Slurm health program runs every interval and `validate` runs too (validate's DCGM
    diagnostic goes further than the health watches, which its health-program check runs): reads only."""
    code, log = kernel_log()
    report.add(
        xid_check(log, set(args.fatal_xids), frozenset(args.warn_xids))
        if code == 0
        else Check("xid", "error", log.strip()[:200])
    )
    report.add(ecc_check())
    report.add(recovery_check())
    if args.nvswitch:
        report.add(fabric_check())
    if args.gdrcopy:
        report.add(gdrcopy_check())
    if args.periodic:
        report.add(dcgm_health_check())


def check_node(args: argparse.Namespace) -> Report:
    report = Report()
    if args.periodic:
        add_cheap_checks(report, args)
        return report
    report.add(health_program_check(args.health_program))
    if args.gpu_absent_reason:
        for name in ("xid", "ecc", "recovery", "dcgm-diag") + (("gdrcopy",) if args.gdrcopy else ()):
            report.add(Check(name, "skip", args.gpu_absent_reason))
        return report
    add_cheap_checks(report, args)
    if shutil.which("dcgmi") is None:
        report.add(Check("dcgm-diag", "skip", "DCGM is not installed on this node (dcgmi not found)"))
    elif (busy := dcgm_guard(args.slurm_node or socket.gethostname())) is not None:
        report.add(busy)
    else:
        code, output = run(["dcgmi", "diag", "-r", str(args.dcgm_level), "-j"], timeout=args.dcgm_timeout)
        report.add(dcgm_check(code, output, args.dcgm_level))
    return report


def _xid_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of XID numbers: {text!r}") from None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpu-absent-reason", default="", help="why GPU checks cannot run (skips them)")
    parser.add_argument("--health-program", default="/usr/local/sbin/gpuplat-node-health")
    parser.add_argument("--dcgm-level", type=int, choices=[1, 2, 3, 4], default=2)
    parser.add_argument("--dcgm-timeout", type=float, default=1800)
    parser.add_argument("--fatal-xids", type=_xid_list, default=list(FATAL_XIDS))
    parser.add_argument("--warn-xids", type=_xid_list, default=list(WARN_XIDS))
    parser.add_argument("--slurm-node", default="", help="this node's Slurm name (default: the host name)")
    parser.add_argument("--nvswitch", action="store_true", help="an NVSwitch system: check the fabric")
    parser.add_argument(
        "--gdrcopy", action="store_true", help="a GPU node of an RDMA fabric: check gdrdrv is loaded"
    )
    parser.add_argument(
        "--periodic", action="store_true", help="the cheap checks only; print the drain reasons, one a line"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    report = check_node(args)
    if args.periodic:
        sys.stdout.write("".join(f"{reason}\n" for reason in report.drain_reasons))
        return 0
    document: dict[str, Any] = asdict(report)
    sys.stdout.write(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
