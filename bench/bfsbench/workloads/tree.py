"""W2 — a source tree: untar into the mount, `find -name '*.h'` cold and warm, `ls -lR`,
`rm -rf` (the linux-5.12.13 test of the s3fs/goofys/rclone article, on a synthetic tree of the
same shape; see treegen.py)."""

from __future__ import annotations

from ..context import WRITE_BUCKET, Case, count_check, q
from ..treegen import ROOT_NAME, plan_tree, write_tree
from .base import Workload

BUCKET = "bench-tree"
PREFIX = "src/"


class Tree(Workload):
    name = "tree"
    number = 2
    title = "Source tree (linux-5.12.13 shape)"
    what = ("Metadata-heavy work on many small and medium files: `tar -xf` of the tree into the "
            "mount (timed until every object is in the bucket), `find -name '*.h'` cold and "
            "warm, `ls -lR` cold, and `rm -rf` of the untarred copy. The reference for the "
            "untar is the article's alternative: untar to local disk, then upload with a "
            "parallel client (s3direct put-dir, 16 uploads in flight).")

    def make_cases(self) -> list[Case]:
        return [
            Case("untar", "untar into the mount", kind="write", ref="direct",
                 ref_title="untar locally + put-dir --concurrency 16"),
            Case("find_cold", "find -name '*.h', cold", ref="direct", ref_title="ListObjectsV2 of the tree"),
            Case("find_warm", "find -name '*.h', warm", ref="direct", ref_title="ListObjectsV2 again"),
            Case("ls_lr", "ls -lR, cold", ref="direct", ref_title="ListObjectsV2 of the tree"),
            Case("rm", "rm -rf of the untarred tree", kind="write", ref="direct",
                 ref_title="rm-prefix (DeleteObjects, 1000 keys per request)"),
        ]

    def setup(self) -> None:
        ctx = self.ctx
        plan = plan_tree(self.p.tree_scale)
        self.stats = plan.stats()
        src_root = ctx.work / "tree-src"
        write_tree(src_root, plan)
        self.tarball = ctx.ramdisk / "tree.tar"
        ctx.sh(f"tar -cf {q(self.tarball)} --sort=name --owner=0 --group=0 --numeric-owner "
               f"--mtime=@1624000000 -C {q(src_root)} {ROOT_NAME}", timeout=3600)
        ctx.s3.mb(BUCKET)
        ctx.s3.mb(WRITE_BUCKET)
        ctx.s3.call("put-dir", str(src_root), BUCKET, PREFIX, "--concurrency", "32")
        self.local_untar = ctx.work / "tree-untar"
        ctx.sh(f"rm -rf {q(src_root)}", timeout=3600)
        st = self.stats
        self.case("untar").nbytes = st["bytes"]
        self.facts = {"files": st["files"], "dirs": st["dirs"], "bytes": st["bytes"],
                      "avg_file_bytes": st["avg_file_bytes"], "h_files": st["h_files"],
                      "scale": self.p.tree_scale, "tar_bytes": self.tarball.stat().st_size}

    def run(self, tool, rep: int) -> None:
        ctx, s3, st = self.ctx, self.ctx.s3, self.stats
        nfiles, nbytes = st["files"], st["bytes"]
        find_check = count_check(st["h_files"], "*.h")
        if tool.kind == "direct":
            prefix = f"t/direct/r{rep}/"
            if self.p.tree_writes:
                untar = (f"rm -rf {q(self.local_untar)} && mkdir -p {q(self.local_untar)} && "
                         f"tar --no-same-owner -xf {q(self.tarball)} -C {q(self.local_untar)} && "
                         + s3.cmd("put-dir", str(self.local_untar), WRITE_BUCKET, prefix,
                                  "--concurrency", "16"))
                self.measure("untar", tool, rep, untar,
                             settle=self.settle_exact(WRITE_BUCKET, prefix, nfiles, nbytes))
                ctx.sh(f"rm -rf {q(self.local_untar)}", timeout=3600)
            ctx.drop_caches()
            ls = s3.cmd("list", BUCKET, PREFIX)
            self.measure("find_cold", tool, rep, ls)
            self.measure("find_warm", tool, rep, ls)
            ctx.drop_caches()
            self.measure("ls_lr", tool, rep, ls)
            if self.p.tree_writes:
                self.measure("rm", tool, rep, s3.cmd("rm-prefix", WRITE_BUCKET, prefix),
                             settle=self.settle_exact(WRITE_BUCKET, prefix, 0, None))
            return

        m = ctx.fresh_cold(tool, BUCKET)
        root = q(m.path / PREFIX.rstrip("/"))
        find = f"find {root} -name '*.h' | wc -l"
        self.measure("find_cold", tool, rep, find, mount=m, check=find_check)
        self.measure("find_warm", tool, rep, find, mount=m, check=find_check)
        m = ctx.fresh_cold(tool, BUCKET)
        self.measure("ls_lr", tool, rep, f"ls -lR {root} >/dev/null", mount=m)

        if not self.p.tree_writes:
            return  # the write cases show as "not run"
        if self.unsupported_writes(tool, rep, ["untar", "rm"]):
            return
        prefix = f"t/{tool.name}/r{rep}/"
        wm = ctx.mounts.fresh(tool, WRITE_BUCKET)
        target = wm.path / prefix
        ctx.sh(f"mkdir -p {q(target)}")
        rec = self.measure("untar", tool, rep,
                           f"tar --no-same-owner -xf {q(self.tarball)} -C {q(target)}", mount=wm,
                           settle=self.settle_exact(WRITE_BUCKET, prefix, nfiles, nbytes))
        if rec["status"] == "ok":
            wm = ctx.mounts.fresh(tool, WRITE_BUCKET)
            self.measure("rm", tool, rep, f"rm -rf {q(wm.path / prefix / ROOT_NAME)}", mount=wm,
                         settle=self.settle_exact(WRITE_BUCKET, prefix, 0, None))
        else:
            ctx.record(self.name, self.case("rm"), tool, rep, "failed", error="untar failed")
        ctx.mounts.unmount(tool, WRITE_BUCKET)
        s3.rm_prefix(WRITE_BUCKET, f"t/{tool.name}/")
