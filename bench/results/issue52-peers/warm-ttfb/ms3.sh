#!/bin/bash
source /var/tmp/ttfb/env.sh
mnt=/var/tmp/ttfb/mnt
for r in ${ROUNDS:-1 2 3}; do
  env -i PATH=$PATH AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY AWS_EC2_METADATA_DISABLED=true ~/.cache/bucketfs-deps/bin/mount-s3 ttfb $mnt --foreground --endpoint-url $AWS_ENDPOINT_URL --force-path-style --region us-east-1 > /var/tmp/ttfb/ms3.log 2>&1 &
  pid=$!
  for i in $(seq 100); do mountpoint -q $mnt && break; sleep 0.05; done
  FILE=$mnt/obj fio --output-format=json ${JOB:-/work/main/bench/fio/ttfb.fio} 2>/dev/null | python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['read']['lat_ns']; print('mount-s3', 'mean %.3f ms' % (j['mean']/1e6), 'min %.3f' % (j['min']/1e6), 'max %.3f' % (j['max']/1e6))"
  umount $mnt; wait $pid
done
