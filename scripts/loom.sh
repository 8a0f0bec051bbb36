#!/usr/bin/env bash
# Model-checks the ring's head/consumed protocol with loom
# (transport/tests/loom_ring.rs): every interleaving of a producer and a
# consumer thread, and every value a weakly ordered load may return, within
# the models' preemption bound.
#
# `--cfg loom` changes every crate's build, so it builds into its own target
# directory (target/loom) and leaves the main one alone. Arguments go to the
# test binary (e.g. a test name to run one model). loom's variables apply:
#   LOOM_MAX_PREEMPTIONS=N  explore up to N preemptions (the models default to 3)
#   LOOM_LOG=1 LOOM_LOCATION=1  trace a failing model
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }--cfg loom"
export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}"
exec cargo test -p barlink-transport --test loom_ring --release -- "$@"
