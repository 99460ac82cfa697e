"""The filesystems under test and how each one is mounted.

Every FUSE daemon runs in the foreground as a child of the bench (so its PID is known, its
peak RSS can be read from /proc/PID/status and it can be stopped by PID), with a clean
environment holding only the variables it needs.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

from .minio import ACCESS_KEY, SECRET_KEY
from .s3 import BASE_PATH
from .util import first_line, log, pid_alive, read_status_kb, run_quiet

REGION = "us-east-1"
# The bucket every workload writes to (the bench empties it with the direct client after each
# run, behind the mounts' backs). Defined here for `BucketFSIndex`; context.py re-exports it.
WRITE_BUCKET = "bench-write"


class Tool:
    """A row in the tables. kind: 'fuse' (mounted), 'direct' (S3 client) or 'local' (local fs)."""
    name = "?"
    kind = "fuse"
    label = "?"
    # True for a tool whose cold state is "a fresh mount that loads a saved listing index":
    # Context.fresh_cold then builds and saves the index with a preparatory mount first.
    loads_saved_index = False
    # True for a tool whose data cache on local disk takes a cap on its bytes (`cached` workload).
    caps_data_cache = True

    def __init__(self, ctx_dirs: "Dirs", endpoint: str):
        self.dirs = ctx_dirs
        self.endpoint = endpoint
        self.missing: Optional[str] = None   # reason the tool cannot run, if it cannot
        self.setup_note = ""                 # options chosen, for the summary
        ctx_dirs.home(self.name).mkdir(parents=True, exist_ok=True)

    def check(self) -> None:
        """Sets self.missing when the tool cannot be used."""

    def version(self) -> str:
        return "n/a"

    # FUSE tools only
    def mount_argv(self, bucket: str, mnt: Path) -> list[str]:
        raise NotImplementedError

    def mount_env(self) -> dict:
        return {"PATH": BASE_PATH, "HOME": str(self.dirs.home(self.name)), "LANG": "C"}

    def redacted_cmd(self) -> str:
        argv = self.mount_argv("BUCKET", Path("MOUNTPOINT"))
        return " ".join(argv)

    def at_endpoint(self, endpoint: str, tag: str) -> "Tool":
        """The same tool (same row, same options) talking to another server, e.g. the
        throttled MinIO of the `throttled` workload. `tag` names its private files."""
        other = copy.copy(self)
        other.endpoint = endpoint
        return other

    def before_mount(self, bucket: str) -> None:
        """Called before a daemon is started on `bucket`."""

    def after_unmount(self, bucket: str) -> None:
        """Called once the daemon of a mount of `bucket` has exited."""

    # The data cache on local disk (the `cached` workload, through `DataCached`)
    def data_cache_argv(self, bucket: str, mnt: Path, cache_dir: Path, cap: int) -> list[str]:
        """The mount command with the tool's data cache on local disk in `cache_dir`."""
        raise NotImplementedError

    def wait_until_cached(self, cache_dir: Path, objects: int, timeout: float) -> dict:
        """After a read through a mount with the data cache: waits until the cache can serve
        what was read to a later open; returns what it saw, for the record. By default there
        is nothing to wait for (s3fs and rclone write their cache file as the program reads)."""
        return {}


class Dirs:
    def __init__(self, work: Path):
        self.work = work

    def home(self, name: str) -> Path:
        """A private HOME per tool (created by the tool's constructor)."""
        return self.work / "home" / name

    def mnt(self, name: str) -> Path:
        p = self.work / "mnt" / name
        p.mkdir(parents=True, exist_ok=True)
        return p

    def logs(self) -> Path:
        p = self.work / "logs"
        p.mkdir(parents=True, exist_ok=True)
        return p


def find_peer(program: str, explicit: Optional[str]) -> Optional[str]:
    """A peer's binary: the one given (and then only that one: a wrong path must not measure
    another build), else the project's dependency directory (scripts/install-deps builds
    into it), else PATH."""
    deps = os.environ.get("BUCKETFS_DEPS_DIR", os.path.expanduser("~/.cache/bucketfs-deps"))
    cands = [explicit] if explicit else [os.path.join(deps, "bin", program), shutil.which(program)]
    for cand in cands:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _s3_sdk_env(env: dict) -> dict:
    """The bench's credentials for a peer built on an AWS SDK, and nothing else that SDK could
    pick up: no shared config or credentials file, no instance metadata lookup."""
    env.update({
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    })
    return env


class BucketFS(Tool):
    name = "bucketfs"
    label = "bucketfs"
    mode_args: list[str] = []   # what sets a variant apart (before --bucketfs-args)

    def __init__(self, dirs: Dirs, endpoint: str, binary: str, extra_args: list[str],
                 shown_as: Optional[str] = None, transport: Optional[str] = None):
        if transport:
            # `bucketfs-index+uring`: the same variant with FUSE over io_uring. Its mount turns
            # the kernel's switch on, after which `auto` would take the ring too: the other
            # variants then say dev-fuse (see `transport_args`).
            self.name = f"{self.name}+{transport}"
            self.label = f"{self.label} (io_uring)"
            self.mode_args = [*self.mode_args, "--fuse-transport", transport]
        self.transport = transport
        self.has_transport_choice = False   # the binary has --fuse-transport (see check)
        super().__init__(dirs, endpoint)
        self.binary = binary
        self.shown_as = shown_as or binary   # the path to show (binary may be a private copy)
        self.extra_args = extra_args
        mode = "".join(f" {a}" for a in self.mode_args)
        self.setup_note = (f"`bucketfs mount --foreground{mode}` with its defaults"
                           + (f" plus `{' '.join(extra_args)}`" if extra_args else ""))

    def check(self) -> None:
        if not (os.path.isfile(self.binary) and os.access(self.binary, os.X_OK)):
            self.missing = f"binary not found ({self.binary})"
            return
        cp = subprocess.run([self.binary, "mount", "--help"], capture_output=True, text=True,
                            timeout=30, stdin=subprocess.DEVNULL)
        if cp.returncode != 0:
            self.missing = "binary has no working `mount` subcommand yet"
            return
        # An older binary without the variant's flag would fail every mount: say why once.
        self.has_transport_choice = "--fuse-transport" in cp.stdout
        absent = [a for a in self.mode_args if a.startswith("--") and a not in cp.stdout]
        if absent:
            self.missing = f"binary has no `{' '.join(absent)}` option"

    def version(self) -> str:
        return first_line([self.binary, "--version"])

    def variant_args(self, bucket: str) -> list[str]:
        return [*self.mode_args, *self.transport_args()]

    def transport_args(self) -> list[str]:
        """/dev/fuse, said explicitly by a binary that has the choice, unless this variant
        is an io_uring one (whose mode_args say so)."""
        if self.transport is None and self.has_transport_choice:
            return ["--fuse-transport", "dev-fuse"]
        return []

    def mount_argv(self, bucket: str, mnt: Path, more_args: tuple[str, ...] = ()) -> list[str]:
        return [self.binary, "mount", "--foreground", "--endpoint-url", self.endpoint,
                "--force-path-style", "--region", REGION, *self.variant_args(bucket),
                *self.extra_args, *more_args, f"s3://{bucket}", str(mnt)]

    def data_cache_argv(self, bucket: str, mnt: Path, cache_dir: Path, cap: int) -> list[str]:
        return self.mount_argv(bucket, mnt, ("--cache", str(cache_dir), "--cache-size", str(cap)))

    def wait_until_cached(self, cache_dir: Path, objects: int, timeout: float) -> dict:
        """Polls `bucketfs cache status` until `objects` objects are whole and checked: only
        then does a later open read the cache file by FUSE passthrough. An object becomes so
        shortly after its last block was read (up to ~1 s per GiB), so the wait also ends
        when the status has not changed for a tenth of `timeout`."""
        t0 = last_change = time.monotonic()
        last = None
        while True:
            status = run_quiet([self.binary, "cache", "status", str(cache_dir)]).stdout.strip()
            status = status.removeprefix(f"{cache_dir}: ")
            now = time.monotonic()
            if status != last:
                last, last_change = status, now
            whole = re.search(r"(\d+) whole", status)
            if whole is None:
                return {"not_whole": f"no whole count in `bucketfs cache status`: {status}"}
            if int(whole.group(1)) >= objects:
                return {"whole_after_seconds": now - t0}
            if now - t0 > timeout or now - last_change > timeout / 10:
                return {"not_whole": f"{whole.group(1)} of {objects} objects whole after "
                                     f"{now - t0:.0f} s (`{status}`)"}
            time.sleep(0.1)

    def redacted_cmd(self) -> str:
        return super().redacted_cmd().replace(self.binary, self.shown_as, 1)

    def mount_env(self) -> dict:
        return _s3_sdk_env(super().mount_env())


class BucketFSWriteBack(BucketFS):
    """The same binary with uploads after close(): like-for-like with rclone, which the bench
    runs with `--vfs-write-back 0s`. Plain `bucketfs` keeps upload errors at close()."""
    name = "bucketfs-wb"
    label = "bucketfs --write-back"
    mode_args = ["--write-back"]


class BucketFSIndex(BucketFS):
    """The same binary serving the tree from a listing index (`--index`). Its cold cases
    measure a fresh mount that loads the index saved by a preparatory mount (see
    Context.fresh_cold): the start of a mount that was used before, which is what the index
    is for. Each bucket has its own `--cache-dir` in the work directory."""
    name = "bucketfs-index"
    label = "bucketfs --index"
    mode_args = ["--index"]
    loads_saved_index = True

    PREPS = {
        "refresh": "`bucketfs refresh`, then unmount",
        "stat": "`bucketfs refresh`, then `du -s` of the mount (a stat of every entry: the files' "
                "stored attributes are fetched and kept in the index), then unmount",
    }

    def __init__(self, dirs: Dirs, endpoint: str, binary: str, extra_args: list[str],
                 shown_as: Optional[str] = None, transport: Optional[str] = None,
                 prep: str = "refresh"):
        super().__init__(dirs, endpoint, binary, extra_args, shown_as, transport)
        if prep not in self.PREPS:
            raise ValueError(f"unknown index preparation {prep!r}")
        self.prep = prep
        self.setup_note += ("; `--cache-dir` of its own per bucket; every cold case runs on a "
                            "fresh mount that loads the index saved just before by a "
                            f"preparatory mount ({self.PREPS[prep]})")

    def cache_root(self) -> Path:
        return self.dirs.home(self.name) / "cache"

    def cache_dir(self, bucket: str) -> Path:
        return self.cache_root() / bucket

    def saved_indexes(self, bucket: str) -> list[Path]:
        return sorted((self.cache_dir(bucket) / "bucketfs-index").glob("*.idx"))

    def check(self) -> None:
        super().check()
        if self.missing:
            return
        cp = subprocess.run([self.binary, "refresh", "--help"], capture_output=True, text=True,
                            timeout=30, stdin=subprocess.DEVNULL)
        if cp.returncode != 0:
            self.missing = "binary has no `refresh` subcommand"

    def variant_args(self, bucket: str) -> list[str]:
        return [*self.mode_args, *self.transport_args(), "--cache-dir", str(self.cache_dir(bucket))]

    def before_mount(self, bucket: str) -> None:
        self.cache_dir(bucket).mkdir(parents=True, exist_ok=True)

    def after_unmount(self, bucket: str) -> None:
        # The bench empties the write bucket with the direct client after each run, behind the
        # mount's back: an index saved of it would be stale at the next mount. The read
        # buckets never change after set-up, and their saved index is what this row measures
        # (fresh_cold builds a new one before each cold case anyway).
        if bucket == WRITE_BUCKET:
            shutil.rmtree(self.cache_dir(bucket), ignore_errors=True)

    def redacted_cmd(self) -> str:
        return super().redacted_cmd().replace(str(self.cache_root()), "CACHE_DIR")


class S3FS(Tool):
    name = "s3fs"
    label = "s3fs"
    caps_data_cache = False   # `use_cache` has no size limit (only a free-space floor)

    def __init__(self, dirs: Dirs, endpoint: str, extra_opts: str):
        super().__init__(dirs, endpoint)
        self.binary = shutil.which("s3fs") or "s3fs"
        self.passwd = dirs.home(self.name) / "passwd-s3fs"
        self.passwd.write_text(f"{ACCESS_KEY}:{SECRET_KEY}\n")
        self.passwd.chmod(0o600)
        self.extra_opts = extra_opts
        self.setup_note = ("s3fs defaults (no `use_cache` data cache, default stat cache), "
                           "path-style requests via `-o url=...,use_path_request_style`"
                           + (f", plus `-o {extra_opts}`" if extra_opts else ""))

    def check(self) -> None:
        if not shutil.which("s3fs"):
            self.missing = "s3fs not installed (scripts/install-deps --bench)"

    def version(self) -> str:
        return first_line([self.binary, "--version"])

    def mount_argv(self, bucket: str, mnt: Path) -> list[str]:
        opts = (f"url={self.endpoint},use_path_request_style,endpoint={REGION},"
                f"passwd_file={self.passwd}")
        if self.extra_opts:
            opts += "," + self.extra_opts
        return [self.binary, bucket, str(mnt), "-f", "-o", opts]

    def data_cache_argv(self, bucket: str, mnt: Path, cache_dir: Path, cap: int) -> list[str]:
        return self.mount_argv(bucket, mnt) + ["-o", f"use_cache={cache_dir}"]

    def redacted_cmd(self) -> str:
        return " ".join(self.mount_argv("BUCKET", Path("MOUNTPOINT"))).replace(
            str(self.passwd), "PASSWD_FILE")


class Rclone(Tool):
    name = "rclone"
    label = "rclone mount"

    def __init__(self, dirs: Dirs, endpoint: str, cache_mode: str, extra_args: list[str]):
        super().__init__(dirs, endpoint)
        self.binary = shutil.which("rclone") or "rclone"
        self.conf = dirs.home(self.name) / "rclone.conf"
        self._write_conf()
        self.cache_mode = cache_mode
        self.extra_args = extra_args
        self.setup_note = (f"`--vfs-cache-mode {cache_mode}` (as in the article) with "
                           "`--vfs-write-back 0s` so uploads start at close(); other options default"
                           + (f", plus `{' '.join(extra_args)}`" if extra_args else ""))

    def _write_conf(self) -> None:
        self.conf.write_text(
            "[bench]\n"
            "type = s3\n"
            "provider = Minio\n"
            "env_auth = false\n"
            f"access_key_id = {ACCESS_KEY}\n"
            f"secret_access_key = {SECRET_KEY}\n"
            f"endpoint = {self.endpoint}\n"
            f"region = {REGION}\n")
        self.conf.chmod(0o600)

    def at_endpoint(self, endpoint: str, tag: str) -> "Tool":
        other = super().at_endpoint(endpoint, tag)
        other.conf = self.dirs.home(self.name) / f"rclone-{tag}.conf"
        other._write_conf()
        return other

    def check(self) -> None:
        if not shutil.which("rclone"):
            self.missing = "rclone not installed (scripts/install-deps --bench)"

    def version(self) -> str:
        return first_line([self.binary, "version"])

    def mount_argv(self, bucket: str, mnt: Path) -> list[str]:
        return self._argv(bucket, mnt, self.cache_mode, self.dirs.home(self.name) / "cache")

    def data_cache_argv(self, bucket: str, mnt: Path, cache_dir: Path, cap: int) -> list[str]:
        # A plain number would be KiB to rclone: say bytes.
        return self._argv(bucket, mnt, "full", cache_dir, ("--vfs-cache-max-size", f"{cap}B"))

    def _argv(self, bucket: str, mnt: Path, cache_mode: str, cache_dir: Path,
              more_args: tuple[str, ...] = ()) -> list[str]:
        return [self.binary, "mount", "--config", str(self.conf), f"bench:{bucket}", str(mnt),
                "--vfs-cache-mode", cache_mode, "--vfs-write-back", "0s",
                "--cache-dir", str(cache_dir), *more_args,
                "--log-level", "NOTICE", *self.extra_args]

    def after_unmount(self, bucket: str) -> None:
        # The VFS cache keeps a copy of every file written (24 GiB in the full run): drop it.
        cache = self.dirs.home(self.name) / "cache"
        for sub in ("vfs", "vfsMeta"):
            shutil.rmtree(cache / sub / "bench" / bucket, ignore_errors=True)

    def redacted_cmd(self) -> str:
        return " ".join(self.mount_argv("BUCKET", Path("MOUNTPOINT"))).replace(
            str(self.conf), "RCLONE_CONF").replace(str(self.dirs.home(self.name) / "cache"), "CACHE_DIR")


class GeeseFS(Tool):
    """geesefs (github.com/yandex-cloud/geesefs), a goofys descendant with write-back, read
    ahead and an optional disk cache. Path-style requests are its default (`--subdomain` would
    change that); it reads the credentials from the environment as any aws-sdk-go client."""
    name = "geesefs"
    label = "geesefs"
    caps_data_cache = False   # `--cache DIR` takes no size limit (`--memory-limit` is RAM)

    def __init__(self, dirs: Dirs, endpoint: str, binary: Optional[str], extra_args: list[str]):
        super().__init__(dirs, endpoint)
        self.given = binary
        self.binary = find_peer("geesefs", binary) or binary or "geesefs"
        self.extra_args = extra_args
        self.setup_note = ("geesefs defaults (its write-back, read-ahead and 1 GB `--memory-limit`; "
                           "no `--cache` disk cache), given only `-f --endpoint URL --region "
                           f"{REGION}` (path-style requests are its default)"
                           + (f", plus `{' '.join(extra_args)}`" if extra_args else ""))

    def check(self) -> None:
        if find_peer("geesefs", self.given) is None:
            self.missing = ("geesefs not found (not installable from the package registries: "
                            "see bench/README.md; --geesefs-bin PATH)")

    def version(self) -> str:
        return first_line([self.binary, "--version"])

    def mount_argv(self, bucket: str, mnt: Path, more_args: tuple[str, ...] = ()) -> list[str]:
        return [self.binary, "-f", "--endpoint", self.endpoint, "--region", REGION,
                *more_args, *self.extra_args, bucket, str(mnt)]

    def data_cache_argv(self, bucket: str, mnt: Path, cache_dir: Path, cap: int) -> list[str]:
        return self.mount_argv(bucket, mnt, ("--cache", str(cache_dir)))

    def mount_env(self) -> dict:
        return _s3_sdk_env(super().mount_env())


class MountpointS3(Tool):
    """Mountpoint for Amazon S3 (`mount-s3`). It refuses by design what S3 cannot do in place:
    a file is written only sequentially, from its start, when it is created (or truncated, with
    `--allow-overwrite`); no rename, no chmod/chown/utimes. The bench gives it
    `--allow-delete --allow-overwrite` so that its write cases can run; a case it refuses
    (the tree's untar sets times) is a failed row with its error, not a crash."""
    name = "mountpoint-s3"
    label = "mountpoint-s3"

    def __init__(self, dirs: Dirs, endpoint: str, binary: Optional[str], extra_args: list[str]):
        super().__init__(dirs, endpoint)
        self.given = binary
        self.binary = find_peer("mount-s3", binary) or binary or "mount-s3"
        self.extra_args = extra_args
        self.setup_note = ("mount-s3 defaults plus `--foreground --endpoint-url URL "
                           f"--force-path-style --region {REGION} --allow-delete --allow-overwrite` "
                           "(writes: new files and truncating overwrites, sequential only)"
                           + (f", plus `{' '.join(extra_args)}`" if extra_args else ""))

    def check(self) -> None:
        if find_peer("mount-s3", self.given) is None:
            self.missing = ("mount-s3 not found (not installable from the package registries: "
                            "see bench/README.md; --mount-s3-bin PATH)")

    def version(self) -> str:
        return first_line([self.binary, "--version"])

    def mount_argv(self, bucket: str, mnt: Path, more_args: tuple[str, ...] = ()) -> list[str]:
        return [self.binary, bucket, str(mnt), "--foreground", "--endpoint-url", self.endpoint,
                "--force-path-style", "--region", REGION, "--allow-delete", "--allow-overwrite",
                *more_args, *self.extra_args]

    def data_cache_argv(self, bucket: str, mnt: Path, cache_dir: Path, cap: int) -> list[str]:
        # --max-cache-size is in MiB.
        mib = max(1, cap >> 20)
        return self.mount_argv(bucket, mnt, ("--cache", str(cache_dir), "--max-cache-size", str(mib)))

    def mount_env(self) -> dict:
        return _s3_sdk_env(super().mount_env())


class DataCached(Tool):
    """A FUSE tool mounted with its data cache on local disk in `cache_dir` (the `cached`
    workload): the same row in the tables, its own mount command. The cache outlives the
    mount; the workload deletes it."""

    def __init__(self, tool: Tool, cache_dir: Path, cap: int):   # no home of its own
        self.tool = tool
        self.name, self.label, self.kind = tool.name, tool.label, tool.kind
        self.dirs, self.endpoint, self.missing = tool.dirs, tool.endpoint, tool.missing
        self.setup_note = tool.setup_note
        self.cache_dir = cache_dir
        self.cap = cap

    def mount_argv(self, bucket: str, mnt: Path) -> list[str]:
        return self.tool.data_cache_argv(bucket, mnt, self.cache_dir, self.cap)

    def mount_env(self) -> dict:
        return self.tool.mount_env()

    def before_mount(self, bucket: str) -> None:
        self.tool.before_mount(bucket)   # e.g. bucketfs --index: its own --cache-dir
        self.cache_dir.mkdir(parents=True, exist_ok=True)

    def after_unmount(self, bucket: str) -> None:
        self.tool.after_unmount(bucket)


class Direct(Tool):
    name = "direct"
    kind = "direct"
    label = "direct S3 (s3direct)"


class Local(Tool):
    name = "local"
    kind = "local"
    label = "local file system"


# ---------------------------------------------------------------------------------------------


def _unescape_mountinfo(s: str) -> str:
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mounted_paths() -> set[str]:
    paths = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 4:
                paths.add(_unescape_mountinfo(parts[4]))
    return paths


class MountError(RuntimeError):
    pass


class Mount:
    def __init__(self, tool: Tool, bucket: str, path: Path, proc: subprocess.Popen, log_path: Path):
        self.tool = tool
        self.bucket = bucket
        self.path = path
        self.proc = proc
        self.pid = proc.pid
        self.log_path = log_path
        self.mount_seconds = 0.0
        self.history: dict = {}   # this mount's entry in MountManager.history

    def alive(self) -> bool:
        return self.proc.poll() is None and pid_alive(self.pid)

    def log_tail(self, n: int = 5) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-n:])[-600:]


class MountManager:
    """Mounts tools on buckets, one mount per (tool, bucket); unmounts by path and PID."""

    def __init__(self, dirs: Dirs, mount_timeout: float = 60):
        self.dirs = dirs
        self.mounts: dict[tuple[str, str], Mount] = {}
        self.mount_timeout = mount_timeout
        self.counter = 0
        self.history: list[dict] = []   # every successful mount: time to answer, RSS right after

    def get(self, tool: Tool, bucket: str) -> Mount:
        m = self.mounts.get((tool.name, bucket))
        if m is not None and m.alive():
            return m
        return self.fresh(tool, bucket)

    def fresh(self, tool: Tool, bucket: str, purpose: str = "") -> Mount:
        """A new daemon on an empty mount point: nothing cached in the daemon or the kernel.
        `purpose` marks untimed helper mounts (e.g. "index build") in the mount history."""
        old = self.mounts.pop((tool.name, bucket), None)
        if old is not None:
            self._unmount(old)
        path = self.dirs.mnt(f"{tool.name}-{bucket}")
        if str(path) in mounted_paths():
            subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)
        self.counter += 1
        log_path = self.dirs.logs() / f"{tool.name}-{bucket}-{self.counter}.log"
        logf = open(log_path, "wb")
        tool.before_mount(bucket)
        t0 = time.perf_counter()
        proc = subprocess.Popen(tool.mount_argv(bucket, path), env=tool.mount_env(),
                                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        logf.close()
        m = Mount(tool, bucket, path, proc, log_path)
        deadline = time.monotonic() + self.mount_timeout
        while True:
            if str(path) in mounted_paths():
                break
            if proc.poll() is not None:
                raise MountError(f"{tool.name} exited with {proc.returncode} while mounting: "
                                 f"{m.log_tail()}")
            if time.monotonic() > deadline:
                self._kill(m)
                raise MountError(f"{tool.name} did not mount within {self.mount_timeout:.0f}s: "
                                 f"{m.log_tail()}")
            time.sleep(0.01)
        # The mount is in the table; wait until it answers (first getattr of the root).
        probe = subprocess.run(["stat", "-c", "%F", str(path)], capture_output=True, text=True,
                               timeout=self.mount_timeout)
        if probe.returncode != 0:
            self._unmount(m)
            raise MountError(f"{tool.name} mounted but the root does not answer: {probe.stderr.strip()}")
        m.mount_seconds = time.perf_counter() - t0
        m.history = {"tool": tool.name, "bucket": bucket, "seconds": m.mount_seconds,
                     "rss_kb": read_status_kb(m.pid, "VmRSS")}
        if purpose:
            m.history["purpose"] = purpose
        self.history.append(m.history)
        self.mounts[(tool.name, bucket)] = m
        return m

    def unmount(self, tool: Tool, bucket: str) -> None:
        m = self.mounts.pop((tool.name, bucket), None)
        if m is not None:
            self._unmount(m)

    def unmount_all(self) -> None:
        for key in list(self.mounts):
            m = self.mounts.pop(key)
            try:
                self._unmount(m)
            except Exception as e:  # keep going: leave no mount behind
                log(f"unmount of {m.path} failed: {e}")

    def _unmount(self, m: Mount) -> None:
        path = str(m.path)
        for attempt in range(20):
            if path not in mounted_paths():
                break
            cp = subprocess.run(["fusermount3", "-u", path], capture_output=True, text=True)
            if cp.returncode == 0:
                break
            time.sleep(0.25)
        else:
            subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True)
        try:
            m.proc.wait(15)
        except subprocess.TimeoutExpired:
            self._kill(m)
        if path in mounted_paths():
            subprocess.run(["fusermount3", "-u", "-z", path], capture_output=True)
        if m.proc.poll() is not None:
            m.tool.after_unmount(m.bucket)

    def _kill(self, m: Mount) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if m.proc.poll() is not None:
                break
            try:
                m.proc.send_signal(sig)
                m.proc.wait(10)
            except subprocess.TimeoutExpired:
                continue
            except OSError:
                break
        if str(m.path) in mounted_paths():
            subprocess.run(["fusermount3", "-u", "-z", str(m.path)], capture_output=True)

    def abort(self, m: Mount) -> None:
        """Kills a daemon that hung (e.g. after a timed-out command) and drops its mount."""
        self.mounts.pop((m.tool.name, m.bucket), None)
        self._kill(m)
