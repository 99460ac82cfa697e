#!/bin/bash
# usage: readers.sh N LABEL BIN [mount args...]: N readers sha256sum files of bench-readers-like bucket "readers" on a fresh mount; prints time and daemon VmHWM
source /var/tmp/ttfb/env.sh
n=$1; label=$2; bin=$3; shift 3
mnt=/var/tmp/ttfb/mnt
sync; echo 3 > /proc/sys/vm/drop_caches
if [ "$bin" = mount-s3 ]; then
  env -i PATH=$PATH AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY AWS_EC2_METADATA_DISABLED=true ~/.cache/bucketfs-deps/bin/mount-s3 readers $mnt --foreground --endpoint-url $AWS_ENDPOINT_URL --force-path-style --region us-east-1 "$@" > /var/tmp/ttfb/r.log 2>&1 &
else
  env -u AWS_CA_BUNDLE AWS_EC2_METADATA_DISABLED=true $bin mount --foreground --endpoint-url $AWS_ENDPOINT_URL --force-path-style --region us-east-1 "$@" s3://readers $mnt > /var/tmp/ttfb/r.log 2>&1 &
fi
pid=$!
for i in $(seq 100); do mountpoint -q $mnt && break; sleep 0.05; done
start=$(date +%s.%N)
pids=(); for i in $(seq 0 $((n-1))); do sha256sum $mnt/r/f$(printf %03d $i) > /dev/null & pids+=($!); done; for p in "${pids[@]}"; do wait $p; done
end=$(date +%s.%N)
hwm=$(grep VmHWM /proc/$pid/status | awk '{print $2}')
echo "$label n=$n $(echo "$end - $start" | bc) s, peak RSS $((hwm/1024)) MiB"
umount $mnt; wait $pid
