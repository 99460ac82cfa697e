"""W1 — large files: one big object cold and warm; N big files written with cp from a RAM
disk and read with cat, serially and in parallel (the 24 x 1 GB test of the s3fs/goofys/rclone
article, and the 1 GB fresh/cached read of the muxfys README); and `cp` of the large object to
another name inside the mount."""

from __future__ import annotations

from ..context import WRITE_BUCKET, Case, q
from ..datagen import write_large_file
from ..util import fmt_size
from .base import Workload

BUCKET = "bench-large"


def _parallel(cmds: list[str]) -> str:
    """Runs commands in the background, waits for all; fails if any failed."""
    body = " ".join(f"{c} & pids+=($!);" for c in cmds)
    return f"pids=(); {body} rc=0; for p in \"${{pids[@]}}\"; do wait $p || rc=1; done; exit $rc"


class LargeFiles(Workload):
    name = "large"
    number = 1
    title = "Large files"
    what = ("Sequential throughput. `cat` of one large object right after mounting with the page "
            "cache dropped (cold) and again (warm); then N large files read with `cat` one after "
            "the other and all at once, and written with `cp` from a RAM disk the same two ways. "
            "Writes are timed until every object is complete in the bucket. Last, `cp` of the large "
            "object to a new name inside the mount (page cache dropped), against one CopyObject.")
    chart_metric = "throughput"

    def make_cases(self) -> list[Case]:
        s, n, ms = self.p.large_size, self.p.large_count, self.p.multi_size
        one, many = fmt_size(s), f"{n} x {fmt_size(ms)}"
        return [
            Case("read_cold", f"read 1 x {one}, cold", ref="direct", nbytes=s,
                 ref_title="one streamed GET"),
            Case("read_warm", f"read 1 x {one}, warm", ref="direct", nbytes=s,
                 ref_title="the same GET again (no cache)"),
            Case("read_serial", f"read {many} serially (cat), cold", ref="direct", nbytes=ms * n,
                 ref_title="one GET per file, serially"),
            Case("read_parallel", f"read {many} in parallel (cat &), cold", ref="direct",
                 nbytes=ms * n, ref_title="one GET per file, all at once"),
            Case("write_serial", f"write {many} serially (cp from RAM disk)", kind="write",
                 ref="direct", nbytes=ms * n, ref_title="put-file (16 MiB parts, 16 in flight), serially"),
            Case("write_parallel", f"write {many} in parallel (cp &)", kind="write", ref="direct",
                 nbytes=ms * n, ref_title="put-file per file, all at once"),
            Case("copy_inside", f"cp 1 x {one} to a new name inside the mount", kind="write",
                 ref="direct", nbytes=s, ref_title="one CopyObject"),
        ]

    def setup(self) -> None:
        ctx, s, n, ms = self.ctx, self.p.large_size, self.p.large_count, self.p.multi_size
        self.src_single = ctx.ramdisk / "large-single.bin"
        write_large_file(self.src_single, s, seed=1)
        if ms == s:
            self.src = self.src_single
        else:
            self.src = ctx.ramdisk / "large-multi.bin"
            write_large_file(self.src, ms, seed=2)
        ctx.s3.mb(BUCKET)
        ctx.s3.mb(WRITE_BUCKET)
        self.single = "single/file.bin"
        # The object copied inside the mount (outside the w/ prefixes the write cases clear).
        self.copy_source = "copysrc/file.bin"
        ctx.s3.call("put-file", str(self.src_single), WRITE_BUCKET, self.copy_source, "--part-size",
                    "16MiB", "--concurrency", "8")
        self.multi = [f"multi/file_{i:02d}.bin" for i in range(1, n + 1)]
        for src, key in [(self.src_single, self.single), *[(self.src, k) for k in self.multi]]:
            ctx.s3.call("put-file", str(src), BUCKET, key, "--part-size", "16MiB",
                        "--concurrency", "8")
        self.facts = {"single_file": s, "files": n, "file_size": ms,
                      "write_source": "RAM disk (/dev/shm)"}

    def run(self, tool, rep: int) -> None:
        ctx, s3 = self.ctx, self.ctx.s3
        n, s = self.p.large_count, self.p.multi_size
        if tool.kind == "direct":
            ctx.drop_caches()
            get1 = s3.cmd("get", BUCKET, self.single)
            self.measure("read_cold", tool, rep, get1)
            self.measure("read_warm", tool, rep, get1)
            gets = [s3.cmd("get", BUCKET, k) + " >/dev/null" for k in self.multi]
            ctx.drop_caches()
            self.measure("read_serial", tool, rep, " && ".join(gets))
            ctx.drop_caches()
            self.measure("read_parallel", tool, rep, _parallel(gets))
            for cid, par in (("write_serial", False), ("write_parallel", True)):
                prefix = f"w/direct/{cid}/r{rep}/"
                puts = [s3.cmd("put-file", str(self.src), WRITE_BUCKET, f"{prefix}file_{i:02d}.bin",
                               "--part-size", "16MiB", "--concurrency", "16") + " >/dev/null"
                        for i in range(1, n + 1)]
                self.measure(cid, tool, rep, _parallel(puts) if par else " && ".join(puts),
                             settle=self.settle_exact(WRITE_BUCKET, prefix, n, n * s))
                s3.rm_prefix(WRITE_BUCKET, prefix)
            prefix = f"w/direct/copy_inside/r{rep}/"
            copy = s3.cmd("copy", WRITE_BUCKET, self.copy_source, f"{prefix}file.bin") + " >/dev/null"
            self.measure("copy_inside", tool, rep, copy,
                         settle=self.settle_exact(WRITE_BUCKET, prefix, 1, self.p.large_size))
            s3.rm_prefix(WRITE_BUCKET, prefix)
            return

        m = ctx.fresh_cold(tool, BUCKET)
        one = q(m.path / self.single)
        self.measure("read_cold", tool, rep, f"cat {one} >/dev/null", mount=m)
        self.measure("read_warm", tool, rep, f"cat {one} >/dev/null", mount=m)
        m = ctx.fresh_cold(tool, BUCKET)
        cats = [f"cat {q(m.path / k)} >/dev/null" for k in self.multi]
        self.measure("read_serial", tool, rep, " && ".join(cats), mount=m)
        m = ctx.fresh_cold(tool, BUCKET)
        self.measure("read_parallel", tool, rep, _parallel(cats), mount=m)

        if self.unsupported_writes(tool, rep, ["write_serial", "write_parallel", "copy_inside"]):
            return
        for cid, par in (("write_serial", False), ("write_parallel", True)):
            prefix = f"w/{tool.name}/{cid}/r{rep}/"
            wm = ctx.mounts.fresh(tool, WRITE_BUCKET)
            target = wm.path / prefix
            ctx.sh(f"mkdir -p {q(target)}")
            cps = [f"cp {q(self.src)} {q(target / f'file_{i:02d}.bin')}" for i in range(1, n + 1)]
            self.measure(cid, tool, rep, _parallel(cps) if par else " && ".join(cps), mount=wm,
                         settle=self.settle_exact(WRITE_BUCKET, prefix, n, n * s))
            ctx.mounts.unmount(tool, WRITE_BUCKET)
            s3.rm_prefix(WRITE_BUCKET, f"w/{tool.name}/")

        prefix = f"w/{tool.name}/copy_inside/r{rep}/"
        wm = ctx.mounts.fresh(tool, WRITE_BUCKET)
        ctx.drop_caches()
        # The target directory after the drop: mountpoint-s3 keeps a directory made by mkdir
        # only in memory until a file is written in it, and forgets it with its dentry, so a
        # mkdir before the drop would fail its cp with ENOENT. The copy's source stays cold.
        ctx.sh(f"mkdir -p {q(wm.path / prefix)}")
        self.measure("copy_inside", tool, rep,
                     f"cp {q(wm.path / self.copy_source)} {q(wm.path / prefix / 'file.bin')}", mount=wm,
                     settle=self.settle_exact(WRITE_BUCKET, prefix, 1, self.p.large_size))
        ctx.mounts.unmount(tool, WRITE_BUCKET)
        s3.rm_prefix(WRITE_BUCKET, f"w/{tool.name}/")
