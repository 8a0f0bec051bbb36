#!/usr/bin/env bash
# Checks tests/vm/libtest.awk (how run.sh reads libtest's output) on canned
# outputs. Needs no QEMU; takes well under a second.
# Ends with "vmtest-selftest: N passed, M failed".
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
passed=0 failed=0

case_() { # name rc expected-output <<< input
    local name=$1 rc=$2 want=$3 got
    got=$(awk -v rc="$rc" -f "$HERE/libtest.awk" /dev/stdin)
    if [ "$got" = "$want" ]; then
        passed=$((passed + 1)); echo "ok: $name"
    else
        failed=$((failed + 1)); echo "FAILED: $name"
        diff <(echo "$want") <(echo "$got") | sed 's/^/    /'
    fi
}

case_ "results on the test lines, panic message as the reason" 101 "PASS guest_a
FAIL guest_b -- assertion failed: x == y
SKIP guest_c -- ignored
RESULT 3 3 101" <<'EOF'

running 3 tests
test guest_a ... ok
test guest_b ... FAILED
test guest_c ... ignored, needs the guest

failures:

---- guest_b stdout ----

thread 'guest_b' (248) panicked at vfio/tests/guest.rs:28:27:
assertion failed: x == y
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    guest_b

test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 2 filtered out; finished in 0.96s

EOF

case_ "uncaptured stderr splits the result onto the next line" 0 "PASS guest_link
PASS guest_bind
RESULT 2 2 0" <<'EOF'
running 2 tests
test guest_link ... guest_link: received 10000 messages; Stats { crc_failures: 0 }
ok
test guest_bind ... ok

test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 9 filtered out; finished in 30.1s
EOF

case_ "a test that printed SKIPPED is skipped, not passed" 0 "SKIP guest_x -- printed SKIPPED
SKIP guest_y -- printed SKIPPED
PASS guest_z
RESULT 3 3 0" <<'EOF'
running 3 tests
test guest_x ... SKIPPED guest_x: needs the QEMU guest (tests/vm/run.sh)
ok
test guest_y ... some other output
SKIPPED guest_y: no edu device
ok
test guest_z ... ok
EOF

case_ "the guest stopped mid-test (no exit status)" "" "PASS guest_a
FAIL guest_b -- no result: the guest stopped before the test ended
RESULT 3 2 " <<'EOF'
running 3 tests
test guest_a ... ok
test guest_b ... 
EOF

case_ "killed by the guest's timeout" "" "PASS guest_a
FAIL guest_hang -- no result: killed by the timeout
RESULT 2 2 137" <<'EOF'
running 2 tests
test guest_a ... ok
test guest_hang ... VMTEST-RC barlink-vfio-guest 137
EOF

case_ "the binary died before running a test" "" "RESULT 0 0 127" <<'EOF'
/mnt/bins/bin/x: error while loading shared libraries: libfoo.so.1: cannot open shared object file
VMTEST-RC barlink-vfio-guest 127
EOF

case_ "module paths in test names" 0 "PASS bind::guest_a
PASS host_after_guest_b
RESULT 2 2 0" <<'EOF'
running 2 tests
test bind::guest_a ... ok
test host_after_guest_b ... ok
EOF

echo "vmtest-selftest: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
