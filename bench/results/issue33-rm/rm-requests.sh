#!/usr/bin/env bash
# rm-requests.sh BIN [mount flags]: fresh MinIO, tar -x of the 1/10 tree (/var/tmp/rs-tree.tar:
# cd bench && python3 -m bfsbench.treegen --scale 0.1 --out /var/tmp/rs-tree; tar -cf /var/tmp/rs-tree.tar -C /var/tmp/rs-tree linux-synth)
# into a fresh mount, 20 s pause, rm -rf timed; prints the S3 requests of the rm by operation (debug log).
set -euo pipefail
BIN=$1; shift
cd "$(dirname "$0")/../../.."
set -a; eval "$(scripts/start-store minio)"; set +a
trap 'scripts/stop-store "$STORE_PID" "$STORE_DIR"' EXIT
python3 -c "
import boto3,os
boto3.client('s3',endpoint_url=os.environ['STORE_ENDPOINT'],region_name='us-east-1').create_bucket(Bucket='dbg')"
MNT=$(mktemp -d)
rm -rf /var/tmp/rs-cache; mkdir -p /var/tmp/rs-cache
$BIN mount --foreground "$@" --endpoint-url "$STORE_ENDPOINT" --force-path-style --region us-east-1 --cache-dir /var/tmp/rs-cache --log-level debug s3://dbg "$MNT" 2>/var/tmp/rm-dbg.log &
pid=$!
for i in $(seq 50); do mountpoint -q "$MNT" && break; sleep 0.1; done
tar -xf /var/tmp/rs-tree.tar -C "$MNT"
$BIN status "$MNT" >/dev/null 2>&1 || true
sleep 20
date -u +%Y-%m-%dT%H:%M:%S.%N > /var/tmp/rm-start
s=$(date +%s.%N); rm -rf "$MNT/linux-synth"; e=$(date +%s.%N)
echo "rm -rf returned in $(echo "$e - $s" | bc) s"
fusermount3 -u "$MNT"; wait $pid
e2=$(date +%s.%N); echo "unmounted at $(echo "$e2 - $s" | bc) s"
rmdir "$MNT"
start=$(cat /var/tmp/rm-start)
sed 's/\x1b\[[0-9;]*m//g' /var/tmp/rm-dbg.log | awk -v s="$start" '$1 >= s' | grep -oE "s3 [A-Z_]+" | sort | uniq -c
sed 's/\x1b\[[0-9;]*m//g' /var/tmp/rm-dbg.log | awk -v s="$start" '$1 >= s' | grep -E "s3 " | head -12 | cut -c1-220
