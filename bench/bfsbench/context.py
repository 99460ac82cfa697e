"""Shared state of one bench run, and the measurement primitive every workload uses."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from .profiles import Profile
from .s3 import BASE_PATH, S3Direct
from .tools import WRITE_BUCKET, Mount, MountError, MountManager, Tool  # noqa: F401
from .util import fmt_secs, io_bytes, log, read_status_kb, run_timed


@dataclasses.dataclass
class Case:
    id: str
    title: str
    kind: str = "read"                 # 'read' (any tool) or 'write' (needs a writable mount)
    ref: Optional[str] = None          # 'direct' or 'local': the reference row of this case
    nbytes: Optional[int] = None       # bytes moved, for throughput
    ref_title: str = ""                # what the reference row does
    ref2: Optional[str] = None         # a second reference row ('local'), with its own ratio
    ref2_title: str = ""


class Context:
    def __init__(self, *, profile: Profile, work: Path, ramdisk: Path, s3: S3Direct,
                 mounts: MountManager, tools: list[Tool], can_drop_caches: bool,
                 store_pid: Optional[int] = None, minio_bin: Optional[str] = None):
        self.profile = profile
        self.work = work
        self.ramdisk = ramdisk
        self.s3 = s3
        self.mounts = mounts
        self.tools = tools
        self.can_drop_caches = can_drop_caches
        self.store_pid = store_pid   # the MinIO process
        self.minio_bin = minio_bin   # for a workload that starts a MinIO of its own
        self.records: list[dict] = []
        self._write_support: dict[str, Optional[str]] = {}
        self.local_env = {"PATH": BASE_PATH, "HOME": str(work / "home" / "local"), "LANG": "C",
                          "LC_ALL": "C"}
        (work / "home" / "local").mkdir(parents=True, exist_ok=True)

    # -- caches ---------------------------------------------------------------------------------

    def drop_caches(self) -> None:
        """sync; echo 3 > /proc/sys/vm/drop_caches (page cache, dentries and inodes).

        Then the client programs (cat, find, s3direct...) are read back into the page cache,
        so that a cold run measures cold data and metadata, not the loading of the programs
        (the FUSE daemons are already resident; the direct client would otherwise pay for
        loading its binary from disk)."""
        os.sync()
        if self.can_drop_caches:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            for path in self._client_programs():
                try:
                    with open(path, "rb") as f:
                        while f.read(1 << 20):
                            pass
                except OSError:
                    pass

    def _client_programs(self) -> list[str]:
        if not hasattr(self, "_programs"):
            names = ["bash", "cat", "cp", "dd", "find", "grep", "ls", "rm", "stat", "tar", "wc",
                     "xargs", "mkdir"]
            found = [shutil.which(n, path=BASE_PATH) for n in names]
            self._programs = [p for p in found if p] + [sys.executable, self.s3.binary]
        return self._programs

    def store_bytes_sent(self) -> Optional[int]:
        """Bytes the MinIO process has written so far, its responses to every client included:
        the difference over a command is what the store sent during it."""
        return io_bytes(self.store_pid, "wchar") if self.store_pid else None

    # -- recording ------------------------------------------------------------------------------

    def record(self, wl: str, case: Case, tool: Tool, rep: Optional[int], status: str, *,
               seconds: Optional[float] = None, nbytes: Optional[int] = None,
               daemon_rss_kb: Optional[int] = None, client_rss_kb: Optional[int] = None,
               error: Optional[str] = None, extra: Optional[dict] = None) -> dict:
        rec = {"workload": wl, "case": case.id, "tool": tool.name, "rep": rep, "status": status,
               "seconds": seconds, "bytes": nbytes if nbytes is not None else case.nbytes,
               "daemon_rss_kb": daemon_rss_kb, "client_rss_kb": client_rss_kb, "error": error,
               "extra": extra or {}}
        self.records.append(rec)
        what = fmt_secs(seconds) if status == "ok" else f"{status}: {error or ''}"
        log(f"  {wl}/{case.id} {tool.name} run {rep}: {what}")
        return rec

    def recorded(self, wl: str, tool: Tool, rep: int) -> set[str]:
        return {r["case"] for r in self.records
                if r["workload"] == wl and r["tool"] == tool.name and r["rep"] == rep}

    # -- measuring ------------------------------------------------------------------------------

    def env_for(self, tool: Tool) -> dict:
        return dict(self.s3.env) if tool.kind == "direct" else dict(self.local_env)

    def measure(self, wl: str, case: Case, tool: Tool, rep: int, cmd: str, *,
                mount: Optional[Mount] = None, settle: Optional[Callable[[float], Optional[str]]] = None,
                check: Optional[Callable[[str], Optional[str]]] = None,
                parse: Optional[Callable[[str], tuple[Optional[float], dict]]] = None,
                nbytes: Optional[int] = None) -> dict:
        """Times one command and records it.

        check(stdout) -> error text or None validates the output (e.g. a file count).
        parse(stdout) -> (seconds or None, extra) lets a command report its own timing.
        """
        res = run_timed(cmd, env=self.env_for(tool), timeout=self.profile.timeout,
                        daemon_pid=mount.pid if mount else None, settle=settle)
        error = res.error
        seconds = res.seconds
        extra: dict = {}
        if res.returned_seconds is not None:
            extra["returned_seconds"] = res.returned_seconds  # the rest is the wait for the bucket
        if error is None and check is not None:
            error = check(res.stdout)
        if error is None and parse is not None:
            try:
                own, extra = parse(res.stdout)
                if own is not None:
                    extra["wall_seconds"] = seconds
                    seconds = own
            except (ValueError, KeyError, IndexError) as e:
                error = f"bad output: {e}"
        if mount is not None and not mount.alive():
            error = (error + "; " if error else "") + f"{tool.name} daemon exited: {mount.log_tail()}"
            self.mounts.abort(mount)
        elif mount is not None and res.timed_out:
            self.mounts.abort(mount)
        status = "ok" if error is None else "failed"
        return self.record(wl, case, tool, rep, status, seconds=seconds if status == "ok" else None,
                           nbytes=nbytes, daemon_rss_kb=res.daemon_rss_kb,
                           client_rss_kb=res.client_rss_kb, error=error, extra=extra)

    def sh(self, cmd: str, timeout: float = 120) -> str:
        """An untimed helper command (e.g. mkdir through a mount), with a time limit."""
        try:
            cp = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True,
                                timeout=timeout, env=self.local_env, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"{cmd!r} timed out") from e
        if cp.returncode != 0:
            raise RuntimeError(f"{cmd!r} failed: {cp.stderr.strip()[-300:]}")
        return cp.stdout

    def fresh_cold(self, tool: Tool, bucket: str) -> Mount:
        """A new mount (empty daemon caches) and dropped kernel caches: the 'cold' state.

        For a tool that loads a saved listing index (bucketfs-index), the cold state is the
        start of a mount that was used before: a preparatory mount builds the index of the
        bucket as it is now and saves it (`bucketfs refresh`, then unmount), the page cache is
        dropped, and the new mount loads that index before it answers (checked through the
        `bucketfs.index` attribute of its root)."""
        if tool.loads_saved_index:
            self.save_index(tool, bucket)
            self.drop_caches()   # the saved file is read from disk by the mount, as after a reboot
        m = self.mounts.fresh(tool, bucket)
        if tool.loads_saved_index:
            status = self.index_status(m)
            m.history["index_status"] = status
            if not status or "building" in status:
                raise RuntimeError(f"{tool.name}: the fresh mount of {bucket} did not load the "
                                   f"saved index (bucketfs.index: {status!r}); {m.log_tail()}")
        self.drop_caches()
        return m

    def save_index(self, tool: Tool, bucket: str) -> dict:
        """A preparatory (untimed) mount of `bucket` that lists it whole, saves the index
        (`bucketfs refresh` returns once it is built and saved) and unmounts."""
        m = self.mounts.fresh(tool, bucket, purpose="index build")
        t0 = time.perf_counter()
        try:
            cp = subprocess.run([tool.binary, "refresh", str(m.path)], capture_output=True,
                                text=True, timeout=self.profile.timeout, env=self.local_env,
                                stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            self.mounts.abort(m)
            raise RuntimeError(f"bucketfs refresh of {bucket} timed out") from e
        seconds = time.perf_counter() - t0
        rss_kb = read_status_kb(m.pid, "VmRSS")
        build: dict = {}
        if cp.returncode == 0 and tool.prep == "stat":
            # Every entry's stat: the files' stored attributes are fetched and kept in the
            # index, as a mount leaves it once its background pass is through.
            t1 = time.perf_counter()
            self.sh(f"du -s {shlex.quote(str(m.path))} >/dev/null", timeout=self.profile.timeout)
            build["stat_seconds"] = time.perf_counter() - t1
            build["rss_after_stat_kb"] = read_status_kb(m.pid, "VmRSS")
        self.mounts.unmount(tool, bucket)
        if cp.returncode != 0:
            raise RuntimeError(f"bucketfs refresh of {bucket} failed ({cp.returncode}): "
                               f"{(cp.stderr or cp.stdout).strip()[-300:]}")
        if not tool.saved_indexes(bucket):
            raise RuntimeError(f"no saved index in {tool.cache_dir(bucket)} after the refresh "
                               f"and unmount of {bucket}")
        build.update({"prep": tool.prep, "refresh_seconds": seconds, "rss_after_refresh_kb": rss_kb,
                      "refresh_output": cp.stdout.strip()[-300:],
                      "index_bytes": sum(p.stat().st_size for p in tool.saved_indexes(bucket))})
        m.history.update(build)
        log(f"  {tool.name}: index of {bucket} built in {fmt_secs(seconds)} "
            f"({build['index_bytes']} bytes saved)")
        return build

    @staticmethod
    def index_status(m: Mount) -> str:
        """The `bucketfs.index` attribute of an --index mount's root: one line per source,
        `... files=N dirs=N age=Ns` once its index is in use, `... building` before."""
        try:
            return os.getxattr(str(m.path), "bucketfs.index").decode(errors="replace").strip()
        except OSError as e:
            return f"unreadable: {e}"

    def write_support(self, tool: Tool) -> Optional[str]:
        """None when the tool can write; else why not. Found by trying, never assumed."""
        if tool.name in self._write_support:
            return self._write_support[tool.name]
        if tool.kind != "fuse":
            return None
        self.s3.mb(WRITE_BUCKET)
        m = self.mounts.get(tool, WRITE_BUCKET)
        probe = m.path / ".bfsbench-write-probe"
        script = (
            "import errno, os, sys\n"
            f"p = {str(probe)!r}\n"
            "try:\n"
            "    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n"
            "    os.write(fd, b'probe')\n"
            "    os.close(fd)\n"
            "    os.unlink(p)\n"
            "except OSError as e:\n"
            "    print(errno.errorcode.get(e.errno, e.errno), e.strerror)\n"
            "    sys.exit(30 if e.errno == errno.EROFS else 1)\n")
        try:
            cp = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                timeout=60, env=self.local_env)
        except subprocess.TimeoutExpired:
            self.mounts.abort(m)
            reason = "write probe timed out"
        else:
            if cp.returncode == 0:
                reason = None
            elif cp.returncode == 30:
                reason = "not supported yet (write returned EROFS)"
            else:
                reason = f"write probe failed: {cp.stdout.strip() or cp.stderr.strip()[-200:]}"
        self._write_support[tool.name] = reason
        log(f"write support of {tool.name}: {reason or 'yes'}")
        return reason


def count_check(expected: int, what: str) -> Callable[[str], Optional[str]]:
    """Checks that the last line of stdout is the integer `expected`."""
    def check(stdout: str) -> Optional[str]:
        lines = stdout.strip().splitlines()
        try:
            got = int(lines[-1].strip())
        except (IndexError, ValueError):
            return f"expected a {what} count, got {stdout[-100:]!r}"
        return None if got == expected else f"wrong {what} count: {got}, expected {expected}"
    return check


def q(p) -> str:
    return shlex.quote(str(p))
