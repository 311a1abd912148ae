"""The distributed training example (examples/train_dist/train.py and train.sbatch): which checkpoint it
resumes from (only complete ones of the same run; an unreadable one is set aside for the one before),
what it refuses before the first step (another run's checkpoints, a directory it cannot write), how it
prunes, and a real two-process run under torchrun that is stopped by SIGTERM, saves the step it is at
within torchrun's shutdown timeout, and resumes to the same bit-exact model as a run that was never
interrupted. The batch script's decisions (torchrun's flags, the directory, requeue or not) run with
srun, scontrol and torchrun replaced by stubs."""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from infra.scheduling.slurm import SPOT_GRACE_TIME_S
from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "train_dist" / "train.py"
SBATCH = SCRIPT.with_name("train.sbatch")
TORCHRUN = Path(sys.executable).parent / "torchrun"
EXIT_FILE = "GPUPLAT_TRAIN_EXIT_FILE"
needs_torchrun = pytest.mark.skipif(
    not TORCHRUN.exists(), reason="torchrun is not installed (pip install -e '.[dev]')"
)
# train.py run for real, each process importing torch: the processes tier (make test-processes).
processes = pytest.mark.processes


def _module() -> ModuleType:
    return load_script(SCRIPT)


def _fake_checkpoint(root: Path, step: int, *, metadata: bool, marker: str | None) -> Path:
    path = root / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"shard")
    if metadata:
        (path / ".metadata").write_bytes(b"plan")
    if marker is not None:
        (path / "COMPLETE").write_text(marker)
    return path


def test_only_complete_checkpoints_are_resumed_from(tmp_path: Path) -> None:
    train = _module()
    _fake_checkpoint(tmp_path, 20, metadata=True, marker="step=20\n")
    _fake_checkpoint(tmp_path, 40, metadata=True, marker="step=40\nseed=7\n")
    _fake_checkpoint(tmp_path, 60, metadata=False, marker=None)  # shards written, DCP never finished
    _fake_checkpoint(tmp_path, 80, metadata=True, marker=None)  # finished, never marked
    _fake_checkpoint(tmp_path, 100, metadata=True, marker="step=60\n")  # a marker copied from elsewhere
    (tmp_path / "step-00000120").write_text("not a directory")
    (tmp_path / "step-00000140.unreadable-0a1b2c3d").mkdir()  # set aside: it did not read back
    assert train.newest_complete(tmp_path) == 40
    assert train.newest_complete(tmp_path / "missing") is None


def test_pruning_runs_in_the_background_and_keeps_the_newest_complete_and_saves_in_flight(
    tmp_path: Path,
) -> None:
    train = _module()
    for step in (10, 20, 30):
        _fake_checkpoint(tmp_path, step, metadata=True, marker=f"step={step}\n")
    _fake_checkpoint(tmp_path, 15, metadata=False, marker=None)
    _fake_checkpoint(tmp_path, 40, metadata=False, marker=None)  # newer than the newest complete
    in_flight = train.saving_dir(tmp_path, 40, "0000beef")
    in_flight.mkdir()
    train.saving_dir(tmp_path, 40, "0000dead").mkdir()  # a save of a run that was killed
    (tmp_path / ".removing-step-00000005").mkdir()  # a removal a killed run did not finish
    pruner = train.Pruner(tmp_path, "0000beef")
    try:
        pruner.prune(keep=2)
        # Out of the step-NNNNNNNN names at once (a kill now leaves no half-removed checkpoint there);
        # removed by the pruner's thread.
        assert not (tmp_path / "step-00000010").exists()
        assert pruner.thread.is_alive() and pruner.thread.daemon
    finally:
        pruner.close(wait=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        in_flight.name, "step-00000020", "step-00000030", "step-00000040",
    ]  # fmt: skip


def test_checkpoints_set_aside_as_unreadable_are_pruned_but_the_newest(tmp_path: Path) -> None:
    """Each is a whole checkpoint: a run whose saves keep failing to read back would fill the disk."""
    train = _module()
    _fake_checkpoint(tmp_path, 50, metadata=True, marker="step=50\n")
    # Step 40 set aside twice, by run cccc and later by run bbbb: the later one is the newest.
    for name in ("step-00000030.unreadable-aaaa", "step-00000040.unreadable-cccc",
                 "step-00000040.unreadable-bbbb", "step-00000020.unreadable-dddd"):  # fmt: skip
        (tmp_path / name).mkdir()
        time.sleep(0.02)  # a later ctime (the kernel's file clock ticks every few milliseconds)
    # Not a checkpoint's name, not a directory: left alone.
    (tmp_path / "notes.unreadable-eeee").mkdir()
    (tmp_path / "step-xyz.unreadable-ffff").mkdir()
    (tmp_path / "step-00000060.unreadable-gggg").write_text("a file")
    stale = {path.name for path in train.stale(tmp_path, keep=2, run="0000beef")}
    assert stale == {
        "step-00000020.unreadable-dddd", "step-00000030.unreadable-aaaa", "step-00000040.unreadable-cccc",
    }  # fmt: skip


@pytest.mark.parametrize(("short_by", "refused"), [(1, True), (0, False)])
def test_the_space_asked_is_the_kept_checkpoints_with_their_factor_and_margin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short_by: int, refused: bool
) -> None:
    """Free space is compared with (checkpoints still to be written) x size x SPACE_FACTOR + SPACE_MARGIN:
    one byte short of it refuses, exactly it passes."""
    train = _module()
    _fake_checkpoint(tmp_path, 10, metadata=True, marker="step=10\n")  # one of the three kept is there
    size = 100 * train.MIB
    needed = int(size * 3 * 1.1) + 64 * train.MIB  # --keep 3: two more and one in flight, 10 % + 64 MiB
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(train.shutil, "disk_usage", lambda _: usage._replace(free=needed - short_by))
    problem = train.storage_problem(tmp_path, size, keep=3)
    assert (problem is not None) == refused, problem
    if refused:
        assert "the 3 checkpoint(s) still to be written" in str(problem), problem


def test_keep_must_leave_a_checkpoint_to_resume_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train = _module()
    with pytest.raises(SystemExit) as stopped:
        train.parse_args(["--dir", str(tmp_path), "--keep", "0"])
    assert stopped.value.code == 2
    assert "--keep" in capsys.readouterr().err


def test_every_rank_reads_its_share_of_a_fixed_global_batch() -> None:
    train = _module()
    shares = [train.batch_indices(7, 5, 64, rank, 4) for rank in range(4)]
    whole = sorted(int(i) for share in shares for i in share)
    assert len(whole) == len(set(whole)) == 64
    assert whole == sorted(int(i) for i in train.batch_indices(7, 5, 64, 0, 1))
    assert not train.batch_indices(7, 6, 64, 0, 1).equal(train.batch_indices(7, 5, 64, 0, 1))


# --- one process, no torchrun: what every rank decides, in seconds ------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _single_process(
    directory: Path, *extra: str, wrap: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """train.py as a world of one, started the way torchrun starts a worker (the env:// variables)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    command = [*wrap, sys.executable, str(SCRIPT), "--dir", str(directory)]
    command += ["--steps", "30", "--every", "10", "--log-every", "10", *extra]
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          timeout=180, check=False)  # fmt: skip


def _files(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under `directory`: (inode, modification time), to see any rewrite."""
    return {
        str(p.relative_to(directory)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.rglob("*")
    }


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A run of one process to step 30 (checkpoints every 10, the newest 2 kept): its directory, whose
    step-10 checkpoint the background pruner removed, and its final model's digest."""
    directory = tmp_path_factory.mktemp("finished") / "run"
    done = _single_process(directory)
    assert done.returncode == 0, done.stdout[-3000:]
    digest = re.search(r"^done step=30 .*digest=(\w+)", done.stdout, re.MULTILINE)
    assert digest, done.stdout[-3000:]
    assert sorted(p.name for p in directory.iterdir()) == ["step-00000020", "step-00000030"]
    return directory, digest.group(1)


@processes
def test_checkpoints_of_a_run_with_other_arguments_are_refused(finished_run: tuple[Path, str]) -> None:
    train = _module()
    directory, _ = finished_run
    before = _files(directory)
    done = _single_process(directory, "--seed", "8", "--hidden", "32")
    assert done.returncode == train.EXIT_OTHER_RUN, done.stdout[-3000:]
    assert "seed 7 (this run: 8)" in done.stdout and "hidden 64 (this run: 32)" in done.stdout
    assert "Traceback" not in done.stdout and not re.search(r"^step \d+ loss", done.stdout, re.MULTILINE)
    assert _files(directory) == before


@processes
@pytest.mark.parametrize("steps", ["30", "10"])
def test_a_finished_run_reports_and_never_rewrites_its_checkpoints(
    finished_run: tuple[Path, str], steps: str
) -> None:
    """Started again at its last step (a requeue after the final save), or with fewer --steps than its
    checkpoint has: it reports the model it has and rewrites nothing in the complete directory."""
    directory, digest = finished_run
    before = _files(directory)
    done = _single_process(directory, "--steps", steps)
    assert done.returncode == 0, done.stdout[-3000:]
    assert re.search(
        rf"^done step=30 resumed_from=30 digest={digest} steps_run=0 ", done.stdout, re.MULTILINE
    )
    assert "=-" not in done.stdout, done.stdout[-3000:]
    assert _files(directory) == before


@processes
def test_an_unreadable_checkpoint_is_set_aside_for_the_one_before(
    finished_run: tuple[Path, str], tmp_path: Path
) -> None:
    directory = tmp_path / "run"
    shutil.copytree(finished_run[0], directory)
    shard = sorted((directory / "step-00000030").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a write the storage lost half of
    done = _single_process(directory)
    assert done.returncode == 0, done.stdout[-3000:]
    assert re.search(r"^checkpoint step 30 does not read back .* moved to \S+/step-00000030\.unreadable-\w+; "
                     r"trying the one before", done.stdout, re.MULTILINE), done.stdout[-3000:]  # fmt: skip
    assert re.search(r"^start host=\S+ world=1 resumed_from=20 ", done.stdout, re.MULTILINE)
    assert f"digest={finished_run[1]}" in done.stdout
    assert _module().newest_complete(directory) == 30  # saved again, whole
    assert len(list(directory.glob("step-00000030.unreadable-*"))) == 1


@processes
@pytest.mark.parametrize(
    ("mount_options", "reason"),
    [("ro", "cannot write to .*: Read-only file system"), ("size=1m", r"has 1 MiB free; .* need about")],
    ids=["read-only", "full"],
)
def test_a_checkpoint_directory_that_cannot_take_the_checkpoints_stops_the_run_before_its_first_step(
    tmp_path: Path, mount_options: str, reason: str
) -> None:
    """A tmpfs over the directory in a mount namespace of the run's own (read-only, or too small for the
    kept checkpoints), so that root too finds it so, as a job's user would: the run stops before its
    first step with the code train.sbatch does not requeue and one paragraph, no traceback."""
    train = _module()
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    mount = f'mount -t tmpfs -o {mount_options} gpuplat-test {shlex.quote(str(directory))} && exec "$@"'
    done = _single_process(
        directory, wrap=["unshare", "--mount", "--propagation", "private", "bash", "-c", mount, "bash"]
    )
    assert done.returncode == train.EXIT_STORAGE, done.stdout[-3000:]
    assert re.search(reason, done.stdout), done.stdout[-3000:]
    assert "Traceback" not in done.stdout and not re.search(r"^step \d+ loss", done.stdout, re.MULTILINE)


# --- train.sbatch, with stubs for srun, scontrol and torchrun -------------------------------------------


def _stub(path: Path, text: str) -> None:
    path.write_text("#!/bin/bash\n" + text)
    path.chmod(0o755)


def _sbatch(
    tmp_path: Path,
    *,
    job_id: int = 12345,
    restarts: int = 0,
    left: int | None = None,
    torchrun_rc: int = 1,
    script: Path = SBATCH,
    extra_env: dict[str, str] | None = None,
) -> tuple[int, str, list[str], list[str]]:
    """Run train.sbatch as Slurm would on a job's first node. torchrun's stub exits `torchrun_rc` (torchrun
    exits 1 whatever its workers' codes) after leaving `left` in the exit file as train.py's workers do.
    Returns the script's exit code and output, torchrun's arguments and scontrol's calls."""
    bin_dir, env_bin = tmp_path / "bin", tmp_path / "torch-env" / "bin"
    bin_dir.mkdir(exist_ok=True)
    env_bin.mkdir(parents=True, exist_ok=True)
    calls = tmp_path / "scontrol.log"
    calls.write_text("")
    (tmp_path / "torchrun.args").unlink(missing_ok=True)
    _stub(bin_dir / "srun", 'while [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n')
    _stub(
        bin_dir / "scontrol",
        f'echo "$*" >> {calls}\n[ "$1 $2" = "show hostnames" ] && echo train-0\nexit 0\n',
    )
    leave = f'echo {left} > "${EXIT_FILE}"\n' if left is not None else ""
    _stub(
        env_bin / "torchrun", f'printf "%s\\n" "$@" > {tmp_path}/torchrun.args\n{leave}exit {torchrun_rc}\n'
    )
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
        "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NAME": "train-dist", "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": "train-0", "SLURM_RESTART_COUNT": str(restarts),
        "GPUPLAT_CHECKPOINT_PATH": str(tmp_path / "checkpoints"), "GPUPLAT_TRAINING_ENV": str(env_bin.parent),
        "TRAIN_SCRIPT": str(SCRIPT), "PROCS_PER_NODE": "2", **(extra_env or {}),
    }  # fmt: skip
    done = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    ran = tmp_path / "torchrun.args"
    arguments = ran.read_text().splitlines() if ran.exists() else []
    return done.returncode, done.stdout + done.stderr, arguments, calls.read_text().splitlines()


def test_the_batch_script_gives_torchrun_the_grace_a_port_of_the_jobs_own_and_a_private_directory(
    tmp_path: Path,
) -> None:
    """torchrun SIGKILLs the workers --shutdown-timeout seconds after SIGTERM (30 s unless told): the script
    derives it from the grace of its own --signal line, which the spot QoS's grace covers too."""
    port = _rendezvous_ports(1)
    code, output, arguments, _ = _sbatch(tmp_path, job_id=port - 20000 + 10000, torchrun_rc=0)
    assert code == 0, output
    signal_line = re.search(r"^#SBATCH --signal=TERM@(\d+)$", SBATCH.read_text(), re.MULTILINE)
    assert signal_line and int(signal_line.group(1)) <= SPOT_GRACE_TIME_S
    grace = int(signal_line.group(1))
    timeout = [int(a.split("=")[1]) for a in arguments if a.startswith("--shutdown-timeout=")]
    assert timeout and 30 < timeout[0] < grace, arguments
    assert "--max-restarts=2" in arguments
    assert f"--rdzv-endpoint=train-0:{port}" in arguments  # 20000 + job ID mod 10000, when free
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    directory = tmp_path / "checkpoints" / user / f"train-dist-{port - 20000 + 10000}"
    assert arguments[arguments.index("--dir") + 1] == str(directory)
    for private in (directory, directory.parent):
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
    other = _rendezvous_ports(1)
    _, _, other_job, _ = _sbatch(tmp_path, job_id=other, torchrun_rc=0)
    assert f"--rdzv-endpoint=train-0:{other}" in other_job


def _rendezvous_ports(count: int) -> int:
    """A port of 20000-29999 free on this machine with the `count` - 1 after it (tests run side by side)."""
    for _ in range(200):
        first = random.randint(20000, 29999 - count)
        try:
            for port in range(first, first + count):
                with socket.socket() as probe:
                    probe.bind(("0.0.0.0", port))
        except OSError:
            continue
        return first
    pytest.fail("no free run of ports in 20000-29999 on this machine")


def _listening(family: socket.AddressFamily, port: int, v6only: bool = False) -> socket.socket:
    listener = socket.socket(family)
    if family == socket.AF_INET6:
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
    listener.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    listener.listen()
    return listener


@pytest.mark.parametrize(
    ("family", "v6only"),
    [(socket.AF_INET, False), (socket.AF_INET6, True)],
    ids=["IPv4 listener", "IPv6-only listener"],
)
def test_the_rendezvous_port_skips_one_taken_on_the_first_node(
    tmp_path: Path, family: socket.AddressFamily, v6only: bool
) -> None:
    """Jobs whose IDs differ by 10,000 derive the same port: the second finds it taken (by a listener of
    either family: torch's store listens dual-stack) and takes the next."""
    port = _rendezvous_ports(2)
    with _listening(family, port, v6only):
        code, output, arguments, _ = _sbatch(tmp_path, job_id=port - 20000 + 10000, torchrun_rc=0)
    assert code == 0, output
    assert f"--rdzv-endpoint=train-0:{port + 1}" in arguments, arguments


def test_the_rendezvous_port_wraps_around_within_its_range(tmp_path: Path) -> None:
    try:
        taken = _listening(socket.AF_INET, 29999)
    except OSError:
        pytest.fail("port 29999 is in use on this machine: the test needs to take it")
    with taken:
        code, output, arguments, _ = _sbatch(tmp_path, job_id=9999, torchrun_rc=0)
    assert code == 0, output
    assert "--rdzv-endpoint=train-0:20000" in arguments or "--rdzv-endpoint=train-0:20001" in arguments


def _hold_lock(path: Path, holder: str, seconds: float) -> subprocess.Popen[str]:
    """Another run's batch script: the directory's lock held (flock), its job ID written in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{holder}\n")
    process = subprocess.Popen(
        ["flock", "-n", str(path), "bash", "-c", f"echo held; sleep {seconds}"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None and process.stdout.readline() == "held\n"
    return process


def test_a_second_job_in_a_running_jobs_directory_is_refused_and_not_requeued(tmp_path: Path) -> None:
    """CKPT_DIR given to two jobs at once: the second would resume from and prune the first one's saves."""
    shared = tmp_path / "sweep"
    holder = _hold_lock(shared / ".run.lock", "777", 30)
    try:
        code, output, arguments, calls = _sbatch(tmp_path, extra_env={"CKPT_DIR": str(shared)})
    finally:
        holder.kill()
        holder.wait()
    assert code == _module().EXIT_OTHER_RUN and "in use by job 777" in output, output
    assert not arguments and not any(call.startswith("requeue") for call in calls)


def test_a_run_names_itself_in_the_lock_it_takes(tmp_path: Path) -> None:
    shared = tmp_path / "run"
    shared.mkdir(mode=0o700)
    (shared / ".run.lock").write_text("777\n")  # left by a run of job 777 that has ended (not locked)
    code, output, arguments, _ = _sbatch(tmp_path, torchrun_rc=0, extra_env={"CKPT_DIR": str(shared)})
    assert code == 0 and arguments, output
    assert (shared / ".run.lock").read_text() == "12345\n"


def test_a_lock_not_yet_named_is_waited_for_then_judged_by_its_name(tmp_path: Path) -> None:
    """Its holder between taking the lock and writing its ID: no verdict from an empty file."""
    shared = tmp_path / "run"
    holder = _hold_lock(shared / ".run.lock", "", 30)
    try:
        code, output, arguments, calls = _sbatch(
            tmp_path, extra_env={"CKPT_DIR": str(shared), "LOCK_WAIT_S": "1"}
        )
    finally:
        holder.kill()
        holder.wait()
    assert code == _module().EXIT_OTHER_RUN and "in use by job (unknown)" in output, output
    assert not arguments and not any(call.startswith("requeue") for call in calls)


def test_a_filesystem_without_locks_is_a_storage_error_not_another_job(tmp_path: Path) -> None:
    """flock(1) fails otherwise than "held" (Lustre mounted noflock: ENOSYS): exit 73, said so."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(bin_dir / "flock", 'echo "flock: 9: Function not implemented" >&2\nexit 71\n')
    code, output, arguments, calls = _sbatch(tmp_path)
    assert code == _module().EXIT_STORAGE and "must give file locks" in output, output
    assert not arguments and not any(call.startswith("requeue") for call in calls)


def test_a_checkpoint_directory_the_lock_cannot_be_written_in_is_a_storage_error(tmp_path: Path) -> None:
    shared = tmp_path / "run"
    (shared / ".run.lock").mkdir(parents=True)  # what a lock file cannot be opened as
    shared.chmod(0o700)
    code, output, arguments, _ = _sbatch(tmp_path, extra_env={"CKPT_DIR": str(shared)})
    assert code == _module().EXIT_STORAGE and "cannot write" in output and not arguments, output


def test_a_requeued_job_waits_for_its_own_run_before_to_let_go(tmp_path: Path) -> None:
    """The run before of the same job (its ID in the lock) still ending: wait for it, then run; one that
    never lets go is requeued as a failed run (within MAX_RESTARTS)."""
    shared = tmp_path / "run"
    holder = _hold_lock(shared / ".run.lock", "12345", 2)
    env = {"CKPT_DIR": str(shared), "LOCK_WAIT_S": "20"}
    code, output, arguments, _ = _sbatch(tmp_path, torchrun_rc=0, extra_env=env)
    holder.wait()
    assert code == 0 and arguments, output
    assert (shared / ".run.lock").read_text() == "12345\n"
    stuck = _hold_lock(shared / ".run.lock", "12345", 30)
    try:
        code, output, arguments, calls = _sbatch(tmp_path, extra_env={**env, "LOCK_WAIT_S": "1"})
    finally:
        stuck.kill()
        stuck.wait()
    assert code == 1 and "still holds" in output and not arguments, output
    assert "requeue 12345" in calls


def test_the_batch_script_refuses_a_checkpoint_directory_someone_else_made(tmp_path: Path) -> None:
    """The checkpoint root is world-writable (shared_fs_checkpoint_mode 1777): a directory made in advance
    under the job's name by another user would let that user read and remove its checkpoints."""
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    squatted = tmp_path / "checkpoints" / user / "train-dist-12345"
    squatted.mkdir(parents=True)
    os.chown(squatted, 65534, 65534)
    code, output, arguments, calls = _sbatch(tmp_path)
    assert code == _module().EXIT_STORAGE and "give the job a directory of its own" in output, output
    assert not arguments and not any(call.startswith("requeue") for call in calls)


def test_the_batch_script_refuses_a_users_directory_someone_else_made(tmp_path: Path) -> None:
    """The user's directory above the job's, in the world-writable root: made in advance by another user,
    it would let that user move the job's directory away (and its checkpoints with it)."""
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    squatted = tmp_path / "checkpoints" / user
    squatted.mkdir(parents=True)
    squatted.chmod(0o777)
    os.chown(squatted, 65534, 65534)
    code, output, arguments, calls = _sbatch(tmp_path)
    assert code == _module().EXIT_STORAGE and f"{squatted} belongs to" in output, output
    assert not arguments and not any(call.startswith("requeue") for call in calls)


def test_the_batch_script_refuses_a_signal_meant_for_itself_alone(tmp_path: Path) -> None:
    """`--signal=B:TERM@N` signals the batch shell only: it would end at once, the steps never save."""
    script = tmp_path / "train.sbatch"
    script.write_text(SBATCH.read_text().replace("#SBATCH --signal=TERM@", "#SBATCH --signal=B:TERM@"))
    code, output, arguments, _ = _sbatch(tmp_path, script=script)
    assert code == 64 and 'drop "B:"' in output and not arguments, output


@pytest.mark.parametrize(
    ("left", "restarts", "code", "requeued"),
    [
        ("EXIT_STOPPED", 9, 1, True),  # saved on SIGTERM: go on in a new allocation, however often
        ("EXIT_OTHER_RUN", 0, None, False),  # the directory holds another run's checkpoints
        ("EXIT_STORAGE", 0, None, False),  # not writable, or too small
        (None, 0, 1, True),  # any other failure: requeued ...
        (None, 5, 1, False),  # ... at most MAX_RESTARTS (5) times
    ],
)
def test_the_batch_script_requeues_what_a_new_allocation_can_fix(
    tmp_path: Path, left: str | None, restarts: int, code: int | None, requeued: bool
) -> None:
    train = _module()
    value = getattr(train, left) if left else None
    status, output, _, calls = _sbatch(tmp_path, restarts=restarts, left=value)
    assert status == (code if code is not None else value), output
    assert ("requeue 12345" in calls) == requeued, (calls, output)


# --- two processes under torchrun -------------------------------------------------------------------------


def _torchrun(
    directory: Path, *extra: str, shutdown_timeout: int | None = None, exit_file: Path | None = None
) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if exit_file is not None:
        env[EXIT_FILE] = str(exit_file)
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2"]
    if shutdown_timeout is not None:
        command += [f"--shutdown-timeout={shutdown_timeout}"]
    command += [str(SCRIPT), "--dir", str(directory), "--steps", "120", "--every", "40", "--log-every", "1"]
    command += extra
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    output, _ = process.communicate(timeout=180)
    return process.returncode, output


def _sigterm_at(process: subprocess.Popen[str], step_pattern: str) -> str:
    """SIGTERM to torchrun once a logged step matches; the log read so far."""
    deadline = time.monotonic() + 120
    log = ""
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        log += line
        if not line or re.match(rf"^step ({step_pattern}) ", line):
            break
    process.send_signal(signal.SIGTERM)
    return log


@processes
@needs_torchrun
@pytest.mark.long
def test_a_save_longer_than_torchruns_shutdown_timeout_is_killed(tmp_path: Path) -> None:
    """What train.sbatch's --shutdown-timeout prevents: torchrun forwards SIGTERM, waits its shutdown
    timeout, then SIGKILLs the workers (torch/distributed/elastic/multiprocessing/api.py _close); a 5 s save
    under a 3 s timeout never completes and leaves train.sbatch no exit code (so no requeue as stopped)."""
    exit_file = tmp_path / "exit"
    process = _torchrun(
        tmp_path / "job",
        "--save-seconds",
        "5",
        "--step-seconds",
        "0.15",
        shutdown_timeout=3,
        exit_file=exit_file,
    )
    log = _sigterm_at(process, r"[3-9]|\d\d")
    code, output = _finish(process)
    output = log + output
    assert code != 0 and re.search(r"Unable to shutdown process \d+ via \S+, forcefully exiting", output), (
        output
    )
    assert "SIGTERM: checkpoint at step" not in output
    assert _module().newest_complete(tmp_path / "job") is None and not exit_file.exists()


@processes
@needs_torchrun
@pytest.mark.long
def test_a_sigterm_saves_the_step_and_the_resumed_run_ends_bit_identical(tmp_path: Path) -> None:
    """The save takes 5 s (--save-seconds: a slow filesystem) and torchrun's shutdown timeout, 20 s here,
    leaves it the time (train.sbatch: the grace less a margin): the step is saved, train.sbatch finds the
    code that requeues, and the resumed run ends bit-identical."""
    train = _module()
    reference = _torchrun(tmp_path / "reference")
    # Slow enough that the SIGTERM, sent once step 45+ is read, lands well before step 120 (loaded machines).
    exit_file = tmp_path / "exit"
    interrupted = _torchrun(
        tmp_path / "job",
        "--step-seconds",
        "0.15",
        "--save-seconds",
        "5",
        shutdown_timeout=20,
        exit_file=exit_file,
    )
    code, output = _finish(reference)
    assert code == 0, output[-3000:]
    expected = re.search(r"^done step=120 .* digest=(\w+)", output, re.MULTILINE)
    assert expected, output[-3000:]

    log = _sigterm_at(interrupted, r"4[5-9]|[5-9]\d")  # past the first periodic checkpoint (40)
    code, output = _finish(interrupted)
    output = log + output
    stopped = re.search(r"^SIGTERM: checkpoint at step (\d+)", output, re.MULTILINE)
    assert code != 0 and stopped, output[-3000:]
    step = int(stopped.group(1))
    assert step > 40 and train.newest_complete(tmp_path / "job") == step
    assert exit_file.read_text().strip() == str(train.EXIT_STOPPED)

    # A save cut off half-way after that one: never resumed from.
    partial = tmp_path / "job" / f"step-{step + 5:08d}"
    shutil.copytree(tmp_path / "job" / f"step-{step:08d}", partial)
    (partial / "COMPLETE").unlink()

    code, output = _finish(_torchrun(tmp_path / "job"))
    assert code == 0, output[-3000:]
    assert re.search(rf"^start host=\S+ world=2 resumed_from={step} ", output, re.MULTILINE), output[-3000:]
    assert f"digest={expected.group(1)}" in output, output[-3000:]


def test_a_checkpoint_is_complete_only_with_dcps_metadata_and_its_own_marker(tmp_path: Path) -> None:
    """DCP writes .metadata last, after every rank's shards: a marker without it (a save cut off, a marker
    copied in) does not make the checkpoint resumable; nor does a marker naming another step."""
    train = _module()
    for step in (20, 40, 60):
        _fake_checkpoint(tmp_path, step, metadata=True, marker=f"step={step}\n")
    _fake_checkpoint(tmp_path, 80, metadata=False, marker="step=80\n")
    assert train.newest_complete(tmp_path) == 60
    assert not train.is_complete(tmp_path / "step-00000080")
    assert train.is_complete(tmp_path / "step-00000060")
    (tmp_path / "step-00000060" / "COMPLETE").write_text("step=6\n")
    assert train.newest_complete(tmp_path) == 40
    assert train.step_dir(tmp_path, 7) == tmp_path / "step-00000007"


def test_only_step_directories_count_as_checkpoints(tmp_path: Path) -> None:
    train = _module()
    _fake_checkpoint(tmp_path, 10, metadata=True, marker="step=10\n")
    (tmp_path / "step-123").mkdir()  # not eight digits
    (tmp_path / "step-0000001x").mkdir()
    (tmp_path / "step-00000030").write_text("a file")
    assert [step for step, _ in train.checkpoints(tmp_path)] == [10]


def test_pruning_removes_incomplete_saves_older_than_the_newest_complete_one(tmp_path: Path) -> None:
    train = _module()
    for step in (10, 20, 30):
        _fake_checkpoint(tmp_path, step, metadata=True, marker=f"step={step}\n")
    _fake_checkpoint(tmp_path, 25, metadata=False, marker=None)  # between two complete ones: abandoned
    _fake_checkpoint(tmp_path, 40, metadata=False, marker=None)  # newer: a save in flight
    pruner = train.Pruner(tmp_path, "this-run")
    pruner.prune(keep=2)
    pruner.close(wait=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000020", "step-00000030", "step-00000040"]


IDENTITY = {"seed": "7", "batch": "64", "lr": "0.05", "hidden": "64", "depth": "1", "world": "2"}


def test_the_run_identity_holds_every_argument_that_shapes_the_result() -> None:
    """The data (seed), the optimisation (batch, lr), the model (hidden, depth) and the world size (the
    only one a resume is bit-identical at): a checkpoint written with another value of any is refused."""
    assert set(_module().RUN_IDENTITY) == set(IDENTITY)


@pytest.mark.parametrize("key", sorted(IDENTITY))
def test_a_checkpoint_written_with_another_value_of_any_identity_key_is_refused(
    tmp_path: Path, key: str
) -> None:
    train = _module()
    path = _fake_checkpoint(tmp_path, 20, metadata=True, marker=None)
    recorded = {**IDENTITY, key: IDENTITY[key] + "1"}
    (path / "COMPLETE").write_text("step=20\n" + "".join(f"{k}={v}\n" for k, v in recorded.items()))
    problem = train.identity_problem(tmp_path, 20, IDENTITY)
    assert problem is not None and f"{key} {recorded[key]} (this run: {IDENTITY[key]})" in problem
    (path / "COMPLETE").write_text("step=20\n" + "".join(f"{k}={v}\n" for k, v in IDENTITY.items()))
    assert train.identity_problem(tmp_path, 20, IDENTITY) is None
