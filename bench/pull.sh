#!/usr/bin/env bash
# Pull throughput of one large ModelPack layer from a local registry: `mounthost cache pull`
# against two baselines measured in the same run, `curl` (one stream to a file) and
# `skopeo copy ... dir:`.
#
# It starts its own docker-registry on 127.0.0.1 (config, storage and log in a temp dir on disk,
# never the packaged service config), pushes a random weights file (SIZE_MIB, default 1024) as a
# ModelPack artifact (LAYER=raw, the default, or LAYER=tar: one file in a tar) over the registry's
# HTTP API with curl, then times RUNS (default 3) pulls of each contender and prints the median
# time and the median CPU seconds (the puller's processes; for mounthost its daemon and client).
# Before every pull the page cache is dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`, root),
# so the registry reads from disk; each time includes a final `sync`, so it ends with the data
# on disk for all three alike. mounthost runs as `mounthost local --no-demo` (host daemon and
# CSI front on a state dir in the temp dir); each of its runs starts from an empty blob cache
# (`mounthost cache prune` before the caches are dropped) and times `mounthost cache pull`, which
# verifies the digest while it streams. Then it times NodeStageVolume of a first and a second
# volume of the cached model through the front (`mounthost client stage`, each a new process:
# the time includes starting it). The binary is MOUNTHOST=path, else target/release,
# target/debug or PATH; without one the script says "mounthost: not available" and measures
# the baselines only. For each mounthost run it prints what the daemon logged of the layer (its
# download module's debug line, in JSON): the milliseconds from the first request to the last
# byte received, to the end of the hash, and to the file stored (fsync'd and renamed), which
# tells a CPU-bound pull (the hash ends late) from a disk-bound one (the store ends late). It
# also prints what bounds the result on this machine: one core's sha256
# speed (`openssl speed`; a blob's digest is one sequential chain, so a verified pull takes at
# least size / that speed) and the disk's write speed (SIZE_MIB written with `dd conv=fsync`
# into the temp dir). Everything is removed on exit.
#
#   bench/pull.sh                      # root
#   SIZE_MIB=256 RUNS=5 LAYER=tar bench/pull.sh
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_MIB=${SIZE_MIB:-1024}
RUNS=${RUNS:-3}
LAYER=${LAYER:-raw}
BENCH_TMP=${BENCH_TMP:-/var/tmp}
REPO=bench/model
TAG=v1
FILE=model.safetensors

for tool in docker-registry curl skopeo openssl python3 dd; do
    command -v "$tool" >/dev/null || { echo "bench/pull.sh needs $tool (scripts/test.sh installs it)" >&2; exit 1; }
done
case "$LAYER" in raw | tar) ;; *) echo "LAYER must be raw or tar" >&2; exit 1 ;; esac

work=$(mktemp -d "$BENCH_TMP/mounthost-bench-pull.XXXXXX")
registry_pid=
local_pid=
cleanup() {
    for pid in $local_pid $registry_pid; do
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [ -d "$work/mh" ]; then
        # What the demo-less local node left mounted (the staged volumes, its runtime tmpfs).
        grep -F " $work/mh" /proc/self/mountinfo | awk '{ print $5 }' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -w /proc/sys/vm/drop_caches ]; then
    can_drop=1
else
    can_drop=0
    echo "warning: cannot write /proc/sys/vm/drop_caches (not root?): pulls read from the page cache" >&2
fi
# sha256_of PATH: its sha256 in hex. openssl, not coreutils' sha256sum: on the machine this was
# written on, sha256sum took 6.3 s per GiB and openssl 1.2 s (SHA-NI).
sha256_of() { openssl dgst -sha256 -r "$1" | cut -d' ' -f1; }
drop_caches() {
    sync
    if [ "$can_drop" = 1 ]; then echo 3 >/proc/sys/vm/drop_caches; fi
}

# --- the registry ---------------------------------------------------------------------------
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
host=127.0.0.1:$port
mkdir -p "$work/data"
cat >"$work/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $work/data
http:
  addr: $host
  secret: mounthost-bench
EOF
docker-registry serve "$work/config.yml" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 300); do
    curl -fsS --noproxy '*' -o /dev/null "http://$host/v2/" 2>/dev/null && break
    kill -0 "$registry_pid" 2>/dev/null || { cat "$work/registry.log" >&2; exit 1; }
    sleep 0.1
done
curl -fsS --noproxy '*' -o /dev/null "http://$host/v2/" || { cat "$work/registry.log" >&2; exit 1; }

# --- the model ------------------------------------------------------------------------------
echo "--- generating ${SIZE_MIB} MiB of random weights and pushing them to $host/$REPO:$TAG ($LAYER layer)"
mkdir -p "$work/src"
# AES-CTR over zeros: incompressible and far faster than /dev/urandom.
# (openssl dies of SIGPIPE when head has enough.)
{ openssl enc -aes-128-ctr -K "$(openssl rand -hex 16)" -iv "$(openssl rand -hex 16)" -in /dev/zero 2>/dev/null || true; } |
    head -c "$((SIZE_MIB * 1024 * 1024))" >"$work/src/$FILE"
size=$(stat -c %s "$work/src/$FILE")
[ "$size" = "$((SIZE_MIB * 1024 * 1024))" ] || { echo "generated $size bytes, not ${SIZE_MIB} MiB" >&2; exit 1; }
file_sha=$(sha256_of "$work/src/$FILE")

# push_blob PATH: upload it (POST, then PUT streamed from disk) and print its digest.
push_blob() {
    local path=$1 digest location
    digest=sha256:$(sha256_of "$path")
    location=$(curl -fsS --noproxy '*' -X POST -D - -o /dev/null "http://$host/v2/$REPO/blobs/uploads/" |
        tr -d '\r' | awk 'tolower($1) == "location:" { print $2 }')
    case "$location" in /*) location=http://$host$location ;; esac
    case "$location" in *\?*) location="$location&digest=$digest" ;; *) location="$location?digest=$digest" ;; esac
    curl -fsS --noproxy '*' -X PUT -H 'Content-Type: application/octet-stream' -H 'Expect:' \
        --upload-file "$path" -o /dev/null "$location"
    echo "$digest"
}

if [ "$LAYER" = tar ]; then
    tar -C "$work/src" --owner=0 --group=0 --mtime=@0 -cf "$work/layer" "$FILE"
    media_type=application/vnd.cncf.model.weight.v1.tar
else
    ln "$work/src/$FILE" "$work/layer"
    media_type=application/vnd.cncf.model.weight.v1.raw
fi
layer_digest=$(push_blob "$work/layer")
layer_size=$(stat -c %s "$work/layer")
diff_id=$layer_digest # uncompressed layers: the diff ID is the digest
printf '{"descriptor":{"name":"bench-model"},"config":{"format":"test"},"modelfs":{"type":"layers","diffIds":["%s"]}}' \
    "$diff_id" >"$work/config.json"
config_digest=$(push_blob "$work/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"application/vnd.cncf.model.manifest.v1+json","config":{"mediaType":"application/vnd.cncf.model.config.v1+json","digest":"%s","size":%d},"layers":[{"mediaType":"%s","digest":"%s","size":%d,"annotations":{"org.cncf.model.filepath":"%s"}}]}' \
    "$config_digest" "$(stat -c %s "$work/config.json")" "$media_type" "$layer_digest" "$layer_size" "$FILE" >"$work/manifest.json"
curl -fsS --noproxy '*' -X PUT -H 'Content-Type: application/vnd.oci.image.manifest.v1+json' \
    --data-binary "@$work/manifest.json" -o /dev/null "http://$host/v2/$REPO/manifests/$TAG"
rm -f "$work/layer" "$work/src/$FILE"
ref=$host/$REPO:$TAG
echo "pushed $ref: layer $layer_digest ($layer_size bytes), file sha256 $file_sha"

# --- what bounds a verified pull here -------------------------------------------------------
# One core's sha256 (MB/s), from openssl's own loop over 1 MiB blocks.
sha_mbps=$(openssl speed -seconds 1 -bytes 1048576 -evp sha256 2>/dev/null |
    awk '$1 == "sha256" || $1 == "SHA2-256" { v = $NF; sub(/k$/, "", v); printf "%.0f", v * 1000 / 1e6 }')
# The disk under the temp dir: SIZE_MIB written and fsync'd.
start=$EPOCHREALTIME
dd if=/dev/zero of="$work/dd" bs=1M count="$SIZE_MIB" conv=fsync status=none
disk_s=$(echo "$start $EPOCHREALTIME" | awk '{ printf "%.3f", $2 - $1 }')
rm -f "$work/dd"
echo "--- this machine: sha256 on one core ${sha_mbps:-?} MB/s (openssl speed), disk write $(awk -v b="$((SIZE_MIB * 1024 * 1024))" -v s="$disk_s" 'BEGIN { printf "%.0f", b / s / 1e6 }') MB/s (dd conv=fsync in $BENCH_TMP)"

# --- the contenders -------------------------------------------------------------------------
mounthost=${MOUNTHOST:-}
if [ -z "$mounthost" ]; then
    for candidate in target/release/mounthost target/debug/mounthost "$(command -v mounthost || true)"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then mounthost=$candidate; break; fi
    done
fi
have_mounthost=0
if [ -n "$mounthost" ] && "$mounthost" cache pull --help >/dev/null 2>&1; then
    have_mounthost=1
fi

# ticks PID FIELDS: the sum of those fields (comma-separated numbers, as in proc(5)) of
# /proc/PID/stat, in clock ticks: 14,15 a process's own user and system CPU time (all its
# threads), 16,17 that of its children it has waited for.
ticks() { awk -v f="$2" '{ sub(/^.*\) /, ""); n = split(f, a, ","); s = 0; for (i = 1; i <= n; i++) s += $(a[i] - 2); print s }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# time_run NAME CMD...: run it RUNS times after dropping caches (output dir cleared before each
# run), each timed to the end of a final sync; prints the seconds of each run to $work/NAME.times
# and the CPU seconds it used to $work/NAME.cpu: the command's and its children's, plus those of
# the process $DAEMON_PID (mounthost's daemon) if set.
out=$work/out
time_run() {
    local name=$1 i start end c0 c1 d0 d1
    shift
    : >"$work/$name.times"
    : >"$work/$name.cpu"
    for i in $(seq "$RUNS"); do
        rm -rf "$out"
        mkdir -p "$out"
        drop_caches
        d0=0 d1=0
        [ -z "${DAEMON_PID:-}" ] || d0=$(ticks "$DAEMON_PID" 14,15)
        c0=$(ticks $$ 16,17)
        start=$EPOCHREALTIME
        "$@" >"$work/$name.log" 2>&1 || { echo "$name failed:" >&2; cat "$work/$name.log" >&2; exit 1; }
        sync
        end=$EPOCHREALTIME
        c1=$(ticks $$ 16,17)
        [ -z "${DAEMON_PID:-}" ] || d1=$(ticks "$DAEMON_PID" 14,15)
        echo "$start $end" | awk '{ printf "%.3f\n", $2 - $1 }' >>"$work/$name.times"
        echo $((c1 - c0 + d1 - d0)) | awk -v hz="$hz" '{ printf "%.2f\n", $1 / hz }' >>"$work/$name.cpu"
    done
}

# median NAME [KIND]: the median of NAME's times (KIND times, the default) or CPU seconds (cpu).
median() { sort -g "$work/$1.${2:-times}" | awk '{ t[NR] = $1 } END { print t[int((NR + 1) / 2)] }'; }
mbps() { awk -v b="$layer_size" -v s="$1" 'BEGIN { printf "%.0f", b / s / 1e6 }'; }

echo "--- $RUNS runs each, page cache dropped before each ($( [ "$can_drop" = 1 ] && echo yes || echo NO)), time includes sync"
time_run curl curl -fsS --noproxy '*' -o "$out/blob" "http://$host/v2/$REPO/blobs/$layer_digest"
curl_sha=sha256:$(sha256_of "$out/blob")
[ "$curl_sha" = "$layer_digest" ] || { echo "curl's copy has digest $curl_sha, not $layer_digest" >&2; exit 1; }

time_run skopeo skopeo --insecure-policy copy --src-tls-verify=false "docker://$ref" "dir:$out/skopeo"
[ -f "$out/skopeo/${layer_digest#sha256:}" ] || { echo "skopeo wrote no $layer_digest" >&2; exit 1; }

if [ "$have_mounthost" = 1 ]; then
    mh() { "$mounthost" --state-dir "$work/mh" --log warn "$@"; }
    # Started directly (not through the `mh` function, whose `&` would fork a subshell), so
    # `$!` is mounthost's own pid and the clean-up stops it.
    # Its download module logs one JSON line per blob (when all bytes were received, hashed
    # and stored), read back after the runs.
    "$mounthost" --state-dir "$work/mh" --log warn,mounthost::oci::download=debug --log-format json \
        local --no-demo --insecure-registry "$host" >"$work/local.log" 2>&1 &
    local_pid=$!
    for _ in $(seq 300); do [ -S "$work/mh/csi.sock" ] && break; sleep 0.1; done
    [ -S "$work/mh/csi.sock" ] || { echo "mounthost local did not start:" >&2; cat "$work/local.log" >&2; exit 1; }
    # Each run: an empty cache (prune runs before time_run drops the caches), then the pull.
    pull_fresh() { mh cache pull --insecure "$ref"; }
    : >"$work/mounthost.times"
    : >"$work/mounthost.cpu"
    for i in $(seq "$RUNS"); do
        mh cache prune >/dev/null
        RUNS=1 DAEMON_PID=$local_pid time_run mounthost.one pull_fresh
        cat "$work/mounthost.one.times" >>"$work/mounthost.times"
        cat "$work/mounthost.one.cpu" >>"$work/mounthost.cpu"
    done
    # The cached blob (the raw layer is the file itself; a tar layer is unpacked at stage).
    blob=$work/mh/cache/blobs/sha256/${layer_digest#sha256:}
    verified=no
    if [ "$LAYER" = raw ] && [ "$(sha256_of "$blob")" = "$file_sha" ]; then verified="yes ($blob)"; fi
    if [ "$LAYER" = tar ] && [ "sha256:$(sha256_of "$blob")" = "$layer_digest" ]; then verified="yes ($blob)"; fi
    # Stage two volumes of the cached model through the CSI front.
    stage_one() {
        local id=$1 staging=$work/mh/kubelet/plugins/kubernetes.io/csi/csi.mounthost.dev/$1/globalmount
        mkdir -p "$staging"
        local start=$EPOCHREALTIME
        mh client stage --volume-id "$id" --staging "$staging" --param plugin=model --param "reference=$ref" \
            --param insecure=true --access-mode multi-node-reader-only >/dev/null
        echo "$start $EPOCHREALTIME" | awk '{ printf "%.3f", $2 - $1 }'
    }
    first_stage=$(stage_one pv-bench-1)
    second_stage=$(stage_one pv-bench-2)
    staged_sha=$(sha256_of "$work/mh/kubelet/plugins/kubernetes.io/csi/csi.mounthost.dev/pv-bench-2/globalmount/$FILE")
    [ "$staged_sha" = "$file_sha" ] || { echo "the staged file has sha256 $staged_sha, not $file_sha" >&2; exit 1; }
fi

curl_s=$(median curl)
skopeo_s=$(median skopeo)
row() { printf '%-10s %10s %10s %10s   %s\n' "$1" "$2" "$(mbps "$2")" "$(median "$1" cpu)" "$(tr '\n' ' ' <"$work/$1.times")"; }
printf '%-10s %10s %10s %10s   %s\n' contender "median s" "MB/s" "CPU s" "runs (s)"
row curl "$curl_s"
row skopeo "$skopeo_s"
if [ "$have_mounthost" = 1 ]; then
    mh_s=$(median mounthost)
    row mounthost "$mh_s"
    awk -v m="$mh_s" -v c="$curl_s" -v s="$skopeo_s" \
        'BEGIN { printf "mounthost/curl throughput %.2fx, mounthost/skopeo %.2fx\n", c / m, s / m }'
    echo "mounthost result verified (sha256 $file_sha): $verified"
    # Where the layer's time went inside the daemon, per run: the streams' last byte against
    # the hash's end (the follower hashes what the streams wrote; on a CPU-bound machine it
    # falls behind), then the fsync and rename.
    python3 - "$work/local.log" "$layer_digest" <<'PY'
import json, sys
runs = []
for line in open(sys.argv[1], errors="replace"):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    f = e.get("fields", {})
    if f.get("message") == "blob downloaded" and f.get("digest") == sys.argv[2]:
        runs.append(f"{f['received_ms']}/{f['verified_ms']}/{f['stored_ms']}")
print("mounthost inside the daemon, ms from the layer's first request to its last byte received/hashed/stored:", " ".join(runs) or "not logged")
PY
    echo "stage of a cached $SIZE_MIB MiB model (client process included): first volume ${first_stage}s, second volume ${second_stage}s"
    [ "$verified" != no ] || exit 1
else
    echo "mounthost: not available (${mounthost:-no binary} has no 'cache pull'; build it or set MOUNTHOST)"
fi
if [ -n "$sha_mbps" ]; then
    awk -v b="$layer_size" -v r="$sha_mbps" -v c="$curl_s" 'BEGIN {
        floor = b / (r * 1e6)
        printf "floor of a verified pull here: %.3f s (the blob at one core'"'"'s sha256 speed)", floor
        if (c < floor) printf "; curl took %.3f s, under it: no verified pull can match curl on this machine now", c
        printf "\n" }'
fi
