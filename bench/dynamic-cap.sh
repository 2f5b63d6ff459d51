#!/usr/bin/env bash
# A pod looping POST then DELETE on its dynamic volume (capped at 32 MiB), a different model of
# 8 MiB each time, against a registry of the test's own sending every blob reply at 256 KiB/s:
# eager mounts, then mounts that fail (one blob answers 404), then lazy mounts, CAP_LOOP_SECS
# seconds each (default 60). Prints, for each kind, the cycles made, the blob GETs, the bytes the
# registry served, the highest level the volume reported (GET /usage) and the most the
# registry's replies still had to send, against the cap. Runs the test
# `a_pod_looping_post_and_delete_stays_within_its_byte_cap` of host/tests/e2e_dynamic_cap.rs (8 s
# a kind in the suite) as root, in a private mount namespace; needs what scripts/test.sh installs.
#
#   bench/dynamic-cap.sh
#   CAP_LOOP_SECS=120 bench/dynamic-cap.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CAP_LOOP_SECS="${CAP_LOOP_SECS:-60}"
exec cargo test -q -p mounthost --test e2e_dynamic_cap -- --exact a_pod_looping_post_and_delete_stays_within_its_byte_cap --nocapture
