#!/usr/bin/env bash
# LAB STAND-IN (d3-fleet lab): a signed FLAT apt repository laid out like NVIDIA's
# https://nvidia.github.io/libnvidia-container/ (stable/deb/$(ARCH)/ + gpgkey at the root).
#   make-repo.sh DEBDIR REPOROOT GNUPGHOME
# - generates the lab signing key in GNUPGHOME once (ed25519, no passphrase; never served),
# - copies DEBDIR/*.deb to REPOROOT/stable/deb/amd64/ and, only when something changed,
#   writes Packages, Packages.gz, Release, InRelease and Release.gpg (apt-ftparchive + gpg),
# - exports the public key, ASCII-armoured, to REPOROOT/gpgkey.
# Prints "changed" or "unchanged". Needs apt-utils (apt-ftparchive) and gnupg.
set -euo pipefail
DEBDIR=${1:?usage: make-repo.sh DEBDIR REPOROOT GNUPGHOME}
ROOT=${2:?usage: make-repo.sh DEBDIR REPOROOT GNUPGHOME}
export GNUPGHOME=${3:?usage: make-repo.sh DEBDIR REPOROOT GNUPGHOME}
UID_NAME="d3-fleet lab apt repository (LAB STAND-IN) <lab-apt@d3-fleet.invalid>"
DEST="$ROOT/stable/deb/amd64"
changed=0

mkdir -p "$DEST"
install -d -m 0700 "$GNUPGHOME"
if ! gpg --batch --quiet --list-secret-keys "$UID_NAME" >/dev/null 2>&1; then
    gpg --batch --quiet --pinentry-mode loopback --passphrase '' \
        --quick-gen-key "$UID_NAME" ed25519 sign never 2>/dev/null
    changed=1
fi
FPR=$(gpg --batch --with-colons --list-secret-keys "$UID_NAME" | awk -F: '$1=="fpr"{print $10; exit}')

for deb in "$DEBDIR"/*.deb; do
    name=$(basename "$deb")
    if ! cmp -s "$deb" "$DEST/$name"; then cp "$deb" "$DEST/$name"; changed=1; fi
done
for deb in "$DEST"/*.deb; do
    [ -e "$deb" ] || continue
    if [ ! -e "$DEBDIR/$(basename "$deb")" ]; then rm -f "$deb"; changed=1; fi
done

KEYTMP=$(mktemp)
trap 'rm -f "$KEYTMP"' EXIT
gpg --batch --armor --export "$FPR" > "$KEYTMP"
if ! cmp -s "$KEYTMP" "$ROOT/gpgkey"; then install -m 0644 "$KEYTMP" "$ROOT/gpgkey"; changed=1; fi

for f in Packages Packages.gz Release InRelease Release.gpg; do [ -s "$DEST/$f" ] || changed=1; done
if gpg --batch --verify "$DEST/InRelease" >/dev/null 2>&1; then :; else changed=1; fi

if [ $changed = 1 ]; then
    cd "$DEST"
    apt-ftparchive packages . > Packages
    gzip -9n -c Packages > Packages.gz
    rm -f Release InRelease Release.gpg
    apt-ftparchive \
        -o APT::FTPArchive::Release::Origin="d3-fleet lab (LAB STAND-IN for NVIDIA)" \
        -o APT::FTPArchive::Release::Label="lab-nvidia-container-toolkit" \
        -o APT::FTPArchive::Release::Architectures="amd64" \
        release . > "$KEYTMP"
    install -m 0644 "$KEYTMP" Release
    gpg --batch --quiet --yes --pinentry-mode loopback --passphrase '' --local-user "$FPR" \
        --clearsign --output InRelease Release
    gpg --batch --quiet --yes --pinentry-mode loopback --passphrase '' --local-user "$FPR" \
        --armor --detach-sign --output Release.gpg Release
    chmod 0644 InRelease Release.gpg Packages Packages.gz
    echo changed
else
    echo unchanged
fi
