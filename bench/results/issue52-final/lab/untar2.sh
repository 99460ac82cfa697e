#!/usr/bin/env bash
# untar.sh LABEL BIN [mount args...]: MinIO at $PORT (started if needed), fresh prefix, tar x
# into a --write-back mount, then poll until every object is listed; prints tar time, stored
# time, CPU seconds of minio, daemon, tar.
set -u
LABEL=$1; BIN=$2; shift 2
PORT=${PORT:-26600}
D=/var/tmp/lab
S3D=${S3D:-/work/main/target/release/examples/s3direct}
if [ -z "${KEEP_MINIO:-}" ] && [ -f $D/minio/minio.pid ]; then kill $(cat $D/minio/minio.pid) 2>/dev/null; sleep 1; fi
[ -n "${KEEP_MINIO:-}" ] || rm -rf $D/minio
eval "$(/var/tmp/lab/start-minio $D/minio $PORT 2>/dev/null)"
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_EC2_METADATA_DISABLED=true
unset AWS_CA_BUNDLE
ROUND=$(date +%s%N)
B=untar-$ROUND
$S3D mb $B >/dev/null 2>&1
P=u/$ROUND
MNT=$D/mnt; mkdir -p $MNT
CACHE=$D/cache-$LABEL; rm -rf $CACHE; mkdir -p $CACHE
MINIO_PID=$(cat $D/minio/minio.pid)
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
case "$LABEL" in
direct*) sleep 100000 & ;;
geesefs*) $BIN -f --endpoint $AWS_ENDPOINT_URL --region us-east-1 "$@" $B $MNT > $D/$LABEL.log 2>&1 & ;;
*) $BIN mount --foreground --endpoint-url $AWS_ENDPOINT_URL --force-path-style --region us-east-1 --cache-dir $CACHE --write-back "$@" s3://$B $MNT > $D/$LABEL.log 2>&1 & ;;
esac
DPID=$!
[ "${LABEL#direct}" != "$LABEL" ] || for i in $(seq 100); do mountpoint -q $MNT && break; sleep 0.1; done
[ "${LABEL#direct}" != "$LABEL" ] || mkdir -p $MNT/$P
sync; echo 3 > /proc/sys/vm/drop_caches
m0=$(cpu $MINIO_PID); d0=$(cpu $DPID)
rm -f $D/series-$LABEL.txt; python3 $D/sample.py $AWS_ENDPOINT_URL $D/sample-$LABEL.txt 25 & SAMPLER=$!; t0=$(date +%s.%N)
[ -n "${PERF:-}" ] && { perf record -F 499 --call-graph dwarf,16384 -p $DPID -o $D/perf-$LABEL.data >/dev/null 2>&1 & PERFPID=$!; }
[ -n "${PERFM:-}" ] && { perf record -F 999 -g -p $MINIO_PID -o $D/perfm-$LABEL.data >/dev/null 2>&1 & PERFMPID=$!; }
if [ "${LABEL#direct}" != "$LABEL" ]; then rm -rf $D/local; mkdir -p $D/local; /usr/bin/time -f "%e %U %S" -o $D/tar.time bash -c "tar --no-same-owner -xf /dev/shm/rs-tree.tar -C $D/local && $S3D put-dir $D/local $B $P/ --concurrency 16 >/dev/null"; else
/usr/bin/time -f "%e %U %S" -o $D/tar.time tar --no-same-owner -xf /dev/shm/rs-tree.tar -C $MNT/$P; fi
t1=$(date +%s.%N)
stored=$(python3 $D/settle.py $AWS_ENDPOINT_URL $B $P/ 7100 $t0)
n=7100
t2=$(date +%s.%N)
m1=$(cpu $MINIO_PID); d1=$(cpu $DPID)
HZ=$(getconf CLK_TCK)
echo "$LABEL tar $(echo "$t1-$t0"|bc) stored $stored objects $n minio_cpu $(echo "($m1-$m0)/$HZ"|bc -l|cut -c1-5) daemon_cpu $(echo "($d1-$d0)/$HZ"|bc -l|cut -c1-5) tar(e,u,s) $(cat $D/tar.time)"
[ -n "${PERFPID:-}" ] && kill -INT $PERFPID; [ -n "${PERFMPID:-}" ] && kill -INT $PERFMPID; sleep 1
if [ "${LABEL#direct}" != "$LABEL" ]; then kill $DPID; else fusermount3 -u $MNT 2>/dev/null || umount $MNT; fi
wait $DPID 2>/dev/null
