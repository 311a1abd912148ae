#!/bin/sh
# Build GDRCopy's kernel module gdrdrv (DKMS) for KERNEL against the source of the NVIDIA driver the node
# pins, unless the record STATE says this very build was done and the module is there.
#
#   gpuplat-gdrdrv-build GDRCOPY_VERSION DRIVER_VERSION FLAVOUR KERNEL STATE
#
# DKMS rebuilds gdrdrv for a new kernel only (packages/dkms.conf: AUTOINSTALL, nothing ties it to the
# nvidia module), so a driver changed on day 2 would keep a gdrdrv compiled against the old driver's
# headers and flavour; NVIDIA/gdrcopy README.md (v2.5.2, "Notes"): the flavour is read from the driver's
# source at build time, and a gdrdrv built for the open flavour does not load beside the proprietary one.
# The source is the pinned driver's (NVIDIA_SRC_DIR, src/gdrdrv/Makefile), not the first /usr/src/nvidia-*
# the Makefile would find, which is an older driver's where one was left behind.
# The record is removed before the build and written after the module is in place, so a build cut short
# is done again by the next run. Prints "built" when it built; exit 1 with what is wrong on stderr; 2 on
# bad usage. GPUPLAT_NVIDIA_SRC_ROOTS (default: /usr/src/kernel-modules /usr/src) is where driver sources
# are looked for.
set -u

if [ "$#" -ne 5 ]; then
    echo "usage: gpuplat-gdrdrv-build GDRCOPY_VERSION DRIVER_VERSION FLAVOUR KERNEL STATE" >&2
    exit 2
fi
gdrcopy=$1 driver=$2 flavour=$3 kernel=$4 state=$5

source_dir=""
for root in ${GPUPLAT_NVIDIA_SRC_ROOTS:-/usr/src/kernel-modules /usr/src}; do
    [ -d "$root" ] || continue
    found=$(find "$root" -maxdepth 3 -path "$root/nvidia-*$driver*/*" -name nv-p2p.c 2>/dev/null | sort | head -n 1)
    if [ -n "$found" ]; then
        source_dir=$(dirname "$found")
        break
    fi
done
if [ -z "$source_dir" ]; then
    echo "gdrdrv: no source of NVIDIA driver $driver (nvidia-*$driver*/**/nv-p2p.c under" \
        "${GPUPLAT_NVIDIA_SRC_ROOTS:-/usr/src/kernel-modules /usr/src}): gdrdrv builds against the driver's" \
        "DKMS source; is driver $driver installed (roles/gpu_driver)?" >&2
    exit 1
fi

wanted="gdrdrv $gdrcopy kernel $kernel nvidia $driver $flavour $source_dir"
if [ -f "$state" ] && [ "$(cat "$state")" = "$wanted" ] && modinfo -k "$kernel" gdrdrv >/dev/null 2>&1; then
    exit 0
fi

rm -f "$state"
log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT
# dkms 2.8 refuses to build a module/version/kernel already built, even with --force (prepare_build, die 3),
# and its unbuild fails where nothing is built: unbuild what there may be, then build and install.
dkms unbuild -m gdrdrv -v "$gdrcopy" -k "$kernel" >/dev/null 2>&1 || :
if ! NVIDIA_SRC_DIR=$source_dir dkms build -m gdrdrv -v "$gdrcopy" -k "$kernel" >"$log" 2>&1 \
    || ! dkms install -m gdrdrv -v "$gdrcopy" -k "$kernel" >>"$log" 2>&1; then
    echo "gdrdrv $gdrcopy did not build for kernel $kernel against $source_dir: $(tail -n 5 "$log" | tr '\n' ' ')" \
        "(/var/lib/dkms/gdrdrv/$gdrcopy/build/make.log has the rest)" >&2
    exit 1
fi
if ! modinfo -k "$kernel" gdrdrv >/dev/null 2>&1; then
    echo "gdrdrv $gdrcopy built for kernel $kernel, but modinfo -k $kernel does not find it: \`dkms status gdrdrv\`" >&2
    exit 1
fi
printf '%s\n' "$wanted" >"$state.tmp" && mv "$state.tmp" "$state" || exit 1
echo built
