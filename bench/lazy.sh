#!/usr/bin/env bash
# Lazy model volumes (docs/lazy.md) against an eager pull of the same model, in one run.
#
# It starts its own docker-registry on 127.0.0.1 (config, storage and log in a temp dir on disk)
# and pushes a ModelPack model of a few small files (config.json, tokenizer.json, both in tar
# layers) and a raw weights file of SIZE_MIB (default 4096) shaped like a safetensors file: an
# 8-byte little-endian header length, a JSON header of HEADER_KIB (default 64), then random
# tensor bytes. Then `mounthost local --no-demo` (a release build: MOUNTHOST=path, else
# target/release/mounthost) drives volumes through the real CSI socket, and for each of RUNS
# (default 3) runs, with the node's blob cache emptied (`cache prune`) and the page cache
# dropped before each measurement:
#
#   eager   NodeStageVolume of an eager volume until it answers OK (the whole pull, verified):
#           the baseline, and its throughput (bytes / time);
#   first   NodeStageVolume of a lazy volume, then the first byte of the weights file: the time
#           from the stage call to that byte (goal: at most 1 s);
#   header  the same volume: the safetensors header (its 8 bytes, then the JSON) and one
#           64 MiB range at a random 64 MiB-aligned offset: the time from the stage call to the
#           end of that range (goal: at most 1.5 s);
#   seq     a new lazy volume: the whole weights file read in order (4 MiB reads) from the
#           stage call on, while the fill runs: its throughput against the eager pull's
#           (goal: at least 0.8x);
#   after   once the fill is over, the weights file opened again (passthrough) and read whole,
#           against the cached blob read directly (the same file, outside FUSE): both with the
#           page cache dropped (cold) and with it warm, each path twice in the order A B B A
#           after one priming read (goal: at least 0.9x);
#   signed  a lazy volume under a signature policy (docs/signing.md: `signedBy`) of the same
#           files signed by `model_signing` (a `model.sig` layer, pushed as tag `signed`) with a
#           chunk index signed by `mounthost model index --sign-key`: the time from the stage
#           call to the first byte of the weights, against `first` (goal: at most 1 s);
#   img-first, img-header, img-seq
#           the same three measurements as first, header and seq, of a lazy volume of an
#           ordinary OCI container image of the same files (tag `image`: an image config with
#           `rootfs.diff_ids`, uncompressed `application/vnd.oci.image.layer.v1.tar` layers, the
#           weights file under models/ in one layer, config.json and tokenizer.json under models/
#           in another above it), staged with `path: /models` so the files are at the volume's
#           root as in the ModelPack volume; img-seq against the same run's eager pull of the
#           ModelPack model (goals: at most 1 s, at most 1.5 s, at least 0.8x);
#   gz-first, gz-header, gz-seq
#           the same of the image whose weights layer is `...layer.v1.tar+gzip` (tag
#           `image-gzip`, gzip -1): no goal, a compressed layer is served only once it is
#           fetched and unpacked.
#
# IMAGE=0 leaves the two images out (neither built nor pushed nor measured); with them, the
# registry's storage holds two more copies of the weights (and the build a third for a while).
#
# Reads are 4 MiB into one buffer; the bytes read during the fill are checked with the CRC-32
# of every 8th block (against the file pushed), so the reader's time is its reads'.
#
# It prints each run's numbers and the range (min-max) over the runs. Everything is removed on
# exit. Needs root (mounts, drop_caches).
#
#   bench/lazy.sh
#   SIZE_MIB=1024 RUNS=1 bench/lazy.sh
#   IMAGE=0 bench/lazy.sh                         # the ModelPack model only
#   MOUNTHOST_LAZY_CHUNK_MIB=16 bench/lazy.sh     # another chunk size (--lazy-chunk-mib)
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_MIB=${SIZE_MIB:-4096}
HEADER_KIB=${HEADER_KIB:-64}
RUNS=${RUNS:-3}
IMAGE=${IMAGE:-1}
BENCH_TMP=${BENCH_TMP:-/var/tmp}
REPO=bench/lazy
TAG=v1

model_signing=.local/venv/bin/model_signing
[ -x "$model_signing" ] || { echo "bench/lazy.sh needs $model_signing (scripts/test.sh installs it)" >&2; exit 1; }
for tool in docker-registry curl openssl python3 tar gzip; do
    command -v "$tool" >/dev/null || { echo "bench/lazy.sh needs $tool (scripts/test.sh installs it)" >&2; exit 1; }
done
[ -w /proc/sys/vm/drop_caches ] || { echo "bench/lazy.sh needs root (it drops the page cache and mounts)" >&2; exit 1; }
mounthost=${MOUNTHOST:-target/release/mounthost}
[ -x "$mounthost" ] || { echo "no $mounthost: cargo build --release (or MOUNTHOST=path)" >&2; exit 1; }
mounthost=$(realpath "$mounthost")

work=$(mktemp -d "$BENCH_TMP/mounthost-bench-lazy.XXXXXX")
registry_pid=
local_pid=
cleanup() {
    # Volumes still staged (an interrupted run): unstaged, so their servers stop.
    if [ -n "$local_pid" ] && kill -0 "$local_pid" 2>/dev/null; then
        mh client list 2>/dev/null | python3 -c '
import json, sys
for v in json.load(sys.stdin):
    print(v["volumeId"], v["stagingPath"])' 2>/dev/null | while read -r id path; do
            mh client unstage --volume-id "$id" --staging "$path" >/dev/null 2>&1 || true
        done
    fi
    for pid in $local_pid $registry_pid; do
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [ -d "$work/mh" ]; then
        grep -F " $work/mh" /proc/self/mountinfo | awk '{ print $5 }' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}
sha256_of() { openssl dgst -sha256 -r "$1" | cut -d' ' -f1; }
# read_all FILE: every byte, in order, 4 MiB reads into one buffer; prints the CRC-32 of
# every 8th 4 MiB block (what checks the bytes costs the reader an eighth of a hash, so the
# time is the read's).
read_all() {
    python3 - "$1" <<'EOF'
import sys, zlib
buf = bytearray(4 << 20)
view = memoryview(buf)
crc, i = 0, 0
with open(sys.argv[1], "rb", buffering=0) as f:
    while n := f.readinto(buf):
        if i % 8 == 0:
            crc = zlib.crc32(view[:n], crc)
        i += 1
print(f"{crc:08x}")
EOF
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

# --- the model ------------------------------------------------------------------------------
echo "--- generating a ${SIZE_MIB} MiB safetensors-shaped weights file and pushing the model to $host/$REPO:$TAG"
mkdir -p "$work/src"
header=$((HEADER_KIB * 1024))
python3 - "$work/src/model.safetensors" "$header" <<'EOF'
import json, struct, sys
path, n = sys.argv[1], int(sys.argv[2])
body = json.dumps({"__metadata__": {"format": "pt"}, "weight": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}})
body = body + " " * (n - len(body))
with open(path, "wb") as f:
    f.write(struct.pack("<Q", n))
    f.write(body.encode())
EOF
{ openssl enc -aes-128-ctr -K "$(openssl rand -hex 16)" -iv "$(openssl rand -hex 16)" -in /dev/zero 2>/dev/null || true; } |
    head -c "$((SIZE_MIB * 1024 * 1024 - header - 8))" >>"$work/src/model.safetensors"
printf '{"architectures":["Bench"],"hidden_size":4096}' >"$work/src/config.json"
printf '{"version":"1.0","model":{"type":"BPE","vocab":{}}}' >"$work/src/tokenizer.json"
size=$(stat -c %s "$work/src/model.safetensors")

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
# push_manifest FILE TAG: an OCI image manifest.
push_manifest() {
    curl -fsS --noproxy '*' -X PUT -H 'Content-Type: application/vnd.oci.image.manifest.v1+json' \
        --data-binary "@$1" -o /dev/null "http://$host/v2/$REPO/manifests/$2"
}
layers=
diff_ids=
for f in config.json tokenizer.json; do
    tar -C "$work/src" --owner=0 --group=0 --mtime=@0 -cf "$work/$f.tar" "$f"
    d=$(push_blob "$work/$f.tar")
    layers="$layers{\"mediaType\":\"application/vnd.cncf.model.weight.config.v1.tar\",\"digest\":\"$d\",\"size\":$(stat -c %s "$work/$f.tar"),\"annotations\":{\"org.cncf.model.filepath\":\"$f\"}},"
    diff_ids="$diff_ids\"$d\","
done
weights_digest=$(push_blob "$work/src/model.safetensors")
layers="$layers{\"mediaType\":\"application/vnd.cncf.model.weight.v1.raw\",\"digest\":\"$weights_digest\",\"size\":$size,\"annotations\":{\"org.cncf.model.filepath\":\"model.safetensors\"}}"
diff_ids="$diff_ids\"$weights_digest\""
printf '{"descriptor":{"name":"bench-lazy"},"config":{"format":"test"},"modelfs":{"type":"layers","diffIds":[%s]}}' "$diff_ids" >"$work/config.cfg"
config_digest=$(push_blob "$work/config.cfg")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"application/vnd.cncf.model.manifest.v1+json","config":{"mediaType":"application/vnd.cncf.model.config.v1+json","digest":"%s","size":%d},"layers":[%s]}' \
    "$config_digest" "$(stat -c %s "$work/config.cfg")" "$layers" >"$work/manifest.json"
push_manifest "$work/manifest.json" "$TAG"
ref=$host/$REPO:$TAG
weights_sha=$(read_all "$work/src/model.safetensors")
echo "pushed $ref: weights $weights_digest ($size bytes)"
# The same files signed by model_signing, its signature one more (raw) layer: tag `signed`.
openssl ecparam -name prime256v1 -genkey -noout -out "$work/sign.key" 2>/dev/null
mkdir -p "$work/trust"
openssl ec -in "$work/sign.key" -pubout -out "$work/trust/bench.pub" 2>/dev/null
"$model_signing" sign key "$work/src" --private_key "$work/sign.key" --signature "$work/model.sig" >/dev/null
sig_digest=$(push_blob "$work/model.sig")
layers="$layers,{\"mediaType\":\"application/vnd.cncf.model.doc.v1.raw\",\"digest\":\"$sig_digest\",\"size\":$(stat -c %s "$work/model.sig"),\"annotations\":{\"org.cncf.model.filepath\":\"model.sig\"}}"
diff_ids="$diff_ids,\"$sig_digest\""
printf '{"descriptor":{"name":"bench-lazy-signed"},"config":{"format":"test"},"modelfs":{"type":"layers","diffIds":[%s]}}' "$diff_ids" >"$work/config-signed.cfg"
config_digest=$(push_blob "$work/config-signed.cfg")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"application/vnd.cncf.model.manifest.v1+json","config":{"mediaType":"application/vnd.cncf.model.config.v1+json","digest":"%s","size":%d},"layers":[%s]}' \
    "$config_digest" "$(stat -c %s "$work/config-signed.cfg")" "$layers" >"$work/manifest-signed.json"
push_manifest "$work/manifest-signed.json" signed
signed_ref=$host/$REPO:signed
"$mounthost" --insecure-registry "$host" --log warn model index "$signed_ref" --sign-key "$work/sign.key" >/dev/null
rm -f "$work"/*.tar
echo "pushed $signed_ref: the same files, signed, with a signed chunk index"

# --- the images -----------------------------------------------------------------------------
# The same files as an ordinary OCI container image, two layers of plain tars holding them
# under models/ (each with the directory's own entry; root's, mtime 0): the weights file at
# the bottom, config.json and tokenizer.json above it. Tag `image` has both uncompressed, tag
# `image-gzip` the same with its weights layer gzipped (-1; the diff_ids are the same).
image_ref=
gzip_ref=
if [ "$IMAGE" != 0 ]; then
    echo "--- building the same files as container images, pushing them to $host/$REPO:image and :image-gzip"
    mkdir -p "$work/img/models"
    chmod 0755 "$work/img/models"
    for f in model.safetensors config.json tokenizer.json; do
        chmod 0644 "$work/src/$f"
        ln "$work/src/$f" "$work/img/models/$f"
    done
    img_tar() { tar -C "$work/img" --owner=0 --group=0 --numeric-owner --mtime=@0 --no-recursion -cf "$@"; }
    img_tar "$work/weights.tar" models models/model.safetensors
    img_tar "$work/files.tar" models models/config.json models/tokenizer.json
    rm -rf "$work/img" "$work/src/model.safetensors"
    weights_tar_digest=$(push_blob "$work/weights.tar")
    files_tar_digest=$(push_blob "$work/files.tar")
    printf '{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":["%s","%s"]}}' \
        "$weights_tar_digest" "$files_tar_digest" >"$work/config-image.cfg"
    config_digest=$(push_blob "$work/config-image.cfg")
    # push_image TAG MEDIA_TYPE FILE: the image whose weights layer is FILE, of MEDIA_TYPE.
    push_image() {
        local digest
        digest=$(push_blob "$3")
        printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%d},"layers":[{"mediaType":"%s","digest":"%s","size":%d},{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%d}]}' \
            "$config_digest" "$(stat -c %s "$work/config-image.cfg")" "$2" "$digest" "$(stat -c %s "$3")" \
            "$files_tar_digest" "$(stat -c %s "$work/files.tar")" >"$work/manifest-$1.json"
        push_manifest "$work/manifest-$1.json" "$1"
    }
    push_image image application/vnd.oci.image.layer.v1.tar "$work/weights.tar"
    image_ref=$host/$REPO:image
    echo "pushed $image_ref: weights layer $weights_tar_digest ($(stat -c %s "$work/weights.tar") bytes)"
    gzip -1 -n -c "$work/weights.tar" >"$work/weights.tar.gz"
    rm -f "$work/weights.tar"
    push_image image-gzip application/vnd.oci.image.layer.v1.tar+gzip "$work/weights.tar.gz"
    gzip_ref=$host/$REPO:image-gzip
    echo "pushed $gzip_ref: weights layer gzipped ($(stat -c %s "$work/weights.tar.gz") bytes)"
    rm -f "$work/weights.tar.gz" "$work/files.tar"
fi
rm -f "$work/src/model.safetensors"

# --- the node -------------------------------------------------------------------------------
mh() { "$mounthost" --state-dir "$work/mh" --insecure-registry "$host" --trust-dir "$work/trust" --log warn "$@"; }
# Started directly (not through mh), so that $! is its pid.
"$mounthost" --state-dir "$work/mh" --insecure-registry "$host" --trust-dir "$work/trust" --log warn local --no-demo >"$work/local.log" 2>&1 &
local_pid=$!
for _ in $(seq 300); do
    [ -S "$work/mh/csi.sock" ] && mh client info >/dev/null 2>&1 && break
    kill -0 "$local_pid" 2>/dev/null || { cat "$work/local.log" >&2; exit 1; }
    sleep 0.1
done
kubelet=$work/mh/kubelet
# stage ID LAZY REFERENCE [KEY=VALUE...]: stage volume ID of REFERENCE, with these further
# parameters (signedBy=, path=), at a new staging path (printed); answers once
# NodeStageVolume is OK.
stage() {
    local id=$1 lazy=$2 reference=$3 staging params=() kv
    shift 3
    for kv in "$@"; do params+=(--param "$kv"); done
    staging=$kubelet/plugins/bench/$id/globalmount
    mkdir -p "$(dirname "$staging")"
    until mh client stage --volume-id "$id" --staging "$staging" --param plugin=model \
        --param "reference=$reference" --param insecure=true --param "lazy=$lazy" "${params[@]}" >"$work/stage.log" 2>&1; do
        grep -q Unavailable "$work/stage.log" || { cat "$work/stage.log" >&2; exit 1; }
        sleep 0.05
    done
    echo "$staging"
}
unstage() {
    mh client unstage --volume-id "$1" --staging "$2" >/dev/null
}
reset() {
    mh cache prune >/dev/null
    drop_caches
}
# The seconds since $t0 (an EPOCHREALTIME).
since() { echo "$1 $EPOCHREALTIME" | awk '{ printf "%.3f", $2 - $1 }'; }
# read_header FILE: the safetensors header, then one 64 MiB range at a random aligned offset.
read_header() {
    python3 - "$1" "$size" <<'EOF'
import os, random, struct, sys
path, size = sys.argv[1], int(sys.argv[2])
with open(path, "rb", buffering=0) as f:
    n = struct.unpack("<Q", f.read(8))[0]
    f.read(n)
    # Past the first 64 MiB (the header's); at a small SIZE_MIB, the end of the file.
    at = random.randrange(1, max(2, size // (64 << 20))) * (64 << 20)
    f.seek(at)
    left = 64 << 20
    while left:
        b = f.read(min(left, 4 << 20))
        if not b:
            break
        left -= len(b)
EOF
}
lazy_done() {
    mh client list | python3 -c '
import json, sys
v = [v for v in json.load(sys.stdin) if v["volumeId"] == sys.argv[1]]
if not v:
    sys.exit("no volume " + sys.argv[1])
v = v[0].get("lazy")
print("yes" if v and v["layers"] and v["layersComplete"] == v["layers"] else "no")' "$1"
}

# image_run NAME REFERENCE: img-first and img-header (one lazy volume), then img-seq (another)
# of the image REFERENCE mounted at path /models, each from an emptied cache; prints
# "staged first header seq".
image_run() {
    local id=bench-$1-$run s t0 staged first header seq got
    reset
    t0=$EPOCHREALTIME
    s=$(stage "$id" true "$2" path=/models)
    staged=$(since "$t0")
    head -c 1 "$s/model.safetensors" >/dev/null
    first=$(since "$t0")
    read_header "$s/model.safetensors"
    header=$(since "$t0")
    lazy_status "$id" >/dev/null
    unstage "$id" "$s"

    reset
    id=bench-$1-seq-$run
    t0=$EPOCHREALTIME
    s=$(stage "$id" true "$2" path=/models)
    got=$(read_all "$s/model.safetensors")
    seq=$(since "$t0")
    [ "$got" = "$weights_sha" ] || { echo "the lazy volume of $2 read other bytes ($got)" >&2; exit 1; }
    lazy_status "$id" >/dev/null
    unstage "$id" "$s"
    echo "$staged $first $header $seq"
}
# lazy_status ID: the volume's lazy status (ListVolumes); fails if it was staged otherwise.
lazy_status() {
    mh client list | python3 -c '
import json, sys
v = [v for v in json.load(sys.stdin) if v["volumeId"] == sys.argv[1]]
if not v or not v[0].get("lazy"):
    sys.exit("volume " + sys.argv[1] + " is not a lazy volume")
print(json.dumps(v[0]["lazy"]))' "$1"
}

results=$work/results
images=$work/results-image
: >"$results"
: >"$images"
for run in $(seq "$RUNS"); do
    echo "--- run $run"
    reset
    id=bench-eager-$run
    t0=$EPOCHREALTIME
    s=$(stage "$id" false "$ref")
    eager=$(since "$t0")
    unstage "$id" "$s"

    reset
    id=bench-lazy-first-$run
    t0=$EPOCHREALTIME
    s=$(stage "$id" true "$ref")
    staged=$(since "$t0")
    head -c 1 "$s/model.safetensors" >/dev/null
    first=$(since "$t0")
    read_header "$s/model.safetensors"
    header=$(since "$t0")
    unstage "$id" "$s"

    reset
    id=bench-lazy-signed-$run
    t0=$EPOCHREALTIME
    s=$(stage "$id" true "$signed_ref" signedBy=bench)
    signed_staged=$(since "$t0")
    head -c 1 "$s/model.safetensors" >/dev/null
    signed_first=$(since "$t0")
    signer=$(mh client list | python3 -c 'import json,sys; v=[v for v in json.load(sys.stdin) if v["volumeId"] == sys.argv[1]][0]["trust"]; print(v["signed"]["by"], v["indexed"]["signedBy"])' "$id")
    [ "$signer" = "bench bench" ] || { echo "the signed volume reports signer and index signer \"$signer\"" >&2; exit 1; }
    unstage "$id" "$s"

    reset
    id=bench-lazy-seq-$run
    t0=$EPOCHREALTIME
    s=$(stage "$id" true "$ref")
    got=$(read_all "$s/model.safetensors")
    seq_s=$(since "$t0")
    [ "$got" = "$weights_sha" ] || { echo "the lazy volume read other bytes ($got)" >&2; exit 1; }
    fetched=$(mh client list | python3 -c '
import json, sys
v = [v for v in json.load(sys.stdin) if v["volumeId"] == sys.argv[1]][0]["lazy"]
print(v["demandRequests"], v["demandBytes"], v["fillBytes"])' "$id")
    for _ in $(seq 6000); do
        [ "$(lazy_done "$id")" = yes ] && break
        sleep 0.1
    done
    [ "$(lazy_done "$id")" = yes ] || { echo "the fill of $id did not end within 10 minutes" >&2; exit 1; }
    blob=$work/mh/cache/blobs/sha256/${weights_digest#sha256:}
    # The same inode either way. A first read after the writes is slower whichever path makes
    # it (a virtual disk's host caches what was read once): read once, then each path twice,
    # in the order A B B A, and take each one's mean.
    drop_caches
    read_all "$blob" >/dev/null
    pt_cold=0; plain_cold=0; pt_warm=0; plain_warm=0
    for path in pt plain plain pt; do
        file=$s/model.safetensors
        [ "$path" = plain ] && file=$blob
        drop_caches
        t0=$EPOCHREALTIME; read_all "$file" >/dev/null; cold=$(since "$t0")
        t0=$EPOCHREALTIME; read_all "$file" >/dev/null; warm=$(since "$t0")
        if [ "$path" = pt ]; then
            pt_cold=$(echo "$pt_cold $cold" | awk '{ print $1 + $2 / 2 }')
            pt_warm=$(echo "$pt_warm $warm" | awk '{ print $1 + $2 / 2 }')
        else
            plain_cold=$(echo "$plain_cold $cold" | awk '{ print $1 + $2 / 2 }')
            plain_warm=$(echo "$plain_warm $warm" | awk '{ print $1 + $2 / 2 }')
        fi
    done
    passthrough=$(mh client list | python3 -c 'import json,sys; print([v for v in json.load(sys.stdin) if v["volumeId"] == sys.argv[1]][0]["lazy"]["passthroughFiles"])' "$id")
    unstage "$id" "$s"

    echo "$eager $staged $first $header $seq_s $pt_cold $plain_cold $pt_warm $plain_warm $signed_staged $signed_first" >>"$results"
    read -r demand_requests demand_bytes fill_bytes <<<"$fetched"
    echo "lazy: during that read $demand_requests ranges ($((demand_bytes >> 20)) MiB) fetched for the reader, $((fill_bytes >> 20)) MiB by the fill"
    awk -v b="$size" -v p="$passthrough" '{
        printf "eager pull to a staged volume %.2f s (%.0f MB/s)\n", $1, b / $1 / 1e6
        printf "lazy: staged %.3f s, first byte %.3f s, header + 64 MiB range %.3f s\n", $2, $3, $4
        printf "lazy: whole file read in order from the stage call %.2f s (%.0f MB/s) = %.2fx the eager pull\n", $5, b / $5 / 1e6, $1 / $5
        printf "after the fill (%d files in passthrough): cold %.2f s vs plain %.2f s = %.2fx; warm %.2f s vs plain %.2f s = %.2fx\n", p, $6, $7, $7 / $6, $8, $9, $9 / $8
        printf "lazy under a signature policy (signed model, signed index): staged %.3f s, first byte %.3f s = %.2fx the unsigned lazy volume'"'"'s\n", $10, $11, $11 / $3
    }' <<<"$(tail -n 1 "$results")"

    [ "$IMAGE" != 0 ] || continue
    img=$(image_run img "$image_ref")
    gz=$(image_run gz "$gzip_ref")
    echo "$eager $img $gz" >>"$images"
    awk -v b="$size" '{
        printf "image (tar layers, path /models): staged %.3f s, first byte %.3f s, header + 64 MiB range %.3f s\n", $2, $3, $4
        printf "image: whole file read in order from the stage call %.2f s (%.0f MB/s) = %.2fx the eager pull\n", $5, b / $5 / 1e6, $1 / $5
        printf "image, weights layer gzipped: staged %.3f s, first byte %.3f s, header + 64 MiB range %.3f s\n", $6, $7, $8
        printf "image, weights layer gzipped: whole file read in order from the stage call %.2f s (%.0f MB/s) = %.2fx the eager pull\n", $9, b / $9 / 1e6, $1 / $9
    }' <<<"$(tail -n 1 "$images")"
done

echo "--- over $RUNS runs (min-max)"
awk -v b="$size" '
function upd(i, v) { if (NR == 1 || v < lo[i]) lo[i] = v; if (NR == 1 || v > hi[i]) hi[i] = v }
{
    upd(1, $1); upd(2, $3); upd(3, $4); upd(4, $1 / $5); upd(5, $7 / $6); upd(6, $9 / $8)
    upd(7, b / $1 / 1e6); upd(8, b / $5 / 1e6); upd(9, $11); upd(10, $11 / $3)
}
END {
    printf "eager pull: %.2f-%.2f s (%.0f-%.0f MB/s)\n", lo[1], hi[1], lo[7], hi[7]
    printf "lazy first byte: %.3f-%.3f s (goal <= 1 s)\n", lo[2], hi[2]
    printf "lazy header + 64 MiB range: %.3f-%.3f s (goal <= 1.5 s)\n", lo[3], hi[3]
    printf "lazy sequential read during the fill / eager pull: %.2f-%.2fx (%.0f-%.0f MB/s; goal >= 0.8x)\n", lo[4], hi[4], lo[8], hi[8]
    printf "passthrough / plain bind, cold: %.2f-%.2fx; warm: %.2f-%.2fx (goal >= 0.9x)\n", lo[5], hi[5], lo[6], hi[6]
    printf "signed lazy first byte: %.3f-%.3f s (goal <= 1 s), %.2f-%.2fx the unsigned lazy volume'"'"'s\n", lo[9], hi[9], lo[10], hi[10]
}' "$results"
[ "$IMAGE" != 0 ] || exit 0
awk -v b="$size" '
function upd(i, v) { if (NR == 1 || v < lo[i]) lo[i] = v; if (NR == 1 || v > hi[i]) hi[i] = v }
{
    upd(1, $3); upd(2, $4); upd(3, $1 / $5); upd(4, b / $5 / 1e6)
    upd(5, $7); upd(6, $8); upd(7, $1 / $9); upd(8, b / $9 / 1e6)
}
END {
    printf "image lazy first byte: %.3f-%.3f s (goal <= 1 s)\n", lo[1], hi[1]
    printf "image lazy header + 64 MiB range: %.3f-%.3f s (goal <= 1.5 s)\n", lo[2], hi[2]
    printf "image lazy sequential read during the fill / eager pull: %.2f-%.2fx (%.0f-%.0f MB/s; goal >= 0.8x)\n", lo[3], hi[3], lo[4], hi[4]
    printf "gzipped image lazy first byte: %.3f-%.3f s; header + 64 MiB range: %.3f-%.3f s; sequential read / eager pull: %.2f-%.2fx (%.0f-%.0f MB/s) (no goal: a compressed layer is served once fetched and unpacked)\n", lo[5], hi[5], lo[6], hi[6], lo[7], hi[7], lo[8], hi[8]
}' "$images"
