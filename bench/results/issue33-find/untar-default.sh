#!/usr/bin/env bash
# untar-default.sh BIN [ROUNDS]: fresh MinIO; per round, tar -x of the 1/10 tree (/var/tmp/rs-tree.tar, made as in
# ../issue33-rm/rm-requests.sh) into a default-mode mount (close returns once stored), against
# s3direct put-dir of the same tree with 1 and 16 uploads in flight.
set -euo pipefail
cd "$(dirname "$0")/../../.."
BIN=$(readlink -f "$1"); ROUNDS=${2:-1}
set -a; eval "$(scripts/start-store minio)"; set +a
export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
trap 'scripts/stop-store "$STORE_PID" "$STORE_DIR"' EXIT
S3D=target/release/examples/s3direct
mk() { python3 -c "
import boto3,os
boto3.client('s3',endpoint_url=os.environ['STORE_ENDPOINT'],region_name='us-east-1').create_bucket(Bucket='$1')"; }
for round in $(seq $ROUNDS); do
  b=d$RANDOM; mk $b
  mnt=$(mktemp -d)
  $BIN mount --foreground --endpoint-url "$STORE_ENDPOINT" --force-path-style --region us-east-1 s3://$b "$mnt" 2>/var/tmp/ud-mount.log &
  pid=$!
  for i in $(seq 50); do mountpoint -q "$mnt" && break; sleep 0.1; done
  start=$(date +%s.%N); tar -xf /var/tmp/rs-tree.tar -C "$mnt"; end=$(date +%s.%N)
  echo "default-mode untar: $(echo "$end - $start" | bc) s"
  fusermount3 -u "$mnt"; wait $pid; rmdir "$mnt"
  for c in 1 16; do
    b=p$RANDOM; mk $b
    start=$(date +%s.%N); $S3D --endpoint-url "$STORE_ENDPOINT" put-dir --concurrency $c /var/tmp/rs-tree $b >/dev/null; end=$(date +%s.%N)
    echo "s3direct put-dir --concurrency $c: $(echo "$end - $start" | bc) s"
  done
done
