#!/usr/bin/env bash
# Fails when a Rust source file has more than 1,000 lines of code (blank
# lines and lines that are only a comment do not count): a file that long
# holds more than one thing a reader can keep in mind. Functions are held
# under 120 lines by clippy's too_many_lines (clippy.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${1:-1000}
over=$(git ls-files '*.rs' | while read -r file; do
    awk -v file="$file" -v limit="$limit" '
        /^[[:space:]]*$/ { next }
        /^[[:space:]]*\/\// { next }
        { code++ }
        END { if (code > limit) printf "%s: %d lines of code (limit %d)\n", file, code, limit }
    ' "$file"
done)
if [ -n "$over" ]; then
    echo "$over"
    exit 1
fi
echo "file sizes: no Rust file over $limit lines of code"
