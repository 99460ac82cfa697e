"""W3 — small random reads in a big file: 100 bytes at 100 random offsets of an 8 GiB object,
cold and warm (the samtools/CRAM case of the muxfys README)."""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

from ..context import Case, q
from ..datagen import put_gen_bytes
from ..util import fmt_size
from .base import Workload

BUCKET = "bench-rand"
KEY = "big/file.bin"
SEED = 3
RANDREAD = Path(__file__).resolve().parent.parent / "randread.py"


def _percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return 0.0
    i = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[i]


def _latency_extra(lat: list[float]) -> dict:
    return {"latencies": [round(x, 6) for x in lat], "lat_p50": _percentile(lat, 50),
            "lat_p95": _percentile(lat, 95), "lat_max": max(lat) if lat else 0.0}


class RandomReads(Workload):
    name = "randread"
    number = 3
    title = "Small random reads in a big file"
    what = ("Latency of small reads far apart: one process opens the big object and `pread`s "
            "100 bytes at each of 100 seeded random offsets (the samtools-on-CRAM pattern). "
            "Seconds are open + all reads, measured inside the reading process; the notes give "
            "the per-read latency. Every run's bytes are checked against the generator. "
            "The reference issues one ranged GET per read.")

    def make_cases(self) -> list[Case]:
        n, ln, size = self.p.rand_reads, self.p.rand_len, fmt_size(self.p.rand_size)
        return [
            Case("rand_cold", f"{n} x {ln} B at random offsets of {size}, cold", ref="direct",
                 nbytes=n * ln, ref_title="one ranged GET per read, sequentially"),
            Case("rand_warm", f"same reads again, warm", ref="direct", nbytes=n * ln,
                 ref_title="the same ranged GETs again"),
        ]

    def setup(self) -> None:
        ctx, size, n, ln = self.ctx, self.p.rand_size, self.p.rand_reads, self.p.rand_len
        ctx.s3.mb(BUCKET)
        ctx.s3.call("put-gen", BUCKET, KEY, "--size", str(size), "--seed", str(SEED),
                    "--part-size", "64MiB", "--concurrency", "4")
        rnd = random.Random(SEED)
        self.offsets = [rnd.randrange(0, size - ln) for _ in range(n)]
        self.offsets_file = ctx.work / "randread-offsets.txt"
        self.offsets_file.write_text("\n".join(map(str, self.offsets)) + "\n")
        h = hashlib.sha256()
        for off in self.offsets:
            h.update(put_gen_bytes(SEED, off, ln))
        self.expected_sha = h.hexdigest()
        self.facts = {"object_size": size, "reads": n, "read_bytes": ln, "seed": SEED}

    def _parse_fuse(self, out: str):
        d = json.loads(out.strip().splitlines()[-1])
        if d["sha256"] != self.expected_sha:
            raise ValueError("data read through the mount differs from the object's bytes")
        return d["seconds"], {"open_seconds": d["open_seconds"], **_latency_extra(d["latencies"])}

    @staticmethod
    def _parse_direct(out: str):
        d = json.loads(out.strip().splitlines()[-1])
        return d["seconds"], _latency_extra(d["latencies"])

    def run(self, tool, rep: int) -> None:
        ctx, ln = self.ctx, self.p.rand_len
        if tool.kind == "direct":
            cmd = ctx.s3.cmd("get-ranges", BUCKET, KEY, "--offsets", str(self.offsets_file),
                             "--len", str(ln))
            ctx.drop_caches()
            self.measure("rand_cold", tool, rep, cmd, parse=self._parse_direct)
            self.measure("rand_warm", tool, rep, cmd, parse=self._parse_direct)
            return
        m = ctx.fresh_cold(tool, BUCKET)
        cmd = f"{q(sys.executable)} {q(RANDREAD)} {q(m.path / KEY)} {q(self.offsets_file)} {ln}"
        self.measure("rand_cold", tool, rep, cmd, mount=m, parse=self._parse_fuse)
        self.measure("rand_warm", tool, rep, cmd, mount=m, parse=self._parse_fuse)
