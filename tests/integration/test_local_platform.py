"""The embedded default end to end: `gpuplat up --stack local` on podman, a second `up` that changes
nothing, a training job that survives losing its node, and `gpuplat down` leaving nothing behind.

Needs podman and the base image (`make host image`); traffic stays on the project's own containers.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from infra.backends.local.cluster import BASE_IMAGE, LocalCluster
from infra.backends.local.node_image import NODE_IMAGES, stack_images
from infra.nodes.inventory import container_name
from infra.nodes.podman import podman
from infra.platform.resolve import load_platform
from infra.spec.load import stack_file
from tests.docs_commands import Block, marked_blocks, named_block, submitted_jobs
from tests.docs_session import BlockRun, Session
from tests.slurm_states import JOB_ENDED

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GPUPLAT = str(Path(sys.executable).parent / "gpuplat")
STACK = "local"
TRAIN_DIST = ROOT / "examples" / "train_dist"
# Long enough for a SIGTERM past the first checkpoint and a node loss past the next one (the loss at
# most step 57), then a stretch of steps run on the resumed job.
DIST_STEPS, DIST_EVERY, DIST_STEP_SECONDS = 160, 20, 0.25
DIST_DIR = "/shared/checkpoints/train-dist"
DATASET_DIR = "/shared/datasets/demo-corpus/v1"
DATASET_CACHE = "/var/cache/gpuplat/datasets"


def gpuplat(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    env = {"NO_COLOR": "1", "PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"}
    return subprocess.run(
        [GPUPLAT, *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def on(node: str, *command: str, check: bool = True, timeout: float = 120) -> str:
    return podman("exec", container_name(STACK, node), *command, check=check, timeout=timeout).stdout


def wait_for(what: str, probe: object, timeout: float, interval: float = 2.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()  # type: ignore[operator]
        if value:
            return str(value)
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def first_up() -> subprocess.CompletedProcess[str]:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed: run `make host` (scripts/setup-host.sh) first")
    if podman("image", "exists", BASE_IMAGE, check=False).returncode != 0:
        pytest.skip(f"base image {BASE_IMAGE} missing: run scripts/build-base-image.sh (make image)")
    left = _stack_leftovers()
    if left:
        # What an earlier run left (its pool image above all) would make this `up` a partial one.
        print(f"\nan earlier run left {', '.join(left)}: gpuplat down first", flush=True)
        cleared = gpuplat("down", "--stack", STACK)
        assert cleared.returncode == 0, cleared.stderr[-3000:]
    return gpuplat("up", "--stack", STACK)


def _stack_leftovers() -> list[str]:
    """The stack's containers, network, volume and node images on this host."""
    containers = podman(
        "ps", "--all", "--filter", f"label=gpuplat.stack={STACK}", "--format", "{{.Names}}"
    ).stdout.split()
    cluster = LocalCluster(load_platform(stack_file(STACK)))
    others = [
        f"{kind} {name}"
        for kind, name in (("network", cluster.network), ("volume", cluster.volume))
        if podman(kind, "exists", name, check=False).returncode == 0
    ]
    return containers + others + stack_images(STACK)


def test_up_brings_the_platform_up(first_up: subprocess.CompletedProcess[str]) -> None:
    assert first_up.returncode == 0, first_up.stderr[-3000:]
    for phase in ("machines", "inventory", "configure", "node images", "join", "validate"):
        assert re.search(rf"✓ {phase} \(\d+\.\d s\)", first_up.stderr), phase
    assert "Slurm partitions" in first_up.stdout
    assert re.search(r"train\s.*gpu:h100:8", first_up.stdout), first_up.stdout


def test_a_pool_node_is_baked_into_an_image_and_the_others_only_join(
    first_up: subprocess.CompletedProcess[str],
) -> None:
    """The train pool's node image (infra/backends/local/node_image.py): train-0 configured in full and sealed
    into the image, train-1 started from it and run through the `join` steps only."""
    assert first_up.returncode == 0
    images = {
        node: podman("inspect", "--format", "{{.ImageName}}", container_name(STACK, node)).stdout.strip()
        for node in ("head-0", "train-0", "train-1")
    }
    assert images["head-0"] == images["train-0"] == BASE_IMAGE, images
    assert images["train-1"].startswith(f"{NODE_IMAGES}:{STACK}-train-"), images
    assert on("train-1", "cat", "/opt/gpuplat/sealed").startswith("gpuplat image sealed")
    join_log = (ROOT / ".gpuplat" / STACK / "logs" / "join.log").read_text()
    recap = join_log.rsplit("PLAY RECAP", 1)[1]
    assert "train-1" in recap and "train-0" not in recap and "head-0" not in recap, recap
    assert "TASK [munge : Install the key provisioned on this host]" in join_log
    joined = {container_name(STACK, n) for n in ("train-0", "train-1")}
    wait_for("Prometheus to scrape both training nodes", lambda: joined <= _scraped_nodes(), 60)
    assert on("train-1", "systemctl", "is-enabled", "munge", "slurmd").split() == ["enabled", "enabled"]


def test_second_up_changes_nothing(first_up: subprocess.CompletedProcess[str]) -> None:
    again = gpuplat("up", "--stack", STACK)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(0 change(s))" in again.stderr, again.stderr[-2000:]
    assert (
        "configure" in again.stderr
        and "skipped: inventory, playbooks, roles and machines unchanged" in again.stderr
    )
    # The skip proves nothing about the playbooks: run them again on every node of the converged cluster.
    rerun = gpuplat("up", "--stack", STACK, "--reconfigure")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "0 task(s) changed" in rerun.stderr, rerun.stderr[-3000:]
    assert "(0 change(s))" in rerun.stderr, rerun.stderr[-2000:]


def _reason(node: str) -> str:
    return on("head-0", "sinfo", "-h", "-N", "-n", node, "-o", "%E", check=False).strip()


def test_validate_drains_a_failing_node_and_takes_it_back(first_up: subprocess.CompletedProcess[str]) -> None:
    """A node that fails its health checks (a GPU device gone) fails `gpuplat validate` (exit 1), is drained
    (by the play, or already by slurmd's health program, which checks every 30 s here), and the pool
    runs its steps on the other node."""
    assert first_up.returncode == 0
    on("train-1", "rm", "-f", "/dev/nvidia7")
    try:
        failed = gpuplat("validate", "--stack", STACK, "--json")
        assert failed.returncode == 1, (failed.stdout[-2000:], failed.stderr[-2000:])
        report = json.loads(failed.stdout)
        assert report["verdict"] == "fail"
        nodes = {n["node"]: n for n in report["nodes"]}
        status, detail = nodes["train-1"]["checks"]["health-program"]
        assert status == "fail" and "/dev/nvidia7 missing" in detail, detail
        assert nodes["train-0"]["checks"]["health-program"][0] == "pass"
        drains = report["drains"]
        assert set(drains["drained"]) | set(drains["already_drained"]) == {"train-1"}, drains
        [pool] = report["pools"]
        assert pool["ready_nodes"] == ["train-0"] and set(pool["storage"]["node_gbps"]) == {"train-0"}
        assert _state("train-1").startswith("drain"), _state("train-1")
    finally:
        on("train-1", "mknod", "-m", "666", "/dev/nvidia7", "c", "195", "7")
    # The health program resumes a drain of its own; the play resumes its own on its next run (the
    # test after this one: both nodes ready, train-1 idle again).
    wait_for(
        "the health program to let train-1 go",
        lambda: not _reason("train-1").startswith("gpuplat-health"),
        90,
    )


def test_validate_runs_the_validation_play_through_slurm(first_up: subprocess.CompletedProcess[str]) -> None:
    """`gpuplat validate`: playbooks/validate.yml on the running cluster (the node checks on every training
    node, then through srun from the controller: storage read, checkpoint write), judged from what the
    play copied back. `up` on the local cluster validates without this play."""
    assert first_up.returncode == 0
    block = named_block("validate")  # the README's command, verbatim; it leaves its report as JSON
    done = run_block(block.text)
    assert done.returncode == 0, (block.where, done.stdout[-3000:], done.stderr[-3000:])
    report = json.loads((ROOT / ".gpuplat" / STACK / "validate" / "report.json").read_text())
    assert report["verdict"] == "pass" and report["stack"] == STACK
    nodes = {n["node"]: n for n in report["nodes"]}
    assert set(nodes) == {"train-0", "train-1"}
    for node in nodes.values():
        checks = {name: status for name, (status, _) in node["checks"].items()}
        assert checks["health-program"] == "pass"
        assert {checks[name] for name in ("xid", "ecc", "recovery", "dcgm-diag")} == {"skip"}
        assert "simulated" in node["gpu_absent_reason"]
    [pool] = report["pools"]
    assert pool["pool"] == "train" and sorted(pool["ready_nodes"]) == ["train-0", "train-1"]
    assert set(pool["storage"]["node_gbps"]) == set(nodes) and pool["storage"]["aggregate_gbps"] > 0
    assert set(pool["checkpoint"]["node_seconds"]) == set(nodes) and pool["checkpoint"]["worst_seconds"] > 0
    assert not any(report["drains"].get(key) for key in ("drained", "already_drained", "failing_not_drained"))
    wait_for("train-1 to take work", lambda: _state("train-1") == "idle", 60)  # resumed, if drained before


def test_openai_client_through_the_gateway(first_up: subprocess.CompletedProcess[str]) -> None:
    from openai import OpenAI

    cluster = LocalCluster(load_platform(stack_file(STACK)))
    assert cluster.gateway_url() in first_up.stdout
    client = OpenAI(base_url=cluster.gateway_url(), api_key="unused", timeout=30, max_retries=0)
    model = cluster.platform.spec.serving.model if cluster.platform.spec.serving else ""
    assert model in [m.id for m in client.models.list().data]
    answer = client.embeddings.create(model=model, input=["a man is eating food", "a man is eating bread"])
    first, second = (item.embedding for item in answer.data)
    assert len(first) == len(second) > 100
    cosine = sum(a * b for a, b in zip(first, second, strict=True))
    assert cosine > 0.5


def run_block(text: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """A documented block as a user runs it: from the repository's root, the venv activated, none of the
    test process's GPUPLAT_* settings. In a session of its own: what it leaves running is killed with it."""
    shell = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", text], cwd=ROOT, env=_user_env(), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = shell.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(shell.pid, signal.SIGKILL)
        stdout, stderr = shell.communicate()
        return subprocess.CompletedProcess(shell.args, -signal.SIGKILL, stdout, stderr + "\n(timed out)")
    return subprocess.CompletedProcess(shell.args, shell.returncode, stdout, stderr)


def job_end_state(job: int) -> str:
    """The job's end state from accounting ("" while it is pending, running, completing or requeued):
    scontrol shows COMPLETING before the end and forgets a job MinJobAge after it."""
    answer = on("head-0", "sacct", "-n", "-X", "-P", "-j", str(job), "-o", "State", check=False).split()
    return answer[0] if answer and answer[0] in JOB_ENDED else ""


def test_the_documented_commands_run_as_written(first_up: subprocess.CompletedProcess[str]) -> None:
    """The README's and the manual's marked blocks (tests/docs_commands.py), verbatim, from the
    repository's root with the venv's commands on PATH; a job a block submits must complete."""
    assert first_up.returncode == 0
    jobs: dict[int, tuple[str, str]] = {}  # job -> the block's place, its output file
    for block in marked_blocks():
        if block.name is not None:
            continue  # run by the test that asks for it by name
        started = time.monotonic()
        done = run_block(block.text)
        print(f"\n{block.where}: exit {done.returncode} in {time.monotonic() - started:.1f} s", flush=True)
        shown = f"{block.where}\n{block.text}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert done.returncode == 0, shown
        submitted = submitted_jobs(done.stdout + done.stderr)
        assert submitted or not re.search(r"\bsbatch\b", block.text), shown
        for job in submitted:
            details = on("head-0", "scontrol", "show", "job", str(job))
            stdout = re.search(r"\bStdOut=(\S+)", details)
            jobs[job] = (block.where, stdout.group(1) if stdout else "")
    for job, (where, output) in jobs.items():
        state = wait_for(f"job {job} of {where} to end", lambda job=job: job_end_state(job), 600, 3)
        log = on("head-0", "cat", output, check=False) if output else "(no StdOut)"
        assert state == "COMPLETED", f"{where}: job {job} ended {state}\n{log[-3000:]}"
        assert re.search(r"^done .*steps_run=\d+", log, re.MULTILINE), log[-3000:]


def _reference_run(directory: Path, arguments: list[str]) -> list[subprocess.Popen[bytes]]:
    """The same job uninterrupted, on this machine: two torchrun agents of two workers (world 4, the
    job's ranks and data shares), one OpenMP thread each as on the nodes (TaskProlog: one CPU). The
    rendezvous gives out ranks in arrival order: either agent's log may hold rank 0's `done` line."""
    torchrun = str(Path(sys.executable).parent / "torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    port = str(random.randint(29600, 29900))
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "reference"]
    agents = []
    for agent in (0, 1):
        command = [
            torchrun,
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
            *rendezvous,
            str(TRAIN_DIST / "train.py"),
        ]
        with (directory / f"agent-{agent}.log").open("wb") as log:
            agents.append(
                subprocess.Popen(
                    [*command, "--dir", str(directory / "checkpoints"), *arguments],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
    return agents


def test_distributed_training_survives_a_sigterm_and_losing_a_node(
    first_up: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    """examples/train_dist on both training nodes (2 nodes x 2 processes, gloo): a spot-style SIGTERM
    saves the step the job is at and the job script requeues it (it resumes from exactly that step);
    then a node is killed: Slurm requeues the job, which resumes from the last complete periodic
    checkpoint, redoes at most one interval, and ends bit-identical to an uninterrupted run."""
    assert first_up.returncode == 0
    head = container_name(STACK, "head-0")
    on("head-0", "mkdir", "-p", "/shared/jobs")
    for name in ("train.py", "train.sbatch"):
        podman("cp", str(TRAIN_DIST / name), f"{head}:/shared/jobs/")
    on("head-0", "sh", "-c", f"rm -rf {DIST_DIR} && mkdir -p {DIST_DIR} && chown alice {DIST_DIR}")
    # The stack's dataset (stacks/Pulumi.local.yaml), where s3://datasets/demo-corpus/v1 appears.
    make_dataset = (
        f"mkdir -p {DATASET_DIR}/shards && head -c 3000000 /dev/urandom > {DATASET_DIR}/shards/000.bin"
    )
    on("head-0", "sh", "-c", f"{make_dataset} && echo '{{\"shards\": 1}}' > {DATASET_DIR}/index.json")
    arguments = ["--steps", str(DIST_STEPS), "--every", str(DIST_EVERY), "--log-every", "1"]
    reference = _reference_run(tmp_path, arguments)
    train_args = " ".join([*arguments, "--step-seconds", str(DIST_STEP_SECONDS)])
    sbatch = ["sbatch", "--parsable", "--account", "research", "--partition", "train", "--nodes", "2"]
    sbatch += ["--gres", "gpu:2", "--chdir", DIST_DIR, "--output", f"{DIST_DIR}/slurm-%j.out"]
    sbatch += [f"--export=ALL,CKPT_DIR={DIST_DIR},DATASET=demo-corpus,TRAIN_ARGS={train_args}"]
    sbatch += ["/shared/jobs/train.sbatch"]
    job = on("head-0", "runuser", "-u", "alice", "--", *sbatch).strip().split(";")[0]

    def job_field(field: str) -> str:
        text = on("head-0", "scontrol", "show", "job", job, check=False)
        match = re.search(rf"\b{field}=(\S+)", text)
        return match.group(1) if match else ""

    # Read where the shared volume lies on this host: the waits below look at the log several times a
    # second, and a `podman exec` per look costs more CPU than the job does.
    volume = LocalCluster(load_platform(stack_file(STACK))).volume
    shared = podman("volume", "inspect", "--format", "{{.Mountpoint}}", volume).stdout
    job_log = Path(shared.strip()) / Path(DIST_DIR).relative_to("/shared") / f"slurm-{job}.out"

    def log() -> str:
        return job_log.read_text(errors="replace") if job_log.exists() else ""

    def progress() -> int:
        steps = re.findall(r"^step (\d+) loss", log(), re.MULTILINE)
        return int(steps[-1]) if steps else 0

    def starts() -> list[tuple[str, int]]:
        found = re.findall(r"^start host=(\S+) world=4 resumed_from=(\d+)", log(), re.MULTILINE)
        return [(host, int(step)) for host, step in found]

    def stepped_since_start(run: int) -> bool:
        """The job's `run`-th start (1-based) or a later one has logged a step since."""
        parts = log().split("start host=")[run:]
        return any(re.search(r"^step \d+ loss", part, re.MULTILINE) for part in parts)

    def sigterm_step() -> str:
        found = re.findall(r"^SIGTERM: checkpoint at step (\d+)", log(), re.MULTILINE)
        return found[-1] if found else ""

    run_s = 60.0  # stepping time the waits below allow beside the job's start (the whole run is 40 s)
    # (b) spot-style: SIGTERM to the job's steps; the job saves where it is and the script requeues it.
    wait_for("the job to pass its first checkpoint", lambda: progress() >= DIST_EVERY + 5, run_s + 120, 0.5)
    signalled = time.monotonic()
    on("head-0", "scancel", "--signal", "TERM", job)
    stopped = int(wait_for("the SIGTERM checkpoint", sigterm_step, 90))
    wait_for("the requeued job's first new step", lambda: stepped_since_start(2), 240, 0.5)
    sigterm_to_step_s = time.monotonic() - signalled
    assert starts()[1][1] == stopped, (stopped, starts())

    # (a) node loss past the next periodic checkpoint: Slurm requeues the job once the node is down.
    target = (stopped // DIST_EVERY + 1) * DIST_EVERY + random.randint(3, DIST_EVERY - 3)
    wait_for(f"step {target}", lambda: progress() >= target, run_s + 60, 0.2)
    victim = random.choice(["train-0", "train-1"])
    podman("kill", container_name(STACK, victim))
    killed = time.monotonic()
    killed_at = progress()
    try:
        wait_for("Slurm to requeue the job", lambda: int(job_field("Restarts") or 0) >= 2, 240, 3)
    finally:
        podman("start", container_name(STACK, victim))
    wait_for("the job's first step after the node loss", lambda: stepped_since_start(3), 300, 0.5)
    kill_to_step_s = time.monotonic() - killed
    wait_for("the job to finish", lambda: job_field("JobState") == "COMPLETED", 600, 3)
    resumed_from = starts()[-1][1]
    redone = killed_at - resumed_from
    for agent in reference:
        agent.wait(timeout=300)
    output = "".join(log.read_text(errors="replace") for log in sorted(tmp_path.glob("agent-*.log")))
    print(
        f"SIGTERM at step {stopped}, resumed from {stopped}, first new step {sigterm_to_step_s:.0f} s after "
        f"the signal; {victim} killed at step {killed_at}, resumed from {resumed_from}: {redone} redone "
        f"(interval {DIST_EVERY}); first new step {kill_to_step_s:.0f} s after the kill"
    )
    # More than three starts: a run stopped by a signal meant for the run before (train.sbatch's comment)
    # and requeued by the job script; every start after the kill resumes from the same checkpoint.
    after_kill = starts()[2:]
    assert after_kill and {step for _, step in after_kill} == {resumed_from}, (killed_at, starts())
    assert 0 <= redone <= DIST_EVERY, (killed_at, starts())
    expected = re.search(r"^done step=\d+ .* digest=(\w+)", output, re.MULTILINE)
    assert expected, output[-3000:]
    assert f"digest={expected.group(1)}" in log().rsplit("start host=", 1)[1], log()[-3000:]
    assert int(job_field("Restarts")) >= 2
    wait_for(f"{victim} back in service", lambda: _state(victim) == "idle", 180)
    # The dataset: copied once per node (first run), found intact by every later run on both nodes.
    assert log().count("demo-corpus v1: staged from") == 2, log()[-3000:]
    assert log().count("demo-corpus v1: cached at") >= 2 * (len(starts()) + 1)


def test_a_corrupted_dataset_cache_entry_is_found_and_staged_again(
    first_up: subprocess.CompletedProcess[str],
) -> None:
    """After the distributed job: another job on train-0 finds the dataset cached (no second copy), and so
    does a second user of another account, who can read the copy and not change it (the cache is
    gpuplat-cache's; both go through the role's sudoers rule). One byte of the cached copy changed (same
    size) is left to `verify` by a job start's cheap check; verify finds it and withdraws the copy, and
    the next stage copies it again into a new directory."""
    assert first_up.returncode == 0

    def srun(user: str, account: str) -> list[str]:
        command = ["runuser", "-u", user, "--", "srun", "--partition", "train", "--account", account]
        return [*command, "--nodelist", "train-0", "--time", "2"]

    alice = [*srun("alice", "research"), "gpuplat-dataset"]
    head = container_name(STACK, "head-0")
    again = podman("exec", head, *alice, "stage", "demo-corpus", check=False)
    assert again.returncode == 0 and "demo-corpus v1: cached at" in again.stderr, (again.stdout, again.stderr)
    path = again.stdout.strip()
    assert path.startswith(f"{DATASET_CACHE}/demo-corpus/v1/g"), path
    bob = podman(
        "exec", head, *srun("bob", "product"), "gpuplat-dataset", "stage", "demo-corpus", check=False
    )
    assert bob.returncode == 0 and bob.stdout.strip() == path, (bob.stdout, bob.stderr)
    tamper = f"echo x >> {path}/index.json || rm -f {path}/shards/000.bin || exit 0; exit 1"
    assert podman("exec", head, *srun("bob", "product"), "sh", "-c", tamper, check=False).returncode == 0
    assert on("train-0", "stat", "-c", "%U %a", f"{path}/shards/000.bin").split() == ["gpuplat-cache", "444"]

    shard = f"{path}/shards/000.bin"
    on("train-0", "sh", "-c", f"printf X | dd of={shard} bs=1 seek=1000 conv=notrunc status=none")
    cheap = podman("exec", head, *alice, "stage", "demo-corpus", check=False)
    assert cheap.returncode == 0 and cheap.stdout.strip() == path, (cheap.stdout, cheap.stderr)
    verify = podman("exec", head, *alice, "verify", "demo-corpus", check=False)
    assert verify.returncode == 1 and "000.bin: content differs" in verify.stdout, (
        verify.stdout,
        verify.stderr,
    )
    staged = on("head-0", *alice, "stage", "demo-corpus").strip()
    assert staged.startswith(f"{DATASET_CACHE}/demo-corpus/v1/g") and staged != path, staged
    original = on("head-0", "sha256sum", f"{DATASET_DIR}/shards/000.bin").split()[0]
    assert on("train-0", "sha256sum", f"{staged}/shards/000.bin").split()[0] == original


def test_the_loop_two_teams_train_register_and_release(first_up: subprocess.CompletedProcess[str]) -> None:
    """docs/loop.md's session, its commands verbatim and in order, in one shell as a user types them
    (tests/docs_session.py): the manual's pages made into text pairs and staged; alice (research) and bob
    (product) submit examples/loop at the same time on the same two nodes; both finish, each registers a
    version from its MLflow run; one is deployed stable, the other enters a canary through the gate, the
    guard watches it under traffic, it is promoted; MLflow's own client resolves models:/embedder@champion
    inside a Slurm task (MLFLOW_TRACKING_URI from the TaskProlog) to that version. Between the page's
    steps the test waits where the page's user waits, and checks what the page says happened."""
    assert first_up.returncode == 0
    started = time.monotonic()
    pairs_file = ROOT / "pairs.jsonl"  # the page's first command writes it where the session runs
    times: dict[str, float] = {}

    def step(session: Session, block: Block, timeout: float = 600) -> BlockRun:
        begun = time.monotonic()
        ran = session.run(block, timeout=timeout)
        times[str(block.name)] = time.monotonic() - begun
        # Whole: what the page shows under each command, refreshed from a run of the tier.
        print(f"\n{ran.report(tail=None)}\n[{block.name}: {times[str(block.name)]:.1f} s]", flush=True)
        assert ran.ok, ran.report()
        return ran

    with Session(ROOT, _user_env()) as session:
        try:
            step(session, named_block("loop-data"))
            # The platform made each team user's job folder, private to them: the other team cannot put
            # a file in it.
            for user, other in (("alice", "bob"), ("bob", "alice")):
                owner_mode = on("head-0", "stat", "-c", "%U %a", f"/shared/jobs/{user}").strip()
                assert owner_mode == f"{user} 700", f"/shared/jobs/{user}: {owner_mode}"
                plant = f"touch /shared/jobs/{user}/x 2>&1; echo rc=$?"
                planted = on("head-0", "runuser", "-u", other, "--", "sh", "-c", plant)
                assert "Permission denied" in planted and "rc=1" in planted, planted
            train = step(session, named_block("loop-train"))
        finally:
            pairs_file.unlink(missing_ok=True)
        submitted_s = time.monotonic() - started
        jobs = _loop_jobs(train.output(3))
        assert set(jobs) == {"alice", "bob"}, jobs

        def states() -> dict[str, str]:
            return {user: job_end_state(job) for user, job in jobs.items()}

        wait_for("both loop jobs to end", lambda: all(states().values()), 600, 3)
        trained_s = time.monotonic() - started - submitted_s
        logs = {
            user: on("head-0", "cat", f"/shared/jobs/{user}/slurm-{job}.out", check=False)
            for user, job in jobs.items()
        }
        assert set(states().values()) == {"COMPLETED"}, (states(), logs)
        assert _overlapped(list(jobs.values())), jobs
        versions: dict[str, int] = {}
        for user, log in logs.items():
            match = re.search(
                r"^registered embedder version (\d+) from runs:/(\w+)/model \(mlflow-artifacts:/", log, re.M
            )
            assert match, log[-3000:]
            versions[user] = int(match.group(1))
            scored = r"^held out \d+ pairs: recall_at_1 [\d.]+ \(base model [\d.]+\)$"
            assert re.search(scored, log, re.M), log[-3000:]
        assert sorted(versions.values()) == [1, 2], versions  # the versions the page deploys

        alice_log = step(session, named_block("loop-log")).output(0)
        assert f"registered embedder version {versions['alice']} from runs:/" in alice_log, alice_log[-3000:]
        step(session, named_block("loop-registry"))
        listed = json.loads(gpuplat("models", "list", "embedder", "--stack", STACK, "--json").stdout)
        location = next(v["location"] for v in listed if int(v["version"]) == 1)
        assert location.startswith("/shared/registry/artifacts/"), location

        release_started = time.monotonic()
        release = step(session, named_block("loop-release"))
        # The model server's user reads the version, and can neither change it nor read the registry's
        # database (the registry's uid is its own on every node: roles/model_registry, model_registry_uid).
        for user in ("nobody", "gpuplat-inference"):
            assert _on_infer_as(user, "test", "-r", f"{location}/model.zip") == 0, (user, location)
            assert _on_infer_as(user, "test", "-w", f"{location}/model.zip") != 0, (user, location)
            assert _on_infer_as(user, "cat", "/shared/registry/mlflow.db") != 0, f"{user} reads the database"
        shares = dict(line.split()[::-1] for line in release.output(2).splitlines())
        assert set(shares) == {"embedder@1", "embedder@2"}, release.output(2)  # both versions answered
        # The guard analyses the canary under the page's background traffic (the local stack's
        # serving.canary: 5 s of warm-up, three intervals of 10 s); the versions are alike and none fails,
        # so it exits 0 with promote-ready (1: rolled back, 5: no verdict).
        guard = step(session, named_block("loop-guard"))
        assert guard.output(1).startswith("promote-ready"), guard.output(1)
        assert "serves every request" in guard.output(3), guard.output(3)
        release_s = time.monotonic() - release_started

        resolved = step(session, named_block("loop-client")).output(0)
        assert resolved.split()[0] == "2", resolved
        # MLflow's download holds the model's own files beside what MLflow adds (registered_model_meta
        # from 3.x): the two the server reads must be there.
        listing = next(line for line in reversed(resolved.splitlines()) if line.startswith("["))
        assert {"MLmodel", "model.zip"} <= set(ast.literal_eval(listing)), resolved
    print(
        f"\nloop: submitted in {submitted_s:.1f} s, both jobs done {trained_s:.1f} s later "
        f"(versions {versions}); deploy, canary, guard, promote {release_s:.1f} s; "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in times.items())
        + f"; whole test {time.monotonic() - started:.1f} s"
    )


def _user_env() -> dict[str, str]:
    """A user's shell as the README's `make up` leaves it: the venv's commands on PATH, none of the test
    process's GPUPLAT_* settings."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUPLAT_")}
    return env | {"NO_COLOR": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def _loop_jobs(squeue: str) -> dict[str, int]:
    """The loop jobs in the page's `squeue` (JOBID PARTITION NAME USER ...): user -> job."""
    rows = [line.split() for line in squeue.splitlines()[1:]]
    return {row[3]: int(row[0]) for row in rows if len(row) > 3 and row[2] == "loop"}


def _overlapped(jobs: list[int]) -> bool:
    """Both jobs ran at once on the same nodes (their start and end times overlap)."""
    spans = []
    for job in jobs:
        fields = ("-o", "Start,End,NodeList")
        text = on("head-0", "sacct", "-n", "-X", "-P", "-j", str(job), *fields, check=False)
        start, end, nodes = text.strip().splitlines()[0].split("|")
        spans.append((start, end, nodes))
    return spans[0][2] == spans[1][2] and spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]


def _on_infer_as(user: str, *command: str) -> int:
    infer = container_name(STACK, "infer-0")
    return podman("exec", infer, "runuser", "-u", user, "--", *command, check=False).returncode


def _scraped_nodes() -> set[str]:
    """The hosts Prometheus scrapes (its active targets' instance labels, port dropped)."""
    cluster = LocalCluster(load_platform(stack_file(STACK)))
    with urllib.request.urlopen(
        f"{cluster.prometheus_url()}/api/v1/targets?state=active", timeout=10
    ) as reply:
        targets = json.loads(reply.read())["data"]["activeTargets"]
    return {str(t["labels"]["instance"]).rsplit(":", 1)[0] for t in targets}


def _state(node: str) -> str:
    return on("head-0", "sinfo", "-h", "-N", "-n", node, "-o", "%T", check=False).strip()


def _slurm_files(node: str) -> str:
    """Checksums of the Slurm configuration a node reads (its own, or the configless cache)."""
    return on(
        node, "sh", "-c", "sha256sum /etc/slurm/*.conf /run/slurm/conf/*.conf 2>/dev/null | sort", check=False
    )


def test_a_node_added_to_the_running_cluster_joins_runs_gpu_work_and_leaves_no_trace(
    first_up: subprocess.CompletedProcess[str],
) -> None:
    assert first_up.returncode == 0
    before = {node: _slurm_files(node) for node in ("head-0", "train-0")}
    assert _state("train-2") == "idle~"  # every name of the pool is in slurm.conf, powered down
    grown = run_block(named_block("scale-up").text)  # the README's commands, verbatim
    assert grown.returncode == 0, grown.stderr[-3000:]
    wait_for("train-2 to join its partition", lambda: _state("train-2") == "idle", 120)
    srun = ["srun", "--partition", "train", "--nodelist", "train-2", "--gres", "gpu:1", "--time", "2"]
    job = on("head-0", "timeout", "120", *srun, "sh", "-c", "echo $(hostname) $CUDA_VISIBLE_DEVICES")
    assert job.split() == ["train-2", "0"], job
    assert {node: _slurm_files(node) for node in before} == before  # nothing changed elsewhere
    # Prometheus on head-0 scrapes it (its configuration reloads a moment after the join's run).
    wait_for("Prometheus to scrape train-2", lambda: container_name(STACK, "train-2") in _scraped_nodes(), 60)

    shrunk = run_block(named_block("scale-down").text)
    assert shrunk.returncode == 0, shrunk.stderr[-3000:]
    assert podman("container", "exists", container_name(STACK, "train-2"), check=False).returncode != 0
    assert _state("train-2") == "idle~"
    assert {node: _slurm_files(node) for node in before} == before


def test_down_leaves_nothing(first_up: subprocess.CompletedProcess[str]) -> None:
    result = run_block(named_block("down").text)  # the README's command, verbatim
    assert result.returncode == 0, result.stderr
    assert _stack_leftovers() == []
