#!/usr/bin/env bash
# The plugin SDK's semver check: `cargo semver-checks` of plugins/sdk against the newest
# release, kept frozen in plugins/sdk-releases/v<version> (plugins/sdk/CHANGELOG.md).
#
#   scripts/semver.sh changed   exit 0 when plugins/sdk or the contract it builds
#                               (wit/plugin.wit) differ from the newest frozen release, 1 when
#                               they are that release
#   scripts/semver.sh install   install the pinned cargo-semver-checks into ~/.cache/mounthost
#                               (once a machine, or into $MOUNTHOST_TOOLS_DIR; about 7 minutes
#                               of compiling on 2 cores)
#   scripts/semver.sh [check]   when changed (or always, given BASELINE=plugins/sdk-releases/vX):
#                               install it if missing, then check; exit non-zero on a change the
#                               version numbers do not allow (a break in a minor release)
#
# Pinned: 0.51.0 builds with Rust 1.93 or later and reads the rustdoc JSON of our Rust (1.95).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.51.0
# Outside the clone, so every clone on a machine (and every CI run there) shares one install.
root=${MOUNTHOST_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mounthost}/cargo-semver-checks-$version
bin=$root/bin/cargo-semver-checks
newest=$(ls -d plugins/sdk-releases/v*/ | sort -V | tail -n 1)
newest=${newest%/}

install() {
    [ -x "$bin" ] && return 0
    echo "--- installing cargo-semver-checks $version into $root"
    # Its own target directory: never the workspace's (whose lock a concurrent build holds).
    local build
    build=$(mktemp -d)
    trap 'rm -rf "$build"; trap - RETURN' RETURN
    CARGO_TARGET_DIR="$build" cargo install --quiet --locked cargo-semver-checks --version "=$version" --root "$root"
}

sdk_version() {
    sed -n 's/^version = "\(.*\)"/\1/p' "$1/Cargo.toml"
}

# The SDK's sources, its version and the contract are those of the newest release (whose
# bindings read its own copy of the contract: the `path:` line of `generate!` differs).
same_as_newest() {
    diff -rq -x lib.rs plugins/sdk/src "$newest/src" >/dev/null &&
        diff -q <(grep -v '^ *path: ' plugins/sdk/src/lib.rs) <(grep -v '^ *path: ' "$newest/src/lib.rs") >/dev/null &&
        [ -f "$newest/wit/plugin.wit" ] && diff -q wit/plugin.wit "$newest/wit/plugin.wit" >/dev/null &&
        [ "$(sdk_version plugins/sdk)" = "$(sdk_version "$newest")" ]
}

case "${1:-check}" in
changed)
    ! same_as_newest
    ;;
install)
    install
    ;;
check)
    baseline=${BASELINE:-}
    if [ -z "$baseline" ]; then
        if same_as_newest; then
            echo "--- cargo semver-checks: plugins/sdk and wit/plugin.wit are the $(sdk_version "$newest") release's ($newest): nothing to check"
            exit 0
        fi
        baseline=$newest
    fi
    install
    echo "--- cargo semver-checks: plugins/sdk $(sdk_version plugins/sdk) against $baseline"
    # By manifest path: the workspace holds several packages of that name (the SDK and the
    # frozen copies). With a target directory of cargo's own, the baseline's build lands there,
    # not in the frozen copy.
    CARGO_TARGET_DIR="$(realpath -m "${CARGO_TARGET_DIR:-target}")" PATH="$(realpath -m "$root")/bin:$PATH" \
        cargo semver-checks --manifest-path plugins/sdk/Cargo.toml --baseline-root "$baseline"
    ;;
*)
    echo "usage: scripts/semver.sh [changed|install|check]" >&2
    exit 2
    ;;
esac
