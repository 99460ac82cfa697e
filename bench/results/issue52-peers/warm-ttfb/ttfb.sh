#!/bin/bash
# usage: ttfb.sh BIN LABEL [extra mount args...]; mounts bucket ttfb, runs fio's ttfb job 3 times on fresh mounts
source /var/tmp/ttfb/env.sh
bin=$1; label=$2; shift 2
mnt=/var/tmp/ttfb/mnt; mkdir -p $mnt
for r in ${ROUNDS:-1 2 3}; do
  env -u AWS_CA_BUNDLE AWS_EC2_METADATA_DISABLED=true $bin mount --foreground --endpoint-url $AWS_ENDPOINT_URL --force-path-style --region us-east-1 "$@" s3://ttfb $mnt > /var/tmp/ttfb/mount-$label.log 2>&1 &
  pid=$!
  for i in $(seq 100); do mountpoint -q $mnt && break; sleep 0.05; done
  FILE=$mnt/obj fio --output-format=json ${JOB:-/work/main/bench/fio/ttfb.fio} 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['read']['lat_ns']; print('$label', 'mean %.3f ms' % (j['mean']/1e6), 'min %.3f' % (j['min']/1e6), 'max %.3f' % (j['max']/1e6))"
  umount $mnt; wait $pid
done
