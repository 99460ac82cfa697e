"""W10 — real programs (issue 49): `tar xf`, `git clone`, sqlite3, `make -j2` and `rsync -a`,
each in a fresh mount of an empty bucket, each followed at once, on the same mount, by a check
that what it wrote is whole (`find` lists every file, `git fsck --full`, `PRAGMA
integrity_check`, the built program runs, an `rsync --checksum` dry run finds nothing to do).

Programs are what users run in a mount, and they lean on what the other workloads do not:
renames of lock files, random writes and fsync (sqlite), mmap'd and truncated output (the
linker), exec from the mount, modes, times and symlinks (rsync). A run whose check fails is a
failed row, not a fast one. Each program is timed as the user sees it: until it exits (a tool
that uploads after close() may still be uploading). Reference: the same programs in a fresh
directory on the local disk (the work directory, /var/tmp by default).
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path
from typing import Callable, Optional

from ..context import Case, count_check, q
from ..treegen import ROOT_NAME, plan_tree, write_tree
from ..util import log, run_quiet
from .base import Workload

# git with a fixed identity and dates, and no system or user configuration.
GIT_ENV = ("export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null "
           "GIT_AUTHOR_NAME=bfsbench GIT_AUTHOR_EMAIL=bfsbench@example.com "
           "GIT_COMMITTER_NAME=bfsbench GIT_COMMITTER_EMAIL=bfsbench@example.com "
           "GIT_AUTHOR_DATE=@1624000000+0000 GIT_COMMITTER_DATE=@1624000000+0000;")

# The C project `make -j2` builds: five sources, one header; the program prints EXPECTED_LINE.
C_PROJECT = {
    "Makefile": ("CC = cc\nCFLAGS = -O2 -Wall\n"
                 "OBJS = main.o scale.o shift.o table.o mix.o\n"
                 "app: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n"
                 "%.o: %.c parts.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n"),
    "parts.h": "int scale(int x);\nint shift(int x);\nint table_sum(int n);\nint mix(int a, int b);\n",
    "main.c": ("#include <stdio.h>\n#include \"parts.h\"\n"
               "int main(void) {\n"
               "    printf(\"bfsbench make: %d\\n\", mix(scale(7), shift(table_sum(10))));\n"
               "    return 0;\n}\n"),
    "scale.c": "#include \"parts.h\"\nint scale(int x) { return 3 * x; }\n",
    "shift.c": "#include \"parts.h\"\nint shift(int x) { return x + 100; }\n",
    "table.c": ("#include \"parts.h\"\n"
                "int table_sum(int n) { int s = 0; for (int i = 1; i <= n; i++) s += i * i; return s; }\n"),
    "mix.c": "#include \"parts.h\"\nint mix(int a, int b) { return a * 1000 + b; }\n",
}
# mix(3 * 7, (1² + ... + 10²) + 100) = 21 * 1000 + 485
EXPECTED_LINE = "bfsbench make: 21485"

CASES_OF = {"untar": ["untar", "untar_find"], "git": ["git_clone"], "sqlite": ["sqlite"],
            "make": ["make"], "rsync": ["rsync"]}
FIXED_MTIME = 1_500_000_000   # of the rsync tree's files and directories (whole seconds)


class Programs(Workload):
    name = "programs"
    number = 10
    title = "Real programs in a fresh mount"
    what = ("Programs as users run them, each on a fresh mount of a new, empty bucket, each "
            "checked at once on the same mount: `tar xf` of the linux-shaped tree, then `find "
            "-type f | wc -l` (timed apart; the count must be the tree's, else both rows fail); "
            "`git clone --no-hardlinks` of a local repository, checked by `git fsck --full`; "
            "sqlite3 inserting rows in transactions in its default journal mode, checked by "
            "`PRAGMA integrity_check` and a count; `make -j2` of a 5-file C project (copied into "
            "the mount untimed), checked by running the program from the mount; `rsync -a` of a "
            "small tree with modes, fixed times and a symlink, checked by `rsync -a --checksum "
            "--dry-run --itemize-changes` printing nothing. A failed check makes a failed row. "
            "Times end when the program exits (a tool uploading after close() may still be "
            "uploading; for the untar, results.json has when the bucket held every file). "
            "Reference: the same in a fresh directory on the local disk.")

    def __init__(self, ctx):
        super().__init__(ctx)
        self.tree = plan_tree(self.p.programs_tree_scale)
        self.buckets_made = 0

    def make_cases(self) -> list[Case]:
        p, files = self.p, len(self.tree.files)
        local = dict(ref="local", ref_title="the same in a fresh directory on local disk")
        return [
            Case("untar", f"tar xf of the tree, {files:,} files (checked: find's count)",
                 kind="write", **local),
            Case("untar_find", "find -type f, counted, right after the tar", **local),
            Case("git_clone", f"git clone --no-hardlinks, {p.programs_git_commits} commits x "
                              f"{p.programs_git_files} files (checked: fsck --full)", kind="write",
                 **local),
            Case("sqlite", f"sqlite3, {p.programs_sqlite_transactions} transactions x "
                           f"{p.programs_sqlite_rows} rows (checked: integrity_check)",
                 kind="write", **local),
            Case("make", "make -j2 of 5 C files (checked: the program runs from the mount)",
                 kind="write", **local),
            Case("rsync", f"rsync -a of {p.programs_rsync_files} files (checked: --checksum "
                          "dry run)", kind="write", **local),
        ]

    # -- set-up ---------------------------------------------------------------------------------

    def setup(self) -> None:
        ctx, p = self.ctx, self.p
        src = ctx.work / "programs-src"
        write_tree(src / "tree", self.tree)
        self.tarball = ctx.ramdisk / "programs-tree.tar"
        ctx.sh(f"tar -cf {q(self.tarball)} --sort=name --owner=0 --group=0 --numeric-owner "
               f"--mtime=@1624000000 -C {q(src / 'tree')} {ROOT_NAME}", timeout=3600)
        shutil.rmtree(src / "tree")
        self.repository = src / "repository"
        self.make_repository(self.repository)
        self.sql_script = src / "transactions.sql"
        self.sql_script.write_text(self.sql_transactions())
        self.project = src / "project"
        self.project.mkdir()
        for name, text in C_PROJECT.items():
            (self.project / name).write_text(text)
        self.rsync_source = src / "rsync-tree"
        rsync_bytes = self.make_rsync_tree(self.rsync_source)
        st = self.tree.stats()
        self.tree_bytes = st["bytes"]
        self.case("untar").nbytes = st["bytes"]
        self.facts = {"tree_files": st["files"], "tree_dirs": st["dirs"], "tree_bytes": st["bytes"],
                      "tree_scale": p.programs_tree_scale,
                      "git_files": p.programs_git_commits * p.programs_git_files,
                      "sqlite_rows": p.programs_sqlite_transactions * p.programs_sqlite_rows,
                      "rsync_files": p.programs_rsync_files, "rsync_bytes": rsync_bytes,
                      "local_dirs_in": str(ctx.work)}

    def make_repository(self, repo: Path) -> None:
        """`programs_git_commits` commits, each adding `programs_git_files` small files."""
        ctx = self.ctx
        ctx.sh(f"{GIT_ENV} git init -q -b main {q(repo)}")
        for commit in range(self.p.programs_git_commits):
            for n in range(self.p.programs_git_files):
                path = repo / f"d{n % 4}" / f"f{commit}-{n}.txt"
                path.parent.mkdir(exist_ok=True)
                path.write_text(f"commit {commit} file {n}\n" * (n + 1))
            ctx.sh(f"{GIT_ENV} cd {q(repo)} && git add -A && git commit -q -m 'commit {commit}'")

    def sql_transactions(self) -> str:
        lines = ["CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);"]
        for tx in range(self.p.programs_sqlite_transactions):
            lines.append("BEGIN;")
            lines += [f"INSERT INTO t (v) VALUES ('row {tx}-{row}');"
                      for row in range(self.p.programs_sqlite_rows)]
            lines.append("COMMIT;")
        return "\n".join(lines) + "\n"

    def make_rsync_tree(self, root: Path) -> int:
        """`programs_rsync_files` files of 100 B to 20 KB in nested directories, with modes
        0644/0755/0600/0640, fixed times (whole seconds) and one symlink; returns their bytes."""
        rnd = random.Random(49)
        modes = [0o644, 0o644, 0o755, 0o600, 0o640]
        total = 0
        for i in range(self.p.programs_rsync_files):
            path = root / f"d{i % 8}" / f"s{i % 3}" / f"file{i}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            data = bytes(rnd.randrange(32, 127) for _ in range(rnd.randrange(100, 20_000)))
            path.write_bytes(data)
            path.chmod(modes[i % len(modes)])
            os.utime(path, (FIXED_MTIME + i, FIXED_MTIME + i))
            total += len(data)
        (root / "latest").symlink_to("d0/s0/file0.txt")
        os.utime(root / "latest", (FIXED_MTIME, FIXED_MTIME), follow_symlinks=False)
        for d in sorted(root.rglob("*"), reverse=True) + [root]:   # children first
            if d.is_dir() and not d.is_symlink():
                os.utime(d, (FIXED_MTIME, FIXED_MTIME))
        return total

    def teardown(self) -> None:
        self.tarball.unlink(missing_ok=True)

    # -- one repetition -------------------------------------------------------------------------

    def run(self, tool, rep: int) -> None:
        if tool.kind == "fuse" and self.unsupported_writes(tool, rep, [c.id for c in self.cases()]):
            return
        programs: dict[str, Callable] = {"untar": self.untar, "git": self.git_clone,
                                         "sqlite": self.sqlite, "make": self.make,
                                         "rsync": self.rsync}
        for program, run_program in programs.items():
            try:
                root, mount = self.fresh_place(tool, program, rep)
                try:
                    run_program(tool, rep, root, mount)
                finally:
                    self.clear_place(tool, root, mount)
            except Exception as e:   # one program's failure must not stop the others
                msg = f"{type(e).__name__}: {e}"
                done = self.ctx.recorded(self.name, tool, rep)
                not_recorded = [cid for cid in CASES_OF[program] if cid not in done]
                for cid in not_recorded:
                    self.ctx.record(self.name, self.case(cid), tool, rep, "failed", error=msg)
                if not not_recorded:
                    log(f"  {tool.name}: cleaning up after {program} failed: {msg}")

    def fresh_place(self, tool, program: str, rep: int):
        """Where a program runs: a new, empty bucket freshly mounted, or an empty local
        directory. Returns (directory, mount or None)."""
        if tool.kind == "local":
            root = self.ctx.work / "programs-local" / f"{program}-r{rep}"
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            return root, None
        self.buckets_made += 1
        bucket = f"bench-prog-{program}-{self.buckets_made}"
        self.ctx.s3.mb(bucket)
        mount = self.ctx.mounts.fresh(tool, bucket)
        return mount.path, mount

    def clear_place(self, tool, root: Path, mount) -> None:
        """Unmounts (the bucket, used once, stays as it is), or deletes the local directory."""
        if mount is None:
            shutil.rmtree(root, ignore_errors=True)
        else:
            self.ctx.mounts.unmount(tool, mount.bucket)

    def output_check(self, cmd: str, what: str, want: Optional[str] = None):
        """A `check` for `measure`: runs `cmd` right after the timed command, on the same mount
        (untimed), and wants it to exit 0 and, when `want` is given, to print exactly that."""
        def check(_stdout: str) -> Optional[str]:
            try:
                cp = run_quiet(["bash", "-c", cmd], env=self.ctx.local_env, timeout=self.p.timeout,
                               check=False)
            except RuntimeError as e:
                return f"{what}: {e}"
            if cp.returncode != 0:
                err = " / ".join(cp.stderr.strip().splitlines()[-3:])
                return f"{what}: exit {cp.returncode}: {err[-300:]}"
            if want is not None and cp.stdout != want:
                return f"{what} printed {cp.stdout[:300]!r}, expected {want[:100]!r}"
            return None
        return check

    def untar(self, tool, rep: int, root: Path, mount) -> None:
        files = len(self.tree.files)
        tar = self.measure("untar", tool, rep, f"tar xf {q(self.tarball)} -C {q(root)}",
                           mount=mount)
        if tar["status"] != "ok":
            self.ctx.record(self.name, self.case("untar_find"), tool, rep, "failed",
                            error="tar xf failed")
            return
        tar_returned = time.monotonic()
        find = self.measure("untar_find", tool, rep, f"find {q(root / ROOT_NAME)} -type f | wc -l",
                            mount=mount, check=count_check(files, "file"))
        if find["status"] != "ok":
            # The untar's check is that count: a tree not listed whole is a failed untar.
            tar.update(status="failed", seconds=None, error=f"find right after: {find['error']}")
            log(f"  programs/untar {tool.name} run {rep}: failed: {tar['error']}")
        if mount is not None and mount.alive():
            # Untimed: until the bucket holds every file (a clean unmount after write-back).
            settled = self.ctx.s3.wait_for(mount.bucket, f"{ROOT_NAME}/", objects=files,
                                           nbytes=self.tree_bytes,
                                           deadline=time.monotonic() + self.p.timeout)
            missing = settled.error
            complete = max(settled.last_write or time.monotonic(), tar_returned)
            tar["extra"]["bucket_complete_after_tar_seconds"] = (
                None if missing else round(complete - tar_returned, 3))
            if missing:
                tar["extra"]["bucket_incomplete"] = missing

    def git_clone(self, tool, rep: int, root: Path, mount) -> None:
        clone = root / "clone"
        self.measure("git_clone", tool, rep,
                     f"{GIT_ENV} git clone -q --no-hardlinks {q(self.repository)} {q(clone)}",
                     mount=mount,
                     check=self.output_check(f"{GIT_ENV} git -C {q(clone)} fsck --full",
                                             "git fsck --full"))

    def sqlite(self, tool, rep: int, root: Path, mount) -> None:
        db = root / "bench.db"
        rows = self.p.programs_sqlite_transactions * self.p.programs_sqlite_rows
        self.measure("sqlite", tool, rep, f"sqlite3 {q(db)} < {q(self.sql_script)}", mount=mount,
                     check=self.output_check(
                         f"sqlite3 {q(db)} 'PRAGMA integrity_check; SELECT count(*) FROM t;'",
                         "integrity_check and count", want=f"ok\n{rows}\n"))

    def make(self, tool, rep: int, root: Path, mount) -> None:
        project = root / "project"
        self.ctx.sh(f"cp -r {q(self.project)} {q(project)}", timeout=self.p.timeout)
        self.measure("make", tool, rep, f"make -C {q(project)} -j2", mount=mount,
                     check=self.output_check(q(project / "app"), "the built program",
                                             want=EXPECTED_LINE + "\n"))

    def rsync(self, tool, rep: int, root: Path, mount) -> None:
        source, copy = f"{self.rsync_source}/", f"{root / 'tree'}/"
        self.measure("rsync", tool, rep, f"rsync -a {q(source)} {q(copy)}", mount=mount,
                     check=self.output_check(
                         f"rsync -a --checksum --dry-run --itemize-changes {q(source)} {q(copy)}",
                         "rsync --checksum dry run", want=""))
