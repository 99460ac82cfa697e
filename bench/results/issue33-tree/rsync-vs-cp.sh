#!/usr/bin/env bash
# Usage: bench/results/issue33-tree/rsync-vs-cp.sh BIN
# Times cp -a and rsync -a (twice each, alternating) of the 1/10 tree's Documentation (711 files;
# `cd bench && python3 -m bfsbench.treegen --scale 0.1 --out /var/tmp/rs-tree`) into a fresh
# --write-back mount each, on a fresh MinIO: the time the command returned, and the time the
# unmount returned (every file stored).
set -euo pipefail
BIN=$1
mkdir -p /var/tmp/rs-cache
cd /work/main
set -a; eval "$(scripts/start-store minio)"; set +a
trap 'scripts/stop-store "$STORE_PID" "$STORE_DIR"' EXIT
SRC=/var/tmp/rs-tree/linux-synth/Documentation
for prog in "cp -a" "rsync -a" "cp -a" "rsync -a"; do
  b=rs$RANDOM
  python3 - <<PY
import boto3,os
s3=boto3.client("s3",endpoint_url=os.environ["STORE_ENDPOINT"],region_name="us-east-1")
s3.create_bucket(Bucket="$b")
PY
  mnt=$(mktemp -d)
  $BIN mount --foreground --write-back --endpoint-url "$STORE_ENDPOINT" --force-path-style --region us-east-1 --cache-dir /var/tmp/rs-cache s3://$b "$mnt" 2>/var/tmp/rs-mount.log &
  pid=$!
  for i in $(seq 50); do mountpoint -q "$mnt" && break; sleep 0.1; done; mountpoint -q "$mnt" || { cat /var/tmp/rs-mount.log; exit 1; }
  start=$(date +%s.%N)
  $prog "$SRC" "$mnt/"
  mid=$(date +%s.%N)
  fusermount3 -u "$mnt"; wait $pid
  end=$(date +%s.%N)
  echo "$prog: returned $(echo "$mid - $start" | bc) s, unmounted (all stored) $(echo "$end - $start" | bc) s"
  rmdir "$mnt"
done
