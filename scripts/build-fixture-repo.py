#!/usr/bin/env python3
"""Build the offline fixture package repositories the role tests install from.

Every package name and version comes from infra/data/packages.yaml, the table of what NVIDIA's and
the distribution's real repositories carry: the fixture can offer nothing the real world lacks, and
the build checks its own indexes against the table before it finishes. What this script adds is
only the payload: stand-in binaries that say they are stand-ins and fail without a GPU, unit files,
version files. The layout mirrors NVIDIA's repositories so the roles use the same URL shapes
against the fixture as against NVIDIA or a mirror:

  <out>/cuda/<cuda_repo>/x86_64/         flat apt repo per release, like NVIDIA's
                                         developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/
      *.deb Packages Packages.gz Release InRelease Release.gpg
      gpuplat-fixture.pub                ASCII-armoured signing key (NVIDIA ships e.g. 3bf863cc.pub)
  <out>/libnvidia-container/gpgkey       key, like nvidia.github.io/libnvidia-container/gpgkey
  <out>/libnvidia-container/stable/deb/amd64/   flat apt repo for the container toolkit
  <out>/distro/<release>/                flat apt repo standing in for the distribution's archive, for
                                         the kernel headers DKMS needs (the test nodes have no network)
  <out>/efa/aws-efa-installer-<v>.tar.gz a stand-in for the AWS EFA installer tarball

The repositories carry several versions on purpose (as the real ones do): driver branches 570 and
580 under the same Debian-style names (branch pinning), two CUDA 12.8 updates, NCCL releases,
toolkit releases.

The signing key is generated at build time into a throwaway GNUPGHOME and is never committed. The
build is skipped when the output is up to date with this script and the facts table (a stamp holds
their hash); --force rebuilds.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.data.packages import (  # noqa: E402
    PACKAGES_FILE,
    PackageFacts,
    Release,
    Repository,
    package_facts,
)

DEFAULT_OUT = ROOT / "build" / "fixture-repo"
KEY_UID = "gpuplat fixture repository (TEST ONLY) <fixture-repo@gpuplat.invalid>"
# The releases the Molecule GPU scenario installs on (its base image).
FIXTURE_RELEASES = ("debian12",)


@dataclass
class Deb:
    name: str
    version: str
    depends: list[str] = field(default_factory=list)
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # path -> (content, mode)
    arch: str = "amd64"

    @property
    def upstream(self) -> str:
        v = self.version.split(":", 1)[-1]
        return v.rsplit("-", 1)[0] if "-" in v else v


def stub(name: str, message: str, rc: int) -> tuple[str, int]:
    return (
        f'#!/bin/sh\n# gpuplat test fixture stand-in for {name}\necho "{message}" >&2\nexit {rc}\n',
        0o755,
    )


def unit(description: str, exec_start: str) -> tuple[str, int]:
    text = f"""\
        [Unit]
        Description={description} (gpuplat test fixture)
        ConditionPathExists=/dev/nvidiactl

        [Service]
        ExecStart={exec_start}

        [Install]
        WantedBy=multi-user.target
        """
    return (textwrap.dedent(text), 0o644)


def payload(name: str, version: str) -> dict[str, tuple[str, int]]:
    """The stand-in files of a package, by its real name: what the roles and the scenario's checks
    look for on disk. Packages not listed here carry only their marker file."""
    upstream = version.split(":", 1)[-1].rsplit("-", 1)[0]
    no_gpu = (
        f"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver (fixture {upstream})"
    )
    if name == "libcuda1":
        return {f"/usr/lib/x86_64-linux-gnu/libcuda.so.{upstream}": ("", 0o644)}
    if name in ("nvidia-kernel-open-dkms", "nvidia-kernel-dkms"):
        flavour = "open" if "open" in name else "proprietary"
        return {f"/usr/src/nvidia-{upstream}/README.fixture": (flavour + "\n", 0o644)}
    if name == "nvidia-driver-cuda":
        return {"/usr/bin/nvidia-smi": stub("nvidia-smi", no_gpu, 9)}
    if name == "nvidia-persistenced":
        return {
            "/usr/bin/nvidia-persistenced": stub("nvidia-persistenced", "no NVIDIA device", 1),
            "/lib/systemd/system/nvidia-persistenced.service": unit(
                "NVIDIA Persistence Daemon", "/usr/bin/nvidia-persistenced --no-persistence-mode --verbose"
            ),
        }
    if name.startswith("nvidia-fabricmanager"):
        return {
            "/usr/bin/nv-fabricmanager": stub("nv-fabricmanager", "no NVSwitch found", 1),
            "/usr/share/nvidia/nvswitch/fabricmanager.cfg": ("LOG_LEVEL=4\nFABRIC_MODE=0\n", 0o644),
            "/lib/systemd/system/nvidia-fabricmanager.service": unit(
                "NVIDIA fabric manager service",
                "/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg",
            ),
        }
    if name.startswith("libnvidia-nscq"):
        return {f"/usr/lib/x86_64-linux-gnu/libnvidia-nscq.so.{upstream}": ("", 0o644)}
    if name.startswith("cuda-cudart-") or name.startswith("cuda-nvcc-"):
        dot = name.rsplit("-", 2)[-2] + "." + name.rsplit("-", 1)[-1]
        prefix = f"/usr/local/cuda-{dot}"
        if name.startswith("cuda-cudart-"):
            return {f"{prefix}/lib64/libcudart.so.{upstream}": ("", 0o644)}
        return {
            f"{prefix}/bin/nvcc": (
                "#!/bin/sh\n# gpuplat test fixture stand-in for nvcc\n"
                f"echo 'Cuda compilation tools, release {dot}, V{upstream}'\n",
                0o755,
            )
        }
    if name.startswith("cuda-toolkit-"):
        dot = name.rsplit("-", 2)[-2] + "." + name.rsplit("-", 1)[-1]
        return {
            f"/usr/local/cuda-{dot}/version.json": (
                f'{{"cuda": {{"name": "CUDA SDK", "version": "{upstream}"}}}}\n',
                0o644,
            )
        }
    if name == "libnccl2":
        return {f"/usr/lib/x86_64-linux-gnu/libnccl.so.{upstream}": ("", 0o644)}
    if name == "libnccl-dev":
        major, minor, patch = upstream.split(".")
        header = (
            f"/* gpuplat test fixture stand-in for nccl.h */\n#define NCCL_MAJOR {major}\n"
            f"#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n"
        )
        return {"/usr/include/nccl.h": (header, 0o644), "/usr/lib/x86_64-linux-gnu/libnccl.so": ("", 0o644)}
    if name == "datacenter-gpu-manager-4-core":
        return {
            "/usr/bin/nv-hostengine": stub("nv-hostengine", "no NVIDIA driver loaded", 1),
            "/usr/bin/dcgmi": stub("dcgmi", "Unable to establish a connection to the host engine", 1),
            "/lib/systemd/system/nvidia-dcgm.service": unit(
                "NVIDIA DCGM service", "/usr/bin/nv-hostengine -n"
            ),
        }
    if name == "datacenter-gpu-manager-exporter":
        return {
            "/usr/bin/dcgm-exporter": stub("dcgm-exporter", "DCGM host engine not reachable", 1),
            "/etc/dcgm-exporter/default-counters.csv": (
                "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization.\n",
                0o644,
            ),
            "/lib/systemd/system/nvidia-dcgm-exporter.service": unit(
                "NVIDIA DCGM exporter", "/usr/bin/dcgm-exporter"
            ),
        }
    if name == "libnvidia-container1":
        return {"/usr/lib/x86_64-linux-gnu/libnvidia-container.so.1": ("", 0o644)}
    if name == "libnvidia-container-tools":
        return {"/usr/bin/nvidia-container-cli": stub("nvidia-container-cli", "no NVIDIA driver", 1)}
    if name == "nvidia-container-toolkit-base":
        return {
            "/usr/bin/nvidia-ctk": (
                "#!/bin/sh\n# gpuplat test fixture stand-in for nvidia-ctk\n"
                f'[ "$1" = --version ] && echo "NVIDIA Container Toolkit CLI version {upstream}" && exit 0\n'
                "echo 'nvidia-ctk fixture: no NVIDIA driver' >&2; exit 1\n",
                0o755,
            ),
            "/usr/bin/nvidia-container-runtime": stub("nvidia-container-runtime", "no NVIDIA driver", 1),
        }
    if name == "nvidia-container-toolkit":
        return {
            "/usr/bin/nvidia-container-runtime-hook": stub("nvidia-container-runtime-hook", "no driver", 1)
        }
    return {}


def planned_debs(facts: PackageFacts, release_id: str, repository: Repository) -> list[Deb]:
    """One stand-in per (name, version) the facts list for the release's repository. Depends are kept
    where they name packages of the same fixture repository (the rest live in the distribution)."""
    packages = list(facts.packages_of(release_id, (repository,)))
    names = {p.name for p in packages}
    debs = []
    for package in packages:
        for version in package.versions:
            depends = [
                d
                for d in package.depends_for(version)
                if all(alt.split()[0] in names for alt in d.split("|"))
            ]
            debs.append(Deb(package.name, version, depends=depends, files=payload(package.name, version)))
    return debs


def kernel_header_debs(release: Release, kernel: str) -> list[Deb]:
    """Stand-ins for the headers of the running kernel (the pattern of the facts, rendered as the role
    renders it) and its flavour's meta package, as the distribution's archive would offer them."""
    names = [release.kernel_headers.replace("{kernel}", kernel)] + [
        meta
        for flavour, meta in release.kernel_headers_by_kernel_flavour.items()
        if flavour in kernel.split("-")
    ]
    return [
        Deb(name, "1.0-1", files={f"/usr/src/{name}/README.fixture": ("headers\n", 0o644)}) for name in names
    ]


def parse_index(text: str) -> set[tuple[str, str]]:
    """(Package, Version) pairs of an apt Packages index."""
    pairs = set()
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
        if "Package" in fields:
            pairs.add((fields["Package"], fields["Version"]))
    return pairs


def unlisted(index: set[tuple[str, str]], offered: dict[str, set[str]]) -> list[str]:
    """What an index offers that the facts table does not list for that repository."""
    return sorted(f"{name} {version}" for name, version in index if version not in offered.get(name, set()))


def build_deb(deb: Deb, pool: Path, work: Path) -> None:
    root = work / f"{deb.name}_{deb.version.replace(':', '%3a')}"
    (root / "DEBIAN").mkdir(parents=True)
    files = dict(deb.files)
    files[f"/usr/share/doc/{deb.name}/gpuplat-fixture"] = (
        f"gpuplat test fixture: stand-in for NVIDIA's {deb.name} {deb.version}\n",
        0o644,
    )
    for path, (content, mode) in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(mode)
    control = [
        f"Package: {deb.name}",
        f"Version: {deb.version}",
        f"Architecture: {deb.arch}",
        "Maintainer: gpuplat test fixtures <fixture-repo@gpuplat.invalid>",
        "Section: multiverse/devel",
        "Priority: optional",
    ]
    if deb.depends:
        control.append("Depends: " + ", ".join(deb.depends))
    control.append(
        f"Description: test fixture standing in for NVIDIA's {deb.name}\n"
        " Contains no NVIDIA software; built by scripts/build-fixture-repo.py."
    )
    (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
    fname = f"{deb.name}_{deb.version.split(':', 1)[-1]}_{deb.arch}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root), str(pool / fname)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload,no-any-return]


def index_and_sign(repo: Path, gnupg: Path, origin: str, label: str) -> None:
    with open(repo / "Packages", "wb") as fh:
        run(["apt-ftparchive", "packages", "."], cwd=repo, stdout=fh)
    run(["gzip", "-9kf", "Packages"], cwd=repo)
    release = run(
        [
            "apt-ftparchive",
            "-o",
            f"APT::FTPArchive::Release::Origin={origin}",
            "-o",
            f"APT::FTPArchive::Release::Label={label}",
            "-o",
            "APT::FTPArchive::Release::Architectures=amd64",
            "release",
            ".",
        ],
        cwd=repo,
        stdout=subprocess.PIPE,
    ).stdout
    (repo / "Release").write_bytes(release)
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    for old in ("InRelease", "Release.gpg"):
        (repo / old).unlink(missing_ok=True)
    run(["gpg", "--batch", "--yes", "--clearsign", "-o", "InRelease", "Release"], cwd=repo, env=env)
    run(["gpg", "--batch", "--yes", "-abs", "-o", "Release.gpg", "Release"], cwd=repo, env=env)


def efa_installer_tarball(path: Path, version: str, plugin: str) -> None:
    script = textwrap.dedent(f"""\
        #!/bin/sh
        # gpuplat test fixture stand-in for the AWS EFA installer {version}.
        # Lays down the paths the rdma and nccl roles rely on; installs no software.
        set -e
        mkdir -p /opt/amazon/efa/bin /opt/amazon/efa/lib {plugin.rsplit("/", 1)[0]}
        printf '#!/bin/sh\\necho "provider: efa (fixture)"\\n' > /opt/amazon/efa/bin/fi_info
        chmod 0755 /opt/amazon/efa/bin/fi_info
        : > {plugin}
        echo "{version}" > /opt/amazon/efa_installed_packages
        echo "EFA installer fixture {version}: done"
        """)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = script.encode()
        info = tarfile.TarInfo("aws-efa-installer/efa_installer.sh")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())


def generate_key(gnupg: Path) -> tuple[bytes, bytes]:
    """A throwaway signing key: (ASCII-armoured, binary) public key."""
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    quick_gen = ["gpg", "--batch", "--quiet", "--passphrase", "", "--quick-gen-key", KEY_UID, "ed25519"]
    run([*quick_gen, "sign", "never"], env=env, stderr=subprocess.DEVNULL)
    armored = run(["gpg", "--batch", "--armor", "--export", KEY_UID], env=env, stdout=subprocess.PIPE).stdout
    binary = run(["gpg", "--batch", "--export", KEY_UID], env=env, stdout=subprocess.PIPE).stdout
    return armored, binary


def build(out: Path, facts: PackageFacts, kernel: str) -> int:
    """Build every fixture repository into `out`; returns the number of packages."""
    toolkit = out / "libnvidia-container" / "stable" / "deb" / "amd64"
    repos: list[tuple[Path, list[Deb], dict[str, set[str]], str]] = []
    for release_id in FIXTURE_RELEASES:
        release = facts.release(release_id)
        cuda = out / "cuda" / str(release.cuda_repo) / "x86_64"
        repos.append(
            (cuda, planned_debs(facts, release_id, "cuda"), facts.offered(release_id, "cuda"), "NVIDIA")
        )
        headers = kernel_header_debs(release, kernel)
        repos.append(
            (out / "distro" / release_id, headers, {d.name: {d.version} for d in headers}, "gpuplat distro")
        )
    repos.append(
        (
            toolkit,
            planned_debs(facts, FIXTURE_RELEASES[0], "container-toolkit"),
            facts.offered(FIXTURE_RELEASES[0], "container-toolkit"),
            "github.com/nvidia/libnvidia-container",
        )
    )
    with tempfile.TemporaryDirectory(prefix="gpuplat-fixture-") as tmp:
        gnupg = Path(tmp) / "gnupg"
        gnupg.mkdir(mode=0o700)
        armored, binary = generate_key(gnupg)
        for index, (repo, debs, offered, origin) in enumerate(repos):
            repo.mkdir(parents=True)
            for deb in debs:
                build_deb(deb, repo, Path(tmp) / f"debs-{index}")
            index_and_sign(repo, gnupg, origin, f"{origin} (gpuplat fixture)")
            extra = unlisted(parse_index((repo / "Packages").read_text()), offered)
            if extra:
                listed = PACKAGES_FILE.name
                raise SystemExit(
                    f"build-fixture-repo: {repo} offers what {listed} does not list: {', '.join(extra)}"
                )
            (repo / "gpuplat-fixture.pub").write_bytes(armored)
            (repo / "cuda-archive-keyring.gpg").write_bytes(binary)
        for release_id in FIXTURE_RELEASES:
            for installer in facts.efa_installer.releases:
                tarball = out / "efa" / f"aws-efa-installer-{installer.version}.tar.gz"
                efa_installer_tarball(
                    tarball, installer.version, installer.plugin_path(facts.release(release_id))
                )
                sign_detached(tarball, gnupg)
        # As AWS publishes its installer: a detached signature beside each tarball and the signing key; the
        # key's fingerprint for the scenario to pin in place of AWS's (rdma_efa_installer_key_fingerprint).
        (out / "efa" / "aws-efa-installer.key").write_bytes(armored)
        (out / "efa" / "fingerprint").write_text(fingerprint(gnupg) + "\n")
    (out / "libnvidia-container" / "gpgkey").write_bytes(armored)
    return sum(len(debs) for _, debs, _, _ in repos)


def sign_detached(path: Path, gnupg: Path) -> None:
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    run(["gpg", "--batch", "--yes", "--detach-sign", "-o", f"{path}.sig", str(path)], env=env)


def fingerprint(gnupg: Path) -> str:
    """The fixture key's primary fingerprint (the fpr record after its pub record, GnuPG doc/DETAILS)."""
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    listing = run(
        ["gpg", "--batch", "--with-colons", "--fingerprint", KEY_UID], env=env, stdout=subprocess.PIPE
    ).stdout.decode()
    records = [line.split(":") for line in listing.splitlines()]
    kinds = [record[0] for record in records]
    return records[kinds.index("fpr", kinds.index("pub"))][9]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args()
    out: Path = args.out.resolve()

    kernel = platform.release()
    digest = hashlib.sha256(
        Path(__file__).read_bytes() + PACKAGES_FILE.read_bytes() + kernel.encode()
    ).hexdigest()
    stamp = out / ".stamp"
    if not args.force and stamp.is_file() and stamp.read_text().strip() == digest:
        print(f"build-fixture-repo: {out} is up to date")
        return 0
    for tool in ("dpkg-deb", "apt-ftparchive", "gpg"):
        if shutil.which(tool) is None:
            print(
                f"build-fixture-repo: '{tool}' not found; run scripts/setup-host.sh as root", file=sys.stderr
            )
            return 2

    if out.exists():
        shutil.rmtree(out)
    count = build(out, package_facts(), kernel)
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    out.chmod(0o755)
    stamp.write_text(digest + "\n")
    print(f"build-fixture-repo: {count} packages from {PACKAGES_FILE.name} signed into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
