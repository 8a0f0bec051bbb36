#!/usr/bin/env bash
# The figures the open issues ask for, measured on this machine's CPU in
# one run, each against its baseline measured in the same run: the link on
# host memory against the raw ring (and its goodput under injected faults),
# the TCP medium on loopback against iperf3 and a TCP ping-pong (plain and
# sealed), the torch backend on CPU tensors against gloo, and the C ABI
# against the Rust link (scripts/ffi-bench.sh). Each repeats RUNS times; a
# summary at the end gives every run's ratio and the medians, and, on the
# host, fault, TCP and torch lines, whether the median meets the target the
# project set for it (the C ABI's lines are ffi-bench.sh's own).
#
#   scripts/figures.sh [--runs 3] [--only host,tcp,torch,ffi] [--bin PATH]
#
# --bin: the barlink binary (default target/release/barlink, built with
# cargo if absent; target/gpu-check/barlink on a machine without Rust).
# iperf3 comes from PATH; a folder holding iperf3 and its libraries can be
# put first with BARLINK_TOOLS=DIR. The torch step needs torch in python3
# (or PYTHON=...) and measures a release build of the barlink package only:
# the one python3 imports if it is one (the test command's is not), else a
# wheel of this tree built with cargo, else the wheel of scripts/gpu-check.sh
# --build, installed into a temporary folder. The C ABI step builds with
# cargo and gcc, or takes a prebuilt ffi_bench from FFI_BENCH (see
# scripts/ffi-bench.sh). Output: $OUT (or target/figures/), one .jsonl a
# run.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
runs=3 only=host,tcp,torch,ffi bin=
while [ $# -gt 0 ]; do
    case $1 in
        --runs) runs=$2; shift 2 ;;
        --only) only=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        *) echo "usage: scripts/figures.sh [--runs N] [--only host,tcp,torch,ffi] [--bin PATH]" >&2; exit 2 ;;
    esac
done
if [ -z "$bin" ]; then
    bin=target/release/barlink
    [ -x "$bin" ] || cargo build --release --quiet --bin barlink || exit 1
fi
[ -x "$bin" ] || { echo "figures: no barlink binary at $bin" >&2; exit 1; }
if [ -n "${BARLINK_TOOLS:-}" ]; then
    export PATH="$BARLINK_TOOLS:$PATH" LD_LIBRARY_PATH="$BARLINK_TOOLS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
python=${PYTHON:-python3}
out=${OUT:-target/figures}
mkdir -p "$out"
rm -f "$out"/*.jsonl "$out"/*.jsonl.server "$out"/ffi.txt
wanted() { [[ ",$only," == *",$1,"* ]]; }
failed=0
step() { # name, limit in seconds, command...
    local name=$1 limit=$2 rc=0
    shift 2
    echo "== $name"
    timeout "$limit" "$@" || rc=$?
    [ "$rc" -eq 0 ] || { failed=$((failed + 1)); echo "FAILED: $name (exit $rc)"; }
}

echo "# scripts/figures.sh: $runs runs, $(nproc) CPUs"
grep -m1 'model name' /proc/cpuinfo
echo "cpu features: $(grep -ow 'avx512f\|vpclmulqdq' /proc/cpuinfo | sort -u | tr '\n' ' ')"

if wanted host; then
    for run in $(seq "$runs"); do
        step "host memory, run $run" 120 bash -c 'set -o pipefail; "$1" bench --sizes 64,4K,64K,1M,16M --windows 7 --paths barlink,raw-ring,raw-ring-crc --json > "$2"' \
            _ "$bin" "$out/host.$run.jsonl"
    done
    step "host memory with faults (rate 0.001)" 120 bash -c 'set -o pipefail; "$1" bench --sizes 64K,1M --windows 7 --paths barlink,barlink-faults --fault-rate 0.001 --json > "$2"' \
        _ "$bin" "$out/faults.jsonl"
fi

tcp_pair() { # output file, client arguments...
    local file=$1 port=18616
    shift
    local server_args=()
    [[ " $* " == *" --encrypt "* ]] && server_args=(--encrypt)
    "$bin" bench --tcp --server --listen "127.0.0.1:$port" --psk-file "$psk" --accept-timeout 30 \
        "${server_args[@]}" --json > "$file.server" 2>&1 &
    local server=$!
    sleep 0.5
    local rc=0
    "$bin" bench --tcp "127.0.0.1:$port" --psk-file "$psk" --json "$@" > "$file" || rc=$?
    wait "$server" || rc=$?
    return "$rc"
}
if wanted tcp; then
    command -v iperf3 >/dev/null || echo "note: iperf3 is not in PATH: the TCP rows have no bandwidth baseline"
    psk=$(mktemp -u)
    export bin psk
    "$bin" keygen --psk --out "$psk" >/dev/null || exit 1
    for run in $(seq "$runs"); do
        step "tcp plain, run $run" 90 bash -c "$(declare -f tcp_pair); tcp_pair \"\$@\"" _ \
            "$out/tcp.$run.jsonl" --sizes 64,1M --windows 7
        step "tcp sealed, run $run" 90 bash -c "$(declare -f tcp_pair); tcp_pair \"\$@\"" _ \
            "$out/tcp-sealed.$run.jsonl" --sizes 1M --windows 7 --encrypt
    done
    rm -f "$psk"
fi

if wanted torch; then
    # Only a release build's figures are barlink's: the test command
    # installs a dev-profile build into its venv, several times slower.
    # A wheel installed for the step goes first on the caller's PYTHONPATH.
    path_with() { local p=$1; [ -n "${PYTHONPATH:-}" ] && p="${p:+$p:}$PYTHONPATH"; echo "$p"; }
    build_of() { PYTHONPATH="$(path_with "$1")" "$python" -c 'import barlink; print(barlink.cpu().get("build", "unknown"))' 2>/dev/null; }
    site= build=$(build_of "")
    imported=${build:-no barlink}
    if [ "$build" != release ]; then
        # This tree's code where cargo can build it; else (no Rust, or the
        # build failed) the wheel scripts/gpu-check.sh --build left.
        wheel=
        if command -v cargo >/dev/null; then
            echo "figures: the barlink $python imports is $imported, not a release build: building one for the torch step"
            rm -rf target/figures-wheel
            "$python" -m pip wheel -q --disable-pip-version-check --no-deps ./python -w target/figures-wheel >&2 &&
                wheel=$(ls target/figures-wheel/barlink-*.whl 2>/dev/null | head -1)
        fi
        [ -n "$wheel" ] || wheel=$(ls target/gpu-check/wheels/barlink-*.whl 2>/dev/null | head -1)
        if [ -n "$wheel" ]; then
            site=$(mktemp -d)
            "$python" -m pip install -q --no-index --no-deps --target "$site" "$wheel" || { rm -rf "$site"; site=; }
        fi
        build=$(build_of "$site")
    fi
    torch_path=$(path_with "$site")
    if [ "$build" != release ]; then
        echo "SKIPPED torch: no release build of barlink to measure ($python imports $imported${wheel:+; the wheel $wheel is ${build:-not importable}}; pip install ./python, or cargo to build one)"
    elif PYTHONPATH="$torch_path" "$python" -c 'import torch, barlink.torch' 2>/dev/null; then
        for run in $(seq "$runs"); do
            step "torch on CPU tensors, run $run" 150 env PYTHONPATH="$torch_path" bash -c 'set -o pipefail; "$1" -m barlink.torch.bench --ops all_reduce,broadcast,all_gather,send_recv -b 4M -e 64M -f 2 --windows 3 --json > "$2"' \
                _ "$python" "$out/torch.$run.jsonl"
        done
    else
        echo "SKIPPED torch: $python has no torch, or barlink.torch is not importable"
    fi
    [ -z "$site" ] || rm -rf "$site"
fi

if wanted ffi; then
    if [ -n "${FFI_BENCH:-}" ] || { command -v cargo >/dev/null && command -v gcc >/dev/null; }; then
        step "C ABI against the Rust link" 400 bash -c 'set -o pipefail; BARLINK_BIN="$1" scripts/ffi-bench.sh --rounds "$2" --sizes 64,64K,1M > "$3"' \
            _ "$bin" "$runs" "$out/ffi.txt"
    else
        echo "SKIPPED ffi: no FFI_BENCH, and no cargo and gcc to build it"
    fi
fi

"$python" - "$out" "$runs" <<'PY'
import json, os, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
def rows(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.startswith("{")]
def line(label, values, fmt="{:.2f}", target=None):
    # target: ("<=" or ">=", value) the median is held to, or None.
    if values:
        shown = " / ".join(fmt.format(v) for v in values)
        median = statistics.median(values)
        verdict = ""
        if target:
            op, bound = target
            met = median <= bound if op == "<=" else median >= bound
            verdict = f"   target {op} {bound}: {'met' if met else 'NOT met'}"
        print(f"{label:<44} {shown}   median {fmt.format(median)}{verdict}")
def size_name(n):
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"
print("\n== summary (each run's ratio, then the median)")
host = [rows(f"host.{r}.jsonl") for r in range(1, runs + 1)]
if any(host):
    for size in (64, 4096, 65536, 1 << 20, 16 << 20):
        if size == 64:
            line("host 64B one-way latency barlink/raw-ring", [
                b["lat_p50_us"] / w["lat_p50_us"] for run in host
                for b in run for w in run
                if b["size_bytes"] == w["size_bytes"] == 64 and b["path"] == "barlink" and w["path"] == "raw-ring"],
                target=("<=", 1.5))
            continue
        for path in ("barlink", "raw-ring-crc"):
            target = None
            if path == "barlink" and size >= 65536:
                target = (">=", 0.85)
            elif path == "raw-ring-crc" and size in (65536, 1 << 20):
                target = (">=", 0.9)
            line(f"host {size_name(size)} {path}/raw-ring", [
                row["ratio_to_raw_ring"] for run in host for row in run
                if row["size_bytes"] == size and row["path"] == path and row.get("ratio_to_raw_ring")],
                target=target)
faults = rows("faults.jsonl")
for size in (65536, 1 << 20):
    clean = [r["gbps"] for r in faults if r["size_bytes"] == size and r["path"] == "barlink"]
    faulty = [r["gbps"] for r in faults if r["size_bytes"] == size and r["path"] == "barlink-faults"]
    if clean and faulty:
        line(f"faults {size_name(size)} goodput/clean (rate 0.001)", [faulty[0] / clean[0]],
             target=(">=", 0.9))
plain = [rows(f"tcp.{r}.jsonl") for r in range(1, runs + 1)]
sealed = [rows(f"tcp-sealed.{r}.jsonl") for r in range(1, runs + 1)]
if any(plain):
    line("tcp 1M plain/iperf3", [r["ratio_to_iperf3"] for run in plain for r in run
                                 if r["path"] == "barlink-tcp" and r["size_bytes"] == 1 << 20 and r.get("ratio_to_iperf3")],
         target=(">=", 0.8))
    line("tcp 64B round trip/ping-pong", [r["lat_ratio_to_tcp_ping_pong"] for run in plain for r in run
                                          if r["path"] == "barlink-tcp" and r["size_bytes"] == 64 and r.get("lat_ratio_to_tcp_ping_pong")])
    line("tcp 1M plain GB/s", [r["gbps"] for run in plain for r in run
                               if r["path"] == "barlink-tcp" and r["size_bytes"] == 1 << 20])
    line("tcp 1M iperf3 GB/s", [r["gbps"] for run in plain for r in run
                                if r["path"] == "iperf3" and r["size_bytes"] == 1 << 20])
if any(plain) and any(sealed):
    pairs = []
    for p, s in zip(plain, sealed):
        pg = [r["gbps"] for r in p if r["path"] == "barlink-tcp" and r["size_bytes"] == 1 << 20]
        sg = [r["gbps"] for r in s if r["path"] == "barlink-tcp" and r["size_bytes"] == 1 << 20]
        if pg and sg:
            pairs.append(sg[0] / pg[0])
    line("tcp 1M sealed/plain", pairs)
torch = [rows(f"torch.{r}.jsonl") for r in range(1, runs + 1)]
if any(torch):
    # Issue 20's sizes; all_gather's is 4 MiB per rank, and a row's size
    # is its largest buffer (the gathered one: two ranks, 8 MiB).
    for op, size, target in (("all_reduce", 64 << 20, 4), ("broadcast", 64 << 20, 4),
                             ("all_gather", 8 << 20, 4), ("send_recv", 16 << 20, 5)):
        ratios = []
        for run in torch:
            by = {r.get("backend"): r for r in run if r.get("op") == op and r.get("size_bytes") == size}
            if "barlink" in by and "gloo" in by and by["barlink"].get("time_us") and by["gloo"].get("time_us"):
                ratios.append(by["gloo"]["time_us"] / by["barlink"]["time_us"])
        label = "4M per rank" if op == "all_gather" else size_name(size)
        line(f"torch {op} {label} barlink/gloo speed", ratios, target=(">=", target))
ffi = os.path.join(out, "ffi.txt")
if os.path.exists(ffi):
    print("C ABI / Rust link (scripts/ffi-bench.sh; medians of the rounds):")
    for row in open(ffi):
        if not row.startswith("# cpu"):
            print("  " + row.rstrip())
PY
echo "figures: $failed steps failed"
[ "$failed" -eq 0 ]
