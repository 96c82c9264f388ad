#!/usr/bin/env bash
# `make demo` as a newcomer meets it, timed by part (issue 36). Asks nothing; removes only the project's own.
#
#   tools/demo_timing.sh [--warm] [--profile] [--down-with OTHER] [CHECKOUT]
#
# cold (default): puts this machine in the newcomer's state first, as far as the project goes:
#   - the lab down and purged (`make lab-purge`: its containers, services, podman images, /var/cache/d3-lab and
#     /var/lib/d3-lab; lab/lab-down.yml says what exactly). It needs a venv: CHECKOUT's own, else OTHER's
#     (--down-with: another checkout of the project whose venv is ready, its make lab-purge), else one made for it
#     first (not timed), removed with the rest;
#   - CHECKOUT/.venv removed (only a real directory inside CHECKOUT: a .venv that is a symlink, e.g. to a venv other
#     checkouts share, is refused: run this from a fresh clone, `git clone REPO /tmp/demo-clone`);
#   - pip's cache: not deleted (it is the user's, not the project's): pip gets an empty one of its own for the run
#     (PIP_CACHE_DIR, removed afterwards), as a newcomer's pip has.
#   Debian packages (podman, mmdebstrap, ...) stay installed: they are the machine's, not the project's.
# --warm: after `make lab-down` (venv, pip cache, the lab's images and build cache kept), as README.md's warm figure.
# --profile: also ansible.posix.profile_tasks (every task's start time, the slowest 25 of each run at its end).
#
# Then it runs `make demo` in CHECKOUT (default: the checkout holding this script), writes every line with its time to
# CHECKOUT/build/demo-timing/{cold,warm}.log and prints the wall time of each part (tools/demo_timing.py): the pip
# installs, each ansible-playbook run and each of its steps (the fleet callback's figures), and the total; the cold
# and warm runs side by side when both logs exist. The exit status is make demo's.
#
# The lab is shared on a machine where several people work: take its lock, e.g.
#   flock /work/locks/lab.lock tools/demo_timing.sh /tmp/demo-clone
set -euo pipefail

mode=cold profile=0 checkout= down_with=
while [ $# -gt 0 ]; do
  case $1 in
    --warm) mode=warm ;;
    --profile) profile=1 ;;
    --down-with) down_with=${2:?--down-with needs a checkout}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "demo_timing.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) checkout=$1 ;;
  esac
  shift
done
checkout=$(cd "${checkout:-$(dirname "$0")/..}" && pwd)
[ -f "$checkout/Makefile" ] && grep -q '^demo:' "$checkout/Makefile" \
  || { echo "demo_timing.sh: $checkout is not a d3-fleet checkout (no Makefile with a demo target)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "demo_timing.sh: run as root (the lab is root's podman)" >&2; exit 2; }
venv=$checkout/.venv
if [ -L "$venv" ]; then
  echo "demo_timing.sh: $venv is a symlink (to $(readlink "$venv")): it is not this checkout's own to remove." >&2
  echo "  Time a fresh clone instead: git clone $checkout /tmp/demo-clone && $0 $([ "$mode" = warm ] && echo '--warm ')/tmp/demo-clone" >&2
  exit 2
fi
out=$checkout/build/demo-timing
mkdir -p "$out"
tools=$(cd "$(dirname "$0")" && pwd)

say() { printf '\n== demo_timing: %s\n' "$*"; }

if [ "$mode" = cold ]; then
  down=$checkout
  if [ ! -x "$venv/bin/ansible-playbook" ] && [ -n "$down_with" ]; then
    down=$(cd "$down_with" && pwd)
  elif [ ! -x "$venv/bin/ansible-playbook" ]; then
    say "a venv to take the lab down with (not timed)"
    make -C "$checkout" --no-print-directory venv
  fi
  say "the lab down and purged (make -C $down lab-purge)"
  make -C "$down" --no-print-directory lab-purge
  say "removing $venv"
  rm -rf -- "$venv"
  pip_cache=$(mktemp -d /tmp/demo-timing-pip-cache.XXXXXX)
  trap 'rm -rf -- "$pip_cache"' EXIT
  export PIP_CACHE_DIR=$pip_cache
else
  [ -x "$venv/bin/ansible-playbook" ] || { echo "demo_timing.sh: --warm needs the venv a cold run left" >&2; exit 2; }
  say "the lab down (make lab-down: images, build cache and venv kept)"
  make -C "$checkout" --no-print-directory lab-down
fi

export ANSIBLE_STDOUT_CALLBACK=d3fleet.fleet.fleet
if [ "$profile" = 1 ]; then
  export ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks,d3fleet.fleet.preload PROFILE_TASKS_TASK_OUTPUT_LIMIT=25
fi
say "make demo ($mode), every line timed into $out/$mode.log"
rc_file=$out/$mode.rc
rm -f "$rc_file"
{ rc=0; make -C "$checkout" --no-print-directory demo 2>&1 || rc=$?; echo "$rc" > "$rc_file"; } \
  | python3 "$tools/demo_timing.py" stamp "$out/$mode.log" --rc-file "$rc_file"
rc=$(cat "$rc_file")
say "wall time by part ($out/cold.log, warm.log)"
logs=()
for m in cold warm; do [ -f "$out/$m.log" ] && logs+=("$out/$m.log"); done
python3 "$tools/demo_timing.py" report "${logs[@]}" | tee "$out/report.txt"
exit "$rc"
