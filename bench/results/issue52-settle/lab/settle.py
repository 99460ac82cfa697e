#!/usr/bin/env python3
# settle.py ENDPOINT BUCKET PREFIX OBJECTS T0: waits until PREFIX holds OBJECTS files; prints
# seconds since T0 (epoch) of the last write the store finished, and the LISTs it took.
import json, re, subprocess, sys, time, urllib.request
ep, bucket, prefix, want, t0 = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
S3D = "/work/main/target/release/examples/s3direct"
READS = re.compile(r'name="(Get|Head|List)')
def writes():
    text = urllib.request.urlopen(ep + "/minio/metrics/v3/api/requests", timeout=5).read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith("minio_api_requests_total{") and not READS.search(l))
def listed():
    out = subprocess.run([S3D, "list", bucket, prefix], capture_output=True, text=True).stdout
    return json.loads(out)["objects"]
last = writes(); last_change = time.time(); lists = 0
while True:
    time.sleep(0.05)
    now = writes(); t = time.time()
    if now != last:
        last, last_change = now, t
        continue
    if t - last_change >= 0.3:
        lists += 1
        n = listed()
        if n >= want and writes() == last:
            print(f"{last_change - t0:.3f} lists {lists}")
            break
        last_change = time.time()  # wait for the next quiet spell
