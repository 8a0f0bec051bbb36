#!/usr/bin/env bash
# Regenerates the C header ffi/include/barlink.h from ffi/src with cbindgen.
#   scripts/gen-header.sh            write ffi/include/barlink.h
#   scripts/gen-header.sh OUT.h      write OUT.h instead (ffi-test.sh compares)
# Installs cbindgen (`cargo install cbindgen --locked`) when missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/ffi/include/barlink.h}"
if ! command -v cbindgen >/dev/null 2>&1; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cbindgen >/dev/null 2>&1; then
    echo "gen-header: cbindgen missing; installing it (cargo install cbindgen --locked)" >&2
    cargo install cbindgen --locked --quiet >&2
fi
mkdir -p "$(dirname "$out")"
cbindgen --quiet --config "$root/ffi/cbindgen.toml" --crate barlink-ffi \
    --output "$out" "$root/ffi"
