#!/usr/bin/env bash
# STAND-IN (lab only): time `make lab` in its three situations and print the figures.
#   up-again : lab already up (nothing to do; must report 0 changed)
#   after-down: after `make lab-down` (images and /var/cache/d3-lab reused)
#   cold     : only with COLD=1: also removes the lab host images and rootfs tarballs (debootstrap again)
# usage: lab/bench_lab.sh [LAB_HOSTS]        (run from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
hosts=${1:-2}
declare -A took
run() {  # LABEL TARGET...
  local label=$1 t0 ds log changed
  shift
  log=$(mktemp /tmp/d3-lab-bench.XXXXXX)
  t0=$(date +%s%N)
  make "$@" LAB_HOSTS="$hosts" > "$log" 2>&1 || { tail -30 "$log"; echo "FAILED: make $*" >&2; exit 1; }
  ds=$(( ($(date +%s%N) - t0) / 100000000 ))
  took[$label]=$(( ds / 10 )).$(( ds % 10 ))
  changed=$(grep -o 'changed=[0-9]*' "$log" | awk -F= '{s += $2} END {print s + 0}')
  printf '%-11s %7ss  (changed tasks: %s)  log %s\n' "$label" "${took[$label]}" "$changed" "$log"
}
run lab-down lab-down
if [ "${COLD:-0}" = 1 ]; then
  users=$(podman ps -a --format '{{.Names}}' --filter ancestor=localhost/d3-lab-host-trixie:latest \
          --filter ancestor=localhost/d3-lab-host-bookworm:latest)
  if [ -n "$users" ]; then
    echo "COLD=1: the lab host images are used by other containers ($users); not removing them" >&2
    exit 1
  fi
  podman rmi --ignore localhost/d3-lab-host-trixie:latest localhost/d3-lab-host-bookworm:latest > /dev/null
  rm -f /var/cache/d3-lab/rootfs-trixie-*.tar /var/cache/d3-lab/rootfs-bookworm-*.tar
  run cold lab
else
  run after-down lab
fi
run up-again lab
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
