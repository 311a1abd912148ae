"""The GPU checks of the Slurm health program (gpuplat_node_check.py --periodic, roles/gpu_validation/files,
installed by roles/slurm_compute) run for real against the recorded answers of tests/data/node-health/:
a GPU that fell off the bus (XID 79, a reboot asked for, DCGM's PCIe watch failing), a fabric manager that
is down on an NVSwitch system (every GPU still listed by `nvidia-smi -L`), and a healthy node. The
scheduler scenario (molecule/slurm_cluster/verify/gpu_health.yml) runs the health program itself with
the same stand-ins and sees Slurm drain the node.

Not modelled: a real GPU's nvidia-smi and DCGM host engine (their formats are cited in the README)."""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.roles.test_shared_fs import compute_role_vars, rendered_script

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "roles" / "gpu_validation" / "files" / "gpuplat_node_check.py"
RECORDED = ROOT / "tests" / "data" / "node-health"


def periodic(tmp_path: Path, case: str, fabric_manager: str, *args: str) -> list[str]:
    """The drain reasons of `--periodic` on the case, with `systemctl is-active` answering fabric_manager."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    systemctl = tools / "systemctl"
    systemctl.write_text(f"#!/bin/sh\necho {fabric_manager}\n[ {fabric_manager} = active ]\n")
    systemctl.chmod(0o755)
    done = subprocess.run(
        [sys.executable, str(PROGRAM), "--periodic", *args],
        capture_output=True,
        text=True,
        check=True,
        env={
            **os.environ,
            "PATH": f"{tools}:{RECORDED / 'bin'}:/usr/bin:/bin",
            "GPUPLAT_RECORDED": str(RECORDED / case),
        },
    )
    return done.stdout.splitlines()


def test_a_healthy_nvswitch_node_has_nothing_to_drain_on(tmp_path: Path) -> None:
    assert periodic(tmp_path, "healthy", "active", "--nvswitch") == []


def test_a_gpu_off_the_bus_drains_on_its_xid_its_recovery_action_and_dcgm(tmp_path: Path) -> None:
    reasons = periodic(tmp_path, "xid79", "active", "--nvswitch")
    assert reasons == [
        "xid: fatal XID since boot: XID 79 on PCI:0000:2a:00 (pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.)",
        "recovery: the driver asks for a recovery action: GPU 1 (00000000:2A:00.0): Reboot",
        "dcgm-health: DCGM health watches report a failure: 1: Failure; PCIe system: Failure; "
        "GPU 1 has fallen off the bus",
    ]


def test_a_fatal_xid_that_rolled_out_of_the_ring_buffer_drains_from_the_journal(tmp_path: Path) -> None:
    ring = (RECORDED / "xid-only-in-journal" / "kernel.log").read_text()
    assert "Xid" not in ring, "the case's point: dmesg alone no longer shows the XID"
    assert periodic(tmp_path, "xid-only-in-journal", "active", "--nvswitch") == [
        "xid: fatal XID since boot: XID 74 on PCI:0000:18:00 (pid=48213, name=python3, "
        "NVLink: fatal error detected on link 3)"
    ]


def test_an_xid_in_both_the_journal_and_the_ring_is_named_once(tmp_path: Path) -> None:
    case = tmp_path / "xid79-both"
    shutil.copytree(RECORDED / "xid79", case)
    ring = (case / "kernel.log").read_text()
    (case / "journal.log").write_text("".join(line.split("] ", 1)[1] + "\n" for line in ring.splitlines()))
    reasons = periodic(tmp_path, str(case), "active", "--nvswitch")
    assert reasons[0] == periodic(tmp_path, "xid79", "active", "--nvswitch")[0]
    assert reasons[0].count("XID 79") == 1


def test_a_fabric_manager_down_drains_an_nvswitch_node_whose_gpus_are_all_listed(tmp_path: Path) -> None:
    reasons = periodic(tmp_path, "fabric-not-started", "inactive", "--nvswitch")
    assert reasons == [
        "fabric: nvidia-fabricmanager is inactive; "
        "GPU 0 (00000000:18:00.0): fabric registration Not Started; "
        "GPU 1 (00000000:2A:00.0): fabric registration Not Started"
    ]


def test_a_node_without_nvswitch_does_not_look_for_a_fabric_manager(tmp_path: Path) -> None:
    assert periodic(tmp_path, "healthy", "inactive") == []


@pytest.mark.parametrize(
    ("state", "status", "drains"),
    [
        ("Completed", "Success", False),
        ("In Progress", "N/A", True),
        ("Completed", "NVML_ERROR_TIMEOUT", True),
        ("N/A", "N/A", False),  # before Hopper: no fabric registration, the service check remains
    ],
)
def test_fabric_registration_states(state: str, status: str, drains: bool) -> None:
    sys.path.insert(0, str(PROGRAM.parent))
    try:
        import gpuplat_node_check as check
    finally:
        sys.path.pop(0)
    result = check.fabric_check_from("active", 0, f"0, 00000000:18:00.0, {state}, {status}\n")
    assert (result.status == "fail") is drains


def test_the_fatal_xids_are_one_list() -> None:
    """The program's defaults (what the health program uses) and gpu_validation's are the same XIDs."""
    sys.path.insert(0, str(PROGRAM.parent))
    try:
        import gpuplat_node_check as check
    finally:
        sys.path.pop(0)
    defaults = yaml.safe_load((ROOT / "roles" / "gpu_validation" / "defaults" / "main.yml").read_text())
    assert list(check.FATAL_XIDS) == defaults["gpu_validation_fatal_xids"]
    assert list(check.WARN_XIDS) == defaults["gpu_validation_warn_xids"]


# The health program itself (roles/slurm_compute/templates/gpuplat-node-health.j2) around the GPU checks:
# rendered as Ansible does, with a stand-in node check. slurmd kills the program after 60 s, whatever
# HealthCheckInterval is (SchedMD/slurm src/slurmd/slurmd/slurmd.c, _run_health_check, max_wait), and
# a killed program drains nothing.


def gpu_health_script(tmp_path: Path, node_check: str, **overrides: object) -> Path:
    stand_in = tmp_path / "node_check.py"
    stand_in.write_text(node_check)
    variables = compute_role_vars()
    variables.update(
        ansible_managed="Ansible managed",
        inventory_hostname="train-0",
        gpuplat_gpu_count=1,
        gpuplat_gpu_model="H100",
        gpuplat_gpu_simulated=True,  # no nvidia-smi -L count: the stand-in alone decides
        shared_fs_mount_path="",
        gpuplat_checkpoint_path="",
        slurm_compute_node_check_program=str(stand_in),
        **overrides,
    )
    return rendered_script(tmp_path, "gpuplat-node-health", variables)


def run_with_nvidia_smi(script: Path, tmp_path: Path) -> list[str]:
    """The drain calls of the program where `command -v nvidia-smi` finds one; scontrol and nvidia-smi
    are exported functions (they win over the program's own PATH)."""
    calls = tmp_path / "scontrol.log"
    environment = {
        "HOME": str(tmp_path),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "BASH_FUNC_scontrol%%": f'() {{ printf "%s\\n" "$*" >> {calls}; }}',
        "BASH_FUNC_nvidia-smi%%": "() { :; }",
    }
    subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=environment, timeout=60, check=False
    )
    return [call for call in calls.read_text().splitlines() if "State=DRAIN" in call]


def test_the_health_program_drains_on_the_gpu_checks_reasons(tmp_path: Path) -> None:
    script = gpu_health_script(tmp_path, "print('xid: fatal XID since boot: XID 79 on PCI:0000:2a:00')\n")
    drains = run_with_nvidia_smi(script, tmp_path)
    assert len(drains) == 1
    assert "xid: fatal XID since boot: XID 79 on PCI:0000:2a:00" in drains[0]


def test_gpu_checks_that_hang_drain_the_node_before_slurmd_would_kill_the_program(tmp_path: Path) -> None:
    """A GPU in a bad state hangs nvidia-smi: the checks are cut at their timeout and the node drained."""
    script = gpu_health_script(
        tmp_path, "import time\ntime.sleep(600)\n", slurm_compute_health_check_gpu_timeout=2
    )
    started = time.monotonic()
    drains = run_with_nvidia_smi(script, tmp_path)
    assert time.monotonic() - started < 20
    assert len(drains) == 1
    assert "GPU checks did not answer within 2s" in drains[0]


def budget_holds(**overrides: object) -> bool:
    """The role's assertion that the health program ends before slurmd's 60 s, on the role's defaults."""
    tasks = yaml.safe_load((ROOT / "roles" / "slurm_compute" / "tasks" / "health.yml").read_text())
    (budget,) = [t for t in tasks if "slurmd kills it" in t["name"]]
    variables = {**compute_role_vars(), "shared_fs_mount_path": "/fsx", "gpuplat_checkpoint_path": "/fsx/ck"}
    variables.update(overrides)
    templar = Templar(loader=DataLoader(), variables=variables)
    return all(
        templar.evaluate_conditional(trust_as_template(condition))
        for condition in budget["ansible.builtin.assert"]["that"]
    )


def test_the_health_programs_defaults_end_well_before_slurmd_kills_it() -> None:
    assert budget_holds()
    assert not budget_holds(slurm_compute_health_check_gpu_timeout=60)
    assert not budget_holds(slurm_compute_health_check_fs_timeout=30)


def test_a_repeating_xid_gives_the_same_drain_reason_run_after_run() -> None:
    """An XID storm (74 repeats on every NVLink retry) names each XID once per GPU: the reason the health
    program compares with the node's (and rewrites when they differ) does not grow with the log."""
    sys.path.insert(0, str(PROGRAM.parent))
    try:
        import gpuplat_node_check as check
    finally:
        sys.path.pop(0)
    line = "[{t}.0] NVRM: Xid (PCI:0000:2a:00): 74, pid={pid}, name=python, NVLink: fatal error\n"
    log = "".join(line.format(t=100 + n, pid=4000 + n) for n in range(3))
    later = log + line.format(t=900, pid=9000)
    first = check.xid_check(log, set(check.FATAL_XIDS))
    assert first.status == "fail"
    assert first.detail.count("XID 74") == 1
    assert check.xid_check(later, set(check.FATAL_XIDS)).detail == first.detail


def test_a_dcgm_warning_is_reported_without_draining() -> None:
    sys.path.insert(0, str(PROGRAM.parent))
    try:
        import gpuplat_node_check as check
    finally:
        sys.path.pop(0)
    output = (RECORDED / "healthy" / "dcgm-health.txt").read_text().replace("Healthy", "Warning")
    result = check.dcgm_health_check_from(0, output)
    assert result.status == "warn"
    report = check.Report()
    report.add(result)
    assert report.drain_reasons == []


def test_a_host_engine_without_watches_gets_them_set_and_no_drain(tmp_path: Path) -> None:
    """A restarted nv-hostengine has no health watches: the program sets them (`dcgmi health -s a`) and
    checks from the next run on."""
    tools = tmp_path / "tools"
    tools.mkdir()
    calls = tmp_path / "dcgmi.calls"
    dcgmi = tools / "dcgmi"
    dcgmi.write_text(
        f'#!/bin/sh\necho "$*" >>{calls}\n'
        '[ "$*" = "health -c" ] && { echo "Health watches not enabled"; exit 1; }\n'
        "exit 0\n"
    )
    dcgmi.chmod(0o755)
    assert periodic(tmp_path, "healthy", "active") == []
    assert calls.read_text().splitlines() == ["health -c", "health -s a"]


def test_gdrcopy_check_fails_without_the_module_or_its_device(tmp_path: Path) -> None:
    sys.path.insert(0, str(PROGRAM.parent))
    try:
        import gpuplat_node_check as check
    finally:
        sys.path.pop(0)
    module, device = tmp_path / "sys-module-gdrdrv", tmp_path / "dev-gdrdrv"
    assert check.gdrcopy_check(module, device).status == "fail"
    module.mkdir()
    missing_device = check.gdrcopy_check(module, device)
    assert missing_device.status == "fail" and "is missing" in missing_device.detail
    device.touch()
    assert check.gdrcopy_check(module, device).status == "pass"


def test_the_gdrcopy_check_runs_on_rdma_gpu_nodes_only(tmp_path: Path) -> None:
    """--gdrcopy from the inventory's gpuplat_gdrcopy, in the health program and in validate's call."""
    echo_args = "import sys\nprint('args: ' + ' '.join(sys.argv[1:]))\n"
    for gdrcopy in (True, False):
        run_dir = tmp_path / str(gdrcopy)
        run_dir.mkdir()
        script = gpu_health_script(run_dir, echo_args, gpuplat_gdrcopy=gdrcopy)
        [drain] = run_with_nvidia_smi(script, run_dir)
        assert ("--gdrcopy" in drain) is gdrcopy
    validate_vars = (ROOT / "roles" / "gpu_validation" / "vars" / "main.yml").read_text()
    assert "(['--gdrcopy'] if gpuplat_gdrcopy | default(false) | bool else [])" in validate_vars
    listed = subprocess.run(
        [sys.executable, str(PROGRAM), "--gdrcopy", "--gpu-absent-reason", "simulated GPUs",
         "--health-program", ""],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert {"name": "gdrcopy", "status": "skip", "detail": "simulated GPUs"} in yaml.safe_load(listed.stdout)[
        "checks"
    ]


def test_a_node_without_gdrdrv_drains_in_the_periodic_check(tmp_path: Path) -> None:
    """The periodic run with --gdrcopy looks at this machine's /sys/module/gdrdrv, which a test machine does
    not have; the names are GDRCopy's (packages/dkms/debian/gdrdrv.init: DRIVER=gdrdrv, mknod /dev/gdrdrv)."""
    assert not Path("/sys/module/gdrdrv").exists(), "a machine with gdrdrv loaded cannot run this test"
    [reason] = periodic(tmp_path, "healthy", "active", "--nvswitch", "--gdrcopy")
    assert reason.startswith("gdrcopy: gdrdrv is not loaded (/sys/module/gdrdrv missing)")
    sys.path.insert(0, str(PROGRAM.parent))
    try:
        import gpuplat_node_check as check
    finally:
        sys.path.pop(0)
    defaults = {name: p.default for name, p in inspect.signature(check.gdrcopy_check).parameters.items()}
    assert defaults == {"module": Path("/sys/module/gdrdrv"), "device": Path("/dev/gdrdrv")}


def test_a_device_node_left_after_gdrdrv_was_unloaded_still_fails(tmp_path: Path) -> None:
    """mknod's /dev/gdrdrv outlives the module (`modprobe -r gdrdrv` by hand removes no node): the module
    itself is what is checked."""
    sys.path.insert(0, str(PROGRAM.parent))
    try:
        import gpuplat_node_check as check
    finally:
        sys.path.pop(0)
    device = tmp_path / "dev-gdrdrv"
    device.touch()
    left = check.gdrcopy_check(tmp_path / "sys-module-gdrdrv", device)
    assert left.status == "fail" and "not loaded" in left.detail


def test_no_kernel_log_at_all_is_an_error_not_a_pass(tmp_path: Path) -> None:
    """Neither the journal nor dmesg answers (dmesg_restrict for a non-root caller, no journald): the xid
    check cannot tell, so it is an error (said on stderr), never a silent pass."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("dmesg", "journalctl"):
        (tools / name).write_text(
            f"#!/bin/sh\necho '{name}: read kernel buffer failed: Operation not permitted' >&2\nexit 1\n"
        )
        (tools / name).chmod(0o755)
    done = subprocess.run(
        [sys.executable, str(PROGRAM), "--health-program", "", "--dcgm-level", "1"],
        capture_output=True,
        text=True,
        check=False,
        env={
            **os.environ,
            "PATH": f"{tools}:{RECORDED / 'bin'}:/usr/bin:/bin",
            "GPUPLAT_RECORDED": str(RECORDED / "healthy"),
        },
    )
    [xid] = [c for c in yaml.safe_load(done.stdout)["checks"] if c["name"] == "xid"]
    assert xid["status"] == "error" and "Operation not permitted" in xid["detail"]


def test_a_journal_too_long_to_read_in_time_counts_what_was_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal of weeks of a chatty kernel that journalctl cannot finish reading: the periodic run must
    not spend the GPU checks' 40 s on it (past which the health program drains the node as hung), and the
    XID it read before being stopped still counts. The stand-in prints an XID 79 line and then hangs; the
    program's kernel log read runs in this process with its journal timeout at half a second (the 8 s it
    waited, as a process, were most of this file's wall time), and the timeouts themselves are held to
    the GPU checks' budget."""
    sys.path.insert(0, str(PROGRAM.parent))
    try:
        import gpuplat_node_check as check
    finally:
        sys.path.pop(0)
    budget = yaml.safe_load((ROOT / "roles" / "slurm_compute" / "defaults" / "main.yml").read_text())[
        "slurm_compute_health_check_gpu_timeout"
    ]
    reads_s = check.JOURNAL_TIMEOUT + check.RING_TIMEOUT
    assert reads_s < budget / 2, f"the kernel log reads may take {reads_s} s of the GPU checks' {budget}"
    tools = tmp_path / "tools"
    tools.mkdir()
    line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2211, name=python3, GPU has fallen off the bus."
    (tools / "journalctl").write_text(f"#!/bin/sh\necho '{line}'\nexec sleep 120\n")
    (tools / "journalctl").chmod(0o755)
    (tools / "dmesg").write_text("#!/bin/sh\nexit 0\n")
    (tools / "dmesg").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    monkeypatch.setattr(check, "JOURNAL_TIMEOUT", 0.5)
    started = time.monotonic()
    code, lines = check.kernel_log()
    elapsed = time.monotonic() - started
    verdict = check.xid_check(lines, set(check.FATAL_XIDS))
    assert (code, verdict.status, verdict.detail) == (
        0,
        "fail",
        "fatal XID since boot: XID 79 on PCI:0000:3b:00 "
        "(pid=2211, name=python3, GPU has fallen off the bus.)",
    )
    assert elapsed < 5, f"the journal's read took {elapsed:.1f} s of its 0.5"
