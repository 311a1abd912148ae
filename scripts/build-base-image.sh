#!/usr/bin/env bash
# Build a local Debian systemd base image used by Molecule and the local cluster:
# debootstrap a minbase rootfs and `podman import` it (no registry is reachable
# from the test hosts). Skips when the image already exists.
#
#   scripts/build-base-image.sh [--force] [SUITE]
#
# SUITE is a Debian release the project supports: bookworm (Debian 12, the default,
# used by the local cluster) or trixie (Debian 13, the second OS of the role tests).
# The image is localhost/gpuplat-base:SUITE.
#
# Environment:
#   GPUPLAT_BASE_IMAGE   image name (default localhost/gpuplat-base:SUITE)
#   GPUPLAT_DEBIAN_MIRROR  Debian archive URL (default: read from the host's apt sources)
set -euo pipefail

force=0
SUITE=bookworm
for arg in "$@"; do
  case $arg in
    --force) force=1 ;;
    bookworm | trixie) SUITE=$arg ;;
    *)
      echo "build-base-image.sh: unknown argument '$arg'; allowed: --force, bookworm, trixie" >&2
      exit 2
      ;;
  esac
done
IMAGE=${GPUPLAT_BASE_IMAGE:-localhost/gpuplat-base:$SUITE}
HERE=$(cd "$(dirname "$0")" && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HERE/containers.conf}

# The suites of `make test` run side by side and may ask for the same image at once: one builds it,
# the others wait for it here.
mkdir -p /tmp/gpuplat-locks
exec 9>"/tmp/gpuplat-locks/base-image-$SUITE.lock"
flock 9

if ((!force)) && podman image exists "$IMAGE"; then
  echo "build-base-image.sh: $IMAGE already present (use --force to rebuild)"
  exit 0
fi

# The Debian mirror the host itself uses (any release: the archive holds them all) (deb822 .sources or one-line .list).
debian_mirror() {
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    # A stanza whose URIs is a Debian archive (not -security) and Suites has the host's release.
    uri=$(awk -v suite="$HOST_SUITE" '
      BEGIN { RS=""; FS="\n" }
      {
        u=""; s=""
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/)   { u=$i; sub(/^URIs:[ \t]*/, "", u); split(u, a, /[ \t]+/); u=a[1] }
          if ($i ~ /^Suites:/) { s=$i }
        }
        if (u != "" && u !~ /security/ && s ~ ("[ \t]" suite "([ \t]|$)")) { print u; exit }
      }' "$f")
    [[ -n $uri ]] && { echo "$uri"; return; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    uri=$(awk -v suite="$HOST_SUITE" '$1=="deb" && $0 !~ /security/ {
            for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i ~ /^[a-z]+:\/\//) { if ($(i+1)==suite) { print $i; exit } }
          }' "$f")
    [[ -n $uri ]] && { echo "$uri"; return; }
  done
  echo "http://deb.debian.org/debian"
}

HOST_SUITE=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-bookworm}")
MIRROR=${GPUPLAT_DEBIAN_MIRROR:-$(debian_mirror)}
ROOTFS=$(mktemp -d /var/tmp/gpuplat-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT

echo "build-base-image.sh: debootstrap $SUITE from $MIRROR"
debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,python3,python3-apt,dbus,iproute2,procps,sudo,ca-certificates,gnupg \
  "$SUITE" "$ROOTFS" "$MIRROR" >/dev/null

# Same mirror inside the image; no recommends, keep images small.
cat >"$ROOTFS/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
SOURCES
cat >"$ROOTFS/etc/apt/apt.conf.d/90gpuplat" <<'APTCONF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Retries "3";
APTCONF
# Units that make no sense in a container (and slow boot / fail there).
for unit in systemd-resolved.service systemd-timesyncd.service getty@tty1.service \
            apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
  ln -sf /dev/null "$ROOTFS/etc/systemd/system/$unit"
done
: >"$ROOTFS/etc/machine-id"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
# No package index in the image: date the lists directory back so that roles using
# apt's cache_valid_time see a stale index and refresh it.
touch -d '2000-01-01' "$ROOTFS/var/lib/apt/lists"

tar -C "$ROOTFS" -c . | podman import \
  --change 'CMD ["/sbin/init"]' \
  --change 'ENV container=podman' \
  --change 'STOPSIGNAL SIGRTMIN+3' \
  - "$IMAGE" >/dev/null
echo "build-base-image.sh: built $IMAGE"
