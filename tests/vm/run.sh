#!/usr/bin/env bash
# barlink's QEMU guest test bed: real vfio-pci behind an emulated VT-d, PCI
# BARs backed by host files, QEMU's edu DMA device, virtio-net for soft-RoCE.
# See tests/vm/README.md. Ends with the line "vmtest: N passed, M failed".
#
#   tests/vm/run.sh [--keep] [--no-rdma] [--platform-only] [--timeout SECS]
#                   [--one-guest | --two-guests-only]
#
# Exit status: 0 all passed, 1 something failed, 2 bad usage, 3 this host
# cannot run the guest at all (no apt, no QEMU, no kernel package).

# ---------------------------------------------------------------------------
# The test targets run in the guest, one "package test-target" per line.
# In the guest each runs as  <bin> --ignored --test-threads=1 guest_
# (as root, with BARLINK_VM_* set); after the guest powered off, on the host,
# as  <bin> --ignored --test-threads=1 host_after_guest_
# with BARLINK_VM_BAR_A / BARLINK_VM_BAR_B naming the files behind the BARs.
TEST_TARGETS="
barlink-vfio  guest
barlink-rdma  guest
barlink-rdma  guest_link
barlink       rdma_guest
barlink       connect_guest
barlink-ffi   guest
barlink-ffi   dmabuf
"
# The second phase: two guests wired by a QEMU socket netdev (server
# 10.0.2.15, client 10.0.2.16). Each of these targets runs in both as
#   <bin> --ignored --test-threads=1 two_guests_
# with BARLINK_VM_ROLE (server|client) and BARLINK_VM_PEER_IP set.
TWO_GUEST_TARGETS="
barlink       rdma_guest
barlink       tcp_guest
barlink-ffi   guest
"
# ---------------------------------------------------------------------------

set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }
KEEP=0
RDMA=${BARLINK_VM_RDMA:-1}
PLATFORM_ONLY=${BARLINK_VM_PLATFORM_ONLY:-0}
TIMEOUT=${BARLINK_VM_TIMEOUT:-240}          # QEMU wall-clock limit, seconds
TWO=${BARLINK_VM_TWO_GUESTS:-1}             # 0: one guest only; only: the two-guest phase only
TWO_TIMEOUT=${BARLINK_VM_TWO_TIMEOUT:-240}  # the two-guest phase's QEMU limit, seconds
while [ $# -gt 0 ]; do
    case "$1" in
        --keep) KEEP=1 ;;
        --no-rdma) RDMA=0 ;;
        --platform-only) PLATFORM_ONLY=1 ;;
        --one-guest) TWO=0 ;;
        --two-guests-only) TWO=only ;;
        --timeout) shift; TIMEOUT=${1:?--timeout needs seconds} ;;
        -h | --help) usage; exit 0 ;;
        *) echo "run.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
# Per test binary in the guest; what is left of TIMEOUT covers boot and checks.
TEST_TIMEOUT=${BARLINK_VM_TEST_TIMEOUT:-$((TIMEOUT - 60))}
TWO_TEST_TIMEOUT=$((TWO_TIMEOUT - 60))
case "$TWO" in
    0 | 1 | only) ;;
    *) echo "run.sh: BARLINK_VM_TWO_GUESTS must be 0, 1 or only" >&2; exit 2 ;;
esac
# the two-guest phase needs soft-RoCE and test binaries
if [ "$RDMA" != 1 ] || [ "$PLATFORM_ONLY" = 1 ]; then
    [ "$TWO" = only ] && { echo "run.sh: --two-guests-only needs RDMA and test binaries" >&2; exit 2; }
    TWO=0
fi
SMP=${BARLINK_VM_SMP:-2}
MEM=${BARLINK_VM_MEM:-1024}
# virtio-net's backend: user-mode networking closed to the outside by default;
# RDMA tests between two guests can use a socket netdev instead.
NETDEV=${BARLINK_VM_NETDEV:-user,id=net0,restrict=on}
MAC=${BARLINK_VM_MAC:-52:54:00:ba:71:01}

WORK=${BARLINK_VM_WORK:-$REPO/target/vmtest}
# Downloads and the initramfs outlive the work dir (and fresh clones in CI).
CACHE=${BARLINK_VM_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/barlink-vmtest}
RUN=$WORK/run
ART=$WORK/artifacts
export CARGO_TERM_COLOR=never

T0=$SECONDS
passed=0 failed=0 skipped=0
say() { echo "vmtest: $*"; }
log() { echo "[vmtest $(date +%T) +$((SECONDS - T0))s] $*"; }
report() { # PASS|FAIL|SKIP name [detail]
    case "$1" in
        PASS) passed=$((passed + 1)) ;;
        FAIL) failed=$((failed + 1)) ;;
        SKIP) skipped=$((skipped + 1)) ;;
    esac
    if [ -n "${3:-}" ]; then echo "$1 $2 -- $3"; else echo "$1 $2"; fi
}
finish() {
    [ "$skipped" -gt 0 ] && say "$skipped skipped"
    say "$passed passed, $failed failed"
}
cannot_run() { # the environment cannot run the guest: exit 3, visibly
    echo
    say "CANNOT RUN the guest test bed on this host: $*"
    say "(exit 3: an environment problem, not a test failure; nothing was tested in the guest)"
    finish
    exit 3
}

mkdir -p "$WORK" "$CACHE" || cannot_run "cannot create $WORK or $CACHE"
exec 9>"$WORK/.lock"
if ! flock -n 9; then
    log "waiting for another tests/vm/run.sh that uses $WORK (BARLINK_VM_WORK)"
    flock -w 600 9 || cannot_run "another tests/vm/run.sh holds $WORK/.lock"
fi
rm -rf "$RUN" "$ART"
mkdir -p "$RUN/share/bin" "$RUN/share/lib" "$RUN/out"
# Everything printed also goes to the harness log (an artifact on failure).
exec > >(tee "$RUN/harness.log") 2>&1

# ------------------------------------------------------------ host packages
HOST_TOOLS="qemu-system-x86_64:qemu-system-x86 cpio:cpio depmod:kmod modprobe:kmod rdma:iproute2 ip:iproute2 g++:g++"
APT_UPDATED=0
apt_update() {
    [ $APT_UPDATED = 1 ] && return 0
    APT_UPDATED=1
    log "apt-get update"
    timeout 180 apt-get update -qq >"$RUN/apt-update.log" 2>&1 || { tail -5 "$RUN/apt-update.log"; return 1; }
}
host_deps() {
    local missing="" t
    for t in $HOST_TOOLS; do
        PATH=$PATH:/usr/sbin:/sbin command -v "${t%%:*}" >/dev/null 2>&1 || missing="$missing ${t#*:}"
    done
    missing=$(echo "$missing" | tr ' ' '\n' | sort -u | tr '\n' ' ')
    [ -z "${missing// /}" ] && return 0
    command -v apt-get >/dev/null || cannot_run "missing$missing and no apt-get to install them"
    [ "$(id -u)" = 0 ] || cannot_run "missing$missing; installing them needs root"
    log "apt-get install$missing"
    local i
    for i in 1 2; do
        if DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=120 $missing \
            >"$RUN/apt-install.log" 2>&1; then
            return 0
        fi
        [ $i = 1 ] && apt_update
    done
    tail -15 "$RUN/apt-install.log"
    cannot_run "apt-get install$missing failed (log above)"
}
export PATH=$PATH:/usr/sbin:/sbin

# ----------------------------------------- Debian packages for the guest
# apt-get download into the cache and dpkg-deb -x; never installed on the host.
RDMA_DEBS="libibverbs1 ibverbs-providers ibverbs-utils perftest librdmacm1 libibumad3 libpci3
           libnl-3-200 libnl-route-3-200"
declare -A DEB=()   # package -> the cached .deb
fetch_debs() { # packages...: resolve the candidate versions, download what the cache lacks
    local info p ver arch f want=() missing=()
    info=$(apt-cache show --no-all-versions "$@" 2>/dev/null)
    while read -r p ver arch; do
        f="$CACHE/debs/${p}_${ver//:/%3a}_${arch}.deb"
        DEB[$p]=$f
        if [ -s "$f" ]; then touch "$f"; else want+=("$p=$ver"); missing+=("$f"); fi
    done < <(echo "$info" | awk '/^Package: /{p=$2} /^Version: /{v=$2} /^Architecture: /{a=$2} /^$/{if (p != "") print p, v, a; p=""} END {if (p != "") print p, v, a}')
    for p in "$@"; do [ -n "${DEB[$p]:-}" ] || { echo "apt knows no package $p"; return 1; }; done
    [ ${#want[@]} = 0 ] && return 0
    log "apt-get download ${want[*]}"
    mkdir -p "$CACHE/debs"
    (cd "$CACHE/debs" && timeout 300 apt-get download -q "${want[@]}") >>"$RUN/apt-download.log" 2>&1
    for f in "${missing[@]}"; do [ -s "$f" ] || { tail -5 "$RUN/apt-download.log"; return 1; }; done
}
unpacked() { # package -> a directory with its unpacked contents (cached; fetch_debs first)
    local f=${DEB[$1]} d
    d="$CACHE/unpacked/$(basename "$f" .deb)"
    if [ ! -e "$d/.done" ]; then
        rm -rf "$d"; mkdir -p "$d"
        dpkg-deb -x "$f" "$d" || return 1
        touch "$d/.done"
    fi
    touch "$d"
    echo "$d"
}

# The kernel: Debian's linux-image-amd64 metapackage names the current image.
KROOT=""
KVER=""
KERNEL=""
fetch_kernel() {
    command -v apt-cache >/dev/null || cannot_run "no apt-cache: the guest kernel comes from Debian's linux-image-amd64"
    local img="" try
    # with stale package lists (a version the mirror no longer has), update and resolve again
    for try in 1 2; do
        img=$(apt-cache depends --important linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: \(linux-image-[0-9][^ ]*\).*/\1/p' | head -1)
        if [ -n "$img" ]; then
            # shellcheck disable=SC2086
            fetch_debs "$img" busybox-static $([ "$RDMA" = 1 ] && echo $RDMA_DEBS) && break
        fi
        [ $try = 1 ] && apt_update && continue
        [ -n "$img" ] || cannot_run "apt knows no linux-image-amd64 (not a Debian apt source, or apt-get update failed)"
        cannot_run "apt-get download failed (see $RUN/apt-download.log)"
    done
    local f=${DEB[$img]}
    KROOT="$CACHE/kernel/$(basename "$f" .deb)"
    # all modules but the big subtrees no guest here needs (what to take is
    # decided later by modprobe --show-depends); DRM's core stays, for vgem
    local x ex=()
    for x in sound drivers/gpu/drm/amd drivers/gpu/drm/i915 drivers/gpu/drm/nouveau drivers/gpu/drm/radeon \
        drivers/media drivers/net/wireless drivers/net/ethernet drivers/staging \
        drivers/scsi drivers/usb drivers/infiniband/hw drivers/input drivers/hid drivers/iio \
        drivers/bluetooth drivers/net/can drivers/isdn drivers/mtd net/wireless net/mac80211 net/bluetooth; do
        ex+=(--exclude="./lib/modules/*/kernel/$x")
    done
    # a tree unpacked with another list is unpacked again
    local done_mark
    done_mark="$KROOT/.done-$(printf '%s\n' "${ex[@]}" | sha256sum | cut -c1-12)"
    if [ ! -e "$done_mark" ]; then
        log "unpacking $(basename "$f") (boot/ and the modules the guest needs)"
        rm -rf "$KROOT"; mkdir -p "$KROOT"
        dpkg-deb --fsys-tarfile "$f" | tar -x -C "$KROOT" --wildcards "${ex[@]}" './boot/vmlinuz-*' './lib/modules/*' ||
            cannot_run "unpacking $(basename "$f") failed"
        # Debian 13 and later compress modules; busybox's modprobe wants plain .ko
        find "$KROOT/lib/modules" -name '*.ko.xz' -exec xz -d {} + 2>/dev/null
        find "$KROOT/lib/modules" -name '*.ko.zst' -exec zstd -q -d --rm {} + 2>/dev/null
        KVER=$(ls "$KROOT/lib/modules")
        depmod -b "$KROOT" "$KVER" || cannot_run "depmod on the unpacked kernel failed"
        # Under TCG the bzImage's own xz decompression costs ~10 s of boot:
        # boot the uncompressed vmlinux through its PVH entry instead, when
        # it has one (a Xen PHYS32_ENTRY note, type 0x12)
        local bz off
        bz=$(ls "$KROOT"/boot/vmlinuz-*)
        off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$bz" | head -1 | cut -d: -f1)
        if [ -n "$off" ] && command -v xz >/dev/null && command -v readelf >/dev/null; then
            tail -c +$((off + 1)) "$bz" | xz -dc --single-stream >"$KROOT/vmlinux" 2>/dev/null
            readelf -n "$KROOT/vmlinux" 2>/dev/null | grep 'type: (0x00000012)' >/dev/null || rm -f "$KROOT/vmlinux"
        fi
        touch "$done_mark"
    fi
    KVER=$(ls "$KROOT/lib/modules")
    KERNEL="$KROOT/boot/vmlinuz-$KVER"
    [ -s "$KROOT/vmlinux" ] && KERNEL="$KROOT/vmlinux"
    # what this run uses is fresh; what no run used for two days goes
    touch "$KROOT" "$f"
    find "$CACHE/kernel" -mindepth 1 -maxdepth 1 -mtime +2 -exec rm -rf {} + 2>/dev/null
    find "$CACHE/debs" "$CACHE/unpacked" -mindepth 1 -maxdepth 1 -mtime +2 -exec rm -rf {} + 2>/dev/null
}

# ------------------------------------------------------------ initramfs
GUEST_MODULES="vfio vfio_pci vfio_iommu_type1 virtio_pci virtio_net 9pnet_virtio 9p"
# Modules only some tests need: a kernel without one fails those tests (and
# its platform check), not the whole run. vgem: a DRM driver without
# hardware whose buffers export as dma-bufs the CPU may map.
OPTIONAL_MODULES="vgem"
RDMA_MODULES="configfs crc32_generic crc32-pclmul rdma_rxe ib_uverbs rdma_ucm"
RDMA_TOOLS="ibv_devices ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong rping udaddy ib_write_bw ib_read_bw ib_send_bw ib_send_lat ib_write_lat"
R=""
LIBPATH=""
copy_elf() { # file-on-host path-in-guest: the ELF plus what ldd resolves
    local src=$1 dst=$2 lib
    install -D -m 755 "$src" "$R$dst" || return 1
    LD_LIBRARY_PATH=$LIBPATH ldd "$src" 2>/dev/null |
        awk '/=>/ && $3 ~ /^\// {print $3} $1 ~ /^\/lib64\// {print $1}' |
        while read -r lib; do
            case "$lib" in
                /lib64/*) [ -e "$R$lib" ] || install -D -m 755 "$(readlink -f "$lib")" "$R$lib" ;;
                *) [ -e "$R/lib/x86_64-linux-gnu/${lib##*/}" ] ||
                       install -D -m 755 "$(readlink -f "$lib")" "$R/lib/x86_64-linux-gnu/${lib##*/}" ;;
            esac
        done
    if LD_LIBRARY_PATH=$LIBPATH ldd "$src" 2>&1 | grep 'not found' >/dev/null; then
        echo "copy_elf: $src: $(LD_LIBRARY_PATH=$LIBPATH ldd "$src" 2>&1 | grep 'not found' | tr '\n' ' ')"
        return 1
    fi
}
INITRD=""
build_initramfs() {
    local bb uroots="" d p
    bb=$(unpacked busybox-static) || cannot_run "unpacking busybox-static failed"
    if [ "$RDMA" = 1 ]; then
        for p in $RDMA_DEBS; do
            d=$(unpacked "$p") || cannot_run "unpacking $p failed (or run with --no-rdma)"
            uroots="$uroots $d"
        done
    fi
    # The stamp names every input: rebuild when one changes.
    local stamp
    stamp=$( {
        echo "$KROOT $bb $uroots $GUEST_MODULES $OPTIONAL_MODULES $RDMA $RDMA_MODULES $RDMA_TOOLS"
        cat "$HERE/guest/init" "$HERE/run.sh" /lib64/ld-linux-x86-64.so.2 "$(command -v rdma)" "$(command -v ip)" | sha256sum
    } | sha256sum | cut -c1-16)
    INITRD="$CACHE/initramfs-$stamp.cpio.gz"
    find "$CACHE" -maxdepth 1 -name 'initramfs-*' -mtime +2 -delete 2>/dev/null
    [ -s "$INITRD" ] && [ -e "$INITRD.libs" ] && { touch "$INITRD" "$INITRD.libs"; return 0; }
    log "building the initramfs ($INITRD)"
    R=$(mktemp -d "$CACHE/initroot.XXXXXX") && chmod 755 "$R"  # the guest's / (mktemp makes 0700)
    mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,etc,root,lib64,lib/x86_64-linux-gnu,mnt/bins,mnt/out}
    install -m 755 "$bb/bin/busybox" "$R/bin/busybox"
    ln -s busybox "$R/bin/sh"
    # modules and their dependencies, and depmod for the reduced tree
    local m ko mods="$GUEST_MODULES $OPTIONAL_MODULES"
    [ "$RDMA" = 1 ] && mods="$mods $RDMA_MODULES"
    for m in $mods; do
        if ! modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" >"$RUN/deps.txt" 2>&1; then
            cat "$RUN/deps.txt"
            case " $OPTIONAL_MODULES " in
                *" $m "*) log "kernel $KVER has no module $m: the tests that need it will fail"; continue ;;
            esac
            cannot_run "kernel $KVER has no module $m"
        fi
        awk '$1 == "insmod" {print $2}' "$RUN/deps.txt" | while read -r ko; do
            install -D -m 644 "$ko" "$R/lib/modules/$KVER/${ko#*/lib/modules/$KVER/}"
        done
    done
    cp "$KROOT/lib/modules/$KVER"/modules.{order,builtin,builtin.modinfo} "$R/lib/modules/$KVER/" 2>/dev/null
    depmod -b "$R" "$KVER" || cannot_run "depmod for the initramfs failed"
    if [ "$RDMA" = 1 ]; then
        # verbs userspace: libibverbs with the rxe provider, tools, perftest
        LIBPATH=""
        for d in $uroots; do LIBPATH="$LIBPATH:$d/usr/lib/x86_64-linux-gnu:$d/lib/x86_64-linux-gnu"; done
        LIBPATH=${LIBPATH#:}
        local ok=1 f
        mkdir -p "$R/etc/libibverbs.d" "$R/usr/lib/x86_64-linux-gnu/libibverbs"
        for d in $uroots; do
            [ -e "$d/etc/libibverbs.d/rxe.driver" ] && cp "$d/etc/libibverbs.d/rxe.driver" "$R/etc/libibverbs.d/"
            for f in "$d"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-*.so; do
                [ -e "$f" ] && { copy_elf "$f" "/usr/lib/x86_64-linux-gnu/libibverbs/${f##*/}" || ok=0; }
            done
            # the libraries themselves, for programs that dlopen them (sideway)
            for f in "$d"/usr/lib/x86_64-linux-gnu/lib{ibverbs,rdmacm,ibumad}.so.*; do
                [ -e "$f" ] && { copy_elf "$f" "/usr/lib/x86_64-linux-gnu/${f##*/}" || ok=0; }
            done
            for f in $RDMA_TOOLS; do
                [ -e "$d/usr/bin/$f" ] && { copy_elf "$d/usr/bin/$f" "/usr/bin/$f" || ok=0; }
            done
        done
        for f in rdma ip; do copy_elf "$(command -v $f)" "/usr/sbin/$f" || ok=0; done
        [ -e "$R/etc/libibverbs.d/rxe.driver" ] && [ -e "$R/usr/bin/ibv_devices" ] || ok=0
        [ $ok = 1 ] || cannot_run "the rdma-core userspace is incomplete (or run with --no-rdma)"
    fi
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$R/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$R/etc/group"
    install -m 755 "$HERE/guest/init" "$R/init"
    # which libraries the initramfs has (test binaries bring only the others)
    (cd "$R" && find lib lib64 usr/lib -type f -name '*.so*' -exec sha256sum {} +) >"$INITRD.libs"
    (cd "$R" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$INITRD.tmp" &&
        mv "$INITRD.tmp" "$INITRD" || { rm -rf "$R"; cannot_run "writing the initramfs failed"; }
    log "initramfs $(du -h "$INITRD" | cut -f1) (unpacked $(du -sh "$R" | cut -f1))"
    rm -rf "$R"
}

# ------------------------------------------------------------ test binaries
# label package target exe
BINS=()
TWO_BINS=()
TRIED=""
build_target() { # package target: builds it once, adds "label package target exe" to BINS
    local pkg=$1 tgt=$2 label out exe
    label="$pkg-$tgt"
    case " $TRIED " in *" $label "*) return 0 ;; esac
    TRIED="$TRIED $label"
    {
        log "cargo test -p $pkg --test $tgt --no-run"
        out=$(cd "$REPO" && timeout 1200 cargo test -p "$pkg" --test "$tgt" --no-run \
            --message-format=json-render-diagnostics 2>"$RUN/build-$label.err")
        exe=$(echo "$out" | grep '"reason":"compiler-artifact"' | grep "\"name\":\"$tgt\"" |
            grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -1)
        if [ -z "$exe" ] || [ ! -x "$exe" ]; then
            if grep -q "no test target named" "$RUN/build-$label.err"; then
                report FAIL "$pkg/$tgt" "test target missing: cargo knows no test target '$tgt' in package '$pkg' (TEST_TARGETS in tests/vm/run.sh)"
            else
                tail -20 "$RUN/build-$label.err"
                report FAIL "$pkg/$tgt" "build failed (above)"
            fi
            return 0
        fi
        cp "$exe" "$RUN/share/bin/$label"
        BINS+=("$label $pkg $tgt $exe")
    }
    return 0
}
build_tests() {
    local pkg tgt out exe b
    if [ "$TWO" != only ]; then
        while read -r pkg tgt; do
            [ -n "$pkg" ] && build_target "$pkg" "$tgt"
        done <<<"$TEST_TARGETS"
    fi
    local ones=("${BINS[@]}")
    if [ "$TWO" != 0 ]; then
        while read -r pkg tgt; do
            [ -n "$pkg" ] || continue
            build_target "$pkg" "$tgt"
            for b in "${BINS[@]}"; do [ "${b%% *}" = "$pkg-$tgt" ] && TWO_BINS+=("$b"); done
        done <<<"$TWO_GUEST_TARGETS"
    fi
    [ "$TWO" = only ] && ones=()
    log "cargo build --bin barlink"
    out=$(cd "$REPO" && timeout 1200 cargo build --bin barlink --message-format=json-render-diagnostics 2>"$RUN/build-barlink.err")
    exe=$(echo "$out" | grep '"reason":"compiler-artifact"' | grep -o '"executable":"[^"]*/barlink"' | cut -d'"' -f4 | tail -1)
    if [ -n "$exe" ] && [ -x "$exe" ]; then
        cp "$exe" "$RUN/share/bin/barlink"
    else
        tail -20 "$RUN/build-barlink.err"
        report FAIL "barlink CLI" "cargo build --bin barlink failed (above)"
    fi
    # The C++ example, through the C ABI (linked statically: nothing to
    # find at run time), for barlink-ffi's guest tests; barlink-c builds
    # the library.
    log "g++ examples/cpp/kv_transfer.cpp (static libbarlink_c)"
    local target_dir=${CARGO_TARGET_DIR:-$REPO/target} kv_built=0
    [[ $target_dir == /* ]] || target_dir=$REPO/$target_dir
    if (cd "$REPO" && timeout 1200 cargo build -p barlink-c 2>"$RUN/build-kv.err") &&
        g++ -std=c++17 -O2 -I"$REPO/ffi/include" "$REPO/examples/cpp/kv_transfer.cpp" \
            -o "$RUN/share/bin/kv_transfer" "$target_dir/debug/libbarlink_c.a" \
            -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc 2>>"$RUN/build-kv.err"; then
        kv_built=1
    else
        tail -20 "$RUN/build-kv.err"
        report FAIL "kv_transfer" "building the C++ example against libbarlink_c.a failed (above)"
    fi
    # the host libraries the binaries need, with the loader they name, where
    # the initramfs lacks them or has other versions
    local b lib sum
    for b in "$RUN"/share/bin/*; do
        ldd "$b" | awk '/=>/ && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
            sum=$(sha256sum <"$lib" | cut -d' ' -f1)
            grep -q "^$sum .*/${lib##*/}\$" "$INITRD.libs" 2>/dev/null || cp -L "$lib" "$RUN/share/lib/${lib##*/}"
        done
    done
    log "shared: $(ls "$RUN/share/bin" | tr '\n' ' ')+ $(ls "$RUN/share/lib" | wc -l) libraries the initramfs lacks"
    : >"$RUN/share/plan"
    for b in "${ones[@]}"; do
        set -- $b
        echo "$1 bin/$1 --ignored --test-threads=1 guest_ --skip host_after_guest_" >>"$RUN/share/plan"
    done
    BINS=("${ones[@]}")
    : >"$RUN/share/plan-two"
    for b in "${TWO_BINS[@]}"; do
        set -- $b
        echo "$1 bin/$1 --ignored --test-threads=1 two_guests_" >>"$RUN/share/plan-two"
    done
    cat >"$RUN/share/env" <<EOF
export BARLINK_VM_GUEST=1
export BARLINK_VM_IVSHMEM=0000:00:10.0,0000:00:11.0,0000:00:12.0,0000:00:13.0
export BARLINK_VM_EDU=0000:00:14.0
export BARLINK_VM_BARLINK=/mnt/bins/bin/barlink
export RUST_BACKTRACE=1
EOF
    [ "$kv_built" = 1 ] && echo "export BARLINK_VM_KV_TRANSFER=/mnt/bins/bin/kv_transfer" >>"$RUN/share/env"
    # extra variables for the guest's tests: BARLINK_LOG, and BARLINK_VM_GUEST_ENV="A=1 B=2"
    [ -n "${BARLINK_LOG:-}" ] && printf 'export BARLINK_LOG=%q\n' "$BARLINK_LOG" >>"$RUN/share/env"
    local kv
    for kv in ${BARLINK_VM_GUEST_ENV:-}; do printf 'export %s=%q\n' "${kv%%=*}" "${kv#*=}" >>"$RUN/share/env"; done
}

# ------------------------------------------------------------ libtest output
# Reads a test binary's output; prints "PASS name", "FAIL name -- why",
# "SKIP name -- why" per test, and "RESULT expected got rc" last.
parse_libtest() { # file rc-if-known
    awk -v rc="${2:-}" -f "$HERE/libtest.awk" "$1"
}
report_libtest() { # file label context rc [prefix of the test names]
    local file=$1 label=$2 ctx=$3 rc=${4:-} prefix=${5:-} kind name rest expected got nres=0
    while read -r kind name_rest; do
        case "$kind" in
            PASS | FAIL | SKIP)
                name=${name_rest%% -- *}
                rest=""; [ "$name" != "$name_rest" ] && rest=${name_rest#* -- }
                report "$kind" "$prefix$name" "$rest"
                nres=$((nres + 1)) ;;
            RESULT)
                set -- $name_rest
                expected=$1 got=$2 rc=${3:-$rc} ;;
        esac
    done < <(parse_libtest "$file" "$rc")
    if [ "${rc:-}" = "" ]; then
        [ "$expected" -gt "$got" ] 2>/dev/null || [ "$got" = 0 ] &&
            report FAIL "$prefix$label ($ctx)" "no exit status: the run did not finish"
    elif [ "$rc" != 0 ] && [ "$rc" != 101 ]; then
        report FAIL "$prefix$label ($ctx)" "the test binary exited with status $rc$([ "$rc" = 137 ] && echo ' (killed: timeout)'); its last line: $(grep -av '^VMTEST-RC' "$file" | grep -av '^ *$' | tail -1)"
    elif [ "$rc" = 101 ] && ! grep -q '^FAIL ' < <(parse_libtest "$file" "$rc"); then
        report FAIL "$prefix$label ($ctx)" "the test binary exited with status 101 but no test failed"
    fi
    [ "$nres" = 0 ] && [ "$rc" = 0 ] && say "note: $label ran no $ctx tests"
    return 0
}

# ------------------------------------------------------------ the guest
boot_guest() {
    local A=$RUN/bar-a B=$RUN/bar-b
    # the BARs' backing files, filled with zeros
    rm -f "$A" "$B"
    head -c $((16 << 20)) /dev/zero >"$A"
    head -c $((16 << 20)) /dev/zero >"$B"
    local qemu=(
        qemu-system-x86_64 -accel tcg -cpu max -smp "$SMP" -m "$MEM"
        -machine q35,kernel-irqchip=split -device intel-iommu,intremap=on
        -nodefaults -display none -monitor none -serial stdio -no-reboot -nic none
        -kernel "$KERNEL" -initrd "$INITRD"
        -append "console=ttyS0 intel_iommu=on loglevel=4 panic=-1 random.trust_cpu=on cryptomgr.notests vmtest.tmo=$TEST_TIMEOUT vmtest.rdma=$RDMA"
        -fsdev "local,id=bins,path=$RUN/share,security_model=none,readonly=on"
        -device virtio-9p-pci,fsdev=bins,mount_tag=vmbins,addr=0x08
        -fsdev "local,id=out,path=$RUN/out,security_model=none"
        -device virtio-9p-pci,fsdev=out,mount_tag=vmout,addr=0x09
        -object "memory-backend-file,id=bar0,share=on,mem-path=$A,size=16M" -device ivshmem-plain,memdev=bar0,addr=0x10
        -object "memory-backend-file,id=bar1,share=on,mem-path=$B,size=16M" -device ivshmem-plain,memdev=bar1,addr=0x11
        -object "memory-backend-file,id=bar2,share=on,mem-path=$A,size=16M" -device ivshmem-plain,memdev=bar2,addr=0x12
        -object "memory-backend-file,id=bar3,share=on,mem-path=$B,size=16M" -device ivshmem-plain,memdev=bar3,addr=0x13
        -device edu,addr=0x14
        -netdev "$NETDEV" -device "virtio-net-pci,netdev=net0,romfile=,mac=$MAC,addr=0x15"
    )
    echo "${qemu[*]}" >"$RUN/qemu-cmdline.txt"
    log "booting the guest (TCG, timeout ${TIMEOUT}s; console: $RUN/console.log)"
    local t0=${EPOCHREALTIME/./}
    timeout -k 10 "$TIMEOUT" "${qemu[@]}" </dev/null 2>&1 |
        while IFS= read -r line; do
            line=${line%$'\r'}
            local t=$(((${EPOCHREALTIME/./} - t0) / 1000))
            printf '[%4d.%03d] %s\n' $((t / 1000)) $((t % 1000)) "$line" >>"$RUN/console.log"
            # progress while the guest runs (the counted lines come after)
            case "$line" in
                *"VMTEST-RESULT FAIL"*) echo "  guest> ${line#*VMTEST-RESULT }" ;;
                *VMTEST-BOOTED* | *VMTEST-RUN-BEGIN* | *VMTEST-DONE*) echo "  guest> ${line#*VMTEST-} (+$((t / 1000))s)" ;;
                "test "*" ... "*) echo "  guest> $line" ;;
            esac
        done
    QEMU_RC=${PIPESTATUS[0]}
    GUEST_SECS=$(((${EPOCHREALTIME/./} - t0) / 1000000))
    log "qemu exited with status $QEMU_RC after ${GUEST_SECS}s"
}

# ------------------------------------------------------------ two guests
# Two guests wired by a QEMU socket netdev: the server's QEMU listens on a
# local TCP port, the client's connects to it; each NIC has its own MAC (with
# the same one rxe takes the peer for itself). No IOMMU and no ivshmem or edu
# devices: the guests run the plan-two tests (two_guests_*) only.
console_reader() { # side log t0: timestamps QEMU's output into log, shows progress
    local side=$1 log=$2 t0=$3 line t
    while IFS= read -r line; do
        line=${line%$'\r'}
        t=$(((${EPOCHREALTIME/./} - t0) / 1000))
        printf '[%4d.%03d] %s\n' $((t / 1000)) $((t % 1000)) "$line" >>"$log"
        case "$line" in
            *"VMTEST-RESULT FAIL"*) echo "  $side> ${line#*VMTEST-RESULT }" ;;
            *VMTEST-BOOTED* | *VMTEST-RUN-BEGIN* | *VMTEST-DONE*) echo "  $side> ${line#*VMTEST-} (+$((t / 1000))s)" ;;
            "test "*" ... "*) echo "  $side> $line" ;;
        esac
    done
}
tcp_listening() { # port: something listens on 127.0.0.1:port (or any address)
    awk -v p="$(printf ':%04X' "$1")" 'NR > 1 && $4 == "0A" && substr($2, length($2) - 4) == p {f = 1} END {exit !f}' \
        /proc/net/tcp 2>/dev/null
}
TWO_SECS=0
boot_pair() {
    local port="" try side ip peer mac netdev t0 pid_server="" pid_client=""
    for try in 1 2 3 4 5 6 7 8 9 10; do
        port=$((20000 + RANDOM % 20000))
        tcp_listening "$port" || break
    done
    t0=${EPOCHREALTIME/./}
    for side in server client; do
        if [ $side = server ]; then
            ip=10.0.2.15 peer=10.0.2.16 mac=52:54:00:ba:71:01 netdev="socket,id=net0,listen=127.0.0.1:$port"
        else
            ip=10.0.2.16 peer=10.0.2.15 mac=52:54:00:ba:71:02 netdev="socket,id=net0,connect=127.0.0.1:$port"
        fi
        mkdir -p "$RUN/out-$side"
        : >"$RUN/console-$side.log"
        # cryptomgr.notests: the boot-time crypto self-tests once held a vCPU
        # for minutes (soft lockup) with two guests under TCG on a busy host
        local qemu=(
            qemu-system-x86_64 -accel tcg -cpu max -smp "$SMP" -m "$MEM" -machine q35
            -nodefaults -display none -monitor none -serial stdio -no-reboot -nic none
            -kernel "$KERNEL" -initrd "$INITRD"
            -append "console=ttyS0 loglevel=4 panic=-1 random.trust_cpu=on cryptomgr.notests vmtest.tmo=$TWO_TEST_TIMEOUT vmtest.rdma=1 vmtest.pci=0 vmtest.ip=$ip vmtest.role=$side vmtest.peer=$peer vmtest.plan=plan-two"
            -fsdev "local,id=bins,path=$RUN/share,security_model=none,readonly=on"
            -device virtio-9p-pci,fsdev=bins,mount_tag=vmbins,addr=0x08
            -fsdev "local,id=out,path=$RUN/out-$side,security_model=none"
            -device virtio-9p-pci,fsdev=out,mount_tag=vmout,addr=0x09
            -netdev "$netdev" -device "virtio-net-pci,netdev=net0,romfile=,mac=$mac,addr=0x15"
        )
        echo "${qemu[*]}" >"$RUN/qemu-cmdline-$side.txt"
        log "booting the $side guest ($ip; TCG, timeout ${TWO_TIMEOUT}s; console: $RUN/console-$side.log)"
        (
            timeout -k 10 "$TWO_TIMEOUT" "${qemu[@]}" </dev/null 2>&1 | console_reader "$side" "$RUN/console-$side.log" "$t0"
            echo "${PIPESTATUS[0]}" >"$RUN/qemu-rc-$side"
        ) &
        if [ $side = server ]; then
            pid_server=$!
            # the client's QEMU connects at once: wait until the server's listens
            for try in $(seq 1 200); do
                tcp_listening "$port" && break
                kill -0 "$pid_server" 2>/dev/null || break
                sleep 0.1
            done
            tcp_listening "$port" || log "the server guest's QEMU is not listening on 127.0.0.1:$port"
        else
            pid_client=$!
        fi
    done
    wait "$pid_server" "$pid_client"
    TWO_SECS=$(((${EPOCHREALTIME/./} - t0) / 1000000))
    log "two guests: qemu exited with status $(cat "$RUN/qemu-rc-server" 2>/dev/null) (server), $(cat "$RUN/qemu-rc-client" 2>/dev/null) (client) after ${TWO_SECS}s"
}
report_pair() {
    local side con kind rest name detail b label pkg tgt f grc why rc
    for side in server client; do
        con=$RUN/console-$side.log
        echo
        echo "=== two guests: the $side's platform checks"
        grep -ao 'VMTEST-RESULT .*' "$con" | sed 's/^VMTEST-RESULT //' >"$RUN/platform-$side.txt"
        while read -r kind rest; do
            name=${rest%% -- *}
            detail=""; [ "$name" != "$rest" ] && detail=${rest#* -- }
            report "$kind" "[$side] $name" "$detail"
        done <"$RUN/platform-$side.txt"
        rc=$(cat "$RUN/qemu-rc-$side" 2>/dev/null)
        if ! grep -aq 'VMTEST-DONE' "$con"; then
            why="qemu exit status ${rc:-unknown}"
            [ "$rc" = 124 ] || [ "$rc" = 137 ] && why="killed after ${TWO_TIMEOUT}s (BARLINK_VM_TWO_TIMEOUT)"
            grep -aq 'Kernel panic' "$con" && why="$why; kernel panic: $(grep -ao 'Kernel panic.*' "$con" | head -1)"
            grep -aq 'VMTEST-BOOTED' "$con" || why="$why; the guest never reached /init"
            report FAIL "[$side] guest" "did not finish: $why"
        else
            report PASS "[$side] guest" "booted, ran, powered off in ${TWO_SECS}s or less"
        fi
        for b in "${TWO_BINS[@]}"; do
            set -- $b
            label=$1 pkg=$2 tgt=$3
            echo
            echo "=== $pkg --test $tgt, in the $side guest (two_guests_*)"
            f=$RUN/out-$side/$label.log
            if [ ! -s "$f" ]; then
                f=$RUN/$label.console-$side.log
                sed -n "/VMTEST-RUN-BEGIN $label/,/VMTEST-RUN-END $label/p" "$con" | sed 's/^\[ *[0-9.]*\] //' >"$f"
            fi
            if ! grep -aq "VMTEST-RUN-BEGIN $label" "$con"; then
                report FAIL "[$side] $label (guest)" "never started in the guest"
                continue
            fi
            grc=$(grep -ao "VMTEST-RC $label [0-9]*" "$f" | awk '{print $3}' | tail -1)
            report_libtest "$f" "$label" two-guests "$grc" "[$side] "
        done
    done
}

# ============================================================ main
log "work dir $WORK, cache $CACHE"
host_deps
# one run at a time prepares the shared cache; what it leaves is not deleted under a running guest
exec 8>"$CACHE/.lock"
if ! flock -n 8; then
    log "waiting for another tests/vm/run.sh that prepares $CACHE"
    flock -w 600 8 || cannot_run "another tests/vm/run.sh holds $CACHE/.lock"
fi
fetch_kernel
log "guest kernel: $KVER ($(basename "$KROOT"), booted as ${KERNEL##*/})"
build_initramfs
flock -u 8
PREP_SECS=$((SECONDS - T0))
if [ "$PLATFORM_ONLY" = 1 ]; then
    say "--platform-only: no test binaries built"
    : >"$RUN/share/plan"
else
    build_tests
fi
CARGO_SECS=$((SECONDS - T0 - PREP_SECS))
QEMU_RC=""
GUEST_SECS=0
CON=$RUN/console.log
if [ "$TWO" != only ]; then
    boot_guest

    echo
    echo "=== guest platform checks"
    # marker lines can share a console line with kernel messages: take from the marker on
    grep -ao 'VMTEST-RESULT .*' "$CON" | sed 's/^VMTEST-RESULT //' >"$RUN/platform.txt"
    while read -r kind rest; do
        name=${rest%% -- *}
        detail=""; [ "$name" != "$rest" ] && detail=${rest#* -- }
        report "$kind" "$name" "$detail"
    done <"$RUN/platform.txt"
    if ! grep -aq 'VMTEST-DONE' "$CON"; then
        why="qemu exit status $QEMU_RC"
        [ "$QEMU_RC" = 124 ] || [ "$QEMU_RC" = 137 ] && why="killed after ${TIMEOUT}s (BARLINK_VM_TIMEOUT)"
        grep -aq 'Kernel panic' "$CON" && why="$why; kernel panic: $(grep -ao 'Kernel panic.*' "$CON" | head -1)"
        grep -aq 'VMTEST-BOOTED' "$CON" || why="$why; the guest never reached /init"
        report FAIL "guest" "did not finish: $why"
    else
        report PASS "guest" "booted, ran, powered off in ${GUEST_SECS}s"
    fi

    for b in "${BINS[@]}"; do
        set -- $b
        label=$1 pkg=$2 tgt=$3 exe=$4
        echo
        echo "=== $pkg --test $tgt, in the guest (guest_*)"
        f=$RUN/out/$label.log
        if [ ! -s "$f" ]; then
            # no results share: take the run from the console
            f=$RUN/$label.console.log
            sed -n "/VMTEST-RUN-BEGIN $label/,/VMTEST-RUN-END $label/p" "$CON" | sed 's/^\[ *[0-9.]*\] //' >"$f"
        fi
        if ! grep -aq "VMTEST-RUN-BEGIN $label" "$CON"; then
            report FAIL "$label (guest)" "never started in the guest"
            continue
        fi
        grc=$(grep -ao "VMTEST-RC $label [0-9]*" "$f" | awk '{print $3}' | tail -1)
        report_libtest "$f" "$label" guest "$grc"
        echo
        echo "=== $pkg --test $tgt, on the host after the guest (host_after_guest_*)"
        if [ -z "$grc" ]; then
            report SKIP "$label (host after guest)" "the guest run did not finish"
            continue
        fi
        (cd "$REPO" && BARLINK_VM_BAR_A=$RUN/bar-a BARLINK_VM_BAR_B=$RUN/bar-b RUST_BACKTRACE=1 \
            timeout -s KILL 120 "$exe" --ignored --test-threads=1 host_after_guest_) >"$RUN/$label.host.log" 2>&1
        report_libtest "$RUN/$label.host.log" "$label" host-after-guest "$?"
    done
fi

if [ "$TWO" != 0 ]; then
    echo
    log "the two-guest phase: server 10.0.2.15 and client 10.0.2.16 on a QEMU socket netdev"
    boot_pair
    report_pair
fi

# bench --rdma's figures (and any other the guest tests recorded): in the
# output and in the artifacts, always; recorded, never asserted
figures=$(ls "$RUN"/out/bench-rdma-*.txt "$RUN"/out-*/bench-rdma-*.txt 2>/dev/null)
if [ -n "$figures" ]; then
    mkdir -p "$ART"
    cp "$RUN"/out/bench-rdma-* "$RUN"/out-*/bench-rdma-* "$ART/" 2>/dev/null
    echo
    echo "=== bench --rdma figures (emulation: soft-RoCE under TCG; recorded, never asserted; in $ART)"
    for f in $figures; do sed 's/^/  /' "$f"; done
fi

echo
log "timings: apt + kernel + initramfs ${PREP_SECS}s, cargo ${CARGO_SECS}s, guest ${GUEST_SECS}s, two guests ${TWO_SECS}s, total $((SECONDS - T0))s; guest kernel $KVER"
if [ "$failed" -gt 0 ]; then
    mkdir -p "$ART"
    cp "$RUN/console.log" "$RUN/harness.log" "$RUN/qemu-cmdline.txt" "$ART/" 2>/dev/null
    cp "$RUN"/out/*.log "$RUN"/out/dmesg.txt "$RUN"/*.host.log "$ART/" 2>/dev/null
    for side in server client; do
        [ -d "$RUN/out-$side" ] || continue
        mkdir -p "$ART/$side"
        cp "$RUN/console-$side.log" "$RUN/qemu-cmdline-$side.txt" "$RUN/out-$side"/*.log "$RUN/out-$side/dmesg.txt" "$ART/$side/" 2>/dev/null
    done
    for f in "$RUN/console.log" "$RUN/console-server.log" "$RUN/console-client.log"; do
        [ -s "$f" ] || continue
        echo
        echo "--- last 40 lines of $(basename "$f") (in $ART):"
        tail -n 40 "$f"
        echo "---"
    done
    say "artifacts (console, harness log, test output, guest dmesg) in $ART"
fi
if [ "$KEEP" = 1 ] || [ "$failed" -gt 0 ]; then
    say "the run's files (BAR files, share, logs) are in $RUN"
else
    rm -rf "$RUN/share" "$RUN/bar-a" "$RUN/bar-b"
fi
finish
[ "$failed" -eq 0 ] && { [ "$TWO" = only ] || { [ -n "$QEMU_RC" ] && grep -aq 'VMTEST-DONE' "$CON"; }; }
