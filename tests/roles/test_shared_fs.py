"""Role shared_fs and the node health check's shared-filesystem checks (fast, no containers).

- the /etc/fstab entry per kind: source, type and options rendered from the role's own vars
  through its mount task (local-volume is not mounted by the role);
- the input checks: fsx-lustre refused on Debian (and Ubuntu releases AWS has no client for),
  checkpoints outside the shared filesystem refused, a mounted kind without a source refused;
- the systemd drop-ins that keep slurmd/slurmctld from starting before the mount;
- slurm_compute's health check, rendered from the role's defaults and run: a mount path that is
  not a mount point, or a checkpoint path that is missing, drains the node with a reason that
  names the path; a healthy node is left alone.
"""

from __future__ import annotations

import configparser
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.roles.ansible_values import render_value

yaml = pytest.importorskip("yaml")
jinja2 = pytest.importorskip("jinja2")
pytest.importorskip("ansible")

from ansible.parsing.dataloader import DataLoader  # noqa: E402
from ansible.template import Templar, trust_as_template  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "shared_fs"
COMPUTE = ROOT / "roles" / "slurm_compute"

FSX_SOURCE = "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh"
INVENTORY: dict[str, dict[str, Any]] = {
    "fsx-lustre": {"shared_fs_mount_path": "/fsx", "shared_fs_source": FSX_SOURCE},
    "lustre": {"shared_fs_mount_path": "/lustre", "shared_fs_source": "10.0.0.5@o2ib:/lustre"},
    "nfs": {"shared_fs_mount_path": "/shared", "shared_fs_source": "nfs1.example.org:/export/gpu"},
    "local-volume": {"shared_fs_mount_path": "/shared", "shared_fs_source": ""},
}
UBUNTU_2204 = {"distribution": "Ubuntu", "distribution_version": "22.04", "distribution_release": "jammy",
               "kernel": "6.8.0-1024-aws"}  # fmt: skip
DEBIAN_12 = {"distribution": "Debian", "distribution_version": "12", "distribution_release": "bookworm",
             "kernel": "6.1.0-37-cloud-amd64"}  # fmt: skip


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def env() -> jinja2.Environment:
    environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=False, keep_trailing_newline=True)
    environment.filters["comment"] = lambda text: "#\n# " + text + "\n#"
    return environment


def shared_fs_vars(kind: str, facts: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """The role's defaults and vars, rendered for a host of the given kind (inventory wins over defaults)."""
    variables: dict[str, Any] = {
        "ansible_managed": "Ansible managed",
        "inventory_hostname": "train-0",
        "ansible_facts": dict(facts or UBUNTU_2204),
        "shared_fs_kind": kind,
        "gpuplat_checkpoint_path": INVENTORY[kind]["shared_fs_mount_path"] + "/checkpoints",
        **INVENTORY[kind],
    }
    defaults = load(ROLE / "defaults" / "main.yml")
    variables.update({k: v for k, v in defaults.items() if k not in overrides})
    variables.update(overrides)
    for key in defaults:
        variables[key] = render_all(variables[key], variables)
    for key, value in load(ROLE / "vars" / "main.yml").items():
        variables[key] = render_all(value, variables)
    return variables


def task(tasks_file: str, module: str, name: str | None = None) -> dict[str, Any]:
    """The one task of tasks/<tasks_file> that calls module (and has that name, if given)."""
    found = [
        t for t in load(ROLE / "tasks" / tasks_file) if module in t and (name is None or t["name"] == name)
    ]
    assert len(found) == 1, f"{tasks_file}: expected one {module} task named {name!r}, found {len(found)}"
    return found[0]


def render_all(value: Any, variables: dict[str, Any]) -> Any:
    """render_value, also inside lists (argv, package lists)."""
    if isinstance(value, list):
        return [render_all(item, variables) for item in value]
    return render_value(env(), value, variables)


def render_args(args: dict[str, Any], variables: dict[str, Any]) -> dict[str, Any]:
    return {key: render_all(value, variables) for key, value in args.items()}


def conditional(expression: str, variables: dict[str, Any]) -> bool:
    """A when:/that: expression evaluated by Ansible's own templating."""
    templar = Templar(loader=DataLoader(), variables=variables)
    return bool(templar.evaluate_conditional(trust_as_template(expression)))


def as_list(value: Any) -> list[str]:
    return value if isinstance(value, list) else [value]


def fstab_entry(kind: str, **overrides: Any) -> tuple[bool, list[str]]:
    """(whether the role mounts it, the /etc/fstab fields ansible.posix.mount would write)."""
    variables = shared_fs_vars(kind, **overrides)
    mount = task("mount.yml", "ansible.posix.mount")
    mounted = all(conditional(c, variables) for c in as_list(mount.get("when", "true")))
    args = render_args(mount["ansible.posix.mount"], variables)
    assert args["state"] == "mounted"
    return mounted, [args["src"], args["path"], args["fstype"], args["opts"], args["dump"], args["passno"]]


# --- /etc/fstab per kind -----------------------------------------------------------------


def test_fsx_lustre_fstab_follows_awss_automatic_mount_recipe() -> None:
    mounted, (src, path, fstype, opts, dump, passno) = fstab_entry("fsx-lustre")
    assert mounted
    assert (src, path, fstype, dump, passno) == (FSX_SOURCE, "/fsx", "lustre", "0", "0")
    options = opts.split(",")
    for option in ("relatime", "flock", "_netdev", "x-systemd.automount"):
        assert option in options
    # Ubuntu 22.04+ has no network.service: requiring it would fail the mount unit at boot.
    assert "x-systemd.requires=systemd-networkd-wait-online.service" in options
    assert "x-systemd.requires=network.service" not in options


def test_onprem_lustre_mounts_the_given_source_with_cluster_wide_locks() -> None:
    mounted, (src, path, fstype, opts, _, _) = fstab_entry("lustre")
    assert mounted
    assert (src, path, fstype) == ("10.0.0.5@o2ib:/lustre", "/lustre", "lustre")
    assert {"flock", "_netdev"} <= set(opts.split(","))


def test_nfs_is_a_hard_v4_1_network_mount() -> None:
    mounted, (src, path, fstype, opts, _, _) = fstab_entry("nfs")
    assert mounted
    assert (src, path, fstype) == ("nfs1.example.org:/export/gpu", "/shared", "nfs")
    options = opts.split(",")
    assert {"nfsvers=4.1", "hard", "_netdev"} <= set(options)
    assert "soft" not in options  # a soft mount returns EIO to a job writing its checkpoint


def test_site_mount_options_override_the_defaults() -> None:
    _, fields = fstab_entry("nfs", shared_fs_nfs_mount_options="nfsvers=3,hard,_netdev")
    assert fields[3] == "nfsvers=3,hard,_netdev"


def test_local_volume_is_left_to_the_container_runtime_and_checked() -> None:
    mounted, _ = fstab_entry("local-volume")
    assert not mounted
    variables = shared_fs_vars("local-volume")
    check = task("mount.yml", "ansible.builtin.command")
    argv = render_args(check["ansible.builtin.command"], variables)["argv"]
    assert argv[0] == "findmnt" and argv[-2:] == ["--mountpoint", "/shared"]
    assert check.get("check_mode") is False  # the check also runs in check mode
    verdict = task("mount.yml", "ansible.builtin.assert")
    assert verdict["ansible.builtin.assert"]["that"] == ["__shared_fs_findmnt.rc == 0"]
    assert conditional(verdict["when"], {**variables, "ansible_check_mode": False, "__shared_fs_mount": {}})


def test_the_checkpoint_and_job_directories_are_created_after_the_mount_is_checked() -> None:
    tasks = load(ROLE / "tasks" / "mount.yml")
    modules = [next(k for k in t if k.startswith("ansible.")) for t in tasks]
    assert modules.index("ansible.builtin.assert") < modules.index("ansible.builtin.file")
    create = tasks[modules.index("ansible.builtin.file")]
    variables = shared_fs_vars("fsx-lustre")
    directories = [render_args(create["ansible.builtin.file"], variables | {"item": item})
                   for item in render_all(create["loop"], variables)]  # fmt: skip
    # The checkpoint root and the folder the manual copies job scripts to, sticky like /tmp.
    assert [d["path"] for d in directories] == ["/fsx/checkpoints", "/fsx/jobs"]
    assert all(d["state"] == "directory" and d["mode"] == "1777" for d in directories)
    without = shared_fs_vars("fsx-lustre", shared_fs_jobs_path="")
    assert render_all(create["loop"], without) == ["/fsx/checkpoints"]


# --- input checks -------------------------------------------------------------------------

FSX_RELEASE_CHECK = "AWS publishes an FSx for Lustre client for this release"


def assert_outcome(tasks_file: str, name: str, variables: dict[str, Any]) -> tuple[bool, str]:
    """(passes, rendered fail_msg) of the assert task with that name; a skipped assert passes."""
    check = task(tasks_file, "ansible.builtin.assert", name)
    if not all(conditional(c, variables) for c in as_list(check.get("when", "true"))):
        return True, ""
    passes = all(conditional(c, variables) for c in as_list(check["ansible.builtin.assert"]["that"]))
    templar = Templar(loader=DataLoader(), variables=variables)
    message = str(templar.template(trust_as_template(check["ansible.builtin.assert"]["fail_msg"])))
    return passes, message


def test_fsx_lustre_is_refused_on_debian_naming_the_supported_releases() -> None:
    passes, message = assert_outcome(
        "validate.yml", FSX_RELEASE_CHECK, shared_fs_vars("fsx-lustre", DEBIAN_12)
    )
    assert not passes
    assert "Debian 12" in message
    assert "Ubuntu 22.04 and 24.04" in message


@pytest.mark.parametrize(("version", "release"), [("22.04", "jammy"), ("24.04", "noble")])
def test_fsx_lustre_is_accepted_on_supported_ubuntu(version: str, release: str) -> None:
    facts = {**UBUNTU_2204, "distribution_version": version, "distribution_release": release}
    assert assert_outcome("validate.yml", FSX_RELEASE_CHECK, shared_fs_vars("fsx-lustre", facts))[0]


def test_fsx_lustre_is_refused_on_ubuntu_without_a_client() -> None:
    facts = {**UBUNTU_2204, "distribution_version": "20.04", "distribution_release": "focal"}
    assert not assert_outcome("validate.yml", FSX_RELEASE_CHECK, shared_fs_vars("fsx-lustre", facts))[0]


@pytest.mark.parametrize("kind", ["lustre", "nfs", "local-volume"])
def test_other_kinds_run_on_debian(kind: str) -> None:
    assert assert_outcome("validate.yml", FSX_RELEASE_CHECK, shared_fs_vars(kind, DEBIAN_12))[0]


@pytest.mark.parametrize(
    ("checkpoint", "accepted"),
    [("/fsx/checkpoints", True), ("/fsx", True), ("/scratch/checkpoints", False), ("/fsxlocal/ckpt", False)],
)
def test_checkpoints_must_be_on_the_shared_filesystem(checkpoint: str, accepted: bool) -> None:
    variables = shared_fs_vars("fsx-lustre", gpuplat_checkpoint_path=checkpoint)
    passes, message = assert_outcome(
        "validate.yml", "The checkpoint path is on the shared filesystem", variables
    )
    assert passes is accepted
    if not accepted:
        assert checkpoint in message and "root disk" in message


@pytest.mark.parametrize("kind", ["fsx-lustre", "lustre", "nfs"])
def test_a_mounted_kind_needs_a_source(kind: str) -> None:
    variables = shared_fs_vars(kind, shared_fs_source="")
    assert not assert_outcome("validate.yml", "The filesystem to mount has a source", variables)[0]


@pytest.mark.parametrize(
    ("path", "accepted"), [("/fsx", True), ("/", False), ("fsx", False), ("/my fsx", False)]
)
def test_mount_path_must_be_absolute_without_whitespace(path: str, accepted: bool) -> None:
    variables = shared_fs_vars("nfs", shared_fs_mount_path=path, gpuplat_checkpoint_path=path)
    name = "The mount path is an absolute path systemd and fstab can take"
    assert assert_outcome("validate.yml", name, variables)[0] is accepted


def test_fsx_repository_and_key_are_variables() -> None:
    variables = shared_fs_vars("fsx-lustre", shared_fs_fsx_repo_url="https://mirror.example/fsx/ubuntu")
    sources = (
        env()
        .from_string((ROLE / "templates" / "fsx-lustre-client.sources.j2").read_text())
        .render(**variables)
    )
    fields = dict(line.split(": ", 1) for line in sources.splitlines() if line and not line.startswith("#"))
    assert fields["URIs"] == "https://mirror.example/fsx/ubuntu"
    assert fields["Suites"] == "jammy"
    assert fields["Signed-By"] == variables["__shared_fs_fsx_keyring"]
    fetch = task("fsx-lustre.yml", "ansible.builtin.uri")
    assert fetch["ansible.builtin.uri"]["url"] == "{{ shared_fs_fsx_repo_key_url }}"
    assert variables["shared_fs_fsx_packages"][0] == "lustre-client-modules-6.8.0-1024-aws"


# --- systemd drop-ins ---------------------------------------------------------------------


@pytest.mark.parametrize("unit", ["slurmd.service", "slurmctld.service"])
def test_slurm_units_require_the_mount(unit: str) -> None:
    variables = {**shared_fs_vars("fsx-lustre"), "item": unit}
    dropin = task("systemd.yml", "ansible.builtin.template")
    args = render_args(dropin["ansible.builtin.template"], variables)
    assert args["dest"] == f"/etc/systemd/system/{unit}.d/gpuplat-shared-fs.conf"
    assert unit in render_value(env(), dropin["loop"], variables)
    text = env().from_string((ROLE / "templates" / args["src"]).read_text()).render(**variables)
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.read_string(text)
    assert parser.sections() == ["Unit"]
    assert parser["Unit"]["RequiresMountsFor"] == "/fsx"
    # systemd reads the drop-in only after a daemon-reload.
    handlers = load(ROLE / "handlers" / "main.yml")
    reload = [h for h in handlers if h.get("listen") == dropin["notify"]]
    assert reload and reload[0]["ansible.builtin.systemd_service"]["daemon_reload"] is True


def test_scheduler_playbook_mounts_before_any_slurm_role() -> None:
    plays = load(ROOT / "playbooks" / "scheduler.yml")
    roles = [
        (
            play["hosts"],
            [r["role"] for r in play.get("roles", [])]
            + [t["ansible.builtin.include_role"]["name"] for t in play.get("tasks", [])],
        )
        for play in plays
    ]
    first = next(i for i, (_, names) in enumerate(roles) if "shared_fs" in names)
    assert set(roles[first][0].split(":")) == {"slurm_controller", "slurm_compute"}
    later = [name for _, names in roles[first + 1 :] for name in names]
    earlier = [name for _, names in roles[:first] for name in names]
    assert {"slurm_controller", "slurm_compute", "slurm_dbd"} <= set(later)
    assert not [name for name in earlier if name.startswith("slurm")]


# --- node health check --------------------------------------------------------------------


def compute_role_vars() -> dict[str, Any]:
    loader = DataLoader()
    values: dict[str, Any] = {}
    for part in ("defaults", "vars"):
        path = COMPUTE / part / "main.yml"
        if path.exists():
            values.update(loader.load_from_file(str(path), trusted_as_template=True) or {})
    return values


def health_script(tmp_path: Path, mount_path: str, checkpoint_path: str) -> Path:
    """slurm_compute's health check as installed on a GPU-less node, from the inventory's paths."""
    variables = compute_role_vars()
    variables.update(
        ansible_managed="Ansible managed",
        inventory_hostname="train-0",
        gpuplat_gpu_count=0,
        gpuplat_gpu_model="",
        gpuplat_gpu_simulated=False,
        shared_fs_mount_path=mount_path,
        gpuplat_checkpoint_path=checkpoint_path,
    )
    return rendered_script(tmp_path, "gpuplat-node-health", variables)


def rendered_script(tmp_path: Path, template: str, variables: dict[str, Any]) -> Path:
    """slurm_compute's templates/<template>.j2 rendered as Ansible does, written to tmp_path/<template>."""
    templar = Templar(loader=DataLoader(), variables=variables)
    text = (COMPUTE / "templates" / f"{template}.j2").read_text()
    rendered = templar.template(trust_as_template(text), escape_backslashes=False,
                                overrides={"trim_blocks": True, "lstrip_blocks": False})  # fmt: skip
    script = tmp_path / template
    script.write_text(str(rendered))
    return script


def run_health(
    script: Path, tmp_path: Path, *args: str, read_only: Path | None = None
) -> tuple[int, str, list[str]]:
    """Run the check with scontrol replaced by a shell function that records its calls. `read_only`: a
    directory the check sees on a read-only filesystem (a read-only tmpfs mounted over it in a mount
    namespace of the check's own, so that root too finds it not writable, as on a real node)."""
    calls = tmp_path / "scontrol.log"
    calls.write_text("")
    environment = {
        "HOME": str(tmp_path),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        # Functions win over PATH lookups; the script resets PATH but inherits exported functions.
        "BASH_FUNC_scontrol%%": f'() {{ printf "%s\\n" "$*" >> {calls}; }}',
    }
    command = ["bash", str(script), *args]
    if read_only is not None:
        mount = f'mount -t tmpfs -o ro gpuplat-test-ro {shlex.quote(str(read_only))} && exec "$@"'
        command = ["unshare", "--mount", "--propagation", "private", "bash", "-c", mount, "bash", *command]
    done = subprocess.run(command, capture_output=True, text=True, env=environment,
                          timeout=60, check=False)  # fmt: skip
    return done.returncode, done.stderr, calls.read_text().splitlines()


def test_health_check_drains_a_node_without_its_shared_filesystem(tmp_path: Path) -> None:
    # A directory on the root disk where the shared filesystem should be mounted: not a mount point.
    mount = tmp_path / "fsx"
    mount.mkdir()
    script = health_script(tmp_path, str(mount), f"{mount}/checkpoints")
    rc, stderr, calls = run_health(script, tmp_path)
    assert rc == 1
    reason = f"gpuplat-health: {mount} not mounted;{mount}/checkpoints missing"
    assert reason in stderr
    assert f"update NodeName=train-0 State=DRAIN Reason={reason}" in calls


def test_health_check_drains_when_only_the_checkpoint_path_is_missing(tmp_path: Path) -> None:
    script = health_script(tmp_path, "/", str(tmp_path / "checkpoints"))
    rc, _, calls = run_health(script, tmp_path)
    assert rc == 1
    assert (
        f"update NodeName=train-0 State=DRAIN Reason=gpuplat-health: {tmp_path}/checkpoints missing" in calls
    )


def test_health_check_drains_when_the_checkpoint_path_is_read_only(tmp_path: Path) -> None:
    """Root may write to any directory of a read-write filesystem, and CI runs as root: the directory is
    made read-only by a read-only mount over it where the test runs as root, by its mode otherwise."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir(mode=0o555)
    script = health_script(tmp_path, "/", str(checkpoints))
    rc, _, calls = run_health(script, tmp_path, read_only=checkpoints if os.geteuid() == 0 else None)
    assert rc == 1
    assert f"update NodeName=train-0 State=DRAIN Reason=gpuplat-health: {checkpoints} not writable" in calls


def test_health_check_leaves_a_healthy_node_alone(tmp_path: Path) -> None:
    # "/" is a mount point everywhere; the checkpoint directory exists and is writable.
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    script = health_script(tmp_path, "/", str(checkpoints))
    rc, stderr, calls = run_health(script, tmp_path)
    assert (rc, stderr) == (0, "")
    assert not [call for call in calls if call.startswith("update")]


def test_health_check_dry_run_only_reports(tmp_path: Path) -> None:
    script = health_script(tmp_path, str(tmp_path), str(tmp_path))
    rc, stderr, calls = run_health(script, tmp_path, "--dry-run")
    assert rc == 1
    assert f"{tmp_path} not mounted" in stderr
    assert not [call for call in calls if call.startswith("update")]


def test_health_check_paths_default_to_the_inventorys_shared_filesystem() -> None:
    options = load(COMPUTE / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    for name in ("slurm_compute_health_check_mounts", "slurm_compute_health_check_writable_paths"):
        assert name in options
    variables = compute_role_vars()
    variables.update(shared_fs_mount_path="/fsx", gpuplat_checkpoint_path="/fsx/checkpoints")
    templar = Templar(loader=DataLoader(), variables=variables)
    assert templar.template(variables["slurm_compute_health_check_mounts"]) == ["/fsx"]
    assert templar.template(variables["slurm_compute_health_check_writable_paths"]) == ["/fsx/checkpoints"]


def task_prolog(tmp_path: Path, stack: str) -> Path:
    """slurm_compute's TaskProlog as the inventory of `stack` renders it."""
    from infra.nodes.inventory import platform_vars
    from infra.platform.resolve import load_platform
    from infra.spec.load import stack_file

    variables = compute_role_vars()
    variables.update(platform_vars(load_platform(stack_file(stack))), ansible_managed="Ansible managed")
    return rendered_script(tmp_path, "gpuplat-task-prolog", variables)


@pytest.mark.parametrize("stack", ["local", "aws-prod", "onprem"])
def test_every_task_finds_the_platform_without_a_login_shell(tmp_path: Path, stack: str) -> None:
    """`sbatch` exports the submitting shell's environment, which has the platform's variables only where
    it was a login shell (/etc/profile.d): the TaskProlog, which slurmstepd runs for the batch script too,
    gives every task the shared filesystem and the checkpoint path; a value the job set wins."""
    from infra.platform.resolve import load_platform
    from infra.spec.load import stack_file

    storage = load_platform(stack_file(stack)).spec.storage
    script = task_prolog(tmp_path, stack)
    bare = {"PATH": "/usr/bin:/bin", "SLURM_CPUS_ON_NODE": "4"}
    exported = subprocess.run(
        ["sh", str(script)], env=bare, capture_output=True, text=True, check=True
    ).stdout
    assert f"export GPUPLAT_CHECKPOINT_PATH={storage.checkpoint_path}" in exported.splitlines()
    assert f"export GPUPLAT_SHARED_PATH={storage.parallel_fs.mount_path}" in exported.splitlines()
    chosen = {**bare, "GPUPLAT_CHECKPOINT_PATH": "/elsewhere"}
    kept = subprocess.run(["sh", str(script)], env=chosen, capture_output=True, text=True, check=True).stdout
    assert "GPUPLAT_CHECKPOINT_PATH" not in kept
