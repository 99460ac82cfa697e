#!/usr/bin/env bash
# pread-ab.sh BIN: per-request cost of the mount, /dev/fuse vs io_uring, 3 rounds of fresh mounts:
# 20,000 4 KiB preads of a file opened O_DIRECT (each one READ answered from memory: the
# transport's round trip), and 20,000 stat() of one file with --metadata-ttl 0 (each a LOOKUP
# that asks the store: a HEAD, so the store's time, not the transport's). Root (the switch).
set -euo pipefail
BIN=$(readlink -f "$1")
cd "$(dirname "$0")/../../.."
switch=/sys/module/fuse/parameters/enable_uring; found=$(cat $switch)
set -a; eval "$(scripts/start-store minio)"; set +a
trap 'scripts/stop-store "$STORE_PID" "$STORE_DIR"; echo "$found" > $switch' EXIT
python3 -c "
import boto3,os
c=boto3.client('s3',endpoint_url=os.environ['STORE_ENDPOINT'],region_name='us-east-1'); c.create_bucket(Bucket='statab')
c.put_object(Bucket='statab',Key='f',Body=b'x'*(1<<20))"
mnt=$(mktemp -d)
for round in 1 2 3; do
for t in dev-fuse uring; do
  $BIN mount --foreground --fuse-transport $t --metadata-ttl 0 --endpoint-url "$STORE_ENDPOINT" --force-path-style --region us-east-1 s3://statab "$mnt" 2>>/var/tmp/stat-ab-mount.log &
  pid=$!
  for i in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
  sleep 0.5
  python3 - "$mnt" "$t" <<'PY'
import os, sys, time, mmap
mnt, t = sys.argv[1], sys.argv[2]
p = os.path.join(mnt, "f")
os.stat(p)
n = 20000
t0 = time.perf_counter()
for _ in range(n):
    os.stat(p)
t1 = time.perf_counter()
fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 4096)
os.preadv(fd, [buf], 0)
t2 = time.perf_counter()
for _ in range(n):
    os.preadv(fd, [buf], 0)
t3 = time.perf_counter()
os.close(fd)
print(f"{t:9s} stat {1e6*(t1-t0)/n:6.1f} us   4KiB O_DIRECT pread {1e6*(t3-t2)/n:6.1f} us")
PY
  fusermount3 -u "$mnt"; wait $pid
done
done
rmdir "$mnt"
