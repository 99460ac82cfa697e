"""W4 — many small files: `grep -r` and `find` over 1000 small text objects, cold and warm
(the ros3fs benchmark against s3fs and mountpoint-s3)."""

from __future__ import annotations

from ..context import Case, count_check, q
from ..datagen import write_small_text_files
from .base import Workload

BUCKET = "bench-small"
PREFIX = "files/"
NEEDLE = "123"


class SmallFiles(Workload):
    name = "smallfiles"
    number = 4
    title = "Many small files"
    what = ("Per-file overhead: `grep -r -l 123` over all the small text objects (open + read "
            "of every file) and `find` over them, each cold (fresh mount, caches dropped) and "
            "warm (immediately again). Outputs are checked (number of matching files / entries). "
            "References: list + GET of every object with 16 in flight, and a plain listing.")

    def make_cases(self) -> list[Case]:
        n = self.p.small_count
        return [
            Case("grep_cold", f"grep -r over {n} files, cold", ref="direct",
                 ref_title="list + GET all, 16 in flight"),
            Case("grep_warm", f"grep -r over {n} files, warm", ref="direct",
                 ref_title="list + GET all again"),
            Case("find_cold", f"find over {n} files, cold", ref="direct", ref_title="ListObjectsV2"),
            Case("find_warm", f"find over {n} files, warm", ref="direct", ref_title="ListObjectsV2 again"),
        ]

    def setup(self) -> None:
        ctx = self.ctx
        src = ctx.work / "small-src"
        self.info = write_small_text_files(src, self.p.small_count, seed=4, needle=NEEDLE)
        ctx.s3.mb(BUCKET)
        ctx.s3.call("put-dir", str(src), BUCKET, PREFIX, "--concurrency", "32")
        ctx.sh(f"rm -rf {q(src)}")
        for c in self.cases():   # bytes are known only now
            c.nbytes = self.info["bytes"] if c.id.startswith("grep") else None
        self.facts = dict(self.info)

    def run(self, tool, rep: int) -> None:
        ctx, s3 = self.ctx, self.ctx.s3
        info = self.info
        grep_check = count_check(info["matching"], "matching file")
        find_check = count_check(info["files"] + info["dirs"] + 1, "entry")
        if tool.kind == "direct":
            get_all = s3.cmd("get-prefix", BUCKET, PREFIX, "--concurrency", "16")
            ls = s3.cmd("list", BUCKET, PREFIX)
            ctx.drop_caches()
            self.measure("grep_cold", tool, rep, get_all)
            self.measure("grep_warm", tool, rep, get_all)
            ctx.drop_caches()
            self.measure("find_cold", tool, rep, ls)
            self.measure("find_warm", tool, rep, ls)
            return
        m = ctx.fresh_cold(tool, BUCKET)
        root = q(m.path / PREFIX.rstrip("/"))
        grep = f"grep -r -l -e {NEEDLE} {root} | wc -l"
        self.measure("grep_cold", tool, rep, grep, mount=m, check=grep_check)
        self.measure("grep_warm", tool, rep, grep, mount=m, check=grep_check)
        m = ctx.fresh_cold(tool, BUCKET)
        find = f"find {root} | wc -l"
        self.measure("find_cold", tool, rep, find, mount=m, check=find_check)
        self.measure("find_warm", tool, rep, find, mount=m, check=find_check)
