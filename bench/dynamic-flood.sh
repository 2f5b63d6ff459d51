#!/usr/bin/env bash
# One pod flooding its dynamic volume's socket while another volume's pod mounts: the time of
# volume B's mounts of a fresh model on a quiet node, while volume A's pod burns its CPU (the
# baseline for what any busy pod costs the node), and while A's pod floods its own socket
# (bench/flood.py: FLOOD_THREADS connections, default 16, sending POST, DELETE, GET and bad
# requests as fast as answers come). A's processes run in a v1 cpu cgroup of one CPU, like a
# pod's limit. Prints the median times of FLOOD_ROUNDS rounds (default 7) and the ratios;
# the target is flooding/quiet <= 1.2. Runs the ignored test `flood_benchmark` of
# host/tests/e2e_dynamic.rs (release build) as root, in a private mount namespace, against a
# real docker-registry, like the end-to-end suite; needs what scripts/test.sh installs.
#
#   bench/dynamic-flood.sh
#   FLOOD_ROUNDS=11 FLOOD_MIB=32 bench/dynamic-flood.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release -q -p mounthost --test e2e_dynamic -- --ignored --exact flood_benchmark --nocapture
