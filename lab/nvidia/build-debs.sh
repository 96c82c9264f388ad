#!/usr/bin/env bash
# LAB STAND-IN (d3-fleet lab): build the stand-in NVIDIA .debs from the plain trees in src/.
#   build-debs.sh OUTDIR
# Prints "unchanged" (and does nothing) when OUTDIR already holds the debs of these exact
# sources, else rebuilds all of them and prints "built N packages". Needs dpkg-deb.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:?usage: build-debs.sh OUTDIR}
# shellcheck source=versions.env
. "$HERE/versions.env"
export SOURCE_DATE_EPOCH

sources_hash() {
    cd "$HERE"
    { find build-debs.sh versions.env src \( -type f -o -type l \) -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
      find src -type f -perm /111 | LC_ALL=C sort; } | sha256sum | cut -c1-64
}

expected_debs() {
    echo "lab-nvidia-driver_${LAB_NVIDIA_DRIVER_VERSION}_amd64.deb"
    for v in $LAB_NVIDIA_TOOLKIT_VERSIONS; do
        for p in nvidia-container-toolkit nvidia-container-toolkit-base libnvidia-container-tools libnvidia-container1; do
            echo "${p}_${v}_amd64.deb"
        done
    done
}

HASH=$(sources_hash)
mkdir -p "$OUT"
if [ "$(cat "$OUT/.source-sha256" 2>/dev/null)" = "$HASH" ]; then
    missing=0
    while read -r f; do [ -s "$OUT/$f" ] || missing=1; done < <(expected_debs)
    if [ $missing = 0 ]; then echo unchanged; exit 0; fi
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

build() {  # NAME VERSION DRIVER_UPSTREAM OVERLAY...
    local name=$1 version=$2 driver=$3 tree; shift 3
    tree="$WORK/${name}_${version}"
    cp -a "$HERE/src/$name" "$tree"
    for overlay in "$@"; do cp -a "$HERE/src/$overlay/." "$tree/"; done
    grep -rlZ '@[A-Z_]*@' "$tree" | xargs -0 -r sed -i \
        -e "s/@VERSION@/${version}/g" -e "s/@UPSTREAM@/${version%-*}/g" \
        -e "s/@DRIVER_VERSION@/${driver}/g" -e "s/@COMMIT@/lab-stand-in-${version%-*}/g"
    if [ "$name" = lab-nvidia-driver ]; then  # like the real driver: libnvidia-ml.so.1 -> .so.<ver>
        mkdir -p "$tree/usr/lib/x86_64-linux-gnu"
        ln -sfn "libnvidia-ml.so.${driver}" "$tree/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    fi
    chmod -R u+rwX,go+rX,go-w "$tree"
    chmod 0755 "$tree/DEBIAN"
    find "$tree" -exec touch -h -d "@${SOURCE_DATE_EPOCH}" {} +
    dpkg-deb --root-owner-group -Zxz --build "$tree" "$WORK/out/${name}_${version}_amd64.deb" >/dev/null
}

mkdir -p "$WORK/out"
DRIVER=${LAB_NVIDIA_DRIVER_VERSION%-*}
build lab-nvidia-driver "$LAB_NVIDIA_DRIVER_VERSION" "$DRIVER"
for v in $LAB_NVIDIA_TOOLKIT_VERSIONS; do
    overlays=()
    if dpkg --compare-versions "$v" ge 1.18.0; then overlays=(nvidia-container-toolkit-base.refresh); fi
    build nvidia-container-toolkit-base "$v" "$DRIVER" "${overlays[@]}"
    for p in nvidia-container-toolkit libnvidia-container-tools libnvidia-container1; do
        build "$p" "$v" "$DRIVER"
    done
done
rm -f "$OUT"/*.deb
cp "$WORK"/out/*.deb "$OUT"/
echo "$HASH" > "$OUT/.source-sha256"
echo "built $(find "$WORK/out" -name '*.deb' | wc -l) packages"
