#!/bin/sh
# Makes throwaway certificates for the TLS tests in DIR (created): a CA and a
# server certificate for 127.0.0.1/localhost signed by it, a client
# certificate signed by it, and a rogue CA with a client certificate of its
# own. Test-only; keys are unencrypted.
set -eu
dir=$1
mkdir -p "$dir"
cd "$dir"
ossl() { openssl "$@" 2>/dev/null; }
make_ca() {  # name
  ossl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$1" \
    -keyout "$1.key" -out "$1.crt"
}
make_cert() {  # name ca extensions
  ossl req -newkey rsa:2048 -nodes -subj "/CN=$1" -keyout "$1.key" -out "$1.csr"
  printf '%s\n' "$3" > "$1.ext"
  ossl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial \
    -days 2 -extfile "$1.ext" -out "$1.crt"
}
make_ca ca
make_ca rogue-ca
make_cert server ca "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth"
make_cert client ca "extendedKeyUsage=clientAuth"
make_cert rogue-client rogue-ca "extendedKeyUsage=clientAuth"
printf 's3cret-token-%s\n' "$$" > token
