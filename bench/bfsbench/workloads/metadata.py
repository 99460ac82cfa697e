"""W5 — metadata at scale: `ls`, `ls -l`, `find` and `stat` of every entry in one flat
directory of 100k objects, each cold; the daemon's peak memory is the other result."""

from __future__ import annotations

from ..context import Case, count_check, q
from .base import Workload

BUCKET = "bench-flat"
PREFIX = "flat/"


class Metadata(Workload):
    name = "metadata"
    number = 5
    title = "Metadata at scale (one flat directory)"
    what = ("Listing and attribute cost in one huge directory, each case on a fresh mount with "
            "caches dropped: `ls` (names only, readdir), `ls -l` (readdir + attributes of every "
            "entry), `find -type f`, and `stat` of every entry by its known name without "
            "listing first (lookup + getattr, via `xargs stat`). Peak RSS of the daemon during each case is the memory result. "
            "Reference: one paginated ListObjectsV2 of the prefix.")

    def make_cases(self) -> list[Case]:
        n = f"{self.p.flat_count:,}"
        ref = "ListObjectsV2 of the prefix"
        return [
            Case("ls", f"ls of {n} entries, cold", ref="direct", ref_title=ref),
            Case("ls_l", f"ls -l of {n} entries, cold", ref="direct", ref_title=ref),
            Case("find", f"find -type f over {n} entries, cold", ref="direct", ref_title=ref),
            Case("stat", f"stat of each of {n} entries by name, cold", ref="direct", ref_title=ref),
        ]

    def setup(self) -> None:
        ctx, n = self.ctx, self.p.flat_count
        ctx.s3.mb(BUCKET)
        ctx.s3.call("populate", BUCKET, PREFIX, "--count", str(n), "--size", str(self.p.flat_size),
                    "--concurrency", "64", "--suffix", ".dat", timeout=4 * 3600)
        listed = ctx.s3.list(BUCKET, PREFIX)
        if listed["objects"] != n:
            raise RuntimeError(f"populate made {listed['objects']} objects, wanted {n}")
        self.names = ctx.work / "flat-names.txt"
        self.names.write_text("".join(f"{i:06d}.dat\n" for i in range(n)))
        self.facts = {"objects": n, "object_size": self.p.flat_size}

    def run(self, tool, rep: int) -> None:
        ctx, n = self.ctx, self.p.flat_count
        if tool.kind == "direct":
            ls = ctx.s3.cmd("list", BUCKET, PREFIX)
            for cid in ("ls", "ls_l", "find", "stat"):
                ctx.drop_caches()
                self.measure(cid, tool, rep, ls)
            return
        cmds = {
            "ls": ("ls -1 {d} | wc -l", n),
            "ls_l": ("ls -l {d} | grep -c '^-'", n),
            "find": ("find {d} -type f | wc -l", n),
            "stat": ("cd {d} && xargs -a {names} -d '\\n' stat -c %s | wc -l", n),
        }
        for cid, (tmpl, expected) in cmds.items():
            m = ctx.fresh_cold(tool, BUCKET)
            cmd = tmpl.format(d=q(m.path / PREFIX.rstrip("/")), names=q(self.names))
            self.measure(cid, tool, rep, cmd, mount=m, check=count_check(expected, "entry"))
