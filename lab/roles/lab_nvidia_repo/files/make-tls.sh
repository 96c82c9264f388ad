#!/usr/bin/env bash
# LAB STAND-IN (d3-fleet lab): a lab certificate authority and a server certificate for the lab apt server's
# https port, so the lab serves NVIDIA's key (and repository) over https like nvidia.github.io does.
#   make-tls.sh DIR NAME [IP...]
# - generates the lab CA (DIR/ca.key, DIR/ca.crt, "d3-fleet lab CA (LAB STAND-IN)") once,
# - issues DIR/server.crt + DIR/server.key for DNS NAME and the given IPs, signed by that CA, when missing,
#   not signed by the current CA, or for other names.
# Lab hosts trust DIR/ca.crt (lab_hosts installs it into /usr/local/share/ca-certificates). Never use it elsewhere.
# Prints "changed" or "unchanged". Needs openssl.
set -euo pipefail
DIR=${1:?usage: make-tls.sh DIR NAME [IP...]}
NAME=${2:?usage: make-tls.sh DIR NAME [IP...]}
shift 2
SAN="DNS:$NAME"
for ip in "$@"; do SAN="$SAN,IP:$ip"; done
changed=0
install -d -m 0700 "$DIR"
umask 077
if [ ! -s "$DIR/ca.key" ] || [ ! -s "$DIR/ca.crt" ]; then
    openssl req -x509 -newkey rsa:3072 -sha256 -nodes -days 3650 \
        -subj "/O=d3-fleet lab/CN=d3-fleet lab CA (LAB STAND-IN)" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -keyout "$DIR/ca.key" -out "$DIR/ca.crt" 2>/dev/null
    chmod 0644 "$DIR/ca.crt"
    changed=1
fi
want_san=$(printf '%s' "$SAN" | tr ',' '\n' | sed 's/^IP:/IP Address:/' | sort | tr '\n' ',')
have_san=$(openssl x509 -in "$DIR/server.crt" -noout -ext subjectAltName 2>/dev/null | tail -n +2 | tr -d ' ' \
    | tr ',' '\n' | sed 's/^IPAddress:/IP Address:/' | sort | tr '\n' ',' || true)
if [ "$changed" = 1 ] || [ ! -s "$DIR/server.key" ] || [ "$want_san" != "$have_san" ] \
    || ! openssl verify -CAfile "$DIR/ca.crt" "$DIR/server.crt" >/dev/null 2>&1; then
    openssl req -newkey rsa:2048 -sha256 -nodes -subj "/O=d3-fleet lab/CN=$NAME" \
        -keyout "$DIR/server.key" -out "$DIR/server.csr" 2>/dev/null
    printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' \
        "$SAN" > "$DIR/server.ext"
    openssl x509 -req -sha256 -days 825 -in "$DIR/server.csr" -CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" \
        -CAcreateserial -extfile "$DIR/server.ext" -out "$DIR/server.crt" 2>/dev/null
    rm -f "$DIR/server.csr" "$DIR/server.ext"
    changed=1
fi
[ "$changed" = 1 ] && echo changed || echo unchanged
