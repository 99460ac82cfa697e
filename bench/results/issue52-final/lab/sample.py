#!/usr/bin/env python3
# sample.py ENDPOINT OUT SECONDS: MinIO's count of writes every 50 ms, "t count" lines.
import re, sys, time, urllib.request
ep, out, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
READS = re.compile(r'name="(Get|Head|List)')
def writes():
    text = urllib.request.urlopen(ep + "/minio/metrics/v3/api/requests", timeout=5).read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith("minio_api_requests_total{") and not READS.search(l))
t0 = time.time()
with open(out, "w") as f:
    while time.time() - t0 < secs:
        try:
            f.write(f"{time.time()-t0:.2f} {writes():.0f}\n")
        except Exception:
            pass
        time.sleep(0.05)
