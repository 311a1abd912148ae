#!/usr/bin/env python3
"""Build the offline fixture package repositories the role tests install from.

The layout mirrors NVIDIA's own repositories so the roles use the same URLs
shape against a mirror as against NVIDIA:

  <out>/cuda/debian12/x86_64/            flat apt repo, like NVIDIA's
                                         developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/
      *.deb Packages Packages.gz Release InRelease Release.gpg
      gpuplat-fixture.pub                ASCII-armoured signing key (NVIDIA ships e.g. 3bf863cc.pub)
  <out>/libnvidia-container/gpgkey       key, like nvidia.github.io/libnvidia-container/gpgkey
  <out>/libnvidia-container/stable/deb/amd64/   flat apt repo for the container toolkit
  <out>/efa/aws-efa-installer-<v>.tar.gz a stand-in for the AWS EFA installer tarball

Packages carry NVIDIA's names, versions and Depends, and almost no payload
(a marker file, stub binaries, unit files). Several versions per package exist
on purpose: two drivers on branch 570 (version skew), a newer 580 driver with
the same Debian-style package names (branch pinning), NCCL for two CUDA
versions (CUDA-major pinning), two CUDA 12.8 updates, two toolkit releases.

The signing key is generated at build time into a throwaway GNUPGHOME and is
never committed. The build is skipped when the output is already up to date
with this script (a stamp holds the script's hash); --force rebuilds.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "build" / "fixture-repo"
KEY_UID = "gpuplat fixture repository (TEST ONLY) <fixture-repo@gpuplat.invalid>"

DRIVER_VERSIONS = ["570.172.08", "570.195.03", "580.95.05"]
CUDA_TOOLKITS = {  # toolkit package version -> (cudart version, nvcc version)
    "12.8.0": ("12.8.57", "12.8.61"),
    "12.8.1": ("12.8.90", "12.8.93"),
}
NCCL_BUILDS = ["2.26.5-1+cuda12.8", "2.27.3-1+cuda12.8", "2.27.3-1+cuda12.9"]
DCGM_VERSION = "1:4.2.3-1"
DCGM_EXPORTER_VERSION = "4.2.3-4.1.3-1"
TOOLKIT_VERSIONS = ["1.17.7-1", "1.17.8-1"]
EFA_INSTALLER_VERSION = "1.43.1"


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


def driver_packages(v: str) -> list[Deb]:
    branch = v.split(".")[0]
    rev = f"{v}-1"
    no_gpu = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver (fixture " + v + ")"
    )
    pkgs = [
        Deb("libcuda1", rev, files={"/usr/lib/x86_64-linux-gnu/libcuda.so." + v: ("", 0o644)}),
        Deb("nvidia-kernel-open-dkms", rev, files={f"/usr/src/nvidia-{v}/README.fixture": ("open\n", 0o644)}),
        Deb(
            "nvidia-kernel-dkms", rev, files={f"/usr/src/nvidia-{v}/README.fixture": ("proprietary\n", 0o644)}
        ),
        Deb(
            "nvidia-driver-cuda",
            rev,
            depends=[f"libcuda1 (= {rev})"],
            files={"/usr/bin/nvidia-smi": stub("nvidia-smi", no_gpu, 9)},
        ),
        Deb(
            "nvidia-persistenced",
            rev,
            files={
                "/usr/bin/nvidia-persistenced": stub("nvidia-persistenced", "no NVIDIA device", 1),
                "/lib/systemd/system/nvidia-persistenced.service": unit(
                    "NVIDIA Persistence Daemon", "/usr/bin/nvidia-persistenced --verbose"
                ),
            },
        ),
        Deb(
            f"cuda-drivers-{branch}",
            rev,
            depends=[
                f"nvidia-driver-cuda (= {rev})",
                f"nvidia-persistenced (= {rev})",
                f"nvidia-kernel-open-dkms (= {rev}) | nvidia-kernel-dkms (= {rev})",
            ],
        ),
        # From 580 on NVIDIA dropped the branch from the fabric manager's name.
        Deb(
            "nvidia-fabricmanager" if int(branch) >= 580 else f"nvidia-fabricmanager-{branch}",
            rev,
            files={
                "/usr/bin/nv-fabricmanager": stub("nv-fabricmanager", "no NVSwitch found", 1),
                "/usr/share/nvidia/nvswitch/fabricmanager.cfg": ("LOG_LEVEL=4\nFABRIC_MODE=0\n", 0o644),
                "/lib/systemd/system/nvidia-fabricmanager.service": unit(
                    "NVIDIA fabric manager service",
                    "/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg",
                ),
            },
        ),
        Deb(
            "libnvidia-nscq" if int(branch) >= 580 else f"libnvidia-nscq-{branch}",
            rev,
            files={f"/usr/lib/x86_64-linux-gnu/libnvidia-nscq.so.{v}": ("", 0o644)},
        ),
    ]
    return pkgs


def cuda_packages() -> list[Deb]:
    pkgs: list[Deb] = []
    for tk, (cudart, nvcc) in CUDA_TOOLKITS.items():
        major, minor, _ = tk.split(".")
        dash, dot = f"{major}-{minor}", f"{major}.{minor}"
        prefix = f"/usr/local/cuda-{dot}"
        pkgs += [
            Deb(
                f"cuda-cudart-{dash}",
                f"{cudart}-1",
                files={
                    f"{prefix}/lib64/libcudart.so.{cudart}": ("", 0o644),
                    f"{prefix}/version.json": (
                        f'{{"cuda": {{"name": "CUDA SDK", "version": "{tk}"}}}}\n',
                        0o644,
                    ),
                },
            ),
            Deb(
                f"cuda-nvcc-{dash}",
                f"{nvcc}-1",
                files={
                    f"{prefix}/bin/nvcc": (
                        "#!/bin/sh\n# gpuplat test fixture stand-in for nvcc\n"
                        f"echo 'Cuda compilation tools, release {dot}, V{nvcc}'\n",
                        0o755,
                    ),
                },
            ),
            Deb(
                f"cuda-toolkit-{dash}",
                f"{tk}-1",
                depends=[f"cuda-cudart-{dash} (>= {cudart})", f"cuda-nvcc-{dash} (>= {nvcc})"],
            ),
        ]
    for build in NCCL_BUILDS:
        upstream = build.split("-")[0]
        mj, mn, pt = upstream.split(".")
        pkgs += [
            Deb("libnccl2", build, files={f"/usr/lib/x86_64-linux-gnu/libnccl.so.{upstream}": ("", 0o644)}),
            Deb(
                "libnccl-dev",
                build,
                depends=[f"libnccl2 (= {build})"],
                files={
                    "/usr/include/nccl.h": (
                        f"/* gpuplat test fixture stand-in for nccl.h */\n#define NCCL_MAJOR {mj}\n"
                        f"#define NCCL_MINOR {mn}\n#define NCCL_PATCH {pt}\n",
                        0o644,
                    ),
                    "/usr/lib/x86_64-linux-gnu/libnccl.so": ("", 0o644),
                },
            ),
        ]
    dcgm_core = "datacenter-gpu-manager-4-core"
    pkgs += [
        Deb(
            dcgm_core,
            DCGM_VERSION,
            files={
                "/usr/bin/nv-hostengine": stub("nv-hostengine", "no NVIDIA driver loaded", 1),
                "/usr/bin/dcgmi": stub("dcgmi", "Unable to establish a connection to the host engine", 1),
                "/lib/systemd/system/nvidia-dcgm.service": unit(
                    "NVIDIA DCGM service", "/usr/bin/nv-hostengine -n"
                ),
            },
        ),
        Deb("datacenter-gpu-manager-4-cuda12", DCGM_VERSION, depends=[f"{dcgm_core} (= {DCGM_VERSION})"]),
        Deb(
            "datacenter-gpu-manager-exporter",
            DCGM_EXPORTER_VERSION,
            depends=[f"{dcgm_core} (>= 1:4.2.3)"],
            files={
                "/usr/bin/dcgm-exporter": stub("dcgm-exporter", "DCGM host engine not reachable", 1),
                "/etc/dcgm-exporter/default-counters.csv": (
                    "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization.\n",
                    0o644,
                ),
                "/lib/systemd/system/nvidia-dcgm-exporter.service": unit(
                    "NVIDIA DCGM exporter", "/usr/bin/dcgm-exporter"
                ),
            },
        ),
    ]
    return pkgs


def toolkit_packages() -> list[Deb]:
    pkgs: list[Deb] = []
    for v in TOOLKIT_VERSIONS:
        pkgs += [
            Deb(
                "libnvidia-container1",
                v,
                files={"/usr/lib/x86_64-linux-gnu/libnvidia-container.so.1": ("", 0o644)},
            ),
            Deb(
                "libnvidia-container-tools",
                v,
                depends=[f"libnvidia-container1 (= {v})"],
                files={"/usr/bin/nvidia-container-cli": stub("nvidia-container-cli", "no NVIDIA driver", 1)},
            ),
            Deb(
                "nvidia-container-toolkit-base",
                v,
                files={
                    "/usr/bin/nvidia-ctk": (
                        "#!/bin/sh\n# gpuplat test fixture stand-in for nvidia-ctk\n"
                        f'[ "$1" = --version ] && '
                        f"echo 'NVIDIA Container Toolkit CLI version {v.split('-')[0]}' && exit 0\n"
                        "echo 'nvidia-ctk fixture: no NVIDIA driver' >&2; exit 1\n",
                        0o755,
                    ),
                    "/usr/bin/nvidia-container-runtime": stub(
                        "nvidia-container-runtime", "no NVIDIA driver", 1
                    ),
                },
            ),
            Deb(
                "nvidia-container-toolkit",
                v,
                depends=[f"nvidia-container-toolkit-base (= {v})", f"libnvidia-container-tools (= {v})"],
                files={
                    "/usr/bin/nvidia-container-runtime-hook": stub(
                        "nvidia-container-runtime-hook", "no driver", 1
                    )
                },
            ),
        ]
    return pkgs


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


def efa_installer_tarball(path: Path) -> None:
    script = textwrap.dedent(f"""\
        #!/bin/sh
        # gpuplat test fixture stand-in for the AWS EFA installer {EFA_INSTALLER_VERSION}.
        # Lays down the paths the rdma and nccl roles rely on; installs no software.
        set -e
        mkdir -p /opt/amazon/efa/bin /opt/amazon/efa/lib /opt/amazon/ofi-nccl/lib
        printf '#!/bin/sh\\necho "provider: efa (fixture)"\\n' > /opt/amazon/efa/bin/fi_info
        chmod 0755 /opt/amazon/efa/bin/fi_info
        : > /opt/amazon/ofi-nccl/lib/libnccl-net.so
        echo "{EFA_INSTALLER_VERSION}" > /opt/amazon/efa_installed_packages
        echo "EFA installer fixture {EFA_INSTALLER_VERSION}: done"
        """)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = script.encode()
        info = tarfile.TarInfo("aws-efa-installer/efa_installer.sh")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args()
    out: Path = args.out.resolve()

    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
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
    cuda = out / "cuda" / "debian12" / "x86_64"
    toolkit = out / "libnvidia-container" / "stable" / "deb" / "amd64"
    cuda.mkdir(parents=True)
    toolkit.mkdir(parents=True)

    with tempfile.TemporaryDirectory(prefix="gpuplat-fixture-") as tmp:
        gnupg = Path(tmp) / "gnupg"
        gnupg.mkdir(mode=0o700)
        env = {**os.environ, "GNUPGHOME": str(gnupg)}
        run(
            [
                "gpg",
                "--batch",
                "--quiet",
                "--passphrase",
                "",
                "--quick-gen-key",
                KEY_UID,
                "ed25519",
                "sign",
                "never",
            ],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        armored = run(
            ["gpg", "--batch", "--armor", "--export", KEY_UID], env=env, stdout=subprocess.PIPE
        ).stdout
        binary = run(["gpg", "--batch", "--export", KEY_UID], env=env, stdout=subprocess.PIPE).stdout

        work = Path(tmp) / "debs"
        for deb in [p for v in DRIVER_VERSIONS for p in driver_packages(v)] + cuda_packages():
            build_deb(deb, cuda, work)
        for deb in toolkit_packages():
            build_deb(deb, toolkit, work)

        index_and_sign(cuda, gnupg, "NVIDIA", "NVIDIA CUDA (gpuplat fixture)")
        index_and_sign(
            toolkit, gnupg, "github.com/nvidia/libnvidia-container", "libnvidia-container (gpuplat fixture)"
        )

    (cuda / "gpuplat-fixture.pub").write_bytes(armored)
    (cuda / "cuda-archive-keyring.gpg").write_bytes(binary)
    (out / "libnvidia-container" / "gpgkey").write_bytes(armored)
    efa_installer_tarball(out / "efa" / f"aws-efa-installer-{EFA_INSTALLER_VERSION}.tar.gz")
    for p in out.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    out.chmod(0o755)
    stamp.write_text(digest + "\n")
    count = len(list(cuda.glob("*.deb"))) + len(list(toolkit.glob("*.deb")))
    print(f"build-fixture-repo: {count} packages signed into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
