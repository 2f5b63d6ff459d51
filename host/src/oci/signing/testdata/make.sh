#!/usr/bin/env bash
# Makes the model-signing fixtures of host/src/oci/signing with the real `model_signing` CLI
# (1.1.1, pip package model-signing) and openssl. Private keys live only in a temp dir and are
# thrown away: only public keys, CA certificates and bundles are kept.
#
#   MODEL_SIGNING=/path/to/model_signing bash host/src/oci/signing/testdata/make.sh
#
# The model signed: `a.txt` holding "hello model\n", `sub/w.bin` holding the 3000 bytes
# i % 251 for i in 0..3000 (the tests compute their digests from the same recipe).
set -euo pipefail
out=$(cd "$(dirname "$0")" && pwd)
ms=${MODEL_SIGNING:-model_signing}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

mkdir -p model/sub
printf 'hello model\n' > model/a.txt
python3 -c 'import sys; sys.stdout.buffer.write(bytes(i % 251 for i in range(3000)))' > model/sub/w.bin

# Key form, P-256 (SEC1 key, as `openssl ecparam -genkey` writes it) and P-384 (PKCS#8).
openssl ecparam -name prime256v1 -genkey -noout -out p256.key
openssl ec -in p256.key -pubout -out "$out/p256.pub"
"$ms" sign key model --private_key p256.key --signature "$out/p256.sig"
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:secp384r1 -out p384.key
openssl pkey -in p384.key -pubout -out "$out/p384.pub"
"$ms" sign key model --private_key p384.key --signature "$out/p384.sig"

# Certificate form: a P-384 CA, a P-256 leaf for code signing with an email SAN, valid ten
# years from the day this ran (the tests verify at a fixed time inside that window).
openssl ecparam -name secp384r1 -genkey -noout -out ca.key
openssl req -x509 -new -key ca.key -subj "/CN=fixture model-signing CA" -days 3650 \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$out/chain.ca.pem"
openssl ecparam -name prime256v1 -genkey -noout -out leaf.key
openssl req -new -key leaf.key -subj "/CN=fixture signer" -out leaf.csr
printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
  "extendedKeyUsage=codeSigning" "subjectAltName=email:signer@example.com" > leaf.ext
openssl x509 -req -in leaf.csr -CA "$out/chain.ca.pem" -CAkey ca.key -CAserial ca.srl -CAcreateserial -days 3650 \
  -extfile leaf.ext -out leaf.pem
"$ms" sign certificate model --private_key leaf.key --signing_certificate leaf.pem \
  --certificate_chain "$out/chain.ca.pem" --signature "$out/chain.sig"

for f in p256 p384; do "$ms" verify key model --signature "$out/$f.sig" --public_key "$out/$f.pub"; done
"$ms" verify certificate model --signature "$out/chain.sig" --certificate_chain "$out/chain.ca.pem"
openssl x509 -in leaf.pem -noout -dates
