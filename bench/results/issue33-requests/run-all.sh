#!/usr/bin/env bash
# Usage: bench/results/issue33-requests/run-all.sh [BEFORE_BIN AFTER_BIN]
#   (defaults: /var/tmp/rpf/bucketfs-3f100d3 /var/tmp/rpf/bucketfs-e9f2c3d)
# Runs requests-per-file.sh once for every program x mode x build (5 x 2 x 2 = 20 runs, the two
# builds back to back for each program and mode), writes every run's JSON line to
# results.json (a JSON array) next to this script, and prints the tables (tables.py).
# Set RESULTS=FILE to write elsewhere. Takes about half an hour on this 2-core machine.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BEFORE=${1:-/var/tmp/rpf/bucketfs-3f100d3}
AFTER=${2:-/var/tmp/rpf/bucketfs-e9f2c3d}
RESULTS=${RESULTS:-$here/results.json}
lines=$(mktemp)
for program in tar cp rsync git pip; do
    for mode in default write-back; do
        for bin in "$BEFORE" "$AFTER"; do
            echo "== $(basename "$bin") $mode $program" >&2
            if ! out=$("$here/requests-per-file.sh" "$bin" "$mode" "$program"); then
                out=$(python3 -c 'import json,sys; print(json.dumps({"build": sys.argv[1], "mode": sys.argv[2], "program": sys.argv[3], "run_failed": True}))' \
                    "$(basename "$bin" | sed 's/^bucketfs-//')" "$mode" "$program")
            fi
            echo "$out" | tee -a "$lines" | cut -c1-300 >&2
        done
    done
done
python3 - "$lines" "$RESULTS" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
with open(sys.argv[2], "w") as f:
    f.write("[\n" + ",\n".join(json.dumps(r, sort_keys=True) for r in runs) + "\n]\n")
PY
rm -f "$lines"
python3 "$here/tables.py" "$RESULTS"
