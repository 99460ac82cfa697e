#!/bin/bash
# Times a 256 MiB sequential write: dd returns (close) and everything stored (unmount),
# under --write-back and default mode, against one MinIO; 3 rounds. Run from anywhere;
# BIN (default: the workspace's release build) is the bucketfs binary. FAR=1 puts
# toxiproxy between the mount and MinIO: 25 ms added each way, 50 MB/s each way.
set -eu
BIN=$(realpath "${BIN:-$(dirname "$0")/../../../target/release/bucketfs}")
cd "$(dirname "$0")/../../.."
unset AWS_CA_BUNDLE AWS_PROFILE AWS_DEFAULT_PROFILE
export AWS_EC2_METADATA_DISABLED=true AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
set -a; eval "$(scripts/start-store minio)"; set +a; export AWS_ENDPOINT_URL=$STORE_ENDPOINT; trap 'grep -qs " $mnt " /proc/mounts && $BIN unmount $mnt; scripts/stop-store "$STORE_PID" "$STORE_DIR"' EXIT
s3=target/release/examples/s3direct
endpoint=$AWS_ENDPOINT_URL
if [ "${FAR:-0}" = 1 ]; then
  tp=$(ls ~/.cache/bucketfs-deps/bin/toxiproxy-server); api=127.0.0.1:$((20000 + RANDOM % 10000))
  "$tp" -host 127.0.0.1 -port ${api#*:} >/dev/null 2>&1 & TP_PID=$!
  sleep 1; listen=127.0.0.1:$((30000 + RANDOM % 10000))
  curl -sf -X POST http://$api/proxies -d "{\"name\":\"s3\",\"listen\":\"$listen\",\"upstream\":\"${AWS_ENDPOINT_URL#http://}\"}" >/dev/null
  for stream in upstream downstream; do
    curl -sf -X POST http://$api/proxies/s3/toxics -d "{\"name\":\"lat-$stream\",\"type\":\"latency\",\"stream\":\"$stream\",\"attributes\":{\"latency\":25}}" >/dev/null
    curl -sf -X POST http://$api/proxies/s3/toxics -d "{\"name\":\"bw-$stream\",\"type\":\"bandwidth\",\"stream\":\"$stream\",\"attributes\":{\"rate\":51200}}" >/dev/null
  done
  endpoint=http://$listen
  trap 'grep -qs " $mnt " /proc/mounts && $BIN unmount $mnt; kill $TP_PID; scripts/stop-store "$STORE_PID" "$STORE_DIR"' EXIT
fi

mnt=$(mktemp -d); cache=$(mktemp -d)
src=$(mktemp); head -c 256M /dev/urandom > "$src"
for round in 1 2 3; do
  for mode in write-back default; do
    b=large-$mode-$round; $s3 mb $b >/dev/null
    extra=""; [ $mode = write-back ] && extra="--write-back"
    $BIN mount --force-path-style --endpoint-url "$endpoint" --cache-dir $cache $extra s3://$b $mnt
    sync; echo 3 > /proc/sys/vm/drop_caches
    t0=$(date +%s.%N)
    dd if="$src" of=$mnt/f bs=1M status=none
    t1=$(date +%s.%N)
    $BIN unmount $mnt
    t2=$(date +%s.%N)
    echo "round $round $mode: close returned $(echo "$t1-$t0"|bc) s, all stored $(echo "$t2-$t0"|bc) s"
  done
done

rm -rf $mnt $cache "$src"
