"""Elastic Slurm training pools on EC2: the programs of Slurm power saving.

Every node name of a pool (``<pool>-<i>``) is defined in slurm.conf (State=CLOUD). Slurm runs:

  resume HOSTLIST       (ResumeProgram) launch one new instance per node name from the pool's launch
                        template, tag it, and tell Slurm its address. The names of each job of
                        SLURM_RESUME_FILE are launched all or nothing (MinCount = their number;
                        resume_file.py; Slurm 21.08 and 22.05 name them under "nodes", 23.02 on
                        under "nodes_resume"); names of no job best effort. An instance a name still has from
                        before is terminated, never reused (Slurm ignores a registration from before the
                        resume request). Names that got no usable instance (an EC2 error such as
                        InsufficientInstanceCapacity, or no private address) lose the instance they may
                        have got and are set POWER_DOWN_FORCE with the error code in the reason: their
                        jobs requeue and the names return to power saving (idle~). A capacity error
                        holds the pool (capacity cool-down, below); a held pool's names get no launch
                        (reason PoolHeld).
  suspend HOSTLIST      (SuspendProgram) terminate the instances of those node names.
  resume-fail HOSTLIST  (ResumeFailProgram) nodes that did not register within ResumeTimeout, which
                        Slurm has set DOWN+POWERED_DOWN: terminate their instances, count a boot failure
                        of their pool (protected mode, below), then POWER_DOWN_FORCE them so they return
                        to power saving (idle~).

on the controller, from systemd timers:

  keep-static           keep the pools' static nodes up: power up those Slurm has powered down;
                        replace a DOWN one (terminate its instance, POWER_DOWN_FORCE; a later round
                        powers it up). A drained static node is reconcile's. A static node
                        that keeps needing this is retried with exponential back-off (base doubling up
                        to a bound), kept in <state_dir>/keep-static.json.
  reconcile             terminate the stack's fleet instances (tags gpuplat:stack and gpuplat:role
                        train, whatever their pool: a pool removed or renamed too) that no node owns:
                        (a) without a gpuplat:node tag
                        and older than the grace, (b) named for a node Slurm does not know (older than
                        the grace), or for a node powered
                        down or powering down for at least the grace less one round (first seen in
                        <state_dir>/reconcile.json), (c) the other instances of a node that has a
                        live one (kept: the one at the node's NodeAddr, else the newest live one),
                        older than the grace. Unhealthy nodes are replaced (replacement.py, after
                        ParallelCluster's clustermgtd): their instances terminated, the names set
                        POWER_DOWN_FORCE (jobs requeued, back to power saving): dynamic nodes a failed
                        resume left DOWN+POWERED_DOWN (reason "ResumeTimeout reached", "gpuplat
                        resume..."), DOWN dynamic nodes, DRAINED nodes (drained and idle; not
                        spot-watch's drain), nodes in service whose NodeAddr has no live instance
                        behind it (terminated or stopped from outside: at once, not after
                        SlurmdTimeout). A node whose instance has an EC2 scheduled event
                        (instance-reboot, system-reboot, system-maintenance, instance-retirement,
                        instance-stop) is drained, so it is replaced once its jobs end. A node
                        in service on an older launch template version whose user data (the
                        bundle) is not the latest's is set POWER_DOWN_ASAP: its jobs finish, the
                        next launch boots the new definition (outdated.py). Every
                        decision is logged; a failed termination is tried again next round. An
                        orphan is gone within grace + timer interval.
                        Then the pools' holds: a pool's boot-failure count starts again when one of its
                        nodes comes up; a held pool's idle powered-down dynamic names are set DOWN with
                        the hold as reason; names DOWN for a hold that is over are POWER_DOWN_FORCE'd.

by an operator (before ``pulumi destroy``: Slurm-launched instances are not Pulumi resources):

  teardown              stop the fleet (the stack's training launch templates tagged
                        gpuplat:fleet=stopped: resume launches nothing from them), then terminate every
                        fleet instance of the stack (every state but terminated, any pool) and wait
                        (--timeout-seconds) until none is left; the ones left are listed.
                        `gpuplat down` runs it before `pulumi destroy`.
  pools                 each pool's hold and boot-failure count, as JSON.
  unprotect POOL        end the pool's protected mode (and its count); its held names are released.

Holds (holds.py, after ParallelCluster 3.11's clustermgtd): a capacity error (ParallelCluster's list of
codes) holds the pool for insufficient_capacity_timeout_s (capacity cool-down); protected_failure_count
boot failures in a row hold it until `unprotect` (protected mode). A held pool's names are DOWN, so a
job that may run elsewhere (a shared partition's GPU-type alternatives, several partitions) runs there.
State in <state_dir>/pools.json, under a lock.

and on a spot node, from systemd:

  spot-watch            on an interruption notice: drain this node, list its jobs, send SIGTERM to
                        their job steps and to every process of their batch steps but the batch
                        shell (`scontrol listpids`: a torchrun the script runs without srun is in no
                        job step), so the job survives to be requeued, wait the grace period for
                        them to checkpoint, POWER_DOWN_FORCE
                        the node (Slurm requeues the requeueable batch jobs still running and ends
                        the rest; the name gets a new instance), then requeue the requeueable batch
                        jobs that ended in the grace period.

Slurm behaviour relied on (21.08 Ubuntu 22.04, 22.05 Debian 12, 23.11 Ubuntu 24.04, 24.11 Debian 13;
tags slurm-21-08-5-1, slurm-22-05-8-1, slurm-23-11-4-1, slurm-24-11-5-1 of SchedMD/slurm):

- ResumeTimeout: a node still POWERING_UP is set DOWN+POWERED_DOWN ("ResumeTimeout reached") and
  ResumeFailProgram runs (src/slurmctld/power_save.c _do_power_work, all four). Nothing brings it
  back by itself: the suspend branch there needs a POWER_DOWN request or a last_busy (0 here).
- POWER_DOWN_FORCE (state=power_down_force) is accepted in any state while power saving is on
  (src/slurmctld/node_mgr.c _valid_node_state_change; 21.08 refuses any change to a node with
  INVALID_REG). update_node() kills the node's jobs, requeueing the batch jobs that allow it
  (kill_running_job_by_node_name), clears POWERING_UP and sets POWER_DOWN; 21.08 also sets the base
  state IDLE there. 22.05 (and 23.11 before 23.11.4) clears POWERED_DOWN so the power thread
  suspends the node again; 23.11.4+ keeps it and the power thread suspends POWERED_DOWN nodes too
  (_node_state_suspendable, commit e2dd4418d4). The suspend runs SuspendProgram (terminate:
  idempotent), sets POWERING_DOWN and, with SlurmctldParameters=idle_on_node_suspend (slurm.conf),
  the base state IDLE without DRAIN/FAIL; after SuspendTimeout the node is IDLE+POWERED_DOWN and
  allocatable (make_node_avail), unless SuspendProgram set it DOWN meanwhile (a held pool's name:
  holds.hold_powering_down). So POWER_DOWN_FORCE takes DOWN+POWERED_DOWN back to idle~ on every
  release; state=resume or state=idle would skip SuspendProgram, the NodeAddr reset and nodes with
  INVALID_REG, and state=resume sets NOT_RESPONDING (_require_node_reg). It is how ParallelCluster
  resets a failed dynamic node (aws-parallelcluster-node v3.11.0,
  src/common/schedulers/slurm_commands.py set_nodes_power_down, from src/slurm_plugin/clustermgtd.py).
- Static nodes are in SuspendExcNodes; a POWER_DOWN request overrides the exclusion (power_save.c:
  IS_NODE_POWER_DOWN comes before the avoid_node_bitmap test).
- `scancel --signal=SIG` without --full/--batch signals the job steps only, never the batch shell
  (src/slurmctld/job_mgr.c _signal_job: KILL_STEPS_ONLY; src/slurmd/slurmd/req.c
  _kill_all_active_steps skips SLURM_BATCH_SCRIPT), all four releases.
- `scontrol requeue` takes running, suspended *and finished* batch jobs back to PENDING
  (job_mgr.c _job_requeue_op: "we support requeue of done/exit/exiting jobs"); it refuses jobs
  without Requeue (ESLURM_DISABLED) and non-batch jobs (ESLURM_BATCH_ONLY), so only those with
  BatchFlag and Requeue (squeue --Format=JobID,BatchFlag,Requeue) are asked for. spot-watch asks
  only for jobs that already ended: a running job it requeued would still be COMPLETING on the node
  when POWER_DOWN_FORCE releases the node a second time (kill_running_job_by_node_name's COMPLETING
  branch), and on 22.05 the GPU of the job's next allocation then stays allocated for good (the box,
  scenario d: "gres/gpu: job N dealloc of node X bad node_offset 0 count is 0", gres_ctld.c). So the
  jobs still running are left to POWER_DOWN_FORCE, whose requeue is the node-failure one (the
  attempt is NODE_FAIL in accounting, the job PENDING with Restarts+1).
- Before 23.02, powered-down CLOUD nodes are listed only with PrivateData=cloud (node_mgr.c
  _is_cloud_hidden); slurm.conf sets it there. Were it missing, an instance of such a node would
  still only go after the grace, as an instance of a powered-down node does.

Instances carry the tags gpuplat:stack, gpuplat:pool, gpuplat:role (train), gpuplat:node and Name.
RunInstances is asked once by botocore (capacity errors come back at once) and again here on
throttling; CreateTags again on InvalidInstanceID.NotFound (ec2.py, retried). The configuration
is a JSON file (``--config``, default /etc/gpuplat/ec2-nodes.json)::

  {"stack": "prod", "region": "us-east-1", "scontrol": "/usr/bin/scontrol",
   "state_dir": "/var/lib/gpuplat", "orphan_grace_s": 300,
   "static_backoff_base_s": 60, "static_backoff_max_s": 3600,
   "insufficient_capacity_timeout_s": 600, "protected_failure_count": 10,
   "pools": {"train": {"launch_template_id": "lt-...", "subnet_id": "subnet-..." | null,
                       "static_nodes": ["train-0"]}}}

(state_dir, orphan_grace_s, static_backoff_*, insufficient_capacity_timeout_s and
protected_failure_count are optional, with these defaults; 0 turns a hold off). squeue and
scancel are looked up beside scontrol. spot-watch reads no configuration file. The EC2 endpoint is
boto3's (AWS_ENDPOINT_URL is honoured) unless ``--endpoint-url`` is given.

Exit codes:
  0  done (suspend of names without instances included)
  1  partly failed: a node got no instance, an EC2 call or a Slurm command failed, a state file
     could not be written, Slurm's node list could not be read (reconcile then terminates nothing),
     or instances are left after the teardown wait (they are listed)
  2  usage error: bad arguments, unreadable or malformed configuration, malformed hostlist, a pool
     `unprotect` does not know
  3  a node name belongs to no configured pool (the other names were handled)

The package: a module per command (resume.py: resume and resume-fail; suspend.py, keep_static.py,
reconcile.py, replacement.py and outdated.py, teardown.py, spot_watch.py), the pools' holds (holds.py: pools,
unprotect), the EC2 and Slurm sides they share (ec2.py, slurm.py), the configuration (settings.py), hostlists
(hostlist.py), state files (state.py), and the command line (cli.py, run as ``python3 -m
gpuplat_ec2_nodes``). roles/slurm_elastic installs it in /usr/local/lib/gpuplat and, as the command
gpuplat-ec2-nodes, a launcher that runs cli.main.
"""
