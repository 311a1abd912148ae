"""The AWS Slurm stack's node lifecycle in the box (tests/box/box.py). The scenarios run on one box,
each asserting Slurm's and the emulator's states; the figures they measure are printed at the end.

a  the controller boots from its user data alone; slurmctld and slurmdbd serve
r  day 2: a role change (a new bundle digest) reaches the running controller through `gpuplat up`'s
   configure phase (the inventory from the stack's outputs, site.yml), with no stop and start of its
   instance (its declared user data names no bundle, so it does not change); nodes launched later
   boot from the new bundle
b  a job for a powered-down pool: slurmctld runs the real resume program, an instance boots, takes its
   name, joins, and the job runs; then the pool's image is taken from that node (image_seal.sh), so
   the later launches boot it and only configure themselves
c  a spot notice while torchrun, started by a requeueable job's batch script (not under srun), trains
   examples/train_dist on CPU from the training environment the controller installed: its workers get
   SIGTERM within the grace and write a DCP checkpoint; the job is requeued (never FAILED) and resumes
   from that checkpoint on a replacement instance
d  a two-node job on capacity for one: nothing is launched (all or nothing), the names return to power
   saving, the job runs on the next attempt
e  a node that never finishes booting (past ResumeTimeout) comes back to power saving, not DOWN
f  a stray instance of the stack that Slurm does not know, and one of a pool removed from the stack, are
   terminated by the reconciler (its log says so)
j  a bad image on the team's second pool (spot2): each boot fails, the instance powers itself off and
   its launch template terminates it, reconcile counts a boot failure and requeues the job; after two
   (slurm_elastic_protected_failure_count in the box) the pool is in protected mode, as `gpuplat
   status` reads it from the controller, and nothing more is launched; the image fixed and the pool
   unprotected, its name is back in power saving
i  a job user on a training node gets no IMDS token (so no instance credentials for the MUNGE key in
   SSM) and cannot read the key file; then the node's instance is terminated from outside: its job is
   requeued within REQUEUE_BOUND_S and done on a new instance of the same name within
   BACK_IN_SERVICE_BOUND_S
g  idle nodes are suspended and their instances terminated
k  a capacity error on the spot pool for a job of both partitions: the job runs on spot2
h  `gpuplat down`'s own path with a node launched, slurmctld and reconcile running and jobs pending: the
   fleet stopped (its launch templates tagged), torn down and waited for, the controllers' resumes
   refused during and after it, then the box's destroy; no instance of the stack left in any state but
   terminated, each ended by the program whose log says so

They run in the order a e_started r b (and the image) j_started e_held c f j k d i e g h; `-k` may pick
a subset that keeps a first and, for e, j and f, their starting steps. e waits out ResumeTimeout, the
longest timer (600 s), on a pool of its own (spot3) while r, b, c, f, j, k, d and i do their work on the
controller, spot and spot2: its job is submitted as soon as a passed, e_held finds the held instance,
the hypervisor notes when it is terminated, and its end is checked after i, by when its job has been
requeued and its name has come back. f's stray is launched when c starts and outlives the reconciler's
grace while c runs. j's job is submitted once the image is taken and its boots fail on spot2
meanwhile; its outcome is checked after f. k waits for spot and spot2 to be powered down, d for spot
alone (after k's cool-down; k's node on spot2 may still be up); i runs on spot-0, one of d's nodes,
and its requeued job on spot-0 again; g, after e, for every node.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
import shlex
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from infra.backends.aws.bootstrap import bundle_files
from infra.lifecycle.fleet_holds import read_fleet_holds
from infra.nodes.podman import podman
from infra.spec.load import PROJECT_ROOT
from tests.box.box import RunCommand, box_substitutes
from tests.box.cloud import user_data
from tests.slurm_states import JOB_ENDED

pytestmark = pytest.mark.box

BOOT_DEADLINE_S = 600
# The controllers install Slurm, MUNGE and the database from the package mirror at boot: 270-350 s here,
# 581 s on the 2-core CI machine while the other test streams ran.
CONTROLLER_BOOT_DEADLINE_S = 1200
CHECKPOINTS = "/fsx/checkpoints"
FIGURES: dict[str, float] = {}
IMAGES: dict[str, str] = {}  # pool -> the image its launch template names now
HELD_POOL = "spot3"  # e: the pool whose node's boot never finishes, used by no other scenario
HELD_NODE = f"{HELD_POOL}-0"
# b: spot-0's job holds the node until its image is taken. A job that ended at once left the node idle
# while the user data still ran its last plays (slurmd starts half-way), and on a loaded machine
# SuspendTime (then 60 s; 30 s in the box now, box.py box_substitutes) ended it before the test could
# take the image.
B_RELEASE = f"{CHECKPOINTS}/box-b-release"
B_JOB: dict[str, str] = {}
HELD: dict[str, Any] = {}  # e: the held instance, its job, when its job was submitted
STRAY: dict[str, Any] = {}  # f: the stray instance, when it was launched (at the start of c)
BAD: dict[str, Any] = {}  # j: the bad image, its job, when its job was submitted
ROLE_CHANGE: dict[str, str] = {}  # r: the bundle its role change published (b's node boots from it)
PROTECTED_FAILURE_COUNT = box_substitutes("", 0)["slurm_elastic_protected_failure_count"]
RECONCILE_INTERVAL_S = box_substitutes("", 0)["slurm_elastic_reconcile_interval_s"]
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 3) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)


def slurm(box: Any, command: str, check: bool = True) -> str:
    return str(box.sh(box.stack.controllers["head-0"], command, check=check))


def submit(box: Any, script: str, options: str = "", partitions: str = "spot") -> str:
    """A job of team user alice on the spot partition (its QoS is spot; spot2 takes it too), one GPU per
    node, run in the checkpoint directory on the shared filesystem (where its output lands)."""
    return submit_file(box, f"--wrap {shlex.quote(script)}", options, partitions)


def submit_file(box: Any, batch: str, options: str = "", partitions: str = "spot") -> str:
    """submit's job from `batch`: a batch script's path, or sbatch's --wrap and its command."""
    command = f"sbatch --parsable -p {partitions} --qos=spot --gres=gpu:1 --chdir={CHECKPOINTS} {options}"
    command += f" {batch}"
    return slurm(box, f"su alice -c {shlex.quote(command)}").strip()


def job_state(box: Any, job: str) -> str:
    """The job's state now (sacct's allocation line; empty until slurmdbd has it)."""
    lines = slurm(box, f"sacct -nXP -j {job} -o State", check=False).split()
    return lines[-1] if lines else ""


def wait_ended(box: Any, job: str, timeout_s: float = BOOT_DEADLINE_S) -> str:
    """The job's final state. An attempt that ended NODE_FAIL and was requeued is not the end: the job
    is back in the queue (squeue lists it) until its last attempt ends."""

    def ended() -> str | None:
        if slurm(box, f"squeue -h -j {job} -o %T", check=False).strip():
            return None
        state = job_state(box, job)
        return state if state in JOB_ENDED else None

    return wait_for(f"job {job} ended", ended, timeout_s)


def node_states(box: Any) -> dict[str, str]:
    words = slurm(box, "sinfo -h -N -o '%N %T'").split()
    return dict(zip(words[0::2], words[1::2], strict=True))


def wait_powered_down(box: Any, but: str = "", timeout_s: float = 300, pool: str = "") -> None:
    """Every node (of `pool`, where given) in power saving (`idle~`), but `but` (the held pool's node
    while e runs)."""

    def wanted(node: str) -> bool:
        return node != but and (not pool or node.rsplit("-", 1)[0] == pool)

    wait_for(
        f"every node{f' of {pool}' if pool else ''} powered down" + (f" but {but}" if but else ""),
        lambda: all(s == "idle~" for n, s in node_states(box).items() if wanted(n)) or None,
        timeout_s,
    )


# Every state of an instance but terminated: stopped and stopping ones are still there (their volumes,
# addresses and network interfaces), shutting-down ones are on their way.
NOT_TERMINATED = ("pending", "running", "shutting-down", "stopping", "stopped")


def live(box: Any, **tags: str) -> list[dict[str, Any]]:
    return list(box.instances("pending", "running", **tags))


def state_of(box: Any, instance_id: str) -> str:
    """The instance's state as EC2 has it: "terminated" is the end; stopped or shutting-down still are
    instances (a stopped one keeps its volumes and addresses)."""
    [reservation] = box.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return str(reservation["Instances"][0]["State"]["Name"])


def terminated(box: Any, instance_id: str) -> bool | None:
    return state_of(box, instance_id) == "terminated" or None


def controller_log(box: Any) -> str:
    """The node program's log on the controller: which of its commands did what."""
    return slurm(box, "cat /var/log/gpuplat/ec2-nodes.log")


def tag(instance: dict[str, Any], key: str) -> str:
    return next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == key), "")


def named(box: Any, instance_id: str) -> dict[str, Any]:
    """The instance once the resume program has tagged its node name: it launches first and tags the
    name after RunInstances returns (node_join.py reads the tag), so a fresh instance is briefly unnamed."""

    def described() -> dict[str, Any] | None:
        [instance] = box.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"]
        return instance if tag(instance, "gpuplat:node") else None

    return wait_for(f"{instance_id} named", described, 60)


def explain(box: Any, job: str) -> str:
    return slurm(
        box, f"sacct -D -j {job} -o JobID,State,NodeList,ExitCode; sinfo -N; scontrol show job {job}", False
    )


def test_a_controllers_boot_from_user_data_alone(box: Any) -> None:
    head = box.stack.controllers["head-0"]
    FIGURES["controller boot s"] = box.wait_boot(head, CONTROLLER_BOOT_DEADLINE_S)
    assert slurm(box, "hostname").strip() == "head-0"
    assert "is UP" in slurm(box, "scontrol ping")
    assert box.platform.name.replace("-", "_") in slurm(box, "sacctmgr -nP show cluster format=cluster")
    assert node_states(box) == {"spot-0": "idle~", "spot-1": "idle~", "spot2-0": "idle~", HELD_NODE: "idle~"}


def test_e_started_a_job_for_the_held_pool(box: Any) -> None:
    """Not checked here: a job for spot3, whose node's next boot the hypervisor holds (its user data never
    runs). Its ResumeTimeout starts now, as soon as the controller serves, and runs out while r, b, c, f,
    j, k, d and i work (e is judged after i)."""
    box.hypervisor.settings.hold_nodes.add(HELD_NODE)
    HELD.update(job=submit(box, "hostname", "--requeue", partitions=HELD_POOL), since=time.monotonic())


# r: the role change, a line the node_identity role writes into every node's platform facts.
ROLE_CHANGE_MARK = "# box role change"
ROLE_CHANGE_TEMPLATE = "roles/node_identity/templates/node.yml.j2"


def started_at(box: Any, instance_id: str) -> str:
    """When the instance's container (its OS) last started: a stop and start changes it."""
    return str(podman("inspect", "--format", "{{.State.StartedAt}}", box.container_of(instance_id)).stdout)


def test_r_a_role_change_reaches_the_running_controller_without_a_stop_and_start(box: Any) -> None:
    """Day 2: a role changed in the operator's checkout (a new bundle digest). `pulumi up` (the box's
    change_roles) publishes the bundle and the group vars naming it and gives the training pools'
    launch templates new versions; the controller's instance is declared as before, so it is neither
    stopped nor started. `gpuplat up`'s configure phase (the inventory from the stack's outputs,
    site.yml through it) brings the change to the running controller. The later scenarios' nodes boot
    from the new bundle (b)."""
    head = box.stack.controllers["head-0"]
    checkout = box.workdir / "checkout"
    shutil.rmtree(checkout, ignore_errors=True)
    for name, path in bundle_files(PROJECT_ROOT).items():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, checkout / name)
    template = checkout / ROLE_CHANGE_TEMPLATE
    template.write_text(template.read_text() + ROLE_CHANGE_MARK + "\n")
    facts = "/etc/gpuplat/node.yml"
    assert ROLE_CHANGE_MARK not in box.sh(head, f"cat {facts}")
    user_data_before, started_before = user_data(box.ec2, head), started_at(box, head)
    slurmctld_before = slurm(box, "systemctl show -p MainPID --value slurmctld").strip()

    change = box.change_roles(checkout)
    assert change.bundle_after != change.bundle_before
    ROLE_CHANGE["bundle"] = change.bundle_after
    assert change.restarted == [], f"pulumi up would stop and start {change.restarted}: their inputs changed"
    for template_id in box.stack.templates.values():
        [latest] = box.ec2.describe_launch_template_versions(
            LaunchTemplateId=template_id, Versions=["$Latest"]
        )["LaunchTemplateVersions"]
        assert change.bundle_after in base64.b64decode(latest["LaunchTemplateData"]["UserData"]).decode()
    start = time.monotonic()
    box.configure(checkout, change)
    FIGURES["role change: site.yml on the running controller s"] = time.monotonic() - start

    assert ROLE_CHANGE_MARK in box.sh(head, f"cat {facts}")  # the change took effect
    assert started_at(box, head) == started_before  # never stopped nor started
    assert user_data(box.ec2, head) == user_data_before
    assert state_of(box, head) == "running"
    assert slurm(box, "systemctl show -p MainPID --value slurmctld").strip() == slurmctld_before
    assert "is UP" in slurm(box, "scontrol ping")


def test_b_a_job_resumes_a_powered_down_node_which_boots_joins_and_runs_it(box: Any) -> None:
    job = submit(box, f"hostname; while [ ! -e {B_RELEASE} ]; do sleep 2; done", "-w spot-0")
    B_JOB["job"] = job
    start = time.monotonic()
    launched = wait_for("an instance for the job", lambda: live(box, gpuplat_node="spot-0"), 120)[0]
    FIGURES["job -> RunInstances s"] = time.monotonic() - start
    instance = named(box, launched["InstanceId"])
    node = tag(instance, "gpuplat:node")
    assert node == "spot-0" and tag(instance, "gpuplat:stack") == box.platform.name
    box.wait_boot(instance["InstanceId"], BOOT_DEADLINE_S)
    assert box.sh(instance["InstanceId"], "hostname").strip() == node
    if ROLE_CHANGE:  # r ran: this node's user data named r's bundle, whose roles wrote the mark
        assert ROLE_CHANGE_MARK in box.sh(instance["InstanceId"], "cat /etc/gpuplat/node.yml")
    wait_for(
        f"{node} idle or allocated",
        lambda: node_states(box)[node] in ("idle", "mixed", "allocated", "completing") or None,
        120,
    )
    FIGURES["RunInstances -> node in service s"] = time.monotonic() - start - FIGURES["job -> RunInstances s"]
    wait_for(f"job {job} running", lambda: job_state(box, job) == "RUNNING" or None, 120)
    assert slurm(box, f"sacct -nXP -j {job} -o NodeList").strip() == node


def test_b_the_pool_image_is_taken_from_the_joined_node(box: Any) -> None:
    """Not a scenario: the image the later launches boot (infra/backends/aws/image_seal.sh), so that they
    only configure themselves; b proved the boot from the bare image. b's job holds the node meanwhile and
    completes once released."""
    [instance] = live(box, gpuplat_node="spot-0")
    start = time.monotonic()
    IMAGES["spot"] = box.bake(instance["InstanceId"], "spot")
    FIGURES["image bake s"] = time.monotonic() - start
    # e's pool (the same instance type and roles) too: the held node's boot after ResumeTimeout is from it.
    box.use_image(HELD_POOL, IMAGES["spot"])
    box.sh(instance["InstanceId"], f"touch {B_RELEASE}")
    assert wait_ended(box, B_JOB["job"]) == "COMPLETED", explain(box, B_JOB["job"])


def test_j_started_a_bad_image_on_the_next_pool(box: Any) -> None:
    """Not checked here: spot2's launch template boots an image on which every bootstrap fails, and a
    job waits for spot2; its boots fail while c and f run (j is judged after f)."""
    BAD["image"] = box.bad_image(IMAGES["spot"], "bad")
    box.use_image("spot2", BAD["image"])
    BAD.update(job=submit(box, "hostname", "--requeue", partitions="spot2"), since=time.monotonic())


def test_e_held_a_node_whose_boot_never_finishes(box: Any) -> None:
    held = wait_for("a held instance", lambda: set(box.hypervisor.held) or None, 180)
    [instance_id] = held
    assert tag(named(box, instance_id), "gpuplat:node") == HELD_NODE
    HELD.update(instance=instance_id, node=HELD_NODE)


def test_c_a_spot_notice_requeues_the_job_which_completes_on_a_replacement(box: Any) -> None:
    launch_stray(box)  # f's stray lives out its grace while c runs
    head = box.container_of(box.stack.controllers["head-0"])
    slurm(box, f"mkdir -p {C_JOB_DIR}")
    for source in (C_JOB_SCRIPT, C_TRAIN_SCRIPT):
        podman("cp", str(source), f"{head}:{C_JOB_DIR}/{source.name}")
    # Pinned to the node b's job left up (the image was taken from it): it starts at once.
    job = submit_file(box, f"{C_JOB_DIR}/{C_JOB_SCRIPT.name}", "-w spot-0")
    wait_for(
        f"job {job} running",
        lambda: "RUNNING" in slurm(box, f"squeue -h -j {job} -o %T", False) or None,
        BOOT_DEADLINE_S,
    )
    node = slurm(box, f"squeue -h -j {job} -o %N").strip()
    first = live(box, gpuplat_node=node)[0]["InstanceId"]
    output = f"{CHECKPOINTS}/slurm-{job}.out"
    wait_for(
        "torchrun's workers training",
        lambda: re.search(r"^step \d+ loss", slurm(box, f"cat {output}", check=False), re.MULTILINE),
        180,
    )
    box.imds.interrupt(first, datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=2))
    noticed, noticed_at = time.monotonic(), time.time()
    # torchrun runs in the batch step (not under srun): the notice's SIGTERM reaches it and its workers
    # within the grace, not at its end, when the node is powered down. The job saves on no timer, so its
    # first complete checkpoint is the one the workers write on that SIGTERM.
    checkpoints = f"{CHECKPOINTS}/box-c-{job}"
    complete = (
        f"cd {checkpoints} && for d in step-*; do"
        " [ ! -e $d/COMPLETE ] || echo $d $(date -r $d/COMPLETE +%s.%N); done"
    )
    written = wait_for(
        "the checkpoint written on SIGTERM", lambda: slurm(box, complete, check=False).split(), 120
    )
    saved, completed_at = written[0], float(written[1])
    FIGURES["spot notice -> checkpoint written s"] = completed_at - noticed_at
    assert FIGURES["spot notice -> checkpoint written s"] < SPOT_GRACE_S
    step = int(saved.removeprefix("step-"))
    assert step > 0, written
    # DCP's checkpoint: its metadata and a part from each of the two ranks.
    parts = slurm(box, f"test -s {checkpoints}/{saved}/.metadata && ls -A {checkpoints}/{saved}").split()
    assert {".metadata", "COMPLETE", "__0_0.distcp", "__1_0.distcp"} <= set(parts), parts
    wait_for(
        f"job {job} requeued",
        lambda: slurm(box, f"squeue -h -j {job} -o %T", False).strip() == "PENDING" or None,
        SPOT_GRACE_S + 120,
    )
    FIGURES["spot notice -> requeued s"] = time.monotonic() - noticed
    wait_for(f"{first} terminated", lambda: terminated(box, first), 240)
    FIGURES["spot notice -> instance terminated s"] = time.monotonic() - noticed
    # A requeued job waits for its old credential to expire before it is scheduled again
    # (job_mgr.c batch_requeue_fini: BeginTime = now + cred_expire + 1).
    replacement = wait_for(
        "a replacement from the pool image",
        lambda: [i for i in live(box, gpuplat_node=node) if i["InstanceId"] != first],
        300,
    )[0]
    assert replacement["ImageId"] == IMAGES["spot"]
    launched = time.monotonic()
    box.wait_boot(replacement["InstanceId"], BOOT_DEADLINE_S)
    FIGURES["RunInstances -> booted, from the pool image s"] = time.monotonic() - launched
    assert wait_ended(box, job) == "COMPLETED", explain(box, job)
    restarts = slurm(box, f"scontrol -o show job {job}").split("Restarts=")[1].split()[0]
    assert int(restarts) >= 1, explain(box, job)  # requeued once, then completed: never FAILED
    log = slurm(box, f"cat {output}")
    assert f"SIGTERM: checkpoint at step {step}; exiting to be requeued" in log, log
    assert re.search(rf"^done step=\d+ .*resumed_from={step} ", log, re.MULTILINE), log
    ran_on = live(box, gpuplat_node=slurm(box, f"sacct -nXP -j {job} -o NodeList").strip())
    assert ran_on and ran_on[0]["InstanceId"] != first


SPOT_GRACE_S = box_substitutes("", 0)["slurm_elastic_spot_grace_s"]
# c's job: torchrun in the batch step of an sbatch script, training the project's example on CPU, and the
# example, copied to the shared filesystem (the job finds train.py beside its script).
C_JOB_SCRIPT = Path(__file__).with_name("torchrun_in_batch_step.sbatch")
C_TRAIN_SCRIPT = PROJECT_ROOT / "examples" / "train_dist" / "train.py"
C_JOB_DIR = f"{CHECKPOINTS}/box-c"


def launch_stray(box: Any) -> None:
    """f's instance: of the stack and its pool, named for a node Slurm does not have."""
    stray = box.ec2_api.run_instances(
        LaunchTemplate={"LaunchTemplateId": box.stack.templates["spot"], "Version": "$Latest"},
        MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": "gpuplat:stack", "Value": box.platform.name}, {"Key": "gpuplat:pool", "Value": "spot"},
            {"Key": "gpuplat:node", "Value": "spot-7"}]}],
    )["Instances"][0]["InstanceId"]  # fmt: skip
    # and one of a pool removed from the stack (its names no longer in slurm.conf): found by the stack's
    # tags alone
    removed = box.ec2_api.run_instances(
        LaunchTemplate={"LaunchTemplateId": box.stack.templates["spot"], "Version": "$Latest"},
        MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [
            {"Key": "gpuplat:stack", "Value": box.platform.name}, {"Key": "gpuplat:pool", "Value": "removed"},
            {"Key": "gpuplat:role", "Value": "train"}, {"Key": "gpuplat:node", "Value": "removed-0"}]}],
    )["Instances"][0]["InstanceId"]  # fmt: skip
    STRAY.update(instance=stray, removed=removed, since=time.monotonic())


# f: the stray's end, from its launch: the reconciler's orphan grace and interval (50 s in the box) and its
# rounds' own time, with room for a loaded machine.
STRAY_BOUND_S = 240


def test_f_a_stray_instance_is_terminated_by_the_reconciler(box: Any) -> None:
    stray, since = STRAY["instance"], STRAY["since"]
    wait_for(
        f"stray {stray} terminated",
        lambda: terminated(box, stray),
        STRAY_BOUND_S - (time.monotonic() - since),
    )
    # As the hypervisor saw it end (f is checked after c, which takes longer than the reconciler), and
    # held to the bound by that: the wait above, begun after c, passes whenever the end came.
    ended = wait_for(f"the hypervisor saw {stray} end", lambda: box.hypervisor.ended.get(stray), 30)
    FIGURES["stray instance -> terminated s"] = ended - since
    assert FIGURES["stray instance -> terminated s"] <= STRAY_BOUND_S
    removed = STRAY["removed"]
    wait_for(f"removed pool's {removed} terminated", lambda: terminated(box, removed), 60)
    log = controller_log(box)
    assert f"reconcile: terminating {stray} (spot-7): is named for a node Slurm does not know" in log
    assert f"reconcile: terminating {removed} (removed-0): is named for a node Slurm does not know" in log


def test_j_repeated_boot_failures_put_the_pool_in_protected_mode(box: Any) -> None:
    """Each boot from the bad image fails; the boot script powers the instance off and its launch
    template terminates it; reconcile sees spot2-0 going up without an instance: a boot failure,
    replaced at once and the job requeued (ParallelCluster's is_bootstrap_failure), not a GPU instance
    until ResumeTimeout. At PROTECTED_FAILURE_COUNT in a row the pool is held (protected mode): no
    launch, whatever waits for it. `gpuplat status` reads the hold from the controller."""

    def protected() -> dict[str, Any] | None:
        report = json.loads(slurm(box, "sudo -u slurm gpuplat-ec2-nodes pools"))["spot2"]
        return report if str(report["hold"]).startswith("gpuplat protected mode") else None

    wait_for("spot2 in protected mode", protected, max(60, 600 - (time.monotonic() - BAD["since"])))
    held_at = time.monotonic()
    launched = box.instances(gpuplat_pool="spot2")
    assert len(launched) == PROTECTED_FAILURE_COUNT, launched
    hypervisor_log = (box.workdir / "hypervisor.log").read_text()
    log = controller_log(box)
    for instance in launched:
        assert state_of(box, instance["InstanceId"]) == "terminated"
        # it powered itself off (the boot script), and EC2 terminated it for its shutdown behaviour
        assert f"{instance['InstanceId']}: container stopped; instance terminated" in hypervisor_log
        assert f"its instance ended during boot ({instance['InstanceId']} terminated" in log
    assert f"pool spot2: {PROTECTED_FAILURE_COUNT} boot failures in a row" in log
    holds = read_fleet_holds(box.platform, box.ec2, RunCommand(box), sleep=lambda _: None)
    assert holds.note is None, holds.note
    [spot2] = [h for h in holds.pools if h.pool == "spot2"]
    assert spot2.hold is not None and spot2.hold.startswith("gpuplat protected mode"), holds
    assert spot2.boot_failures == PROTECTED_FAILURE_COUNT
    assert slurm(box, f"squeue -h -j {BAD['job']} -o %T").strip() in ("PENDING", "CONFIGURING")
    # two reconcile rounds: nothing more launched
    time.sleep(max(0, 2 * RECONCILE_INTERVAL_S + 5 - (time.monotonic() - held_at)))
    assert len(box.instances(gpuplat_pool="spot2")) == PROTECTED_FAILURE_COUNT
    # The operator fixes the image and ends protected mode; the name goes back to power saving.
    slurm(box, f"scancel {BAD['job']}")
    box.use_image("spot2", IMAGES["spot"])
    slurm(box, "sudo -u slurm gpuplat-ec2-nodes unprotect spot2")
    assert json.loads(slurm(box, "sudo -u slurm gpuplat-ec2-nodes pools"))["spot2"]["hold"] is None
    wait_for("spot2-0 back in power saving", lambda: node_states(box)["spot2-0"] == "idle~" or None, 180)


def test_k_a_capacity_error_on_one_pool_and_the_job_runs_on_the_teams_next_pool(box: Any) -> None:
    """A job of both of the team's partitions (`-p spot,spot2`: Slurm tries them in that order) gets a
    capacity error on spot: the pool's cool-down sets its powered-down names DOWN, the job is requeued
    and starts on spot2 (ParallelCluster's ICE handling, clustermgtd.py:1277). The failed name too:
    SuspendProgram holds it as slurmctld powers it down, so the requeued job never takes it again
    (on the code before, it was idle~ after SuspendTimeout and the job cycled on it, PoolHeld, for
    minutes until a reconcile round held it)."""
    wait_powered_down(box, but=HELD_NODE)
    spot = box.stack.templates["spot"]
    before = {i["InstanceId"] for i in box.instances(gpuplat_pool="spot")}
    log_before = controller_log(box)
    box.faults.refuse_capacity(spot)
    try:
        job = submit(box, "sleep 5", "--requeue", partitions="spot,spot2")
        # The refusal on spot by the resume program's line, not any RunInstances (spot3's, for e, may come).
        refusal = "resume: pool spot: run_instances for "
        wait_for("the refused launch", lambda: refusal in controller_log(box)[len(log_before) :] or None, 180)
        refused = time.monotonic()
        # RUNNING, or already done: the job runs 5 s, which a poll through podman under load can miss
        # (the box once waited out BOOT_DEADLINE_S for a job that had completed). Not sacct's RUNNING:
        # sacct says so while the job's nodes still boot (CONFIGURING).
        wait_for(
            f"job {job} running",
            lambda: (
                slurm(box, f"squeue -h -j {job} -o %T", False).strip() == "RUNNING"
                or job_state(box, job) == "COMPLETED"
                or None
            ),
            BOOT_DEADLINE_S,
            every_s=1,
        )
        FIGURES["capacity error -> job running on the next pool s"] = time.monotonic() - refused
        assert wait_ended(box, job) == "COMPLETED", explain(box, job)
        assert slurm(box, f"sacct -nXP -j {job} -o NodeList").strip() == "spot2-0", explain(box, job)
    finally:
        box.faults.refuse_capacity(spot, False)
    log = controller_log(box)[len(log_before) :]
    assert "pool spot: InsufficientInstanceCapacity: capacity cool-down" in log
    assert "(PoolHeld)" not in log, log
    assert {i["InstanceId"] for i in box.instances(gpuplat_pool="spot")} == before


def test_d_a_two_node_job_on_capacity_for_one_launches_nothing_and_runs_on_the_next_attempt(box: Any) -> None:
    """All or nothing per job (SLURM_RESUME_FILE): with capacity for one instance, the job's two names
    are asked for in one RunInstances with MinCount 2, which EC2 refuses whole; no instance idles
    waiting for the other. The capacity cool-down (60 s in the box) holds the one pool, then the job
    runs on the next attempt."""
    # Both names must be launched by this job: none still up from c, none held by k's cool-down (its
    # names are DOWN until it is over). spot2 is not this job's partition: k's node may still be up.
    wait_powered_down(box, pool="spot")
    # This job's refusal, by the resume program's line: not any RunInstances, since spot3's node may be
    # launched meanwhile (e's requeued job, once its ResumeTimeout is over), and take the one instance.
    refusal = "resume: pool spot: run_instances for spot-0,spot-1 failed"
    refusals = controller_log(box).count(refusal)
    before = {i["InstanceId"] for i in box.instances(gpuplat_pool="spot")}
    box.faults.limit_capacity(1)
    job = submit(box, "srun hostname", "-N 2")
    wait_for("the failed launch", lambda: controller_log(box).count(refusal) > refusals or None, 180)
    failed_at = time.monotonic()
    time.sleep(5)  # a best-effort resume would have its one instance by now
    assert {i["InstanceId"] for i in box.instances(gpuplat_pool="spot")} == before, (
        "an instance launched for part of the job"
    )
    box.faults.limit_capacity(None)
    assert wait_ended(box, job) == "COMPLETED", explain(box, job)
    FIGURES["capacity error -> job done on the next attempt s"] = time.monotonic() - failed_at
    assert "InsufficientInstanceCapacity" in controller_log(box)


# i: the name whose instance is terminated from outside (one of d's two, both up after d).
I_NODE = "spot-0"
# i: reconcile's round (slurm_elastic_reconcile_interval_s, 20 s in the box) and the round's own time.
REQUEUE_BOUND_S = 60
# i: the requeued job's credential wait (cred_expire 30 s + 1), a resume and a boot from the pool image
# (35 to 72 s measured), slurmd's registration.
BACK_IN_SERVICE_BOUND_S = 300


def test_i_an_instance_terminated_from_outside_requeues_its_job_and_the_name_comes_back(box: Any) -> None:
    """Terminated from outside (the console, a reclaim without notice): Slurm alone would wait for
    slurmd to stop answering, then SlurmdTimeout; reconcile sees a node in service without a live
    instance and replaces it in its next round (ParallelCluster's is_backing_instance_valid)."""
    marker = f"{CHECKPOINTS}/box-i-first-run"
    # On spot-0 (d left both of spot's names up), so that the requeued attempt must have the same name
    # back: unpinned, it once ran on spot-1, d's other node, and the name's return went unchecked.
    script = f"if [ -e {marker} ]; then echo again; else touch {marker}; sleep 900; fi"
    job = submit(box, script, f"--requeue -w {I_NODE}")
    # squeue's RUNNING, not CONFIGURING (sacct says RUNNING for both): the node has booted and is in
    # service. An instance gone while its node is still powering up is resume-fail's, at ResumeTimeout.
    wait_for(
        f"job {job} running",
        lambda: slurm(box, f"squeue -h -j {job} -o %T", False).strip() == "RUNNING" or None,
        BOOT_DEADLINE_S,
    )
    node = slurm(box, f"squeue -h -j {job} -o %N").strip()
    [instance] = live(box, gpuplat_node=node)
    a_job_user_gets_no_credentials_and_no_munge_key(box, instance["InstanceId"])
    # RUNNING is the allocation, not the batch script: under load (13) slurmd had not started it when the
    # instance went, so the requeued attempt found no marker and slept its 900 s. Its first run's marker.
    wait_for(f"job {job}'s script started", lambda: slurm(box, f"test -e {marker} && echo yes", False), 60)
    box.ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    gone = time.monotonic()

    def requeued() -> bool | None:
        restarts = re.search(r"Restarts=(\d+)", slurm(box, f"scontrol -o show job {job}", check=False))
        return (restarts is not None and int(restarts.group(1)) >= 1) or None

    wait_for(f"job {job} requeued", requeued, REQUEUE_BOUND_S, every_s=1)
    FIGURES["instance terminated from outside -> job requeued s"] = time.monotonic() - gone
    assert f"reconcile: replacing {node}: gpuplat reconcile: replaced" in controller_log(box)
    assert wait_ended(box, job, BACK_IN_SERVICE_BOUND_S) == "COMPLETED", explain(box, job)
    FIGURES["instance terminated from outside -> job done on a new instance s"] = time.monotonic() - gone
    assert slurm(box, f"sacct -nXP -j {job} -o NodeList").strip() == node == I_NODE, explain(box, job)
    again = live(box, gpuplat_node=node)
    assert again and again[0]["InstanceId"] != instance["InstanceId"]


# A token request as IMDSv2 takes it, printing the HTTP status or the error.
TOKEN_PUT = (
    "import urllib.request as u\n"
    "r = u.Request('http://169.254.169.254/latest/api/token', method='PUT',"
    " headers={'X-aws-ec2-metadata-token-ttl-seconds': '60'})\n"
    "try:\n    print(u.urlopen(r, timeout=3).status)\nexcept Exception as e:\n    print('refused', e)\n"
)


def a_job_user_gets_no_credentials_and_no_munge_key(box: Any, instance_id: str) -> None:
    """On a training node running alice's job: root gets an IMDS token, alice none (imds_guard's
    nftables table), so no instance credentials to read the key from SSM; nor the key file."""
    put = f"python3 -c {shlex.quote(TOKEN_PUT)}"
    assert box.sh(instance_id, put).strip() == "200"
    assert box.sh(instance_id, f"su alice -c {shlex.quote(put)}").startswith("refused")
    assert "Permission denied" in box.sh(
        instance_id, "su alice -c 'cat /etc/munge/munge.key' 2>&1", check=False
    )


def test_e_a_node_that_never_boots_comes_back_to_power_saving(box: Any) -> None:
    """Checked after i: the held boot's ResumeTimeout ran out while the other scenarios worked on spot and
    spot2. When its instance was terminated is the hypervisor's note, taken as it happened."""
    instance_id, node, job = HELD["instance"], HELD["node"], HELD["job"]
    bound = box.resume_timeout_s + 180
    wait_for(
        f"{instance_id} terminated after ResumeTimeout",
        lambda: terminated(box, instance_id),
        bound - (time.monotonic() - HELD["since"]),
    )
    wait_for(f"the hypervisor saw {instance_id} end", lambda: instance_id in box.hypervisor.ended or None, 30)
    FIGURES["held boot -> terminated s"] = box.hypervisor.ended[instance_id] - HELD["since"]
    # Within the bound by the hypervisor's note: the wait above, begun after i, passes whenever the end came.
    assert box.resume_timeout_s <= FIGURES["held boot -> terminated s"] <= bound
    # Requeued, not failed. The requeued job is eligible again cred_expire later and resumes the node anew
    # (its next boot is not held, from the pool image), so by now it may be running or done there: any of
    # those counts, with a restart recorded (scontrol keeps an ended job for MinJobAge, 300 s; after that,
    # sacct -D lists each attempt of a requeued job).
    # (squeue and scontrol refuse a job id slurmctld has purged.)
    state = slurm(box, f"squeue -h -j {job} -o %T", check=False).strip() or job_state(box, job)
    assert state in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETED"), explain(box, job)
    restarts = re.search(r"Restarts=(\d+)", slurm(box, f"scontrol show job {job}", check=False))
    # One line per attempt: a requeue starts a new accounting record of the job id, shown with -D only
    # (Slurm's sacct.1, field Submit: "If a job is requeued, the submit time is reset ... -D/--duplicates
    # ... display all duplicate entries for a job"). Lines, not words: "CANCELLED by 0" is one state.
    attempts = slurm(box, f"sacct -D -nXP -j {job} -o State").splitlines()
    assert (restarts is not None and int(restarts.group(1)) >= 1) or len(attempts) >= 2, explain(box, job)
    slurm(box, f"scancel {job}", check=False)
    # A node that was resuming again boots (its next boot is not held), idles, then powers down.
    back = 120 if state == "PENDING" else box.resume_timeout_s + 180
    wait_for(
        f"{node} back in power saving", lambda: node_states(box)[node] == "idle~" or None, back, every_s=1
    )


def test_g_idle_nodes_are_suspended_and_their_instances_terminated(box: Any) -> None:
    start = time.monotonic()
    wait_powered_down(box)
    wait_for("no live training instance", lambda: not live(box, gpuplat_role="train") or None, 180)
    FIGURES["last job ended -> instances terminated s"] = time.monotonic() - start


# h: after the teardown, the controllers' next try at the pending jobs' names: a requeue (reconcile's round,
# 20 s), cred_expire + 1 (31 s) or SuspendTimeout (15 s), the resume itself, with room for a loaded machine.
RELAUNCH_TRY_BOUND_S = 150
FLEET_STOPPED_REFUSAL = "is held (gpuplat fleet stopped"


def test_h_gpuplat_down_stops_the_fleet_tears_it_down_then_destroys_leaving_nothing(box: Any) -> None:
    """`gpuplat down`'s own path (infra/lifecycle/fleet.py destroy_with_fleet) with live Slurm-launched
    instances, slurmctld and reconcile running on the controller and jobs pending: the fleet is stopped
    (its launch templates tagged, which the resume program reads), torn down and waited for, and only
    then destroyed. A job submitted once the fleet is stopped makes slurmctld resume its node at once,
    and the job whose instance the teardown took is requeued and resumed again after it: the resume
    program refuses both, during the teardown and after it, so no instance comes back. At the end no
    instance of the stack is left in any state but terminated (stopped or stopping would be), each
    ended by the program whose log says so: the teardown the fleet's, the destroy the controllers."""
    stack = box.platform.name
    submit(box, "sleep 600", "--requeue", partitions="spot")
    wait_for("a training instance", lambda: live(box, gpuplat_role="train") or None, 120)
    ever = {i["InstanceId"] for i in box.instances(gpuplat_stack=stack)}
    up = {i["InstanceId"] for i in box.instances(*NOT_TERMINATED, gpuplat_stack=stack)}
    lines: list[str] = []
    during: dict[str, str] = {}

    def refused_once_more(what: str, timeout_s: float) -> None:
        refusals = controller_log(box).count(FLEET_STOPPED_REFUSAL)
        wait_for(what, lambda: controller_log(box).count(FLEET_STOPPED_REFUSAL) > refusals or None, timeout_s)

    def on_line(line: str) -> None:
        lines.append(line)
        if line.startswith("teardown: fleet of stack") and not during:
            # Stopped, nothing terminated yet: a job for a powered-down pool, which slurmctld resumes
            # at once; the teardown goes on once the controller's resume program refused to launch.
            refusals = controller_log(box).count(FLEET_STOPPED_REFUSAL)
            during["job"] = submit(box, "hostname", partitions="spot2")
            wait_for(
                "the resume refused during the teardown",
                lambda: controller_log(box).count(FLEET_STOPPED_REFUSAL) > refusals or None,
                120,
            )

    def before_destroy() -> None:
        """The teardown is over and the controllers still run: nothing of the fleet is left, and the
        controllers' next try at the pending jobs is refused too."""
        assert not box.instances(*NOT_TERMINATED, gpuplat_role="train")
        assert {state_of(box, i) for i in box.stack.controllers.values()} == {"running"}
        refused_once_more("the resume refused after the teardown", RELAUNCH_TRY_BOUND_S)
        assert not box.instances(*NOT_TERMINATED, gpuplat_role="train")

    start = time.monotonic()
    result, destroyed = box.down(on_line, before_destroy)
    FIGURES["gpuplat down -> nothing left s"] = time.monotonic() - start
    assert result == "destroyed"
    assert during, f"the fleet was never stopped: {lines}"
    left = box.instances(*NOT_TERMINATED, gpuplat_stack=stack)
    assert not left, [(i["InstanceId"], i["State"]["Name"]) for i in left]
    assert {i["InstanceId"] for i in box.instances(gpuplat_stack=stack)} == ever, "launched during `down`"
    # Which program ended what: the teardown's lines name the fleet's instances, the destroy the rest.
    by_teardown = {
        i for i in up if any(line.startswith("teardown: terminating") and i in line for line in lines)
    }
    assert by_teardown == up - set(destroyed), lines
    assert set(destroyed) == set(box.stack.controllers.values()) <= up
    print("\nbox figures: " + ", ".join(f"{k} {v:.0f}" for k, v in FIGURES.items()))
