"""The image seal (infra/backends/aws/image_seal.sh) run for real, in a container of the local base image
that holds what a configured node built by EC2 Image Builder holds: Image Builder's working directory with
its `perform_cleanup` marker and a TOE run's files, a populated Slurm spool, cloud-init's instance state,
a random seed, DHCP leases, authorized_keys and a dbus machine id of its own. What must survive and what
must go is asserted file by file.

Not modelled: the real Image Builder run after the component (its cleanup script reads the marker; the
page "Required post-build cleanup" of
https://docs.aws.amazon.com/imagebuilder/latest/userguide/security-best-practices.html says so)."""

from __future__ import annotations

import shlex
import shutil
import uuid
from pathlib import Path

import pytest
import yaml

from infra.backends.local.cluster import BASE_IMAGE
from infra.nodes.podman import exists, podman

ROOT = Path(__file__).resolve().parents[2]
SEAL = ROOT / "infra" / "backends" / "aws" / "image_seal.sh"

# A stand-in for cloud-init that only records how it was called (the base image has none).
CLOUD_INIT_STUB = '#!/bin/sh\necho "$@" >>/opt/gpuplat-cloud-init-calls\n'

KEPT = [
    "/tmp/imagebuilder_service/perform_cleanup",
    "/tmp/imagebuilder_service/TOE_2026-12-06_07-00-00_abcd/detailedoutput.json",
    "/opt/gpuplat/venv/bin/python3",
]
REMOVED = [
    "/tmp/ansible-tmp-1/AnsiballZ.py",
    "/var/tmp/build.log",
    "/var/lib/slurm/slurmd/conf-cache/slurm.conf",
    "/var/lib/slurm/slurmd/job00042/slurm_script",
    "/var/lib/slurm/slurmd/cred_state",
    "/var/lib/cloud/instances/i-0abc/user-data.txt",
    "/var/lib/systemd/random-seed",
    "/var/lib/dhcp/dhclient.ens5.leases",
    "/root/.ssh/authorized_keys",
    "/home/admin/.ssh/authorized_keys",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/munge/munge.key",
    "/opt/gpuplat/bundle.zip",
]

pytestmark = [
    pytest.mark.containers,
    pytest.mark.skipif(
        shutil.which("podman") is None or not exists("image", BASE_IMAGE),
        reason=f"needs podman and the base image {BASE_IMAGE} (make image)",
    ),
]


def sealed_container_report() -> str:
    populate = " && ".join(
        [f"mkdir -p $(dirname {p}) && echo state >{p}" for p in KEPT + REMOVED]
        + [
            f"printf %s {shlex.quote(CLOUD_INIT_STUB)} >/usr/local/bin/cloud-init",
            "chmod +x /usr/local/bin/cloud-init",
            "echo 0123456789abcdef0123456789abcdef >/var/lib/dbus/machine-id",
            "echo 0123456789abcdef0123456789abcdef >/etc/machine-id",
        ]
    )
    report = (
        f"for p in {' '.join(KEPT + REMOVED)}; do [ -e $p ] && echo present $p || echo absent $p; done;"
        " echo slurmd-spool-dir $([ -d /var/lib/slurm/slurmd ] && echo kept);"
        " echo machine-id-bytes $(stat -c %s /etc/machine-id);"
        " echo dbus-machine-id $(readlink /var/lib/dbus/machine-id);"
        " echo cloud-init-calls $(cat /opt/gpuplat-cloud-init-calls)"
    )
    name = f"gpuplat-test-seal-{uuid.uuid4().hex[:8]}"
    try:
        result = podman(
            "run", "--name", name, "--privileged", "--no-hosts", "--network", "none",
            "--volume", f"{SEAL}:/run/image_seal.sh:ro", BASE_IMAGE,
            "bash", "-c", f"set -e; umount /etc/hostname; {populate}; bash /run/image_seal.sh; {report}",
        )  # fmt: skip
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)
    return str(result.stdout)


@pytest.fixture(scope="module")
def report() -> str:
    return sealed_container_report()


def test_image_builders_working_directory_and_the_installed_software_survive(report: str) -> None:
    for path in KEPT:
        assert f"present {path}" in report, report


def test_what_belongs_to_one_instance_goes(report: str) -> None:
    for path in REMOVED:
        assert f"absent {path}" in report, report
    assert "slurmd-spool-dir kept" in report, "the spool directory stays, emptied"


def test_machine_ids_are_empty_and_dbus_follows_etc(report: str) -> None:
    assert "machine-id-bytes 0" in report
    assert "dbus-machine-id /etc/machine-id" in report


def test_cloud_init_cleans_its_own_state(report: str) -> None:
    assert "cloud-init-calls clean --logs" in report


def test_the_seal_clears_the_spool_slurmd_is_configured_with() -> None:
    """One spool directory: slurm.conf's SlurmdSpoolDir, the role's variable and the seal's default."""
    conf = (ROOT / "roles" / "slurm_common" / "templates" / "slurm.conf.j2").read_text()
    [configured] = [line.split("=", 1)[1] for line in conf.splitlines() if line.startswith("SlurmdSpoolDir=")]
    role = yaml.safe_load((ROOT / "roles" / "slurm_compute" / "defaults" / "main.yml").read_text())
    assert role["slurm_compute_spool_dir"] == configured
    assert f"slurmd_spool=${{GPUPLAT_SLURMD_SPOOL:-{configured}}}" in SEAL.read_text()
