#!/usr/bin/env bash
# The GPU checks, in one run on a machine with an NVIDIA GPU (about 3
# minutes on an H200 machine): the CUDA layer's device tests, `barlink
# validate --gpu`, and `barlink bench --gpu` with its baselines, then the
# torch backend on CUDA tensors and what two contexts taking turns on one
# GPU cost (scripts/gpu_turns.py); it prints the GPU's name, driver and BAR1
# size first and which routes the device allowed, then measures the CPU.
# Each step has a limit; together they pass 10 minutes, so a run cut short
# loses the CPU measurements, which come last.
#
#   scripts/gpu-check.sh            build with cargo here, then run
#   scripts/gpu-check.sh --build    only build: release binaries, stripped,
#                                   into target/gpu-check/ (to copy to a GPU
#                                   machine that has no Rust toolchain)
#   scripts/gpu-check.sh --run      only run, from target/gpu-check/
#
# The build also makes the Python wheel (target/gpu-check/wheels/); where
# the GPU machine's python3 has torch, the run installs it into a temporary
# folder and runs the placement and torch backend tests against that torch
# and its CUDA device.
#
# Output also goes to $OUT (or target/gpu-check/out) as gpu-check.log,
# bench-gpu.jsonl, torch-cuda.jsonl, bench-cpu.jsonl and torch-cpu.jsonl.
# Ends with "gpu-check: N passed, M failed". GPU_CHECK_CPU=0 skips the
# CPU measurements (for a scripts/figures.sh run after it).
set -uo pipefail
cd "$(dirname "$0")/.."
dir=target/gpu-check
mode=${1:-all}

build() {
    echo "== building release binaries into $dir"
    mkdir -p "$dir"
    cargo build --release --bin barlink || return 1
    cp target/release/barlink "$dir/barlink"
    # The CUDA layer's real-device tests, as an executable that runs without cargo.
    local test_exe
    test_exe=$(cargo test --release -p barlink-cuda --test device --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
    [ -n "$test_exe" ] || { echo "could not build the device tests"; return 1; }
    cp "$test_exe" "$dir/cuda-device-tests"
    strip "$dir/barlink" "$dir/cuda-device-tests" 2>/dev/null || true
    # The Python package (abi3, so one wheel serves the GPU machine's python3).
    local pip=target/pyenv/bin/pip
    [ -x "$pip" ] || pip="python3 -m pip"
    rm -rf "$dir/wheels" && mkdir -p "$dir/wheels"
    $pip wheel -q --no-deps ./python -w "$dir/wheels" || return 1
    ls -la "$dir"
}

case $mode in
    --build) build; exit $? ;;
    --run) ;;
    all) build || exit 1 ;;
    *) echo "usage: scripts/gpu-check.sh [--build|--run]" >&2; exit 2 ;;
esac

out=${OUT:-$dir/out}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1
passed=0
failed=0
check() { # name, timeout in seconds, command...
    local name=$1 limit=$2
    shift 2
    echo
    echo "== $name"
    local rc=0
    timeout "$limit" "$@" || rc=$?
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1)); echo "ok: $name"
    else
        failed=$((failed + 1)); echo "FAILED: $name (exit $rc$([ "$rc" -eq 124 ] && echo ": past its $limit s"))"
    fi
}

echo "== the GPU"
grep -m1 'model name' /proc/cpuinfo
echo "cpu features: $(grep -m1 -ow 'avx512f\|vpclmulqdq' /proc/cpuinfo | sort -u | tr '\n' ' ')"
if command -v nvidia-smi >/dev/null; then
    timeout 20 nvidia-smi --query-gpu=name,driver_version,pci.bus_id,memory.total --format=csv
    timeout 20 nvidia-smi -q -d MEMORY | sed -n '/BAR1/,/Free/p'
    timeout 20 nvidia-smi topo -m 2>/dev/null | head -5
else
    echo "nvidia-smi: not found"
fi
for gpu in /sys/bus/pci/devices/*; do
    [ "$(cat "$gpu/vendor" 2>/dev/null)" = 0x10de ] || continue
    echo "sysfs $(basename "$gpu"): $(cd "$gpu" && ls resource[0-9]* 2>/dev/null | tr '\n' ' ')"
    cat "$gpu/resource" 2>/dev/null | head -6
done

check "CUDA layer on the device (cuda-device-tests)" 60 "$dir/cuda-device-tests" --nocapture --test-threads=1
check "barlink validate --gpu" 90 "$dir/barlink" validate --gpu
# One run, its rows kept and shown: the device time is short.
check "barlink bench --gpu --json" 120 bash -c 'set -o pipefail; "$1" bench --gpu --json --windows 5 --lat-iters 300 | tee "$2"' \
    _ "$dir/barlink" "$out/bench-gpu.jsonl"
torch_version=$(timeout 60 python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)
if ls "$dir"/wheels/barlink-*.whl >/dev/null 2>&1 && [ -n "$torch_version" ]; then
    site=$(mktemp -d)
    if timeout 60 python3 -m pip install -q --no-index --no-deps --target "$site" "$dir"/wheels/barlink-*.whl; then
        # The tests a GPU changes; the rest run in CI (each rank's import
        # of a CUDA torch takes seconds, so the whole suite would not fit).
        check "python: the torch backend on the GPU (torch $torch_version)" 200 \
            env PYTHONPATH="$site" python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_placement.py python/tests/test_torch.py \
            -k '(cuda and not staged) or real_gpu or distributed_data'
        check "python -m barlink.torch.bench --device cuda (barlink and gloo on CUDA tensors)" 90 \
            env PYTHONPATH="$site" bash -c 'set -o pipefail; python3 -m barlink.torch.bench --device cuda --ops all_reduce,broadcast,send_recv -b 1M -e 64M -f 8 --windows 3 --json | tee "$1"' \
            _ "$out/torch-cuda.jsonl"
    else
        failed=$((failed + 1)); echo "FAILED: pip install the barlink wheel"
        site=
    fi
else
    echo
    echo "SKIPPED python: no wheel in $dir/wheels or no torch in python3"
fi
if [ -n "$torch_version" ]; then
    # bench --gpu's two ends are two CUDA contexts on one GPU: what that
    # arrangement alone costs a turn (its CPU run: the pipe's part).
    check "two processes taking turns on the GPU (scripts/gpu_turns.py)" 90 \
        bash -c 'python3 scripts/gpu_turns.py cuda 3000 && python3 scripts/gpu_turns.py cpu 3000'
fi
echo
echo "== the platform as barlink sees it"
timeout 15 "$dir/barlink" topo 2>&1 | head -40
timeout 15 "$dir/barlink" doctor 2>&1 | head -60
echo
echo "== routes the device allowed (from the tests above)"
# The test prints the dma-buf route after its own name, on the same line.
sed '/^== routes the device allowed/q' "$out/gpu-check.log" |
    grep -o -E '(dma-buf export|CUDA IPC export): .*' || echo "(the device tests did not run)"
grep -o '"cuda_ipc_refused":"[^"]*"' "$out/bench-gpu.jsonl" 2>/dev/null | sort -u || true

# Last, so that a run cut short loses only these: the host-memory link
# and the torch backend on CPU tensors, measured on this machine's CPU
# (a kind the development machines may not have). GPU_CHECK_CPU=0 leaves
# them to a scripts/figures.sh run after this one, which repeats them.
if [ "${GPU_CHECK_CPU:-1}" = 0 ]; then
    echo
    echo "SKIPPED the CPU measurements: GPU_CHECK_CPU=0 (scripts/figures.sh measures this CPU)"
else
    check "barlink bench on host memory, this CPU" 60 bash -c 'set -o pipefail; "$1" bench --sizes 64,4K,64K,1M,16M --windows 5 --paths barlink,raw-ring,raw-ring-crc --json | tee "$2"' \
        _ "$dir/barlink" "$out/bench-cpu.jsonl"
    if [ -n "${site:-}" ]; then
        check "python -m barlink.torch.bench on CPU tensors" 90 \
            env PYTHONPATH="$site" bash -c 'set -o pipefail; python3 -m barlink.torch.bench --ops all_reduce,broadcast,all_gather,send_recv -b 4M -e 64M -f 4 --windows 3 --json | tee "$1"' \
            _ "$out/torch-cpu.jsonl"
    fi
fi
echo
echo "gpu-check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
