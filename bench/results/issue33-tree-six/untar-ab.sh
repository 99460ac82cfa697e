#!/usr/bin/env bash
# untar-ab.sh BIN... : for each binary in turn (twice over), untar the 1/10 tree into a fresh --write-back mount;
# prints when tar returned and when the daemon exited after fusermount3 -u (every file stored)
set -euo pipefail
cd /work/main
set -a; eval "$(scripts/start-store minio)"; set +a
trap 'scripts/stop-store "$STORE_PID" "$STORE_DIR"' EXIT
mkdir -p /var/tmp/rs-cache
for round in 1 2; do for BIN in "$@"; do
  b=ab$RANDOM
  python3 -c "
import boto3,os
boto3.client('s3',endpoint_url=os.environ['STORE_ENDPOINT'],region_name='us-east-1').create_bucket(Bucket='$b')"
  mnt=$(mktemp -d)
  $BIN mount --foreground --write-back --endpoint-url "$STORE_ENDPOINT" --force-path-style --region us-east-1 --cache-dir /var/tmp/rs-cache s3://$b "$mnt" 2>/var/tmp/ab-mount.log &
  pid=$!
  for i in $(seq 50); do mountpoint -q "$mnt" && break; sleep 0.1; done; mountpoint -q "$mnt" || { cat /var/tmp/ab-mount.log; exit 1; }
  start=$(date +%s.%N)
  tar -xf /var/tmp/rs-tree.tar -C "$mnt"
  mid=$(date +%s.%N)
  fusermount3 -u "$mnt"; wait $pid
  end=$(date +%s.%N)
  echo "$BIN: tar returned $(echo "$mid - $start" | bc) s, all stored $(echo "$end - $start" | bc) s"
  rmdir "$mnt"
done; done
