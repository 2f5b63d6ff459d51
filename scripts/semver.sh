#!/usr/bin/env bash
# The plugin SDK's semver check: `cargo semver-checks` of plugins/sdk against its previous
# release, kept frozen in plugins/sdk-releases/v<version> (plugins/sdk/CHANGELOG.md).
#
#   scripts/semver.sh install   install the pinned cargo-semver-checks into ~/.cache/mounthost
#                               (once a machine, or into $MOUNTHOST_TOOLS_DIR; about 7 minutes
#                               of compiling on 2 cores)
#   scripts/semver.sh [check]   install it if missing, then check; exit 1 on a change the
#                               version numbers do not allow (a break in a minor release)
#
# Pinned: 0.51.0 builds with Rust 1.93 or later and reads the rustdoc JSON of our Rust (1.95).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.51.0
# Outside the clone, so every clone on a machine (and every CI run there) shares one install.
root=${MOUNTHOST_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mounthost}/cargo-semver-checks-$version
bin=$root/bin/cargo-semver-checks

install() {
    [ -x "$bin" ] && return 0
    echo "--- installing cargo-semver-checks $version into $root"
    # Its own target directory: never the workspace's (whose lock a concurrent build holds).
    local build
    build=$(mktemp -d)
    trap 'rm -rf "$build"; trap - RETURN' RETURN
    CARGO_TARGET_DIR="$build" cargo install --quiet --locked cargo-semver-checks --version "=$version" --root "$root"
}

case "${1:-check}" in
install)
    install
    ;;
check)
    install
    baseline=$(ls -d plugins/sdk-releases/v*/ | sort -V | tail -n 1)
    echo "--- cargo semver-checks: plugins/sdk $(sed -n 's/^version = "\(.*\)"/\1/p' plugins/sdk/Cargo.toml) against $baseline"
    # By manifest path: the workspace holds two packages of that name (the SDK and the frozen
    # copy). With a target directory of cargo's own, the baseline's build lands there, not in
    # the frozen copy.
    CARGO_TARGET_DIR="$(realpath -m "${CARGO_TARGET_DIR:-target}")" PATH="$(realpath -m "$root")/bin:$PATH" \
        cargo semver-checks --manifest-path plugins/sdk/Cargo.toml --baseline-root "$baseline"
    ;;
*)
    echo "usage: scripts/semver.sh [install|check]" >&2
    exit 2
    ;;
esac
