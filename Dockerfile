# syntax=docker/dockerfile:1
#
# The mounthost image: one binary for every role (`mounthost host`, `mounthost csi`, ...).
#
#   docker build -t ghcr.io/mounthost/mounthost:0.1.0 .
#
# `weed` (SeaweedFS) is NOT in this image. The stock seaweedfs plugin's plans run the program
# name `weed`, which the host daemon maps to /usr/local/bin/weed unless told otherwise with
# `--program weed=/path/to/weed` (env MOUNTHOST_PROGRAMS=weed=/path/to/weed; several mappings
# are comma-separated). A deployment provides the binary in one of two ways:
#   - an init container of the host DaemonSet running the `chrislusf/seaweedfs:4.48` image copies
#     its /usr/bin/weed into a hostPath volume (a FUSE process outlives its pod, and a restarted
#     one must still find the binary) that the host container mounts, say
#     at /var/lib/mounthost-programs, and the host runs with `--program weed=/var/lib/mounthost-programs/weed`;
#   - or an image of your own built on this one:
#       FROM ghcr.io/mounthost/mounthost:0.1.0
#       COPY --from=chrislusf/seaweedfs:4.48 /usr/bin/weed /usr/local/bin/weed
#     which needs no flag, /usr/local/bin/weed being the default.
# See docs/reference.md ("Providing weed").

FROM rust:1.95-bookworm AS build
# host/build.rs compiles the plugins from source for this target (the stock ones, which it embeds
# into the binary, and the test fixtures). A layer of its own: a source change does not repeat it.
RUN rustup target add wasm32-wasip2
WORKDIR /src
# Only what the build reads. No manifests-first dependency layer: host/build.rs compiles the
# plugins from plugins/ and wit/, so a layer of manifests alone cannot build anything. The cache
# mounts below keep the crates registry and the target directory between builds instead (the
# binary is copied out of the cached target directory in the same step).
COPY Cargo.toml Cargo.lock ./
# .cargo/config.toml sets the plugins' 128 KiB wasm stack size.
COPY .cargo/ .cargo/
COPY wit/ wit/
COPY proto/ proto/
COPY plugins/ plugins/
COPY examples/plugins/ examples/plugins/
COPY host/ host/
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p mounthost \
    && install -m 0755 target/release/mounthost /usr/local/bin/mounthost

FROM debian:bookworm-slim
LABEL org.opencontainers.image.source="https://github.com/mounthost/mounthost" \
      org.opencontainers.image.title="mounthost" \
      org.opencontainers.image.description="Kubernetes CSI driver: a stable privileged host daemon with backend logic in sandboxed WebAssembly plugins" \
      org.opencontainers.image.licenses="Apache-2.0"
# fuse3: fusermount3, which a FUSE program such as `weed mount` needs to unmount itself on
# SIGTERM; ca-certificates: for programs that talk TLS. Nothing else.
# Versions are not pinned: bookworm's point releases replace them (an old pin stops resolving),
# and this layer should pick up their security fixes on every rebuild.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends fuse3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/mounthost /usr/local/bin/mounthost
# Non-root by default: the CSI front (`mounthost csi`, node and controller) runs as this user.
# The host daemon (`mounthost host`) must mount, so its DaemonSet sets runAsUser: 0 (privileged).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/mounthost"]
