#!/usr/bin/env bash
# find-perf.sh BIN: system-wide perf of 15 cold finds (drop caches each) over a saved index of the 1/10 tree
set -euo pipefail
cd "$(dirname "$0")/../../.."
BIN=$1
set -a; eval "$(scripts/start-store minio)"; set +a
trap 'scripts/stop-store "$STORE_PID" "$STORE_DIR"' EXIT
S3D=target/release/examples/s3direct
b=f$RANDOM
python3 -c "
import boto3,os
boto3.client('s3',endpoint_url=os.environ['STORE_ENDPOINT'],region_name='us-east-1').create_bucket(Bucket='$b')"
$S3D --endpoint-url "$STORE_ENDPOINT" put-dir --concurrency 16 /var/tmp/rs-tree $b >/dev/null
cache=$(mktemp -d /var/tmp/fi-cache.XXXX)
mnt=$(mktemp -d)
$BIN mount --foreground --index --index-attributes-rate 0 --cache-dir $cache --endpoint-url "$STORE_ENDPOINT" --force-path-style --region us-east-1 s3://$b "$mnt" 2>>/var/tmp/fi-mount.log & pid=$!
for i in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
$BIN refresh "$mnt" >/dev/null
find "$mnt" -name '*.h' | wc -l
perf record -a -g -F 1999 -o /var/tmp/find-perf.data 2>/dev/null &
ppid=$!
sleep 0.3
tot=0
for i in $(seq 15); do sync; echo 2 > /proc/sys/vm/drop_caches; s=$(date +%s%N); find "$mnt" -name '*.h' >/dev/null; e=$(date +%s%N); tot=$((tot + e - s)); done
kill -INT $ppid; wait $ppid || true
echo "mean find: $((tot / 15 / 1000)) us"
fusermount3 -u "$mnt"; wait $pid; rmdir "$mnt"; rm -rf "$cache"
