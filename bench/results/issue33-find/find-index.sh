#!/usr/bin/env bash
# find-index.sh BIN: fresh MinIO, the 1/10 tree (/var/tmp/rs-tree, made as in ../issue33-rm/rm-requests.sh)
# uploaded by s3direct; an --index mount saves its index; then 3 fresh mounts that load it, each
# `find -name '*.h'` after dropping caches (FUSE requests by op printed for the first); then the same find
# on the local copy, caches dropped.
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
mountit() { $BIN mount --foreground --index --index-attributes-rate 0 --metrics-addr 127.0.0.1:19464 --cache-dir $cache --endpoint-url "$STORE_ENDPOINT" --force-path-style --region us-east-1 s3://$b "$mnt" 2>>/var/tmp/fi-mount.log & pid=$!; for i in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done; }
mountit; $BIN refresh "$mnt" >/dev/null; fusermount3 -u "$mnt"; wait $pid
for round in 1 2 3; do
  mountit; sleep 1
  sync; echo 3 > /proc/sys/vm/drop_caches
  before=$(curl -s 127.0.0.1:19464/metrics | grep '^bucketfs_fuse_requests_total' || true)
  start=$(date +%s.%N); n=$(find "$mnt" -name '*.h' | wc -l); end=$(date +%s.%N)
  echo "round $round: find $n in $(echo "$end - $start" | bc) s"
  curl -s 127.0.0.1:19464/metrics | grep '^bucketfs_fuse_requests_total' > /var/tmp/fi-after.txt || true
  [ $round = 1 ] && { echo "$before" > /var/tmp/fi-before.txt; cat /var/tmp/fi-after.txt | sed 's/bucketfs_fuse_requests_total//' | tr '\n' ' '; echo; }
  fusermount3 -u "$mnt"; wait $pid
done
rmdir "$mnt"; rm -rf "$cache"
start=$(date +%s.%N); sync; echo 3 > /proc/sys/vm/drop_caches; s2=$(date +%s.%N); n=$(find /var/tmp/rs-tree -name '*.h' | wc -l); end=$(date +%s.%N)
echo "local: find $n in $(echo "$end - $s2" | bc) s"
