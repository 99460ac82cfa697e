"""W8 — reads served from each tool's data cache on local disk: bucketfs `--cache` (a file
wholly cached is read by FUSE passthrough, the kernel reading the cache file itself), rclone's
`--vfs-cache-mode full`, s3fs's `use_cache` (and geesefs's and mountpoint-s3's `--cache`
when in the run), against reading the same bytes from a local file. What a cache that outlives the mount is worth: data read once, read again after a
remount or on the same mount, with the page cache dropped, so that the bytes come from the
cache on disk and not from S3 or memory."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

from ..context import Case, count_check, q
from ..datagen import write_large_file, write_small_text_files
from ..tools import DataCached, Mount, Tool
from ..util import cpu_seconds, disk_bytes, fmt_size
from .base import Workload

BUCKET = "bench-cached"
KEY = "big/cached.bin"
PREFIX = "files/"
NEEDLE = "123"
# How long the bench waits for what the fill read to be servable from the cache (bucketfs:
# whole and checked, up to ~1 s per GiB after the last block was read).
CACHED_TIMEOUT = 60
# Each tool's cap on its cache directory (bucketfs, rclone and mountpoint-s3; s3fs and geesefs
# have none): room for the data of one case twice over, so that nothing is evicted.
CAP_FACTOR = 2


class CachedReads(Workload):
    name = "cached"
    number = 8
    title = "Reads from the local disk cache"
    what = ("Each tool with its data cache on local disk, in a fresh directory of the work "
            "directory per case: bucketfs `--cache DIR --cache-size CAP`, rclone "
            "`--vfs-cache-mode full --cache-dir DIR --vfs-cache-max-size CAP`, s3fs "
            "`-o use_cache=DIR` (no cap: s3fs has none), and when in the run geesefs "
            "`--cache DIR` (no cap either) and mountpoint-s3 `--cache DIR --max-cache-size "
            "CAP_MiB`. A first read through the mount fills "
            "the cache (untimed; for bucketfs the bench then waits, up to "
            f"{CACHED_TIMEOUT} s or until the status stops changing, until `bucketfs cache "
            "status` counts the objects whole and checked, which a later open needs to read "
            "by passthrough); then the page cache "
            "is dropped and the same read is timed, on a new mount of the same directory "
            "(*remount*) or on the same mount. The large file's bytes are checked (sha256, "
            "read again after the timing), grep's count of matching files too. Notes: the "
            "bytes the cache directory takes on disk once the tool is unmounted, against its "
            "cap; the bytes MinIO sent during the timed read (near 0: served by the cache); "
            "the daemon's CPU time during it (near 0: the kernel read the cache file without "
            "the daemon); **× paired local**: the median over the runs of the run's time / "
            "the time of the same command on the local copy timed next to it (page cache "
            "dropped before each; the local read goes first in even repetitions, second in odd "
            "ones), which compares the two in the same state of the machine. Reference: the "
            "same command on a local copy of the data on the same disk, page cache dropped.")
    chart_metric = "throughput"

    def make_cases(self) -> list[Case]:
        size, n = fmt_size(self.p.cached_size), self.p.cached_files
        return [
            Case("reread_remount", f"cat of a {size} file cached by an earlier mount", ref="local",
                 nbytes=self.p.cached_size, ref_title="cat of a local file, page cache dropped"),
            Case("reread_same_mount", f"cat of a {size} file cached by this mount", ref="local",
                 nbytes=self.p.cached_size, ref_title="cat of a local file, page cache dropped"),
            Case("grep_remount", f"grep -r over {n} files cached by an earlier mount",
                 ref="local", ref_title="grep -r over a local copy, page cache dropped"),
        ]

    def setup(self) -> None:
        ctx, s = self.ctx, self.p.cached_size
        ctx.s3.mb(BUCKET)
        # The local copy is laid out as the bucket, so every command runs on either root.
        self.local = ctx.work / "cached-local"
        (self.local / KEY).parent.mkdir(parents=True)
        write_large_file(self.local / KEY, s, seed=8)
        ctx.s3.call("put-file", str(self.local / KEY), BUCKET, KEY, "--part-size", "64MiB",
                    "--concurrency", "4")
        digest = hashlib.sha256()
        with open(self.local / KEY, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        self.sha256 = digest.hexdigest()
        self.info = write_small_text_files(self.local / PREFIX, self.p.cached_files, seed=8,
                                           needle=NEEDLE)
        ctx.s3.call("put-dir", str(self.local / PREFIX), BUCKET, PREFIX, "--concurrency", "32")
        self.case("grep_remount").nbytes = self.info["bytes"]
        self.cap = CAP_FACTOR * max(s, self.info["bytes"])
        self.facts = {"file_size": s, "small_files": self.info["files"],
                      "small_files_bytes": self.info["bytes"],
                      "matching_files": self.info["matching"], "cache_cap_bytes": self.cap,
                      "caches_and_local_copy_on": str(ctx.work)}

    def teardown(self) -> None:
        shutil.rmtree(self.local, ignore_errors=True)

    # -- commands -------------------------------------------------------------------------------

    def _command(self, cid: str, root: Path) -> str:
        """The command of a case, on a mount or on the local copy."""
        if cid == "grep_remount":
            # -c reads every file to its end (-l would stop at the first match); a read error
            # fails the pipeline.
            return (f"set -o pipefail; grep -r -c -e {NEEDLE} {q(root / PREFIX)} "
                    f"| grep -v ':0$' | wc -l")
        return f"cat {q(root / KEY)} >/dev/null"

    def _check(self, cid: str, root: Path) -> Callable[[str], Optional[str]]:
        """Checks a case's output: grep's count of matching files, or the file's bytes, read
        again (after the timing) through the same root."""
        if cid == "grep_remount":
            return count_check(self.info["matching"], "matching file")
        return lambda _stdout: self._check_bytes(root / KEY)

    def _check_bytes(self, path: Path) -> Optional[str]:
        cp = subprocess.run(["sha256sum", str(path)], capture_output=True, text=True,
                            timeout=self.p.timeout, env=self.ctx.local_env,
                            stdin=subprocess.DEVNULL)
        if cp.returncode != 0:
            return f"reading it again to check its bytes failed: {cp.stderr.strip()[-200:]}"
        got = cp.stdout.split()[0]
        return None if got == self.sha256 else f"wrong bytes: sha256 {got}, expected {self.sha256}"

    # -- runs -----------------------------------------------------------------------------------

    def run(self, tool, rep: int) -> None:
        if tool.kind == "local":
            for case in self.cases():
                self.ctx.drop_caches()
                self.measure(case.id, tool, rep, self._command(case.id, self.local),
                             check=self._check(case.id, self.local))
            return
        self._cached_case(tool, rep, "reread_remount", remount=True, objects=1)
        self._cached_case(tool, rep, "reread_same_mount", remount=False, objects=1)
        self._cached_case(tool, rep, "grep_remount", remount=True, objects=self.info["files"])

    def _cached_case(self, tool: Tool, rep: int, cid: str, *, remount: bool, objects: int) -> None:
        """One case in a fresh cache directory: the case's command through a mount with the
        tool's cache fills it (untimed) and the bench waits until the cache can serve the
        `objects` read; then, after a remount if `remount`, the page cache is dropped and the
        command is timed. Once the tool is unmounted, the directory's bytes on disk are
        recorded and it is deleted."""
        ctx = self.ctx
        cached = DataCached(tool, ctx.work / "caches" / f"{tool.name}-{cid}-{rep}", self.cap)
        try:
            m = ctx.mounts.fresh(cached, BUCKET, purpose="cache fill" if remount else "")
            ctx.sh(self._command(cid, m.path), timeout=self.p.timeout)
            filled = tool.wait_until_cached(cached.cache_dir, objects, CACHED_TIMEOUT)
            # The local read paired with this one, in the same state (page cache dropped just
            # before), before it in even repetitions and after it in odd ones, so that neither
            # is always the first large read after a drop (see the README: on the development
            # VM those are bimodal whatever reads them).
            local_first = rep % 2 == 0
            paired_local = self._time_local(cid) if local_first else None
            if remount:
                m = ctx.fresh_cold(cached, BUCKET)
            else:
                ctx.drop_caches()
            rec = self._measure_cached(cid, cached, rep, m)
            if not local_first:
                paired_local = self._time_local(cid)
            rec["extra"]["paired_local_seconds"] = paired_local
        finally:
            ctx.mounts.unmount(cached, BUCKET)
            on_disk = disk_bytes(cached.cache_dir) if cached.cache_dir.exists() else None
            shutil.rmtree(cached.cache_dir, ignore_errors=True)
        rec["extra"].update(filled, cache_disk_bytes=on_disk,
                            cache_cap=self.cap if tool.caps_data_cache else None)

    def _time_local(self, cid: str) -> float:
        """Seconds the case's command takes on the local copy, page cache dropped (untimed
        by the harness: recorded with the tool's run it is paired with)."""
        self.ctx.drop_caches()
        t0 = time.perf_counter()
        self.ctx.sh(self._command(cid, self.local), timeout=self.p.timeout)
        return time.perf_counter() - t0

    def _measure_cached(self, cid: str, tool: Tool, rep: int, m: Mount) -> dict:
        """Times the case's command on mount `m`, and records what the store sent and the
        daemon's CPU time during it (counted before the output is checked)."""
        ctx = self.ctx
        sent0, cpu0 = ctx.store_bytes_sent(), cpu_seconds(m.pid)
        during: dict = {}
        check = self._check(cid, m.path)

        def counted_check(stdout: str) -> Optional[str]:
            sent, cpu = ctx.store_bytes_sent(), cpu_seconds(m.pid)
            if sent is not None and sent0 is not None:
                during["store_bytes"] = sent - sent0
            if cpu is not None and cpu0 is not None:
                during["daemon_cpu_seconds"] = cpu - cpu0
            return check(stdout)

        rec = self.measure(cid, tool, rep, self._command(cid, m.path), mount=m,
                           check=counted_check)
        rec["extra"].update(during)
        return rec
