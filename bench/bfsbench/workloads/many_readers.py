"""W11 — many readers at once (issue 52): N processes, each hashing (`sha256sum`) its own file
of the same bucket through one fresh mount, all at once; timed until the last exits, with the
daemon's peak RSS. It shows whether read-ahead scales with the readers and the memory left, or
starts at its largest for each one. One case per count in the profile's `readers_counts`."""

from __future__ import annotations

import hashlib

from ..context import Case, q
from ..datagen import write_large_file
from ..util import fmt_size
from .base import Workload

BUCKET = "bench-readers"
# Distinct contents: file i holds content i % CONTENTS, so a tool that mixed files up fails.
CONTENTS = 16


def _key(i: int) -> str:
    return f"readers/file_{i:03d}.bin"


class ManyReaders(Workload):
    name = "readers"
    number = 11
    title = "Many readers at once"
    what = ("N readers at once through one fresh mount (page cache dropped), each `sha256sum` of "
            "its own file; timed until every reader exited, every hash checked; peak RSS is the "
            "daemon's during the run. Reference: the same GETs at once by the direct client.")
    chart_metric = "throughput"

    def counts(self) -> list[int]:
        return [int(c) for c in str(self.p.readers_counts).split(",") if c.strip()]

    def make_cases(self) -> list[Case]:
        size = fmt_size(self.p.readers_size)
        return [Case(f"readers_{n}", f"{n} readers x {size} at once (sha256sum each)", ref="direct",
                     nbytes=n * self.p.readers_size, ref_title="one GET per file, all at once")
                for n in self.counts()]

    def setup(self) -> None:
        ctx, size = self.ctx, self.p.readers_size
        most = max(self.counts())
        src = ctx.ramdisk / "readers"
        src.mkdir(exist_ok=True)
        self.hashes = []
        for c in range(min(CONTENTS, most)):
            path = src / f"content_{c:02d}.bin"
            write_large_file(path, size, seed=1100 + c)
            self.hashes.append(hashlib.sha256(path.read_bytes()).hexdigest())
        tree = ctx.ramdisk / "readers-tree"
        (tree / "readers").mkdir(parents=True, exist_ok=True)
        for i in range(most):
            link = tree / _key(i)
            if not link.exists():
                link.hardlink_to(src / f"content_{i % CONTENTS:02d}.bin")
        ctx.s3.mb(BUCKET)
        ctx.s3.call("put-dir", str(tree), BUCKET, "", "--concurrency", "16")
        self.facts = {"files": most, "file_size": size, "distinct_contents": len(self.hashes)}

    def _check(self, n: int):
        def check(out: str):
            got = {}
            for line in out.splitlines():
                digest, _, path = line.partition("  ")
                got[path.rsplit("/", 1)[-1]] = digest
            for i in range(n):
                name = _key(i).rsplit("/", 1)[-1]
                if got.get(name) != self.hashes[i % CONTENTS]:
                    return f"{name}: sha256 {got.get(name)}, expected {self.hashes[i % CONTENTS]}"
            return None
        return check

    def run(self, tool, rep: int) -> None:
        ctx = self.ctx
        for n in self.counts():
            cid = f"readers_{n}"
            if tool.kind == "direct":
                gets = [f"--get {q(_key(i))}={self.hashes[i % CONTENTS]}" for i in range(n)]
                ctx.drop_caches()
                self.measure(cid, tool, rep, ctx.s3.cmd("mixed", BUCKET) + " " + " ".join(gets))
                continue
            m = ctx.fresh_cold(tool, BUCKET)
            files = " ".join(q(m.path / _key(i)) for i in range(n))
            # One sha256sum per file, all at once; their lines are checked, in any order.
            cmd = (f"pids=(); for f in {files}; do sha256sum \"$f\" & pids+=($!); done; rc=0; "
                   f"for p in \"${{pids[@]}}\"; do wait $p || rc=1; done; exit $rc")
            self.measure(cid, tool, rep, cmd, mount=m, check=self._check(n))
