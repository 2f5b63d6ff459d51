#!/usr/bin/env bash
# A registry that trickles (8 blobs, a byte every 2 s each: every download slot its volume may
# take) against another volume's stage of a fresh model from a real docker-registry: the median
# stage time of TRICKLE_ROUNDS rounds (default 5) on a quiet node and while the registry
# trickles, alternating, and their ratio; the goal is trickling/quiet <= 1.2. Runs the ignored
# test `trickle_benchmark` of host/tests/e2e_registry_hostile.rs (release build) as root, in a
# private mount namespace, like the end-to-end suite; needs what scripts/test.sh installs.
#
#   bench/registry-trickle.sh
#   TRICKLE_ROUNDS=9 TRICKLE_MIB=1024 bench/registry-trickle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release -q -p mounthost --test e2e_registry_hostile -- --ignored --exact trickle_benchmark --nocapture
