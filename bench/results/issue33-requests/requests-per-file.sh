#!/usr/bin/env bash
# Usage: bench/results/issue33-requests/requests-per-file.sh BIN MODE PROGRAM
#   BIN      a bucketfs binary
#   MODE     default | write-back
#   PROGRAM  tar | cp | rsync | git | pip
#
# One run: a fresh MinIO (scripts/start-store minio), a fresh bucket, a fresh mount of BIN with
# --metrics-addr; scrapes the metrics just before PROGRAM starts and just after it returns, then
# waits until the daemon has nothing left to store (gauges bucketfs_files_open_for_writing and
# bucketfs_uploads_in_background at 0 and bucketfs_s3_requests_total unchanged for 3 s) and
# scrapes again ("settled"), counts the regular files in the mount with find, unmounts (timed),
# lists the bucket, stops the store. Prints one JSON line on stdout: the counter deltas
# (fuse = bucketfs_fuse_requests_total by op, fuse_errors, s3 = bucketfs_s3_requests_total by
# op:outcome, at return and settled), files, dirs, times, objects in the bucket, and, if PROGRAM
# failed, its exit code and the tail of its stderr. Logs and the list of files found stay in
# $RPF_WORK/<run>/.
#
# Inputs (environment, defaults in brackets):
#   RPF_TREE   [/var/tmp/rs-tree]        the tree for cp and rsync (holds linux-synth/)
#   RPF_TAR    [/var/tmp/rs-tree.tar]    the same tree as a tar (linux-synth/ at its top)
#   RPF_BARE   [/var/tmp/rpf/repo.git]   a bare repository for git clone
#   RPF_WHEELS [/var/tmp/rpf/wheels]     the wheel(s) for pip install
#   RPF_WORK   [/var/tmp/rpf/runs]       where run directories (cache dir, logs) go
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 BIN default|write-back tar|cp|rsync|git|pip" >&2; exit 2; }
BIN=$(readlink -f "$1"); MODE=$2; PROGRAM=$3
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
TREE=${RPF_TREE:-/var/tmp/rs-tree}
TAR=${RPF_TAR:-/var/tmp/rs-tree.tar}
BARE=${RPF_BARE:-/var/tmp/rpf/repo.git}
WHEELS=${RPF_WHEELS:-/var/tmp/rpf/wheels}
WORK=${RPF_WORK:-/var/tmp/rpf/runs}
[ -x "$BIN" ] || { echo "no binary $BIN" >&2; exit 2; }
case "$MODE" in default) WB=() ;; write-back) WB=(--write-back) ;; *) echo "bad MODE $MODE" >&2; exit 2 ;; esac
unset AWS_CA_BUNDLE

label=$(basename "$BIN"); label=${label#bucketfs-}
run=$WORK/$(date +%Y%m%d-%H%M%S)-$label-$MODE-$PROGRAM
mkdir -p "$run/cache" "$run/mnt"
mnt=$run/mnt

case "$PROGRAM" in
    tar)   [ -f "$TAR" ] || { echo "no $TAR" >&2; exit 2; }
           cmd=(tar -xf "$TAR" -C "$mnt") ;;
    cp)    [ -d "$TREE" ] || { echo "no $TREE" >&2; exit 2; }
           cmd=(cp -r "$TREE" "$mnt/") ;;
    rsync) [ -d "$TREE" ] || { echo "no $TREE" >&2; exit 2; }
           cmd=(rsync -a "$TREE/" "$mnt/tree/") ;;
    git)   [ -d "$BARE" ] || { echo "no $BARE" >&2; exit 2; }
           cmd=(git clone "$BARE" "$mnt/repo") ;;
    pip)   shopt -s nullglob; wheels=("$WHEELS"/*.whl); shopt -u nullglob
           [ ${#wheels[@]} -gt 0 ] || { echo "no wheels in $WHEELS" >&2; exit 2; }
           cmd=(python3 -m pip install --no-index --no-deps --no-compile --target "$mnt/site" "${wheels[@]}") ;;
    *) echo "bad PROGRAM $PROGRAM" >&2; exit 2 ;;
esac

dpid=""
STORE_PID=""
cleanup() {
    set +e
    if mountpoint -q "$mnt"; then fusermount3 -u "$mnt" 2>/dev/null || { sleep 2; fusermount3 -u "$mnt"; }; fi
    if [ -n "$dpid" ]; then
        for _ in $(seq 600); do kill -0 "$dpid" 2>/dev/null || break; sleep 0.5; done
        if kill -0 "$dpid" 2>/dev/null; then echo "daemon $dpid still running: SIGTERM" >&2; kill "$dpid"; fi
        wait "$dpid" 2>/dev/null
    fi
    [ -z "$STORE_PID" ] || "$REPO/scripts/stop-store" "$STORE_PID" "$STORE_DIR"
    rmdir "$mnt" 2>/dev/null
    rm -rf "$run/cache"
}
trap cleanup EXIT

cd "$REPO"
set -a; eval "$(scripts/start-store minio)"; set +a
cd /
bucket=rpf-$PROGRAM-$RANDOM$RANDOM
python3 -c "import boto3,os; boto3.client('s3',endpoint_url=os.environ['STORE_ENDPOINT'],region_name='us-east-1').create_bucket(Bucket='$bucket')"
port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
murl=http://127.0.0.1:$port/metrics

"$BIN" mount --foreground "${WB[@]}" --endpoint-url "$STORE_ENDPOINT" --force-path-style --region us-east-1 \
    --cache-dir "$run/cache" --metrics-addr "127.0.0.1:$port" "s3://$bucket" "$mnt" 2>"$run/daemon.log" &
dpid=$!
for _ in $(seq 100); do mountpoint -q "$mnt" && break; kill -0 "$dpid" 2>/dev/null || break; sleep 0.1; done
mountpoint -q "$mnt" || { echo "mount failed:" >&2; tail -20 "$run/daemon.log" >&2; exit 1; }

# scrape OUT: the metrics as JSON {"name{labels}": value}; settle OUT: wait, then scrape.
py_metrics='
import json, sys, time, urllib.request
url, what, out = sys.argv[1], sys.argv[2], sys.argv[3]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def scrape():
    for attempt in range(50):
        try:
            text = opener.open(url, timeout=10).read().decode()
            break
        except OSError:
            time.sleep(0.2)
    else:
        raise SystemExit("metrics: no answer from " + url)
    m = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            m[key] = float(value)
        except ValueError:
            pass
    return m
def s3_total(m):
    return sum(v for k, v in m.items() if k.startswith("bucketfs_s3_requests_total"))
start = time.monotonic()
m = scrape()
if what == "settle":
    quiet_since, last = None, None
    while time.monotonic() - start < 1800:
        busy = m.get("bucketfs_files_open_for_writing", 0) + m.get("bucketfs_uploads_in_background", 0)
        total = s3_total(m)
        now = time.monotonic()
        if busy == 0 and total == last:
            quiet_since = quiet_since or now
            if now - quiet_since >= 3:
                break
        else:
            quiet_since = None
        last = total
        time.sleep(0.5)
        m = scrape()
    else:
        m["settle_timed_out"] = 1
    m["settle_seconds"] = time.monotonic() - start
json.dump(m, open(out, "w"), indent=0, sort_keys=True)
'
python3 -c "$py_metrics" "$murl" scrape "$run/m-before.json"
t0=$(date +%s.%N)
set +e
"${cmd[@]}" >"$run/program.out" 2>"$run/program.err"
rc=$?
set -e
t1=$(date +%s.%N)
python3 -c "$py_metrics" "$murl" scrape "$run/m-after.json"
python3 -c "$py_metrics" "$murl" settle "$run/m-settled.json"
find "$mnt" -type f -printf '%P\n' | sort >"$run/files.txt"
files=$(wc -l <"$run/files.txt")
dirs=$(( $(find "$mnt" -type d | wc -l) - 1 ))
t2=$(date +%s.%N)
fusermount3 -u "$mnt"
wait "$dpid"; drc=$?; dpid=""
t3=$(date +%s.%N)

cmd_json=$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "${cmd[@]}")
python3 - "$run" "$bucket" <<PY
import boto3, json, os, sys
run, bucket = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=os.environ["STORE_ENDPOINT"], region_name="us-east-1")
keys = markers = size = 0
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
    for o in page.get("Contents", []):
        keys += 1; size += o["Size"]; markers += o["Key"].endswith("/")
def load(name):
    return json.load(open(os.path.join(run, name)))
before, after, settled = load("m-before.json"), load("m-after.json"), load("m-settled.json")
def delta(prefix, a, b=before):
    out = {}
    for k, v in a.items():
        if not k.startswith(prefix + "{"):
            continue
        d = v - b.get(k, 0)
        if d:
            labels = dict(p.split("=", 1) for p in k[len(prefix) + 1:-1].split(","))
            name = ":".join(x.strip('"') for x in labels.values())
            out[name] = int(d)
    return dict(sorted(out.items()))
rc = int("$rc")
err = ""
if rc != 0:
    err = open(os.path.join(run, "program.err"), errors="replace").read()[-2000:]
line = {
    "build": "$label", "bin": "$BIN", "mode": "$MODE", "program": "$PROGRAM",
    "command": $cmd_json,
    "exit_code": rc, "error": err,
    "files": int("$files"), "dirs": int("$dirs"),
    "program_seconds": round($t1 - $t0, 3),
    "settle_seconds": round(settled.get("settle_seconds", 0), 3),
    "settle_timed_out": bool(settled.get("settle_timed_out")),
    "unmount_seconds": round($t3 - $t2, 3), "daemon_exit_code": int("$drc"),
    "fuse": delta("bucketfs_fuse_requests_total", after),
    "fuse_errors": delta("bucketfs_fuse_errors_total", after),
    "s3": delta("bucketfs_s3_requests_total", after),
    "s3_settled": delta("bucketfs_s3_requests_total", settled),
    "fuse_settled": delta("bucketfs_fuse_requests_total", settled),
    "bucket_objects": keys, "bucket_markers": markers, "bucket_bytes": size,
    "run_dir": run,
}
line["fuse_total"] = sum(line["fuse"].values())
line["s3_total"] = sum(line["s3"].values())
line["s3_settled_total"] = sum(line["s3_settled"].values())
print(json.dumps(line, sort_keys=True))
PY
