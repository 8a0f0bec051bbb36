#!/usr/bin/env bash
# Checks the hand-written ibverbs ABI of rdma/src/sys.rs (struct sizes,
# field offsets, enum values) against the real <infiniband/verbs.h>: the
# unit test sys::layout compiles a C program with gcc that prints them.
# Installs libibverbs-dev with apt when the header is missing and this runs
# as root (the crate itself never needs it: libibverbs is loaded at run time).
#
# Exit status: 0 the layout matches, 1 it differs (or the test failed),
# 3 not checked (no header and no way to install it). The last line says which.
set -uo pipefail
cd "$(dirname "$0")/.."
header=/usr/include/infiniband/verbs.h
if [ ! -e "$header" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "rdma-layout: installing libibverbs-dev for $header"
        install_verbs_dev() {
            DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq --no-install-recommends \
                -o DPkg::Lock::Timeout=120 libibverbs-dev >/tmp/rdma-layout-apt.log 2>&1
        }
        # A fresh image may have empty package lists: fill them and retry.
        install_verbs_dev || { apt-get update -qq -o DPkg::Lock::Timeout=120 >/dev/null 2>&1 && install_verbs_dev; } ||
            tail -5 /tmp/rdma-layout-apt.log
    fi
fi
if [ ! -e "$header" ]; then
    echo "rdma-layout: SKIPPED: no $header (apt-get install libibverbs-dev as root)"
    exit 3
fi
out=$(cargo test -q -p barlink-rdma --lib sys::layout -- --nocapture 2>&1)
status=$?
echo "$out" | grep -E '^layout:|SKIPPED|panicked|differ|  ibv_|error' | head -60
if [ $status -ne 0 ]; then
    echo "rdma-layout: FAILED (rdma/src/sys.rs differs from $header, or the test did not build)"
    exit 1
fi
if echo "$out" | grep SKIPPED >/dev/null; then
    echo "rdma-layout: SKIPPED: $(echo "$out" | grep -o 'SKIPPED.*' | head -1)"
    exit 3
fi
echo "rdma-layout: $(echo "$out" | grep -o '^layout: .*' | sed 's/^layout: //')"
