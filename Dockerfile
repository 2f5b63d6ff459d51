# Stub: the container image ships with the issue that adds the host daemon and the CSI front
# (deploy/ will reference it). Until then this only documents the intended shape:
#
#   FROM rust:1.95-bookworm AS build
#   RUN rustup target add wasm32-wasip2
#   WORKDIR /src
#   COPY . .
#   RUN cargo build --release --locked -p mounthost
#
#   FROM debian:bookworm-slim
#   RUN apt-get update && apt-get install -y --no-install-recommends fuse3 ca-certificates \
#       && rm -rf /var/lib/apt/lists/*
#   COPY --from=build /src/target/release/mounthost /usr/local/bin/mounthost
#   ENTRYPOINT ["/usr/local/bin/mounthost"]
FROM scratch
