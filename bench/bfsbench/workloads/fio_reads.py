"""W7 — read latency and throughput with fio, in the job shapes mountpoint-s3 publishes for its
own benchmarks (sync I/O, `psync`): sequential 256 KiB reads by 1 and 4 threads, random reads
of 256 KiB and 4 KiB, a sequential read skipping 17 MiB after each 1 MiB, and time to first
byte (a 1-byte `O_DIRECT` read of a file just opened). The job files are `bench/fio/*.fio`;
random offsets are drawn here (seeded) and replayed by fio from an iolog, so the direct client
sends exactly the same ranged GETs, one at a time."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

from ..context import Case, q
from ..minio import ACCESS_KEY, SECRET_KEY
from ..util import fmt_size
from .base import Workload

BUCKET = "bench-fio"
JOBS = Path(__file__).resolve().parent.parent.parent / "fio"
THREADS = 4
SKIP = 17 << 20
SKIP_BLOCK = 1 << 20
# Time to first byte is a millisecond or two, and one slow run in two moves a median of two
# by half: it is measured this many times per repetition (each on a fresh mount), and the
# median is over all of them.
TTFB_REPEATS = 3


def _key(i: int) -> str:
    return f"fio/obj{i}.bin"


class FioReads(Workload):
    name = "fio"
    number = 7
    title = "Read latency and throughput (fio)"
    what = ("mountpoint-s3's fio job shapes (`bench/fio/*.fio`, sync I/O): sequential 256 KiB reads "
            "of one object by 1 thread and of 4 objects by 4 threads, random 256 KiB and 4 KiB reads "
            "(seeded offsets replayed from an iolog), a sequential read skipping 17 MiB after each "
            "1 MiB, and the time to first byte of a file just opened (open + a 1-byte O_DIRECT read, "
            "10 times). Each case runs on a fresh mount with the page cache dropped. Seconds are "
            "fio's own; the reference sends the same requests with the direct client, one at a "
            "time (one streamed GET for a sequential read).")
    chart_metric = "throughput"

    def make_cases(self) -> list[Case]:
        s, n = self.p.fio_size, self.p.fio_reads
        size = fmt_size(s)
        return [
            Case("seq_1t", f"sequential read of {size}, 256 KiB blocks, 1 thread", ref="direct",
                 nbytes=s, ref_title="one streamed GET"),
            Case("seq_4t", f"sequential read of {THREADS} x {size}, 256 KiB blocks, {THREADS} threads",
                 nbytes=s * THREADS),
            Case("rand_256k", f"{n} random reads of 256 KiB in {size}", ref="direct", nbytes=n * 256 * 1024,
                 ref_title="one ranged GET per read, sequentially"),
            Case("rand_4k", f"{n} random reads of 4 KiB in {size}", ref="direct", nbytes=n * 4096,
                 ref_title="one ranged GET per read, sequentially"),
            Case("skip17", f"sequential 1 MiB reads skipping 17 MiB, {size}", ref="direct",
                 nbytes=len(self._skip_offsets()) * SKIP_BLOCK,
                 ref_title="one ranged GET per read, sequentially"),
            Case("ttfb", f"time to first byte: open + 1-byte O_DIRECT read, 10 times "
                 f"({TTFB_REPEATS} measurements per repetition)", ref="direct",
                 ref_title="the floor: a 1-byte ranged GET by curl (SigV4) on one kept-alive "
                           "connection, 10 times"),
        ]

    def _skip_offsets(self) -> list[int]:
        return list(range(0, self.p.fio_size - SKIP_BLOCK + 1, SKIP_BLOCK + SKIP))

    def setup(self) -> None:
        if shutil.which("fio") is None:
            raise RuntimeError("fio is not installed: run scripts/install-deps --bench")
        ctx, s = self.ctx, self.p.fio_size
        ctx.s3.mb(BUCKET)
        for i in range(THREADS):
            ctx.s3.call("put-gen", BUCKET, _key(i), "--size", str(s), "--seed", str(70 + i),
                        "--part-size", "64MiB", "--concurrency", "4")
        rnd = random.Random(7)
        self.offsets = {
            bs: [rnd.randrange(0, (s - bs) // 4096) * 4096 for _ in range(self.p.fio_reads)]
            for bs in (256 * 1024, 4096)
        }
        self.offset_files = {}
        for bs, offsets in {**self.offsets, SKIP_BLOCK: self._skip_offsets()}.items():
            path = ctx.work / f"fio-offsets-{bs}.txt"
            path.write_text("\n".join(map(str, offsets)) + "\n")
            self.offset_files[bs] = path
        self.facts = {"object_size": s, "objects": THREADS, "random_reads": self.p.fio_reads,
                      "fio": ctx.sh("fio --version").strip()}

    # -- fio ------------------------------------------------------------------------------------

    def _iolog(self, path: Path, offsets: list[int], bs: int, tag: str) -> Path:
        log = self.ctx.work / f"fio-{tag}.iolog"
        lines = ["fio version 2 iolog", f"{path} add", f"{path} open"]
        lines += [f"{path} read {off} {bs}" for off in offsets]
        lines.append(f"{path} close")
        log.write_text("\n".join(lines) + "\n")
        return log

    def _fio(self, job: str, **env: str) -> str:
        assigns = " ".join(f"{k}={q(v)}" for k, v in env.items())
        return f"env {assigns} fio --output-format=json {q(str(JOBS / job))}"

    @staticmethod
    def _checked(expected_bytes: int):
        """A parser of fio's output that fails the run where fio read other than the case's bytes
        (the reference sends exactly those: a job that read more would be timed for other work)."""
        def parse(out: str):
            seconds, extra = FioReads._parse_fio(out)
            if extra["io_bytes"] != expected_bytes:
                raise ValueError(f"fio read {extra['io_bytes']} bytes, the case is {expected_bytes}")
            return seconds, extra
        return parse

    @staticmethod
    def _parse_fio(out: str):
        # fio prints notes before the JSON; the JSON object starts at the first '{' line.
        text = out[out.index("\n{") + 1:] if not out.startswith("{") else out
        d = json.loads(text)
        jobs = d["jobs"]
        runtime_ms = max(j["read"]["runtime"] for j in jobs)
        io_bytes = sum(j["read"]["io_bytes"] for j in jobs)
        lat_ms = [j["read"]["lat_ns"]["mean"] / 1e6 for j in jobs]
        if io_bytes == 0:
            raise ValueError("fio read nothing")
        return runtime_ms / 1000, {"io_bytes": io_bytes, "lat_mean_ms": max(lat_ms)}

    @staticmethod
    def _parse_ttfb(out: str):
        _, extra = FioReads._parse_fio(out)
        return extra["lat_mean_ms"] / 1000, extra

    @staticmethod
    def _parse_direct(out: str):
        d = json.loads(out.strip().splitlines()[-1])
        return d["seconds"], {}

    def _curl_ttfb(self) -> str:
        """The floor of a first byte: what a minimal client (curl, signing with SigV4) takes
        for the same 1-byte GET, 10 times on one kept-alive connection (the first opens it,
        as a fresh mount's first GET does)."""
        url = f"{self.ctx.s3.endpoint}/{BUCKET}/{_key(1)}"
        # Headers and the write-out apply to every URL (one -H each time would pile up).
        return (f"curl -sS --fail --aws-sigv4 aws:amz:us-east-1:s3 --user {ACCESS_KEY}:{SECRET_KEY} "
                f"-H 'Range: bytes=0-0' -w '%{{time_total}}\\n' " + " ".join([f"-o /dev/null {q(url)}"] * 10))

    @staticmethod
    def _parse_curl_ttfb(out: str):
        lat = [float(line) for line in out.split()]
        if len(lat) != 10:
            raise ValueError(f"{len(lat)} answers from curl, not 10")
        mean = sum(lat) / len(lat)   # as fio reports its mean read latency
        return mean, {"lat_mean_ms": mean * 1000}

    def run(self, tool, rep: int) -> None:
        ctx, s = self.ctx, self.p.fio_size
        if tool.kind == "direct":
            # Each case cold, as the mounts' are: MinIO reads the object from disk again.
            ranges = {"rand_256k": 256 * 1024, "rand_4k": 4096, "skip17": SKIP_BLOCK}
            ctx.drop_caches()
            self.measure("seq_1t", tool, rep, ctx.s3.cmd("get", BUCKET, _key(0)), parse=self._parse_direct)
            for cid, bs in ranges.items():
                cmd = ctx.s3.cmd("get-ranges", BUCKET, _key(0), "--offsets", str(self.offset_files[bs]),
                                 "--len", str(bs))
                ctx.drop_caches()
                self.measure(cid, tool, rep, cmd, parse=self._parse_direct)
            for _ in range(TTFB_REPEATS):
                ctx.drop_caches()
                self.measure("ttfb", tool, rep, self._curl_ttfb(), parse=self._parse_curl_ttfb)
            return
        m = ctx.fresh_cold(tool, BUCKET)
        self.measure("seq_1t", tool, rep, self._fio("seq.fio", FILE=str(m.path / _key(0)), SIZE=str(s)),
                     mount=m, parse=self._checked(s))
        m = ctx.fresh_cold(tool, BUCKET)
        files = {f"FILE{i}": str(m.path / _key(i)) for i in range(THREADS)}
        self.measure("seq_4t", tool, rep, self._fio("seq_threads.fio", SIZE=str(s), **files),
                     mount=m, parse=self._checked(s * THREADS))
        for cid, bs in (("rand_256k", 256 * 1024), ("rand_4k", 4096)):
            m = ctx.fresh_cold(tool, BUCKET)
            log = self._iolog(m.path / _key(0), self.offsets[bs], bs, cid)
            self.measure(cid, tool, rep, self._fio("replay.fio", IOLOG=str(log), BS=str(bs)), mount=m,
                         parse=self._checked(len(self.offsets[bs]) * bs))
        m = ctx.fresh_cold(tool, BUCKET)
        reads = len(self._skip_offsets())
        self.measure("skip17", tool, rep, self._fio("skip.fio", FILE=str(m.path / _key(0)), SIZE=str(s),
                                                    READS=str(reads)),
                     mount=m, parse=self._checked(reads * SKIP_BLOCK))
        for _ in range(TTFB_REPEATS):
            m = ctx.fresh_cold(tool, BUCKET)
            self.measure("ttfb", tool, rep, self._fio("ttfb.fio", FILE=str(m.path / _key(1))), mount=m,
                         parse=self._parse_ttfb)
