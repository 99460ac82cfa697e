"""Reads LEN bytes at each offset listed in a file with pread(2), timing every read.

    python3 randread.py PATH OFFSETS_FILE LEN

Prints one JSON object: total seconds (open + reads), per-read latencies, sha256 of the data.
Started as a separate process by the random-read workload so that each run is a fresh open().
"""

import hashlib
import json
import os
import sys
import time


def main() -> None:
    path, offsets_file, length = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with open(offsets_file) as f:
        offsets = [int(x) for x in f.read().split()]
    digest = hashlib.sha256()
    latencies = []
    nbytes = 0
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    t_open = time.perf_counter() - t0
    try:
        for off in offsets:
            t = time.perf_counter()
            data = os.pread(fd, length, off)
            latencies.append(time.perf_counter() - t)
            digest.update(data)
            nbytes += len(data)
    finally:
        os.close(fd)
    total = time.perf_counter() - t0
    print(json.dumps({"seconds": total, "open_seconds": t_open, "bytes": nbytes,
                      "latencies": latencies, "sha256": digest.hexdigest()}))


if __name__ == "__main__":
    main()
