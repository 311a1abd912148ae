"""The EFA installer is run only when AWS's signature on it verifies (roles/rdma): AWS signs each
aws-efa-installer-<version>.tar.gz (a .sig beside it) with the key aws-efa-installer.key, fingerprint
4E90 91BC BB97 A96B 26B1 5E59 A054 80B1 DD2D 3CCC ("Get started with EFA and NCCL", step 5.3,
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html). The role's verifier
(roles/rdma/files/gpuplat-verify-signature.sh) runs here against real GnuPG with keys made for the test:
AWS's own key and signatures are not fetched (no network in the unit tier)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "rdma"
VERIFY = ROLE / "files" / "gpuplat-verify-signature.sh"
AWS_FINGERPRINT = "4E9091BCBB97A96B26B15E59A05480B1DD2D3CCC"


def gpg(home: Path, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        ["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "", *args],
        capture_output=True,
        text=True,
        check=True,
        input=stdin,
        env={**os.environ, "GNUPGHOME": str(home)},
    )
    return done.stdout


class Signer:
    def __init__(self, home: Path, name: str) -> None:
        home.mkdir(mode=0o700)
        self.home = home
        gpg(home, "--quick-gen-key", f"{name} <{name}@example.invalid>", "ed25519", "sign", "never")
        colons = gpg(home, "--with-colons", "--fingerprint")
        self.fingerprint = next(line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr:"))
        self.keyfile = home.parent / f"{name}.key"
        self.keyfile.write_text(gpg(home, "--armor", "--export", self.fingerprint))

    def sign(self, file: Path) -> Path:
        signature = file.with_name(file.name + f".{self.home.name}.sig")
        gpg(self.home, "--detach-sign", "--output", str(signature), str(file))
        return signature


@pytest.fixture(scope="module")
def signers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Signer, Signer]:
    base = tmp_path_factory.mktemp("gpg")
    return Signer(base / "publisher", "publisher"), Signer(base / "someone", "someone")


def verify(file: Path, signature: Path, keyfile: Path, fingerprint: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(VERIFY), str(file), str(signature), str(keyfile), fingerprint],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def tarball(tmp_path: Path) -> Path:
    file = tmp_path / "aws-efa-installer-1.47.0.tar.gz"
    file.write_bytes(b"the installer as published\n" * 100)
    return file


def test_the_publishers_signature_passes(signers: tuple[Signer, Signer], tarball: Path) -> None:
    publisher, _ = signers
    spaced = " ".join(publisher.fingerprint[i : i + 4] for i in range(0, 40, 4)).lower()
    done = verify(tarball, publisher.sign(tarball), publisher.keyfile, spaced)
    assert done.returncode == 0, done.stderr


def test_a_changed_file_is_refused(signers: tuple[Signer, Signer], tarball: Path) -> None:
    publisher, _ = signers
    signature = publisher.sign(tarball)
    tarball.write_bytes(tarball.read_bytes() + b"#")
    done = verify(tarball, signature, publisher.keyfile, publisher.fingerprint)
    assert done.returncode == 1 and "does not verify" in done.stderr


def test_a_key_file_with_another_key_is_refused(signers: tuple[Signer, Signer], tarball: Path) -> None:
    """A mirror that serves its own key and signs its own tarball with it."""
    publisher, someone = signers
    done = verify(tarball, someone.sign(tarball), someone.keyfile, publisher.fingerprint)
    assert done.returncode == 1 and "not the publisher's key" in done.stderr


def test_a_signature_by_another_key_in_the_key_file_is_refused(
    signers: tuple[Signer, Signer], tarball: Path, tmp_path: Path
) -> None:
    """The key file holds the publisher's key and another one, which signed the tarball."""
    publisher, someone = signers
    both = tmp_path / "both.key"
    both.write_text(publisher.keyfile.read_text() + someone.keyfile.read_text())
    done = verify(tarball, someone.sign(tarball), both, publisher.fingerprint)
    assert done.returncode == 1 and f"signed by key {someone.fingerprint}" in done.stderr


def test_a_signature_by_a_revoked_key_is_refused(
    tmp_path_factory: pytest.TempPathFactory, tarball: Path
) -> None:
    """The key file carries the publisher's revocation (GnuPG writes one for each new key under
    openpgp-revocs.d, its armour lines escaped with a colon); a good signature by the revoked key is refused,
    though GnuPG reports it VALIDSIG."""
    revoked = Signer(tmp_path_factory.mktemp("revoked") / "publisher", "revoked")
    signature = revoked.sign(tarball)
    certificate = revoked.home / "openpgp-revocs.d" / f"{revoked.fingerprint}.rev"
    gpg(revoked.home, "--import", stdin=certificate.read_text().replace(":-----BEGIN", "-----BEGIN"))
    revoked.keyfile.write_text(gpg(revoked.home, "--armor", "--export", revoked.fingerprint))
    done = verify(tarball, signature, revoked.keyfile, revoked.fingerprint)
    assert done.returncode == 1 and "is revoked" in done.stderr


def test_the_role_verifies_before_it_unpacks_and_pins_aws_key() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "efa.yml").read_text())
    names = [t["name"] for t in tasks]
    verify_at = next(i for i, t in enumerate(tasks) if "gpuplat-verify-signature" in str(t))
    unpack_at = next(i for i, t in enumerate(tasks) if "ansible.builtin.unarchive" in str(t))
    assert verify_at < unpack_at, names
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["rdma_efa_installer_key_fingerprint"].replace(" ", "") == AWS_FINGERPRINT


def test_the_installer_run_is_the_tarball_just_verified_unpacked_afresh() -> None:
    """The tarballs of every version unpack into one aws-efa-installer directory. A tree left there (the
    previous version on a day-2 upgrade, a kill mid-unpack, one unpacked before signatures were checked)
    must never be what runs: the role removes it and unpacks the verified tarball whenever it runs the
    installer, and nothing decides to skip the unpack on a file that tree holds."""
    tasks = yaml.safe_load((ROLE / "tasks" / "efa.yml").read_text())
    verify_at = next(i for i, t in enumerate(tasks) if "gpuplat-verify-signature" in str(t))
    [install] = [t for t in tasks if "efa_installer.sh" in str(t)]
    assert tasks.index(install) > verify_at
    assert install["when"] == (
        "(__rdma_efa_recorded.content | default('') | b64decode | trim) != rdma_efa_installer_version"
    )
    steps = install["block"]
    modules = [next(k for k in step if k.startswith("ansible.builtin.")) for step in steps]
    assert modules == ["ansible.builtin.file", "ansible.builtin.unarchive", "ansible.builtin.command"]
    removed, unpacked, run = steps
    unpacked_to = "{{ rdma_efa_installer_dir }}/aws-efa-installer"
    assert removed["ansible.builtin.file"] == {"path": unpacked_to, "state": "absent"}
    assert "creates" not in unpacked["ansible.builtin.unarchive"] and "when" not in unpacked
    assert run["ansible.builtin.command"]["chdir"] == unpacked_to and "when" not in run
