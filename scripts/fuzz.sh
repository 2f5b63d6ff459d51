#!/usr/bin/env bash
# Coverage-guided fuzzing of one parser: scripts/fuzz.sh TARGET SECONDS [libFuzzer options...]
#
# cargo-fuzz (libFuzzer) on the stable toolchain: `-s none` (no sanitizer; AddressSanitizer
# needs nightly's -Zsanitizer, and the code under test has no unsafe of its own to check),
# so what libFuzzer finds is a panic, an abort, a timeout or a leak of memory past -rss_limit_mb.
# Targets live in host/fuzz/fuzz_targets; `scripts/fuzz.sh list` names them. The seed corpus
# is host/fuzz/corpus/TARGET (in the repository, only read); what the run learns goes to
# .local/fuzz/corpus/TARGET and crashes to .local/fuzz/artifacts/TARGET/ (re-run one with
# `scripts/fuzz.sh TARGET 0 .local/fuzz/artifacts/TARGET/crash-...`: SECONDS 0 takes input files). FUZZ_PROFILE=dev builds
# unoptimised (faster to build, slower to run; what .ci/run uses), the default is release.
# Installs cargo-fuzz with `cargo install --locked` when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' host/fuzz/Cargo.toml | grep -v '^mounthost-fuzz$')
if [ "${1:-}" = list ]; then
    echo "$targets"
    exit 0
fi
if [ $# -lt 2 ] || ! grep -qx "$1" <<<"$targets"; then
    echo "usage: scripts/fuzz.sh TARGET SECONDS [libFuzzer options...] | scripts/fuzz.sh list" >&2
    echo "targets: $(echo $targets)" >&2
    exit 2
fi
target=$1 seconds=$2
shift 2
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "--- installing cargo-fuzz"
    cargo install --locked cargo-fuzz@0.13.2
fi
profile=()
[ "${FUZZ_PROFILE:-release}" = dev ] && profile=(--dev)
work=.local/fuzz
mkdir -p "$work/corpus/$target" "$work/artifacts/$target"
# SECONDS 0: the arguments are inputs (crash files) to run once each, not options.
if [ "$seconds" = 0 ]; then
    if [ $# -eq 0 ]; then
        echo "usage: scripts/fuzz.sh TARGET 0 FILE... (SECONDS 0 runs the given inputs once each)" >&2
        exit 2
    fi
    inputs=()
    for f in "$@"; do inputs+=("$(realpath "$f")"); done
    cd host
    exec cargo fuzz run -s none "${profile[@]}" "$target" "${inputs[@]}" -- -rss_limit_mb=2048 -timeout=10
fi
cd host
exec cargo fuzz run -s none "${profile[@]}" "$target" \
    "../$work/corpus/$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -artifact_prefix="../$work/artifacts/$target/" -print_final_stats=1 \
    -rss_limit_mb=2048 -timeout=10 "$@"
