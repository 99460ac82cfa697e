"""W6 — FUSE overhead: throughput of re-reading a large file whose bytes were just read
(so they are cached by the kernel and/or the daemon), against reading a page-cached local file
(the question of the goofys-vs-s3fs throughput article)."""

from __future__ import annotations

from ..context import Case, q
from ..datagen import write_large_file
from ..util import fmt_size
from .base import Workload

BUCKET = "bench-overhead"
KEY = "big/cached.bin"


class FuseOverhead(Workload):
    name = "overhead"
    number = 6
    title = "FUSE overhead on cached data"
    what = ("What reading through the mount costs when the network is out of the picture: the "
            "large file is read once (untimed) and then read again with `cat` (128 KiB reads) "
            "and with `dd bs=1M`. Whether the second read is served by the kernel page cache, by "
            "the daemon's own cache or again from S3 depends on the tool: that is part of the "
            "result. Reference: the same reads of a page-cached file on the local disk.")
    chart_metric = "throughput"

    def make_cases(self) -> list[Case]:
        s = self.p.overhead_size
        return [
            Case("cat_cached", f"cat of a cached {fmt_size(s)} file", ref="local", nbytes=s,
                 ref_title="cat of a page-cached local file"),
            Case("dd_cached", f"dd bs=1M of a cached {fmt_size(s)} file", ref="local", nbytes=s,
                 ref_title="dd bs=1M of a page-cached local file"),
        ]

    def setup(self) -> None:
        ctx, s = self.ctx, self.p.overhead_size
        ctx.s3.mb(BUCKET)
        ctx.s3.call("put-gen", BUCKET, KEY, "--size", str(s), "--seed", "6", "--part-size", "64MiB",
                    "--concurrency", "4")
        self.local = ctx.work / "overhead-local.bin"
        write_large_file(self.local, s, seed=6)
        self.facts = {"file_size": s, "local_file_on": str(ctx.work)}

    def run(self, tool, rep: int) -> None:
        ctx = self.ctx
        if tool.kind == "local":
            path, m = self.local, None
        elif tool.kind == "fuse":
            m = ctx.fresh_cold(tool, BUCKET)
            path = m.path / KEY
        else:
            return
        ctx.sh(f"cat {q(path)} >/dev/null", timeout=self.p.timeout)   # warm-up, untimed
        self.measure("cat_cached", tool, rep, f"cat {q(path)} >/dev/null", mount=m)
        self.measure("dd_cached", tool, rep, f"dd if={q(path)} of=/dev/null bs=1M status=none",
                     mount=m)
