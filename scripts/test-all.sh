#!/usr/bin/env bash
# Every test barlink has that this machine can run, from a fresh clone:
# formatting and lints, unit/property/scenario/CLI tests, a fuzz smoke run
# of each target, and the benchmarks run once each as a smoke check.
# Installs what it needs (cargo-fuzz, cbindgen, QEMU and the guest's kernel
# and userspace through apt; pytest, numpy and maturin into target/pyenv).
# Ends with "test-all: N passed, M failed, K skipped".
#
#   FUZZ_SECONDS=10     seconds per fuzz target (0 skips the fuzz stage, visibly)
#   PROPTEST_CASES=512  cases per property test
#   SOAK_DURATION=20s   length of the soak run
set -uo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS=${FUZZ_SECONDS:-10}
export PROPTEST_CASES=${PROPTEST_CASES:-512}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
log=$(mktemp -d)
passed=0
failed=0
skipped=0

step() { printf '\n=== %s [%dm%02ds into the run]\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)); }
ok() { passed=$((passed + 1)); echo "ok: $*"; }
bad() { failed=$((failed + 1)); echo "FAILED: $*"; }
skip() { skipped=$((skipped + 1)); echo "SKIPPED: $*"; }

# The Python stage's environment (mostly torch's download) is made in the
# background while the Rust stages compile; that stage then finds it ready.
./scripts/python-test.sh --prepare >"$log/python-prepare.txt" 2>&1 &
python_prepare=$!

step "format"
if cargo fmt --version >/dev/null 2>&1; then
    if cargo fmt --all -- --check && (cd fuzz && cargo fmt -- --check); then ok "cargo fmt"; else bad "cargo fmt (run: cargo fmt --all)"; fi
else
    skip "cargo fmt: rustfmt is not installed with this toolchain"
fi

step "lints"
if cargo clippy --version >/dev/null 2>&1; then
    if cargo clippy --workspace --all-targets -- -D warnings; then ok "cargo clippy"; else bad "cargo clippy"; fi
    # The fuzz targets are a crate of their own, outside the workspace.
    if (cd fuzz && cargo clippy --all-targets -- -D warnings); then ok "cargo clippy (fuzz/)"; else bad "cargo clippy (fuzz/)"; fi
else
    skip "cargo clippy: clippy is not installed with this toolchain"
fi

step "layout (no Rust file over 1,000 lines of code; functions are held to 120 by clippy)"
if ./scripts/file-sizes.sh; then ok "file sizes"; else bad "file sizes (scripts/file-sizes.sh)"; fi

# Before the tests: it installs the header that their layout test reads, so
# on a fresh machine that test runs rather than says SKIPPED.
step "ibverbs ABI of rdma/src/sys.rs against verbs.h (scripts/rdma-layout.sh; installs libibverbs-dev as root)"
./scripts/rdma-layout.sh >"$log/layout.txt" 2>&1; case $? in 0) ok "$(tail -1 "$log/layout.txt")" ;; 3) skip "$(tail -1 "$log/layout.txt")" ;; *) cat "$log/layout.txt"; bad "rdma-layout (scripts/rdma-layout.sh)" ;; esac

step "tests (unit, property with PROPTEST_CASES=$PROPTEST_CASES, scenario, CLI)"
# bench --tcp's bandwidth baseline; its test says SKIPPED without it.
if ! command -v iperf3 >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing iperf3 (apt-get), the bench --tcp baseline"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null 2>&1; } ||
        echo "could not install iperf3: the bench --tcp test will say SKIPPED for its baseline"
fi
# The huge-page window test needs reserved 2 MiB pages; as root, reserve a
# few for the run and put the old value back afterwards.
hugepages=/proc/sys/vm/nr_hugepages
if [ -w "$hugepages" ] && [ "$(cat "$hugepages")" -lt 8 ]; then
    old_hugepages=$(cat "$hugepages")
    echo 8 >"$hugepages" 2>/dev/null && trap 'echo "$old_hugepages" >"$hugepages"' EXIT
fi
cargo test --workspace 2>&1 | tee "$log/test.txt"
test_status=${PIPESTATUS[0]}
tests_passed=$(awk '/^test result:/ {for (i = 1; i <= NF; i++) if ($i ~ /^passed;?$/) s += $(i-1)} END {print s + 0}' "$log/test.txt")
tests_failed=$(awk '/^test result:/ {for (i = 1; i <= NF; i++) if ($i ~ /^failed;?$/) s += $(i-1)} END {print s + 0}' "$log/test.txt")
# A test that lacks what it needs prints "SKIPPED <name>: <why>" and returns;
# cargo counts it as passed, so it is moved from passed to skipped here.
tests_skipped=$(grep -c 'SKIPPED' "$log/test.txt" || true)
tests_passed=$((tests_passed - tests_skipped))
skipped=$((skipped + tests_skipped))
grep 'SKIPPED' "$log/test.txt" | sed 's/^[. ]*/  /' || true
if [ "$test_status" -eq 0 ]; then ok "cargo test: $tests_passed tests passed, $tests_skipped skipped"; else bad "cargo test: $tests_failed tests failed"; fi

# A sub-suite that prints "<name>: N passed, M failed[, K skipped]" as its
# summary: its checks count one by one in the totals here.
count_suite() {
    local name=$1 file=$2 status=$3
    local line p f k
    line=$(grep -E "^$name: [0-9]+ passed, [0-9]+ failed" "$file" | tail -1)
    p=$(sed -E 's/^[^:]*: ([0-9]+) passed.*/\1/' <<<"$line")
    f=$(sed -E 's/^[^:]*: [0-9]+ passed, ([0-9]+) failed.*/\1/' <<<"$line")
    k=$(grep -oE "^$name: ([0-9]+ passed, [0-9]+ failed, )?[0-9]+ skipped" "$file" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' | tail -1)
    if [ -z "$line" ]; then
        bad "$name: no summary line (exit $status)"
        return
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + ${k:-0}))
    if [ "$status" -ne 0 ] && [ "${f:-0}" -eq 0 ]; then
        bad "$name exited $status"
    else
        echo "${name}: $p passed, $f failed, ${k:-0} skipped (counted)"
    fi
}

step "C ABI: header current, library, pkg-config, C misuse test, C++ example, again under ASan+UBSan"
./scripts/ffi-test.sh 2>&1 | tee "$log/ffi.txt"
count_suite ffi-test "$log/ffi.txt" "${PIPESTATUS[0]}"

step "Python package: pip install ./python and torch into target/pyenv, pytest (the torch backend included), python -m barlink.bench --quick (scripts/python-test.sh)"
wait "$python_prepare"
sed 's/^/  prepared in the background: /' "$log/python-prepare.txt"
./scripts/python-test.sh 2>&1 | tee "$log/python.txt"
count_suite python-test "$log/python.txt" "${PIPESTATUS[0]}"

step "QEMU guest: real vfio-pci, IOMMU and BARs, edu DMA, soft-RoCE (tests/vm/run.sh)"
if ./tests/vm/selftest.sh >"$log/vmself.txt" 2>&1; then ok "vmtest output parser selftest"; else cat "$log/vmself.txt"; bad "vmtest output parser selftest"; fi
./tests/vm/run.sh 2>&1 | tee "$log/vm.txt"
vm_status=${PIPESTATUS[0]}
if [ "$vm_status" -eq 3 ]; then
    skip "guest test bed: $(grep -m1 'CANNOT RUN' "$log/vm.txt" | sed 's/^vmtest: //')"
else
    count_suite vmtest "$log/vm.txt" "$vm_status"
    [ "$vm_status" -eq 0 ] || echo "guest artifacts: target/vmtest/artifacts"
fi

step "loom models of the ring's index protocol (own target dir: --cfg loom)"
if ./scripts/loom.sh >"$log/loom.txt" 2>&1; then
    ok "loom: $(grep -o 'test result: ok. [0-9]* passed' "$log/loom.txt" | tail -1 | grep -o '[0-9]* passed') models hold"
else
    tail -30 "$log/loom.txt"
    bad "loom models"
fi

step "soak (${SOAK_DURATION:-20s} of traffic with faults injected into the ring windows)"
if cargo run -q -- soak --duration "${SOAK_DURATION:-20s}" --fault-rate 0.001 --progress-every 5; then
    ok "soak: nothing lost, corrupted or duplicated"
else
    bad "soak"
fi

step "fuzz smoke (${FUZZ_SECONDS}s per target, stable toolchain, no sanitizer)"
if [ "$FUZZ_SECONDS" -gt 0 ]; then
    if ! cargo fuzz --version >/dev/null 2>&1; then
        echo "installing cargo-fuzz from crates.io"
        cargo install cargo-fuzz --locked --quiet || bad "cargo install cargo-fuzz"
    fi
    if cargo fuzz --version >/dev/null 2>&1; then
        for target in $(cd fuzz && cargo fuzz list); do
            # New inputs go to a scratch corpus; the committed seeds stay as they are.
            scratch=$(mktemp -d)
            if (cd fuzz && cargo fuzz run --sanitizer none "$target" "$scratch" "corpus/$target" \
                    -- -max_total_time="$FUZZ_SECONDS" -print_final_stats=1) >"$log/fuzz-$target.txt" 2>&1; then
                runs=$(grep -o 'Done [0-9]* runs' "$log/fuzz-$target.txt" | tail -1)
                ok "fuzz $target: ${runs:-ran}, no crash"
            else
                tail -40 "$log/fuzz-$target.txt"
                bad "fuzz $target found a crash (input saved under fuzz/artifacts/$target)"
            fi
            rm -rf "$scratch"
        done
    fi
else
    skip "fuzz smoke: FUZZ_SECONDS=0"
fi

step "benchmarks, once each (criterion's test mode under cargo test: runs, does not time)"
# The test profile shares the build of the tests above; timing figures
# come from `cargo bench` and `barlink bench`, never from here.
if cargo test --bench engine >"$log/bench.txt" 2>&1; then
    ok "cargo test --bench engine: $(grep -c '^Success' "$log/bench.txt") benchmarks ran once"
else
    tail -30 "$log/bench.txt"
    bad "criterion benchmarks"
fi

total_passed=$((tests_passed + passed))
total_failed=$((tests_failed + failed))
echo
echo "took $((SECONDS / 60))m$((SECONDS % 60))s"
echo "checks: $passed passed, $failed failed (tests counted separately: $tests_passed passed, $tests_failed failed, $tests_skipped skipped)"
echo "test-all: $total_passed passed, $total_failed failed, $skipped skipped"
rm -rf "$log"
[ "$failed" -eq 0 ] && [ "$test_status" -eq 0 ]
