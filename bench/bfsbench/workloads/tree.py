"""W2 — a source tree: untar into the mount, `find -name '*.h'` cold and warm, `ls -lR`, `du -sh`,
`rm -rf` (the linux-5.12.13 test of the s3fs/goofys/rclone article, on a synthetic tree of the
same shape; see treegen.py)."""

from __future__ import annotations

import re

from ..context import WRITE_BUCKET, Case, count_check, q
from ..treegen import ROOT_NAME, plan_tree, write_tree
from .base import Workload

BUCKET = "bench-tree"
PREFIX = "src/"


def ls_lr_lines(plan) -> int:
    """The lines `ls -lR src | wc -l` prints for the tree under `src/`: per directory shown (D,
    `src` included) a "path:" header and a "total" line; a line per entry shown (F files, and
    D - 1 directories); a blank line between directories. Names starting with a dot are not
    shown (no -a), nor anything below a hidden directory: the full shape has 6 such files
    (`.gitignore`, `.mailmap`...)."""
    def shown(path: str) -> bool:
        return not any(part.startswith(".") for part in path.split("/"))
    files = sum(1 for path, _ in plan.files if shown(path))
    dirs = 1 + sum(1 for path in plan.dirs if shown(path))
    return files + 4 * dirs - 2


class Tree(Workload):
    name = "tree"
    number = 2
    title = "Source tree (linux-5.12.13 shape)"
    what = ("Metadata-heavy work on many small and medium files: `tar -xf` of the tree into the "
            "mount (timed until every object is in the bucket), `find -name '*.h'` cold and "
            "warm, `ls -lR | wc -l` cold, `du -sh` cold, and `rm -rf` of the untarred copy. "
            "Outputs are checked (the `*.h` count, the `ls -lR` line count). References: the "
            "direct client (one ListObjectsV2 of the tree for each read case; for the untar, the "
            "article's alternative: untar to local disk, then upload with a parallel client, "
            "s3direct put-dir with 16 uploads in flight, storing a marker per directory as the "
            "mounts do, so both send the same requests), and for the read cases also the same "
            "commands on a copy of the tree on the local disk (page cache dropped for the cold "
            "cases): **× local** says what the mount costs over a local file system.")

    def make_cases(self) -> list[Case]:
        listing = "ListObjectsV2 of the tree"
        local = dict(ref2="local", ref2_title="the same command on the tree on local disk")
        return [
            Case("untar", "untar into the mount", kind="write", ref="direct",
                 ref_title="untar locally + put-dir --concurrency 16 --dir-markers"),
            Case("find_cold", "find -name '*.h', cold", ref="direct", ref_title=listing, **local),
            Case("find_warm", "find -name '*.h', warm", ref="direct", ref_title=f"{listing} again",
                 **local),
            Case("ls_lr", "ls -lR | wc -l, cold", ref="direct", ref_title=listing, **local),
            Case("du", "du -sh, cold", ref="direct", ref_title=listing, **local),
            Case("rm", "rm -rf of the untarred tree", kind="write", ref="direct",
                 ref_title="rm-prefix (DeleteObjects, 1000 keys per request)"),
        ]

    def setup(self) -> None:
        ctx = self.ctx
        plan = plan_tree(self.p.tree_scale)
        self.stats = plan.stats()
        self.ls_lr_lines = ls_lr_lines(plan)
        src_root = ctx.work / "tree-src"
        write_tree(src_root, plan)
        self.tarball = ctx.ramdisk / "tree.tar"
        ctx.sh(f"tar -cf {q(self.tarball)} --sort=name --owner=0 --group=0 --numeric-owner "
               f"--mtime=@1624000000 -C {q(src_root)} {ROOT_NAME}", timeout=3600)
        ctx.s3.mb(BUCKET)
        ctx.s3.mb(WRITE_BUCKET)
        ctx.s3.call("put-dir", str(src_root), BUCKET, PREFIX, "--concurrency", "32")
        self.local_untar = ctx.work / "tree-untar"
        # The generated tree stays on the local disk: the local file system's reference row.
        self.local_tree = src_root
        st = self.stats
        self.facts = {"files": st["files"], "dirs": st["dirs"], "bytes": st["bytes"],
                      "avg_file_bytes": st["avg_file_bytes"], "h_files": st["h_files"],
                      "scale": self.p.tree_scale, "tar_bytes": self.tarball.stat().st_size}
        # The untar and rm cases may use a smaller tree than the read cases.
        self.untar_tarball, self.untar_stats = self.tarball, st
        write_scale = self.p.tree_write_scale
        if write_scale and write_scale != self.p.tree_scale:
            write_plan = plan_tree(write_scale)
            self.untar_stats = write_plan.stats()
            write_root = ctx.work / "tree-write-src"
            write_tree(write_root, write_plan)
            self.untar_tarball = ctx.ramdisk / "tree-write.tar"
            ctx.sh(f"tar -cf {q(self.untar_tarball)} --sort=name --owner=0 --group=0 --numeric-owner "
                   f"--mtime=@1624000000 -C {q(write_root)} {ROOT_NAME}", timeout=3600)
            ctx.sh(f"rm -rf {q(write_root)}", timeout=3600)
            self.facts.update(untar_scale=write_scale, untar_files=self.untar_stats["files"],
                              untar_dirs=self.untar_stats["dirs"], untar_bytes=self.untar_stats["bytes"])
        self.case("untar").nbytes = self.untar_stats["bytes"]

    def run(self, tool, rep: int) -> None:
        ctx, s3, st = self.ctx, self.ctx.s3, self.stats
        nfiles, nbytes = self.untar_stats["files"], self.untar_stats["bytes"]
        find_check = count_check(st["h_files"], "*.h")
        ls_check = count_check(self.ls_lr_lines, "ls -lR line")

        def du_parse(stdout: str):
            size = stdout.strip().split("\t", 1)[0]
            if not re.fullmatch(r"[0-9.,]+[KMGTP]?", size):
                raise ValueError(f"no size in du output {stdout[-100:]!r}")
            return None, {"output": size}

        if tool.kind == "local":
            root = q(self.local_tree)
            find = f"find {root} -name '*.h' | wc -l"
            ctx.drop_caches()
            self.measure("find_cold", tool, rep, find, check=find_check)
            self.measure("find_warm", tool, rep, find, check=find_check)
            ctx.drop_caches()
            self.measure("ls_lr", tool, rep, f"ls -lR {root} | wc -l", check=ls_check)
            ctx.drop_caches()
            self.measure("du", tool, rep, f"du -sh {root}", parse=du_parse)
            return
        if tool.kind == "direct":
            prefix = f"t/direct/r{rep}/"
            if self.p.tree_writes:
                untar = (f"rm -rf {q(self.local_untar)} && mkdir -p {q(self.local_untar)} && "
                         f"tar --no-same-owner -xf {q(self.untar_tarball)} -C {q(self.local_untar)} && "
                         + s3.cmd("put-dir", str(self.local_untar), WRITE_BUCKET, prefix,
                                  "--concurrency", "16", "--dir-markers"))
                self.measure("untar", tool, rep, untar,
                             settle=self.settle_exact(WRITE_BUCKET, prefix, nfiles, nbytes))
                ctx.sh(f"rm -rf {q(self.local_untar)}", timeout=3600)
            ctx.drop_caches()
            ls = s3.cmd("list", BUCKET, PREFIX)
            self.measure("find_cold", tool, rep, ls)
            self.measure("find_warm", tool, rep, ls)
            ctx.drop_caches()
            self.measure("ls_lr", tool, rep, ls)
            ctx.drop_caches()
            self.measure("du", tool, rep, ls)
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
        self.measure("ls_lr", tool, rep, f"ls -lR {root} | wc -l", mount=m, check=ls_check)
        m = ctx.fresh_cold(tool, BUCKET)
        self.measure("du", tool, rep, f"du -sh {root}", mount=m, parse=du_parse)

        if not self.p.tree_writes:
            return  # the write cases show as "not run"
        if self.unsupported_writes(tool, rep, ["untar", "rm"]):
            return
        prefix = f"t/{tool.name}/r{rep}/"
        wm = ctx.mounts.fresh(tool, WRITE_BUCKET)
        target = wm.path / prefix
        ctx.sh(f"mkdir -p {q(target)}")
        rec = self.measure("untar", tool, rep,
                           f"tar --no-same-owner -xf {q(self.untar_tarball)} -C {q(target)}", mount=wm,
                           settle=self.settle_exact(WRITE_BUCKET, prefix, nfiles, nbytes))
        if rec["status"] == "ok":
            wm = ctx.mounts.fresh(tool, WRITE_BUCKET)
            self.measure("rm", tool, rep, f"rm -rf {q(wm.path / prefix / ROOT_NAME)}", mount=wm,
                         settle=self.settle_exact(WRITE_BUCKET, prefix, 0, None))
        else:
            ctx.record(self.name, self.case("rm"), tool, rep, "failed", error="untar failed")
        ctx.mounts.unmount(tool, WRITE_BUCKET)
        s3.rm_prefix(WRITE_BUCKET, f"t/{tool.name}/")
