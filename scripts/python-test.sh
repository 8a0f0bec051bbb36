#!/usr/bin/env bash
# The Python package as a new user gets it: a virtual environment under
# target/ (kept, so reruns reuse it), `pip install ./python` (maturin comes
# through pip's build isolation), the pytest suite against the installed
# package, and `python -m barlink.bench --quick` once as a smoke run and
# once more sending a bytearray (`--send writable`; figures not checked).
# torch (CPU use only; pip brings its CUDA runtime wheels, ~7 GB, kept in
# the environment for reruns) is installed for the torch.distributed
# backend's tests. Ends with "python-test: N
# passed, M failed, K skipped".
#
#   BARLINK_PYENV=target/pyenv   where the environment lives
#   PYTHON=python3               the interpreter it is made from (>= 3.11)
#   BARLINK_TORCH=0              leave torch out: its tests say SKIPPED
#   BARLINK_PY_PROFILE=dev       cargo profile of the extension (release: as users get it)
#
#   scripts/python-test.sh --prepare   only the environment (venv, pytest,
#                                      numpy, torch): test-all.sh runs it in
#                                      the background while Rust compiles
set -uo pipefail
cd "$(dirname "$0")/.."
prepare_only=0 summary_name=python-test
[ "${1:-}" = --prepare ] && prepare_only=1 summary_name=python-prepare

venv=${BARLINK_PYENV:-target/pyenv}
python=${PYTHON:-python3}
passed=0
failed=0
skipped=0
ok() { passed=$((passed + 1)); echo "ok: $*"; }
bad() { failed=$((failed + 1)); echo "FAILED: $*"; }
summary() {
    echo "$summary_name: $passed passed, $failed failed, $skipped skipped"
    [ "$failed" -eq 0 ]
    exit
}

if [ ! -x "$venv/bin/python" ]; then
    if ! "$python" -m venv "$venv" 2>/dev/null; then
        # Debian's python3 keeps venv in a package of its own.
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "installing python3-venv (apt-get)"
            # test-all.sh runs this in the background while its own steps
            # may install packages: wait for dpkg's lock rather than fail.
            lock=(-o DPkg::Lock::Timeout=120)
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${lock[@]}" python3-venv >/dev/null 2>&1 ||
                { apt-get update -qq "${lock[@]}" >/dev/null 2>&1 &&
                    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${lock[@]}" python3-venv >/dev/null 2>&1; }
        fi
        rm -rf "$venv"
        "$python" -m venv "$venv" || { bad "$python -m venv $venv"; summary; }
    fi
fi
if "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    ok "$("$venv/bin/python" --version) in $venv"
else
    bad "the package needs Python >= 3.11; $venv has $("$venv/bin/python" --version 2>&1) (set PYTHON)"
    summary
fi
if "$venv/bin/pip" install -q --disable-pip-version-check "pytest>=8" "numpy>=1.26"; then
    ok "pip install pytest numpy"
else
    bad "pip install pytest numpy"
    summary
fi
if [ "${BARLINK_TORCH:-1}" = 0 ]; then
    skipped=$((skipped + 1))
    echo "SKIPPED: pip install torch (BARLINK_TORCH=0): the torch backend's tests say SKIPPED"
else
    started=$(date +%s)
    if "$venv/bin/pip" install -q --disable-pip-version-check "torch>=2.4"; then
        ok "pip install torch: $("$venv/bin/python" -c 'import torch; print(torch.__version__)') ($(($(date +%s) - started)) s)"
    else
        bad "pip install torch (set BARLINK_TORCH=0 to run without the torch backend's tests)"
    fi
fi
if [ "$prepare_only" = 1 ]; then
    summary
fi
started=$(date +%s)
# The tests build the extension in the dev profile (its own crate and the
# transport optimized, see Cargo.toml), which shares the dependencies the
# cargo tests built: the release profile's fat LTO is for figures.
# BARLINK_PY_PROFILE=release builds what `pip install ./python` gives users.
profile=${BARLINK_PY_PROFILE:-dev}
if MATURIN_PEP517_ARGS="--profile $profile" "$venv/bin/pip" install -q --disable-pip-version-check \
    --force-reinstall --no-deps ./python; then
    ok "pip install ./python, $profile profile ($(($(date +%s) - started)) s)"
else
    bad "pip install ./python"
    summary
fi

# From the repository root the tests import the installed package, not
# python/barlink (which has no compiled module in a fresh clone).
log=$(mktemp)
# The build the extension reports (barlink.cpu()["build"]), for its test:
# the profiles with debug assertions report "debug".
case $profile in
    dev | test) expect_build=debug ;;
    *) expect_build=release ;;
esac
BARLINK_TEST_BUILD=$expect_build "$venv/bin/pytest" -q -p no:cacheprovider python/tests 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
line=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$log" | tail -1)
count() { grep -oE "[0-9]+ $1" <<<"$line" | grep -oE '[0-9]+' || echo 0; }
p=$(count passed)
f=$(count failed)
e=$(count error)
k=$(count skipped)
passed=$((passed + p))
failed=$((failed + f + e))
skipped=$((skipped + k))
if [ "$status" -ne 0 ] && [ $((f + e)) -eq 0 ]; then bad "pytest exited $status"; fi
rm -f "$log"

cli=(--no-cli)
[ -x target/release/barlink ] && cli=(--barlink target/release/barlink)
if "$venv/bin/python" -m barlink.bench --quick --rounds 1 --sizes 64,64K,1M "${cli[@]}"; then
    ok "python -m barlink.bench --quick (smoke of the $profile build: figures not checked)"
else
    bad "python -m barlink.bench --quick"
fi
# The writable path (a bytearray, lent for the call): its row says so.
if "$venv/bin/python" -m barlink.bench --quick --rounds 1 --sizes 1M --send writable --no-cli --json \
    | grep '"path": "python".*"send": "writable"' >/dev/null; then
    ok "python -m barlink.bench --send writable (smoke: a bytearray sent lent)"
else
    bad "python -m barlink.bench --send writable"
fi
summary
