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
            "listing first (lookup + getattr, via `xargs stat`), then the same again on the same mount (warm, "
            "against the same on local disk). Peak RSS of the daemon during each case is the memory result. "
            "Reference: one paginated ListObjectsV2 of the prefix.")

    def make_cases(self) -> list[Case]:
        n = f"{self.p.flat_count:,}"
        ref = "ListObjectsV2 of the prefix"
        return [
            Case("ls", f"ls of {n} entries, cold", ref="direct", ref_title=ref),
            Case("ls_l", f"ls -l of {n} entries, cold", ref="direct", ref_title=ref),
            Case("find", f"find -type f over {n} entries, cold", ref="direct", ref_title=ref),
            Case("stat", f"stat of each of {n} entries by name, cold", ref="direct", ref_title=ref),
            Case("stat_warm", f"stat of each of {n} entries by name, warm", ref="local",
                 ref_title="the same on as many files on local disk, warm"),
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
        # The local file system's reference for the warm stat: as many files, same names.
        self.local = ctx.work / "flat-local"
        self.local.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            with open(self.local / f"{i:06d}.dat", "wb") as f:
                f.truncate(self.p.flat_size)
        self.facts = {"objects": n, "object_size": self.p.flat_size}

    def run(self, tool, rep: int) -> None:
        ctx, n = self.ctx, self.p.flat_count
        stat = "cd {d} && xargs -a {names} -d '\\n' stat -c %s | wc -l"
        if tool.kind == "local":
            cmd = stat.format(d=q(self.local), names=q(self.names))
            ctx.sh(cmd, timeout=3600)  # warm: the second time
            self.measure("stat_warm", tool, rep, cmd, check=count_check(n, "entry"))
            return
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
            "stat": (stat, n),
        }
        for cid, (tmpl, expected) in cmds.items():
            m = ctx.fresh_cold(tool, BUCKET)
            cmd = tmpl.format(d=q(m.path / PREFIX.rstrip("/")), names=q(self.names))
            self.measure(cid, tool, rep, cmd, mount=m, check=count_check(expected, "entry"))
            if cid == "stat":
                # The same names again on the same mount: what its metadata caches give.
                self.measure("stat_warm", tool, rep, cmd, mount=m, check=count_check(expected, "entry"))
