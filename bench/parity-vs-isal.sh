#!/usr/bin/env bash
# Compares storc's parity kernels with Intel ISA-L on the same buffers.
# Usage: bench/parity-vs-isal.sh [--quick] [--json]
# Installs libisal-dev (Debian) if its header is missing; builds in release mode.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ ! -f /usr/include/isa-l/raid.h ]]; then
    echo "parity-vs-isal: installing libisal-dev" >&2
    sudo_cmd=()
    if [[ "$(id -u)" != 0 ]]; then sudo_cmd=(sudo); fi
    "${sudo_cmd[@]}" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq libisal-dev >&2
fi

# Cargo's own progress goes to stderr, so --json output on stdout stays clean.
exec cargo run --quiet --release --manifest-path "$root/bench/parity-vs-isal/Cargo.toml" -- "$@"
