#!/usr/bin/env bash
# The C ABI against the Rust link, between two processes, in the same run:
# ffi/bench/ffi_bench.c (blocking barlink_send, barlink_post_send + poll,
# zero-copy barlink_post_send_buffer; default config) and `barlink bench
# --paths barlink,barlink-copied,barlink-acked` (the Rust link the C face
# wraps) take turns size by size, ROUNDS times; each round's ratio is C /
# Rust at each size, and the medians of the rounds are printed with the
# CPU they ran on, beside each C mode's one-way latency less the Rust
# link's. The
# latency is the median of 20,000 round trips at sizes up to 4 KiB (the
# small differences a C call makes are lost among 500 on a shared VM) and
# of 500 above.
# Last, ffi/examples/latency_pairs.rs takes the 64 B one-way through both
# in turns between one pair of processes: a shared VM's launches differ by
# more than the gap, and that figure does not see them.
#
# Three Rust baselines: `barlink` sends one shared buffer again and again
# (a count more each time, never a copy, many messages in flight), as
# zero-copy barlink_post_send_buffer does; `barlink-copied` sends a copy
# of the bytes made for each message (into buffers reused once
# acknowledged, as the C face reuses its spares), as a Rust caller that
# only borrows its memory must, and as barlink_post_send and a blocking
# barlink_send below its lending size (4 packets) do; `barlink-acked`
# sends its one buffer again only once the link let go of it (each
# message acknowledged first), as a Rust caller that refills one buffer
# for every message must, and as a blocking barlink_send that lends its
# bytes lets its caller do. "C/Rust" is to `barlink`, "C/Rust same use"
# to the path that does what the C call did (for a blocking send, by
# what barlink_get_stats says it did: lent or copied). The latencies are
# compared with `barlink`'s.
#
#   scripts/ffi-bench.sh [--rounds 3] [--sizes 64,4K,64K,1M,16M] [--quick]
#                        [--recv in-place|copy|posted] [--progress-thread]
#
# --quick: 64,64K,1M, 2 rounds of 3 windows of 8 MiB, 2,000 round trips for
# the small sizes' latency (under a minute).
# --recv: how the C receiver takes messages: in place (barlink_recv_message,
# as the Rust link's receiver takes its buffers; the default), copied
# into its own buffer (barlink_recv), or landing in receives it keeps
# posted ahead into a pool of its own (barlink_post_recv, each taken with
# barlink_wait_completion), as a server lends its buffers.
# --progress-thread: the C links run with BARLINK_CONFIG_PROGRESS_THREAD (a
# thread per link moves packets while the caller copies; on a machine with
# cores to spare); the Rust link stays driven by its caller.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
rounds=3 sizes=64,4K,64K,1M,16M windows=5 bytes=64M lat=500 small_lat=20000 recv=in-place progress=
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) rounds=$2; shift 2 ;;
        --progress-thread) progress=--progress-thread; shift ;;
        --sizes) sizes=$2; shift 2 ;;
        --quick) rounds=2 sizes=64,64K,1M windows=3 bytes=8M lat=200 small_lat=2000; shift ;;
        --recv) recv=$2; shift 2 ;;
        *) echo "usage: scripts/ffi-bench.sh [--rounds N] [--sizes LIST] [--quick] [--recv in-place|copy|posted] [--progress-thread]" >&2; exit 2 ;;
    esac
done
target="${CARGO_TARGET_DIR:-$root/target}"
work="$target/ffi-bench"
mkdir -p "$work"
# On a machine without Rust or a C compiler: FFI_BENCH=path/to/ffi_bench
# (built here, its library found through LD_LIBRARY_PATH) and
# BARLINK_BIN=path/to/barlink skip the build.
barlink="${BARLINK_BIN:-$target/release/barlink}"
ffi_bench="${FFI_BENCH:-}"
if [ -z "$ffi_bench" ]; then
    ./scripts/ffi-test.sh --build >/dev/null
    cargo build --release --quiet --bin barlink
    cargo build --release --quiet -p barlink-c -p barlink-ffi --lib --example latency_pairs
    gcc -O2 -Wall -Wextra -std=c11 -I ffi/include ffi/bench/ffi_bench.c \
        -L "$target/release" -lbarlink_c -Wl,-rpath,"$target/release" -o "$work/ffi_bench"
    ffi_bench="$work/ffi_bench"
fi
bytes_of() { # 64K -> 65536, as barlink bench reads sizes
    python3 -c 'import sys
u={"":1,"K":1<<10,"M":1<<20,"G":1<<30}
print(",".join(str(int(s.rstrip("KMG"))*u[s[len(s.rstrip("KMG")):]]) for s in sys.argv[1].split(",")))' "$1"
}
c_bytes=$(bytes_of "$bytes")
# Round trips timed at `size`: many where the latency is the figure.
lat_iters() {
    if [ "$(bytes_of "$1")" -le 4096 ]; then echo "$small_lat"; else echo "$lat"; fi
}
echo "# scripts/ffi-bench.sh: C ABI / Rust link, $rounds rounds, sizes $sizes, $windows windows of $bytes, C receiving $recv${progress:+, C links with a progress thread}"
"$barlink" bench --paths barlink --sizes 64 --windows 1 --lat-iters 1 | grep '^# cpu'
# A barlink from before session 56 (BARLINK_BIN) has no barlink-acked.
rust_paths=barlink,barlink-copied,barlink-acked
if ! "$barlink" bench --help | grep -q barlink-acked; then
    rust_paths=barlink,barlink-copied
    echo "# note: $barlink has no barlink-acked path: a blocking send that lends has no same-use ratio"
fi
# Size by size, the Rust link and then the C ABI: the two runs of a size
# lie seconds apart, so a change of the machine's speed between them is
# rarer than across whole runs of every size.
for round in $(seq "$rounds"); do
    : >"$work/rust.$round.jsonl"
    : >"$work/c.$round.jsonl"
    for size in ${sizes//,/ }; do
        iters=$(lat_iters "$size")
        "$barlink" bench --paths "$rust_paths" --sizes "$size" --windows "$windows" \
            --bytes-per-window "$bytes" --lat-iters "$iters" --json >>"$work/rust.$round.jsonl"
        "$ffi_bench" --sizes "$(bytes_of "$size")" --windows "$windows" --bytes-per-window "$c_bytes" \
            --lat-iters "$iters" --recv "$recv" $progress --json >>"$work/c.$round.jsonl"
    done
done
python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def rows(path):
    return [json.loads(line) for line in open(path) if line.startswith("{")]
# A size's C and Rust runs follow each other: where the machine's speed
# changed between them (a shared VM's slow phases run every path several
# times slower), their ratios say nothing, and in a slow phase they show
# the machine, not barlink. Zero copy moves each size at well within 2.5x
# of the Rust link's speed: a round's size where it is 2.5x off, or where
# the Rust link moved it 2.5x slower than in its fastest round, is left
# out of the medians.
runs = []
for r in range(1, rounds + 1):
    rust = {(row["path"], row["size_bytes"]): row for row in rows(f"{work}/rust.{r}.jsonl")}
    runs.append((rust, rows(f"{work}/c.{r}.jsonl")))
all_sizes = sorted({row["size_bytes"] for _, c in runs for row in c})
fastest = {size: max(rust[("barlink", size)]["gbps"] for rust, _ in runs) for size in all_sizes}
def steady(run, size):
    rust, c = run
    own = rust[("barlink", size)]["gbps"]
    zero_copy = [row for row in c if row["size_bytes"] == size and row["path"] == "c-post-send-buffer"]
    return own > fastest[size] / 2.5 and all(1 / 2.5 < row["gbps"] / own < 2.5 for row in zero_copy)
kept = {size: [r for r, run in enumerate(runs, start=1) if steady(run, size)] for size in all_sizes}
for size in all_sizes:
    if not kept[size]:
        print(f"# note: {size} B: the machine's speed changed within every round: its medians take them all "
              f"and say little")
        kept[size] = list(range(1, rounds + 1))
    elif len(kept[size]) < rounds:
        left = [r for r in range(1, rounds + 1) if r not in kept[size]]
        print(f"# note: {size} B: round(s) {', '.join(map(str, left))} left out of the medians: zero copy 2.5x "
              f"off the Rust link, or the Rust link 2.5x slower than in its fastest round (the machine's speed "
              f"changed); their rows are in {work}/c.N.jsonl and rust.N.jsonl")
ratio, copied_ratio, same_ratio, lat_delta, c_gbps = {}, {}, {}, {}, {}
# The Rust path that does what each C call did: zero copy pipelined
# against `barlink`, a copy per message against `barlink-copied`, and a
# blocking send against `barlink-acked` (one buffer sent again once
# acknowledged) where it lent most of its messages over the kept rounds
# (barlink_get_stats, in ffi_bench's rows), else `barlink-copied`. None
# where that is unknown: an ffi_bench or a barlink from before session 56.
lent, copied_count = {}, {}
for r in range(1, rounds + 1):
    for row in runs[r - 1][1]:
        if r in kept[row["size_bytes"]] and "messages_lent" in row:
            key = (row["size_bytes"], row["path"])
            lent[key] = lent.get(key, 0) + row["messages_lent"]
            copied_count[key] = copied_count.get(key, 0) + row["messages_copied"]
def same_use(key, rust):
    path = key[1]
    if path == "c-post-send-buffer":
        return "barlink"
    if path != "c-send":
        return "barlink-copied"
    if key not in lent:
        return None
    same = "barlink-acked" if lent[key] > copied_count[key] else "barlink-copied"
    return same if (same, key[0]) in rust else None
same_path = {}
rust_gbps = {size: [runs[r - 1][0][("barlink", size)]["gbps"] for r in kept[size]] for size in all_sizes}
for r in range(1, rounds + 1):
    rust, c = runs[r - 1]
    for row in c:
        if r not in kept[row["size_bytes"]]:
            continue
        base = rust[("barlink", row["size_bytes"])]
        copied = rust[("barlink-copied", row["size_bytes"])]
        key = (row["size_bytes"], row["path"])
        ratio.setdefault(key, []).append(row["gbps"] / base["gbps"])
        copied_ratio.setdefault(key, []).append(row["gbps"] / copied["gbps"])
        same = same_use(key, rust)
        same_path[key] = same
        if same is not None:
            same_ratio.setdefault(key, []).append(row["gbps"] / rust[(same, row["size_bytes"])]["gbps"])
        c_gbps.setdefault(key, []).append(row["gbps"])
        lat_delta.setdefault(key, []).append(row["lat_p50_us"] - base["lat_p50_us"])
if any(path is None for path in same_path.values()):
    print("# note: a blocking send's same-use ratio is left out (-): this ffi_bench does not say whether it "
          "lent or copied, or this barlink has no barlink-acked path (both came in session 56)")
print(f"# {'size':>10}  {'C path':<20} {'C GB/s':>8} {'Rust GB/s':>10} {'C/Rust':>7}  (rounds' ratios)   "
      f"{'C/Rust copied':>13}  {'C/Rust same use':<22}  one-way p50 C - Rust (barlink)")
for (size, path), values in sorted(ratio.items()):
    key = (size, path)
    same = (f"{statistics.median(same_ratio[key]):.2f} ({same_path[key]})" if same_path[key] else "-")
    print(f"  {size:>10}  {path:<20} {statistics.median(c_gbps[key]):>8.2f} "
          f"{statistics.median(rust_gbps[size]):>10.2f} {statistics.median(values):>7.2f}  "
          f"({', '.join(f'{v:.2f}' for v in values)})   {statistics.median(copied_ratio[key]):>13.2f}  "
          f"{same:<22}  {statistics.median(lat_delta[key]):+.2f} us")
PY
pairs="$target/release/examples/latency_pairs"
# It takes the C ABI as the default run does: receiving in place, driven by
# the caller. Given FFI_BENCH, it finds the library as ffi_bench does.
lib=(--lib "$target/release/libbarlink_c.so")
[ -n "${FFI_BENCH:-}" ] && lib=()
if [ "$recv" != in-place ] || [ -n "$progress" ]; then
    echo "# note: 64 B in turns skipped: it receives in place with no progress thread, unlike this run"
elif [ ! -x "$pairs" ]; then
    echo "# note: 64 B in turns skipped: $pairs is not built (cargo build --release -p barlink-c -p barlink-ffi --lib --example latency_pairs)"
else
    "$pairs" "${lib[@]}" --turns 200 --per-turn 100 --modes c-send,c-post-send,c-post-send-buffer | grep -v "^# cpu" ||
        echo "# note: latency_pairs failed (its message is above)"
fi
