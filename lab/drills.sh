#!/bin/bash
# Fault drills on the lab (issue 12): runs tests/lab/test_drills.py (drills 1-7) and the rollout drills in
# tests/lab/test_rollout.py (8: controller killed mid-rollout, 9: broken image at the canary), then prints every
# drill's figure in one table. Needs a running lab of 3 hosts (make lab LAB_HOSTS=3); takes the shared lab lock.
#   lab/drills.sh            # all drills
#   lab/drills.sh -k drill_1 # extra pytest arguments
# The lab is a STAND-IN (lab/README.md); the figures are the lab's, with its shortened cold starts.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] || make venv >/dev/null
out=$(mktemp /tmp/d3-drills.XXXXXX.jsonl)
trap 'rm -f "$out"' EXIT
rc=0
D3_DRILLS_OUT="$out" flock /tmp/d3-lab.lock .venv/bin/pytest -m lab -p no:cacheprovider -q \
    tests/lab/test_drills.py tests/lab/test_rollout.py "$@" || rc=$?
.venv/bin/python3 - "$out" <<'PY'
import json, sys
rows = sorted((json.loads(line) for line in open(sys.argv[1]) if line.strip()), key=lambda r: r["drill"])
head = ("drill", "fault", "figure", "lab time")
table = [head] + [(str(r["drill"]), r["name"], r["figure"], f"{r['lab_s']} s") for r in rows]
widths = [max(len(row[i]) for row in table) for i in range(len(head))]
print()
for row in table:
    print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
print(f"\n{len(rows)} drill(s); lab time {sum(r['lab_s'] for r in rows)} s")
PY
exit "$rc"
