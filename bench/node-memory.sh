#!/usr/bin/env bash
# The peak memory of the host daemon and of each lazy server under load, with no lazy memory
# limit, to size the host DaemonSet's memory limit and --lazy-memory-mib (docs/lazy.md,
# "Sizing"): a model of MEM_MIB MiB of weights (default 512) pulled eagerly; MEM_VOLUMES lazy
# volumes (default 3) of another such model staged at once and each read through during its
# fill (4 MiB sequential reads beside 64 random 1 MiB reads); a dynamic volume's pod mounting
# a third model lazily twice and reading both mounts. Prints the host daemon's VmHWM, each lazy
# server's VmHWM (/proc/<pid>/status) and its cgroup's peak (v2 memory.peak, v1
# memory.max_usage_in_bytes; page cache included). Runs the ignored test `memory_benchmark` of
# host/tests/e2e_node_defaults.rs (release build) as root, in a private mount namespace,
# against a real docker-registry, like the end-to-end suite; needs what scripts/test.sh installs.
#
#   bench/node-memory.sh
#   MEM_MIB=2048 MEM_VOLUMES=4 bench/node-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release -q -p mounthost --test e2e_node_defaults -- --ignored --exact memory_benchmark --nocapture
