#!/usr/bin/env bash
# lean-ab.sh BIN [ROUNDS]: indexed cold find and du over io_uring, READDIRPLUS full vs lean (files nodeid 0), vs local.
set -euo pipefail
BIN=$(readlink -f "$1"); ROUNDS=${2:-5}
cd /work/main
switch=/sys/module/fuse/parameters/enable_uring; found=$(cat $switch)
set -a; eval "$(scripts/start-store minio)"; set +a
trap 'scripts/stop-store "$STORE_PID" "$STORE_DIR"; echo "$found" > $switch' EXIT
b=f$RANDOM
python3 -c "
import boto3,os
boto3.client('s3',endpoint_url=os.environ['STORE_ENDPOINT'],region_name='us-east-1').create_bucket(Bucket='$b')"
target/release/examples/s3direct --endpoint-url "$STORE_ENDPOINT" put-dir --concurrency 16 /var/tmp/rs-tree $b >/dev/null
cache=$(mktemp -d /var/tmp/fi-cache.XXXX)
mnt=$(mktemp -d)
mountit() {
  env $2 $BIN mount --foreground --fuse-transport "$1" --index --index-attributes-rate 0 --metrics-addr 127.0.0.1:19464 \
    --cache-dir "$cache" --endpoint-url "$STORE_ENDPOINT" --force-path-style --region us-east-1 s3://$b "$mnt" \
    2>>/var/tmp/lean-ab-mount.log &
  pid=$!
  for i in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
}
unmount() { fusermount3 -u "$mnt"; wait $pid; }
mountit dev-fuse X=1; $BIN refresh "$mnt" >/dev/null; unmount
one() { # transport env cmd round
  mountit "$1" "$2"; sleep 1
  sync; echo 3 > /proc/sys/vm/drop_caches
  start=$(date +%s.%N); n=$($3 "$mnt" | wc -l); end=$(date +%s.%N)
  echo "round $4 $1 $2 $3: $n lines in $(echo "$end - $start" | bc) s"
  if [ "$4" = 1 ]; then
    curl -s 127.0.0.1:19464/metrics | grep -E '^bucketfs_fuse_requests_total' \
      | sed 's/bucketfs_fuse_requests_total//' | tr '\n' ' '; echo
  fi
  unmount
}
findh() { find "$1" -name '*.h'; }
dus() { du -s "$1"; }
for round in $(seq "$ROUNDS"); do
  for cmd in findh dus; do
    one uring X=1 $cmd $round; one uring BUCKETFS_LEAN=1 $cmd $round
    sync; echo 3 > /proc/sys/vm/drop_caches
    start=$(date +%s.%N); n=$($cmd /var/tmp/rs-tree | wc -l); end=$(date +%s.%N)
    echo "round $round local $cmd: $n lines in $(echo "$end - $start" | bc) s"
  done
done
rmdir "$mnt"; rm -rf "$cache"
