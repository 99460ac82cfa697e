#!/bin/bash
source /var/tmp/ttfb/env.sh
n=${N:-10}
for r in ${ROUNDS:-1 2 3}; do
args=(); for i in $(seq $n); do args+=( -o /dev/null "$AWS_ENDPOINT_URL/ttfb/obj" ); done
curl -sS --fail --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" -H 'Range: bytes=0-0' -w '%{time_total} %{http_code}\n' "${args[@]}" | awk '$2 != 206 {bad++} {s+=$1; c++} END {printf "curl floor mean %.3f ms over %d (%d not 206)\n", s/c*1000, c, bad}'
done
