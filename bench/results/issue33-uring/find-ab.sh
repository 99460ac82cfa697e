#!/usr/bin/env bash
# find-ab.sh BIN[,BIN...] [ROUNDS] [--floor]: `find -name '*.h'` on a mount that loads a saved index, cold
# (caches dropped), over /dev/fuse and over io_uring in turn, against the same find on the local
# copy. With --floor, also on squashfuse_ll (libfuse's low-level API, in C) serving a squashfs
# image of the tree kept in /dev/shm (which drop_caches does not empty): a FUSE file system that
# answers from memory, the nearest measurable to the FUSE floor (installs squashfuse and
# squashfs-tools from Debian if missing; ../issue33-fuse-floor).
# Fresh MinIO; the 1/10 linux-shaped tree (/var/tmp/rs-tree, made as in ../issue33-rm/rm-requests.sh;
# TREE=DIR for another)
# uploaded by s3direct; an --index mount saves its index once. Each round: one fresh mount per
# transport (alternating which goes first), then local. Prints one line per measurement and
# the FUSE requests of the first round per transport. Root (drop_caches, the kernel's switch,
# which it sets back as found). WALK="du -s" (any command taking the tree as its last
# argument) times that walk instead of the find; its output is thrown away.
set -euo pipefail
# BIN may be several binaries, comma-separated (an A/B of two builds): each round then mounts
# each of them per transport, labelled by file name.
IFS=, read -r -a BINS <<<"$1"; ROUNDS=${2:-5}; FLOOR=${3:-}
for i in "${!BINS[@]}"; do BINS[$i]=$(readlink -f "${BINS[$i]}"); done
BIN=${BINS[0]}; TREE=${TREE:-/var/tmp/rs-tree}
cd "$(dirname "$0")/../../.."
switch=/sys/module/fuse/parameters/enable_uring; found=$(cat $switch)
set -a; eval "$(scripts/start-store minio)"; set +a
trap 'scripts/stop-store "$STORE_PID" "$STORE_DIR"; echo "$found" > $switch' EXIT
b=f$RANDOM
python3 -c "
import boto3,os
boto3.client('s3',endpoint_url=os.environ['STORE_ENDPOINT'],region_name='us-east-1').create_bucket(Bucket='$b')"
target/release/examples/s3direct --endpoint-url "$STORE_ENDPOINT" put-dir --concurrency 16 $TREE $b >/dev/null
cache=$(mktemp -d /var/tmp/fi-cache.XXXX)
mnt=$(mktemp -d)
mountit() {
  $BIN mount --foreground --fuse-transport "$1" --index --index-attributes-rate 0 --metrics-addr 127.0.0.1:19464 \
    --cache-dir "$cache" --endpoint-url "$STORE_ENDPOINT" --force-path-style --region us-east-1 s3://$b "$mnt" \
    2>>/var/tmp/find-ab-mount.log &
  pid=$!
  for i in $(seq 100); do mountpoint -q "$mnt" && break; sleep 0.1; done
}
unmount() { fusermount3 -u "$mnt"; wait $pid; }
mountit dev-fuse; $BIN refresh "$mnt" >/dev/null; unmount
walk() {
  if [ -n "${WALK:-}" ]; then $WALK "$1" >/dev/null; echo "(${WALK})"; else find "$1" -name '*.h' | wc -l; fi
}
one() {
  for BIN in "${BINS[@]}"; do one_of "$@"; done
}
one_of() {
  mountit "$1"; sleep 1
  sync; echo 3 > /proc/sys/vm/drop_caches
  start=$(date +%s.%N); n=$(walk "$mnt"); end=$(date +%s.%N)
  label=$1; [ ${#BINS[@]} = 1 ] || label="$(basename "$BIN") $1"
  echo "round $2 $label: find $n in $(echo "$end - $start" | bc) s"
  if [ "$2" = 1 ]; then
    curl -s 127.0.0.1:19464/metrics | grep -E '^bucketfs_fuse_((ring_)?requests|names_only_entries)_total' \
      | sed 's/bucketfs_fuse_//' | tr '\n' ' '; echo
  fi
  unmount
}
image=/dev/shm/find-ab-tree.sqfs
if [ "$FLOOR" = --floor ]; then
  command -v squashfuse_ll >/dev/null && command -v mksquashfs >/dev/null \
    || DEBIAN_FRONTEND=noninteractive apt-get install -y -q squashfuse squashfs-tools >/dev/null
  # Uncompressed (since 2026-12-03), so that squashfuse_ll answers from memory without
  # decompressing: on the 71,000-file tree, decompression made it no floor.
  mksquashfs $TREE "$image" -noappend -quiet -no-progress -noI -noD -noF -noX >/dev/null
fi
floor() {
  squashfuse_ll "$image" "$mnt"; sleep 1
  sync; echo 3 > /proc/sys/vm/drop_caches
  start=$(date +%s.%N); n=$(walk "$mnt"); end=$(date +%s.%N)
  echo "round $1 squashfuse: find $n in $(echo "$end - $start" | bc) s"
  fusermount3 -u "$mnt"
}
for round in $(seq "$ROUNDS"); do
  [ "$FLOOR" = --floor ] && floor $round
  if [ $((round % 2)) = 1 ]; then one dev-fuse $round; one uring $round; else one uring $round; one dev-fuse $round; fi
  sync; echo 3 > /proc/sys/vm/drop_caches
  start=$(date +%s.%N); n=$(walk $TREE); end=$(date +%s.%N)
  echo "round $round local: find $n in $(echo "$end - $start" | bc) s"
done
rmdir "$mnt"; rm -rf "$cache" "$image"
