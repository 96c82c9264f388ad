#!/bin/sh
# LAB STAND-IN: builds the vLLM D3 *simulator* images localhost/d3-vllm-sim:{nightly,nightly-next,nightly-broken}.
# These replace docker.io/vllm/vllm-openai:nightly in the lab only; production roles never use them.
#
# Idempotent: the rootfs tarball is cached in $D3_SIM_CACHE_DIR (default /var/cache/d3-lab); the images are
# rebuilt only when a tag is missing or its io.d3-fleet.lab.sim.source-sha256 label differs from the hash of
# vllm_sim.py + Containerfile (+ this script). Last line of output: "D3_SIM_BUILD: built" or "D3_SIM_BUILD: unchanged".
#
# Environment: D3_SIM_IMAGE (default localhost/d3-vllm-sim), D3_SIM_CACHE_DIR, D3_SIM_MIRROR (default: the URI
# of this machine's own apt source for the suite), D3_SIM_SUITE (default bookworm), D3_SIM_FORCE=1 rebuilds all.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
IMAGE=${D3_SIM_IMAGE:-localhost/d3-vllm-sim}
CACHE_DIR=${D3_SIM_CACHE_DIR:-/var/cache/d3-lab}
SUITE=${D3_SIM_SUITE:-bookworm}
FORCE=${D3_SIM_FORCE:-0}
BASE_IMAGE=localhost/d3-vllm-sim-base:$SUITE
ROOTFS_TAR=$CACHE_DIR/d3-vllm-sim-rootfs-$SUITE.tar
HASH_LABEL=io.d3-fleet.lab.sim.source-sha256

log() { printf 'd3-vllm-sim build: %s\n' "$*"; }

mirror() {
  if [ -n "${D3_SIM_MIRROR:-}" ]; then echo "$D3_SIM_MIRROR"; return; fi
  # The archive URI this machine's apt sources use for $SUITE (not hard-coded).
  uri=$(apt-get indextargets --format '$(RELEASE) $(REPO_URI)' 2>/dev/null \
        | awk -v s="$SUITE" '$1 == s { print $2; exit }')
  if [ -z "$uri" ]; then
    uri=$(apt-get indextargets --format '$(RELEASE) $(REPO_URI)' 2>/dev/null \
          | awk '$1 !~ /-(security|updates|backports)$/ && $2 ~ /\/debian\/?$/ { print $2; exit }')
  fi
  [ -n "$uri" ] || { echo "cannot derive a Debian archive URI from apt sources; set D3_SIM_MIRROR" >&2; exit 1; }
  echo "$uri"
}

build_rootfs() {
  mkdir -p "$CACHE_DIR"
  tmp=$(mktemp -d "$CACHE_DIR/d3-vllm-sim-rootfs.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  m=$(mirror)
  log "mmdebstrap $SUITE minbase + python3 from $m (cached afterwards in $ROOTFS_TAR)"
  # mmdebstrap: one apt run, about 2.4x less CPU than debootstrap (lab/images/build-host-rootfs.sh)
  mmdebstrap --variant=minbase --include=python3-minimal,libpython3.11-stdlib \
    --hook-dir=/usr/share/mmdebstrap/hooks/maybe-merged-usr --dpkgopt=force-unsafe-io \
    "$SUITE" "$tmp/root" "$m" > "$tmp/mmdebstrap.log" 2>&1 \
    || { tail -20 "$tmp/mmdebstrap.log" >&2; exit 1; }
  r=$tmp/root
  rm -f "$r/etc/dpkg/dpkg.cfg.d/99mmdebstrap"
  # keep it small: no docs, man pages, locales, apt lists or package caches
  rm -rf "$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/locale/* \
         "$r"/usr/share/lintian "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/* "$r"/var/cache/debconf/*-old \
         "$r"/var/log/* "$r"/tmp/* "$r"/root/.cache
  find "$r/usr/lib/python3.11" -name '__pycache__' -prune -exec rm -rf {} + 2>/dev/null || true
  tar --numeric-owner -C "$r" -cf "$ROOTFS_TAR.part" .
  mv "$ROOTFS_TAR.part" "$ROOTFS_TAR"
  rm -rf "$tmp"
  trap - EXIT
}

image_label() {  # IMAGE:TAG -> value of the hash label, empty if the image is missing
  podman image inspect --format "{{ index .Labels \"$HASH_LABEL\" }}" "$1" 2>/dev/null || true
}

SRC_HASH=$(cat "$HERE/vllm_sim.py" "$HERE/Containerfile" "$HERE/build.sh" | sha256sum | cut -d' ' -f1)

up_to_date=1
for t in nightly nightly-next nightly-broken; do
  [ "$(image_label "$IMAGE:$t")" = "$SRC_HASH" ] || up_to_date=0
done
if [ "$FORCE" != 1 ] && [ "$up_to_date" = 1 ]; then
  log "images $IMAGE:{nightly,nightly-next,nightly-broken} match source hash $SRC_HASH"
  echo "D3_SIM_BUILD: unchanged"
  exit 0
fi

if [ "$FORCE" = 1 ] || [ ! -s "$ROOTFS_TAR" ]; then build_rootfs; fi
if [ "$FORCE" = 1 ] || ! podman image exists "$BASE_IMAGE"; then
  log "import $ROOTFS_TAR as $BASE_IMAGE"
  podman import -q --change 'CMD ["/bin/sh"]' "$ROOTFS_TAR" "$BASE_IMAGE" >/dev/null
fi

log "build $IMAGE:nightly"
podman build -q --pull=never --label "$HASH_LABEL=$SRC_HASH" --label io.d3-fleet.lab.sim.variant=nightly \
  -f "$HERE/Containerfile" -t "$IMAGE:nightly" "$HERE" >/dev/null

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
# nightly-next: same content, a different label -> a different digest ("the next nightly"), and a STAND-IN
# regression: it answers 1.5x slower (D3_SIM_LATENCY_SCALE; same answers), so a benchmark across a rollout
# nightly -> nightly-next shows a latency change and no accuracy change. `-e D3_SIM_LATENCY_SCALE=1` undoes it.
printf 'FROM %s:nightly\nLABEL io.d3-fleet.lab.sim.variant=nightly-next\nENV D3_SIM_LATENCY_SCALE=1.5\n' \
  "$IMAGE" > "$ctx/Containerfile.next"
log "build $IMAGE:nightly-next"
podman build -q --pull=never -f "$ctx/Containerfile.next" -t "$IMAGE:nightly-next" "$ctx" >/dev/null
# nightly-broken: starts and logs, but never binds its port (never healthy)
printf 'FROM %s:nightly\nLABEL io.d3-fleet.lab.sim.variant=nightly-broken\nENV D3_SIM_BEHAVIOUR=never-ready\n' \
  "$IMAGE" > "$ctx/Containerfile.broken"
log "build $IMAGE:nightly-broken"
podman build -q --pull=never -f "$ctx/Containerfile.broken" -t "$IMAGE:nightly-broken" "$ctx" >/dev/null
rm -rf "$ctx"
trap - EXIT
echo "D3_SIM_BUILD: built"
