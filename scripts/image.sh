#!/usr/bin/env bash
# Builds the runtime image of the Dockerfile without Docker, for machines that cannot pull its base
# images: the Dockerfile's last stage made from Debian packages (mmdebstrap of the base's suite,
# bookworm), plus a mounthost binary built here, written as an OCI image archive that
# `ctr image import`, `skopeo copy oci-archive:...` and `podman load` read. The Dockerfile stays
# what users build; host/tests/packaging.rs checks that this script and the Dockerfile's last
# stage name the same base, packages, binary path, user, entrypoint and labels, and that the
# Debian suite built is the base's (`--print-config` is what it reads; the suite is derived from
# BASE here).
#
#   scripts/image.sh [--binary PATH] [--version STRING] [--out FILE] [--refresh]
#   scripts/image.sh --print-config
#
#   --binary PATH     the mounthost binary to put in the image (default: target/release/mounthost,
#                     built with `cargo build --release --locked -p mounthost` when missing)
#   --version STRING  the image's tag and its org.opencontainers.image.version label (default:
#                     the crate version)
#   --out FILE        the OCI archive to write (default: target/image/mounthost-<version>.oci.tar)
#   --refresh         build the Debian root filesystem again instead of using the cached one
#   --print-config    print what the image is made of (base, the Debian suite built, packages,
#                     paths, user, entrypoint, labels) and exit; needs neither root nor the network
#
# Needs root, `mmdebstrap` and `umoci` (apt-get install -y mmdebstrap umoci) and the Debian
# mirror. The root filesystem is cached in .local/image/ under a key of everything that goes into
# it (packages, suites, mirror, the steps below), so a second build only adds the binary: a
# cached root filesystem does not pick up Debian's later security updates until --refresh.
#
# How it matches debian:bookworm-slim plus the Dockerfile's RUN (docs/install.md, "Building the
# image without Docker"): the same variant (minbase, merged /usr) and suites as Debian's official
# image builder (debuerreotype), its "slim" dpkg filters (no documentation but copyright files, no
# man or info pages, no translations), the apt lists and caches removed, no recommends. Not
# carried over: the apt settings bookworm-slim writes for later `apt-get` runs in derived images
# (docker-clean and friends), and the build dates (files carry the time of this build).
set -euo pipefail
cd "$(dirname "$0")/.."

# --- What the image is. Keep these equal to the Dockerfile's last stage.
BASE=debian:bookworm-slim
# The Debian suite the root filesystem is made of: the base's, never named twice.
[[ "$BASE" =~ ^debian:([a-z]+)-slim$ ]] ||
    { echo "scripts/image.sh: BASE=$BASE is no debian:<suite>-slim" >&2; exit 2; }
SUITE=${BASH_REMATCH[1]}
PACKAGES=(fuse3 ca-certificates)
BINARY_PATH=/usr/local/bin/mounthost
IMAGE_USER=65532:65532
ENTRYPOINT=(/usr/local/bin/mounthost)
# debian:bookworm-slim's PATH, which the Dockerfile inherits.
IMAGE_ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
LABELS=(
    "org.opencontainers.image.source=https://github.com/mounthost/mounthost"
    "org.opencontainers.image.title=mounthost"
    "org.opencontainers.image.description=Kubernetes CSI driver: a stable privileged host daemon with backend logic in sandboxed WebAssembly plugins"
    "org.opencontainers.image.licenses=Apache-2.0"
)
REPOSITORY=ghcr.io/mounthost/mounthost

# The suites of bookworm-slim's /etc/apt/sources.list.d/debian.sources.
MIRROR=http://deb.debian.org/debian
SECURITY_MIRROR=http://deb.debian.org/debian-security
SOURCES=(
    "deb $MIRROR $SUITE main"
    "deb $MIRROR $SUITE-updates main"
    "deb $SECURITY_MIRROR $SUITE-security main"
)
# The "slim" part of bookworm-slim: dpkg leaves these out (now and in later installs).
SLIM_DPKG=(
    'path-exclude=/usr/share/doc/*'
    'path-include=/usr/share/doc/*/copyright'
    'path-exclude=/usr/share/man/*'
    'path-exclude=/usr/share/info/*'
    'path-exclude=/usr/share/locale/*'
    'path-exclude=/usr/share/lintian/*'
    'path-exclude=/usr/share/linda/*'
)
# After the installs: the build machine's resolver and host name (runtimes provide their own),
# the build-time apt option (the Dockerfile passes --no-install-recommends on its command line
# only), backup copies dpkg and debconf leave, and the sources in bookworm-slim's deb822 form
# instead of mmdebstrap's one-line list.
# shellcheck disable=SC2016 # expanded by mmdebstrap's hook shell, where $1 is the root
CUSTOMIZE='set -e; r="$1"
rm -f "$r/etc/resolv.conf" "$r/etc/hostname" "$r/etc/apt/apt.conf.d/99mmdebstrap"
rm -f "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old "$r/var/cache/ldconfig/aux-cache"
rm -f "$r/etc/apt/sources.list"
cat > "$r/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: '"$MIRROR"'
Suites: '"$SUITE $SUITE-updates"'
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: '"$SECURITY_MIRROR"'
Suites: '"$SUITE-security"'
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF'

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
die() { echo "scripts/image.sh: $*" >&2; exit 2; }

binary="" version="" out="" refresh=false print_config=false
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) [ $# -ge 2 ] || die "--binary needs a path"; binary=$2; shift 2 ;;
        --version) [ $# -ge 2 ] || die "--version needs a string"; version=$2; shift 2 ;;
        --out) [ $# -ge 2 ] || die "--out needs a file name"; out=$2; shift 2 ;;
        --refresh) refresh=true; shift ;;
        --print-config) print_config=true; shift ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

if $print_config; then
    echo "base=$BASE"
    echo "suite=$SUITE"
    printf 'package=%s\n' "${PACKAGES[@]}"
    echo "binary=$BINARY_PATH"
    echo "user=$IMAGE_USER"
    printf 'entrypoint=%s\n' "${ENTRYPOINT[@]}"
    printf 'env=%s\n' "${IMAGE_ENV[@]}"
    printf 'label=%s\n' "${LABELS[@]}"
    exit 0
fi

if [ -z "$version" ]; then
    # [workspace.package] version in Cargo.toml: the crate's version.
    version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
    [ -n "$version" ] || die "no [workspace.package] version in Cargo.toml; pass --version"
fi
# An OCI tag: what `ctr`, skopeo and registries accept after the colon.
[[ "$version" =~ ^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$ ]] ||
    die "--version '$version' is not a valid image tag (letters, digits, '_', '.', '-'; at most 128; not starting with '.' or '-')"
out=${out:-target/image/mounthost-$version.oci.tar}

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap installs the packages in a chroot)"
for tool in mmdebstrap umoci unshare tar sha256sum; do
    command -v "$tool" >/dev/null || die "$tool is missing: apt-get install -y mmdebstrap umoci"
done

started=$SECONDS
step() { echo "--- [$((SECONDS - started)) s] $*"; }

if [ -z "$binary" ]; then
    binary=target/release/mounthost
    if [ ! -e "$binary" ]; then
        step "building the release binary (cargo build --release --locked -p mounthost)"
        cargo build --release --locked -p mounthost
    fi
fi
[ -f "$binary" ] && [ -x "$binary" ] || die "--binary $binary is not an executable file"

# The cache key covers every input of the root filesystem, and the recipe: a change to any of
# them makes a new one.
key=$(printf '%s\n' "$SUITE" "${PACKAGES[@]}" "${SOURCES[@]}" "${SLIM_DPKG[@]}" "$CUSTOMIZE" \
    "mmdebstrap $(mmdebstrap --version)" "minbase merged-usr no-recommends" | sha256sum | cut -c1-16)
cache=.local/image/rootfs-$SUITE-$key.tar
mkdir -p .local/image "$(dirname "$out")"

work=$(mktemp -d "${TMPDIR:-/tmp}/mounthost-image.XXXXXX")
trap 'rm -rf "$work"' EXIT

if $refresh || [ ! -f "$cache" ]; then
    step "building the $SUITE root filesystem (mmdebstrap: minbase, merged /usr, ${PACKAGES[*]}) into $cache"
    dpkg_opts=()
    for o in "${SLIM_DPKG[@]}"; do dpkg_opts+=("--dpkgopt=$o"); done
    # In a mount namespace of its own: what mmdebstrap mounts in the chroot (/proc, /sys, /dev)
    # cannot stay behind on the machine if it is interrupted. Its progress lines are shown, the
    # packages' own output only when it fails (the whole log is in .local/image/mmdebstrap.log).
    log=.local/image/mmdebstrap.log
    if ! unshare --mount --propagation private -- \
        mmdebstrap --mode=root --variant=minbase --format=tar \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --aptopt='APT::Install-Recommends "false"' "${dpkg_opts[@]}" \
        --include="$(IFS=,; echo "${PACKAGES[*]}")" \
        --customize-hook="$CUSTOMIZE" \
        "$SUITE" "$work/rootfs.tar" "${SOURCES[@]}" > "$log" 2>&1; then
        tail -n 40 "$log" >&2
        die "mmdebstrap failed (log: $log)"
    fi
    grep -E '^(I: (running apt-get update|downloading|installing|success)|W:)' "$log" | sed 's/^/    /'
    # mmdebstrap puts device nodes into /dev; an image has an empty /dev (runtimes mount their own).
    tar --delete --wildcards --file "$work/rootfs.tar" './dev/?*'
    mv "$work/rootfs.tar" "$cache"
else
    step "using the cached root filesystem $cache (--refresh builds it again)"
fi

step "the binary layer: $binary at $BINARY_PATH"
mkdir -p "$work/binary"
install -D -m 0755 "$binary" "$work/binary$BINARY_PATH"
tar --create --file "$work/binary.tar" --directory "$work/binary" \
    --owner=0 --group=0 --numeric-owner --mode=go-w --sort=name "${BINARY_PATH#/}"

step "the OCI image $REPOSITORY:$version (umoci)"
layout=$work/oci
umoci init --layout "$layout"
umoci new --image "$layout:$version"
umoci raw add-layer --image "$layout:$version" \
    --history.created_by "mmdebstrap --variant=minbase $SUITE (${PACKAGES[*]}), scripts/image.sh" "$cache"
umoci raw add-layer --image "$layout:$version" \
    --history.created_by "COPY mounthost $BINARY_PATH, scripts/image.sh" "$work/binary.tar"
config_args=(--config.user "$IMAGE_USER")
for e in "${ENTRYPOINT[@]}"; do config_args+=(--config.entrypoint "$e"); done
for e in "${IMAGE_ENV[@]}"; do config_args+=(--config.env "$e"); done
for l in "${LABELS[@]}" "org.opencontainers.image.version=$version"; do config_args+=(--config.label "$l"); done
umoci config --image "$layout:$version" --history.created_by "scripts/image.sh: user, entrypoint, labels" \
    "${config_args[@]}"
umoci gc --layout "$layout"

# An OCI archive is the layout's directory as a tar, with the layout's files at its top.
tar --create --file "$out.tmp" --directory "$layout" --owner=0 --group=0 --numeric-owner --sort=name \
    oci-layout index.json blobs
mv "$out.tmp" "$out"

unpacked=$(($(stat -c %s "$cache") + $(stat -c %s "$work/binary.tar")))
step "done in $((SECONDS - started)) s: $out"
echo "    archive (compressed layers): $(du -h --apparent-size "$out" | cut -f1) ($(stat -c %s "$out") bytes)"
echo "    unpacked (layer tars): $((unpacked / 1024 / 1024)) MiB ($unpacked bytes)"
echo "    import: ctr image import --base-name $REPOSITORY $out   (gives $REPOSITORY:$version)"
echo "    or:     skopeo copy oci-archive:$out:$version docker://REGISTRY/mounthost:$version"
