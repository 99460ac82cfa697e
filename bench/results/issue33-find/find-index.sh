#!/usr/bin/env bash
# find-index.sh BIN [perf]: fresh MinIO, the 1/10 tree (/var/tmp/rs-tree, made as in ../issue33-rm/rm-requests.sh)
# uploaded by s3direct; an --index mount saves its index. Then:
#   (default) 3 fresh mounts that load it, each `find -name '*.h'` after dropping caches (the FUSE requests
#             by op of the first: a fresh mount's counters), then the same find on the local copy, caches dropped;
#   perf      one mount that loads it, `perf record -a -g` (to /var/tmp/find-perf.data) over 15 finds, each
#             after dropping dentries and inodes; prints the mean find time.
set -euo pipefail
BIN=$(readlink -f "$1"); MODE=${2:-rounds}
cd "$(dirname "$0")/../../.."
set -a; eval "$(scripts/start-store minio)"; set +a
trap 'scripts/stop-store "$STORE_PID" "$STORE_DIR"' EXIT
b=f$RANDOM
python3 -c "
import boto3,os
boto3.client('s3',endpoint_url=os.environ['STORE_ENDPOINT'],region_name='us-east-1').create_bucket(Bucket='$b')"
target/release/examples/s3direct --endpoint-url "$STORE_ENDPOINT" put-dir --concurrency 16 /var/tmp/rs-tree $b >/dev/null
cache=$(mktemp -d /var/tmp/fi-cache.XXXX)
mnt=$(mktemp -d)
mountit() {
  $BIN mount --foreground --index --index-attributes-rate 0 --metrics-addr 127.0.0.1:19464 --cache-dir "$cache" \
    --endpoint-url "$STORE_ENDPOINT" --force-path-style --region us-east-1 s3://$b "$mnt" 2>>/var/tmp/fi-mount.log &
  pid=$!
  for i in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
}
unmount() { fusermount3 -u "$mnt"; wait $pid; }
mountit; $BIN refresh "$mnt" >/dev/null; unmount
if [ "$MODE" = perf ]; then
  mountit; find "$mnt" -name '*.h' | wc -l
  perf record -a -g -F 1999 -o /var/tmp/find-perf.data 2>/dev/null & ppid=$!
  sleep 0.3; total=0
  for i in $(seq 15); do
    sync; echo 2 > /proc/sys/vm/drop_caches
    s=$(date +%s%N); find "$mnt" -name '*.h' >/dev/null; e=$(date +%s%N); total=$((total + e - s))
  done
  kill -INT $ppid; wait $ppid || true
  echo "mean find: $((total / 15 / 1000)) us"
  unmount
else
  for round in 1 2 3; do
    mountit; sleep 1
    sync; echo 3 > /proc/sys/vm/drop_caches
    start=$(date +%s.%N); n=$(find "$mnt" -name '*.h' | wc -l); end=$(date +%s.%N)
    echo "round $round: find $n in $(echo "$end - $start" | bc) s"
    [ $round = 1 ] && curl -s 127.0.0.1:19464/metrics | grep '^bucketfs_fuse_requests_total' | sed 's/bucketfs_fuse_requests_total//' | tr '\n' ' ' && echo
    unmount
  done
  sync; echo 3 > /proc/sys/vm/drop_caches
  start=$(date +%s.%N); n=$(find /var/tmp/rs-tree -name '*.h' | wc -l); end=$(date +%s.%N)
  echo "local: find $n in $(echo "$end - $start" | bc) s"
fi
rmdir "$mnt"; rm -rf "$cache"
