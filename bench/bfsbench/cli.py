"""`bench/run`: builds what it needs, starts MinIO, sets up data, runs the workloads with the
tools interleaved, and writes the report."""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from . import report, sysinfo, util
from .context import Context
from .minio import MinIO, find_minio
from .profiles import PROFILES, get_profile
from .s3 import S3Direct
from .tools import (BucketFS, BucketFSIndex, BucketFSWriteBack, Direct, Dirs, GeeseFS, Local,
                    MountManager, MountpointS3, Rclone, S3FS, mounted_paths)
from .util import log
from .workloads import ALL as ALL_WORKLOADS, BY_NAME

BENCH = Path(__file__).resolve().parents[1]
REPO = BENCH.parent
FUSE_TOOLS = ["bucketfs", "s3fs", "rclone"]
# Run only when named in --tools: other bucketfs modes, to compare them in one run, and the
# peers that scripts/install-deps cannot install from the package registries (no machine has
# them by default, so a default run would only list them as missing).
OPTIONAL_TOOLS = ["bucketfs-wb", "bucketfs-index", "geesefs", "mountpoint-s3"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="bench/run",
        description="Benchmark bucketfs against s3fs, rclone mount (and geesefs, mountpoint-s3 "
                    "when named in --tools) and a direct S3 client on a private MinIO. See "
                    "bench/README.md.")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--smoke", dest="profile", action="store_const", const="smoke",
                      help="tiny sizes, 1 run: checks the machinery in under a minute (CI)")
    size.add_argument("--quick", dest="profile", action="store_const", const="quick",
                      help="reduced sizes, a few runs: about 10 minutes on 2 cores")
    size.add_argument("--full", dest="profile", action="store_const", const="full",
                      help="the articles' sizes (24 x 1 GiB, 71k-file tree, 8 GiB, 100k objects)")
    ap.add_argument("--tools", default=",".join(FUSE_TOOLS),
                    help=f"comma-separated FUSE tools to compare (default: {','.join(FUSE_TOOLS)}; "
                         "also bucketfs-wb: bucketfs --write-back, bucketfs-index: bucketfs "
                         "--index, whose cold cases load a saved listing index, and the peers "
                         "geesefs and mountpoint-s3; a bucketfs one with +uring, e.g. "
                         "bucketfs-index+uring, mounts with --fuse-transport uring, and then "
                         "the others with --fuse-transport dev-fuse)")
    ap.add_argument("--workloads", default=",".join(w.name for w in ALL_WORKLOADS),
                    help="comma-separated workloads: " + ", ".join(w.name for w in ALL_WORKLOADS))
    ap.add_argument("--runs", type=int, help="repetitions of every case (overrides the profile)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a profile field, e.g. --set large_count=4 --set rand_size=2GiB")
    ap.add_argument("--out", type=Path, help="output directory (default: bench/results, or "
                    "bench/results/raw/smoke for --smoke)")
    ap.add_argument("--workdir", type=Path, default=Path("/var/tmp"),
                    help="where MinIO's data and local files go (a disk, not tmpfs; default /var/tmp)")
    ap.add_argument("--keep-workdir", action="store_true", help="do not delete the work directory")
    ap.add_argument("--no-build", action="store_true", help="do not run cargo build first")
    ap.add_argument("--bucketfs-bin", default=str(REPO / "target/release/bucketfs"))
    ap.add_argument("--bucketfs-args", default="",
                    help="extra arguments for `bucketfs mount` (bucketfs-wb and "
                         "bucketfs-index too)")
    ap.add_argument("--index-prep", choices=["refresh", "stat"], default="refresh",
                    help="bucketfs-index: what the preparatory mount before each cold case does "
                         "before it unmounts and saves the index: refresh (list the bucket; "
                         "default), or stat (refresh, then du -s over the mount, so the saved "
                         "index also holds the files' stored attributes)")
    ap.add_argument("--s3direct-bin", default=str(REPO / "target/release/examples/s3direct"))
    ap.add_argument("--s3fs-opts", default="", help="extra -o options for s3fs (comma-separated)")
    ap.add_argument("--rclone-cache-mode", default="writes",
                    help="rclone --vfs-cache-mode (default: writes, as in the article)")
    ap.add_argument("--rclone-args", default="", help="extra arguments for rclone mount")
    ap.add_argument("--geesefs-bin", help="geesefs binary (default: ~/.cache/bucketfs-deps/bin/"
                    "geesefs or geesefs on PATH)")
    ap.add_argument("--geesefs-args", default="", help="extra arguments for geesefs")
    ap.add_argument("--mount-s3-bin", help="mountpoint-s3's mount-s3 binary (default: "
                    "~/.cache/bucketfs-deps/bin/mount-s3 or mount-s3 on PATH)")
    ap.add_argument("--mount-s3-args", default="", help="extra arguments for mount-s3")
    ap.add_argument("--minio", help="MinIO binary (default: $BUCKETFS_MINIO, "
                    "~/.cache/bucketfs-deps/bin/minio, or minio on PATH)")
    ap.add_argument("--timeout", type=float, help="per-command time limit in seconds")
    ap.add_argument("--render", type=Path, metavar="DIR",
                    help="only rewrite DIR/SUMMARY.md and the charts from DIR/results.json "
                         "(after a change to the report code; no measurement)")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    a.profile = a.profile or "quick"
    return a


def build(args) -> None:
    """cargo build of the direct client and of bucketfs (each may fail on its own)."""
    if args.no_build:
        return
    for what, cmd in (("s3direct", ["--example", "s3direct"]), ("bucketfs", ["--bin", "bucketfs"])):
        log(f"cargo build --release -p bucketfs {' '.join(cmd)}")
        cp = subprocess.run(["cargo", "build", "--release", "-p", "bucketfs", *cmd], cwd=REPO,
                            capture_output=True, text=True)
        if cp.returncode != 0:
            log(f"building {what} failed (continuing; it will be reported):\n"
                + "\n".join(cp.stderr.strip().splitlines()[-15:]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    util.VERBOSE = args.verbose
    if args.render:
        print(report.render(args.render))
        return 0
    overrides = dict(s.split("=", 1) for s in args.set)
    profile = get_profile(args.profile, overrides)
    if args.timeout:
        profile.timeout = args.timeout
    out = args.out or (BENCH / "results" / "raw" / "smoke" if args.profile == "smoke"
                       else BENCH / "results")
    started = datetime.datetime.now(datetime.timezone.utc)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    raw_dir = (BENCH / "results" / "raw" / f"{stamp}-{args.profile}") if args.out is None \
        else out / "raw"

    tool_names = [t.strip() for t in args.tools.split(",") if t.strip()]
    for t in tool_names:
        base, _, transport = t.partition("+")
        if base not in FUSE_TOOLS + OPTIONAL_TOOLS or (transport and (transport != "uring"
                                                                      or not base.startswith("bucketfs"))):
            raise SystemExit(f"unknown tool {t!r}; known: {', '.join(FUSE_TOOLS + OPTIONAL_TOOLS)}, "
                             "and each bucketfs one with +uring")
    wl_names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for w in wl_names:
        if w not in BY_NAME:
            raise SystemExit(f"unknown workload {w!r}; known: {', '.join(BY_NAME)}")

    if not shutil.which("fusermount3"):
        raise SystemExit("fusermount3 not found: run scripts/install-deps --bench")
    minio_bin = find_minio(args.minio)
    if not minio_bin:
        raise SystemExit("MinIO not found: run scripts/install-deps (or set BUCKETFS_MINIO)")
    build(args)
    if not os.access(args.s3direct_bin, os.X_OK):
        raise SystemExit(f"direct client {args.s3direct_bin} missing: "
                         "cargo build --release -p bucketfs --example s3direct")
    is_root = os.geteuid() == 0
    if not is_root:
        log("not root: page cache cannot be dropped; cold runs will only be fresh mounts")

    args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bfsbench-", dir=args.workdir))
    ramdisk = Path(tempfile.mkdtemp(prefix="bfsbench-", dir="/dev/shm"))
    dirs = Dirs(work)
    minio = MinIO(minio_bin, work / "minio-data", dirs.logs() / "minio.log")
    mounts = MountManager(dirs)

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    # A +uring variant's mount turns the kernel's (whole machine's) switch on: put it back.
    uring_switch = _read_uring_switch()
    t_start = time.monotonic()
    records: list[dict] = []
    workloads = []
    tools = []
    meta: dict = {}
    incomplete = None
    try:
        minio.start()
        dirs.home("s3direct").mkdir(parents=True)
        s3 = S3Direct(_stripped_copy(args.s3direct_bin, work / "bin"), minio.url,
                      str(dirs.home("s3direct")))
        fuse_tools = []
        # A private copy: a build finishing during the run cannot swap the binary mid-run.
        bucketfs_bin = _private_copy(args.bucketfs_bin, work / "bin")
        bfs = dict(binary=bucketfs_bin, extra_args=shlex.split(args.bucketfs_args),
                   shown_as=args.bucketfs_bin)
        for name in tool_names:
            base, _, transport = name.partition("+")
            bfs["transport"] = transport or None
            if base == "bucketfs":
                t = BucketFS(dirs, minio.url, **bfs)
            elif base == "bucketfs-wb":
                t = BucketFSWriteBack(dirs, minio.url, **bfs)
            elif base == "bucketfs-index":
                t = BucketFSIndex(dirs, minio.url, **bfs, prep=args.index_prep)
            elif name == "s3fs":
                t = S3FS(dirs, minio.url, args.s3fs_opts)
            elif name == "rclone":
                t = Rclone(dirs, minio.url, args.rclone_cache_mode, shlex.split(args.rclone_args))
            elif name == "geesefs":
                t = GeeseFS(dirs, minio.url, args.geesefs_bin, shlex.split(args.geesefs_args))
            else:
                t = MountpointS3(dirs, minio.url, args.mount_s3_bin, shlex.split(args.mount_s3_args))
            t.check()
            if t.missing:
                log(f"{name}: missing ({t.missing})")
            fuse_tools.append(t)
        tools = fuse_tools + [Direct(dirs, minio.url), Local(dirs, minio.url)]
        ctx = Context(profile=profile, work=work, ramdisk=ramdisk, s3=s3, mounts=mounts,
                      tools=tools, store_pid=minio.proc.pid, minio_bin=minio_bin,
                      can_drop_caches=is_root and os.access("/proc/sys/vm/drop_caches", os.W_OK))
        records = ctx.records
        meta = {
            "command": "bench/run " + " ".join(sys.argv[1:] if argv is None else argv),
            "started_utc": started.strftime("%Y-%m-%d %H:%M:%S"),
            "profile": profile.describe(),
            "machine": sysinfo.machine(work),
            "versions": sysinfo.versions(tools, minio.version()),
            "can_drop_caches": ctx.can_drop_caches,
            "tool_order": [t.name for t in tools if t.kind == "fuse"] + ["reference"],
            "mount_commands": {t.name: t.redacted_cmd() for t in fuse_tools},
        }
        runs_by_wl = {w: (args.runs or profile.runs_for(w)) for w in wl_names}
        meta["runs_text"] = ", ".join(f"{w}: {n}×" for w, n in runs_by_wl.items())
        for wl_cls in ALL_WORKLOADS:
            if wl_cls.name not in wl_names:
                continue
            wl = wl_cls(ctx)
            workloads.append(wl)
            log(f"== {wl.number}. {wl.title}: setting up data")
            t0 = time.monotonic()
            wl.setup()
            log(f"   set-up took {time.monotonic() - t0:.1f}s: {wl.facts}")
            active = [t for t in tools if wl.applies_to(t)]
            for t in active:
                if t.missing:
                    for case in wl.cases():
                        ctx.record(wl.name, case, t, None, "missing", error=t.missing)
            broken: dict[str, str] = {}
            for rep in range(runs_by_wl[wl.name]):
                for t in active:
                    if t.missing:
                        continue
                    if t.name in broken:
                        for case in wl.cases():
                            ctx.record(wl.name, case, t, rep, "failed", error=broken[t.name])
                        continue
                    try:
                        wl.run(t, rep)
                    except KeyboardInterrupt:
                        raise
                    except Exception as e:  # a tool's failure must not stop the others
                        msg = f"{type(e).__name__}: {e}"
                        log(f"  {t.name} failed in {wl.name} run {rep}: {msg}")
                        broken[t.name] = msg
                        done = ctx.recorded(wl.name, t, rep)
                        for case in wl.cases():
                            if case.id not in done:
                                ctx.record(wl.name, case, t, rep, "failed", error=msg)
            mounts.unmount_all()
            wl.teardown()
            wl.facts["workload_seconds"] = round(time.monotonic() - t0, 1)
    except KeyboardInterrupt as e:
        incomplete = f"interrupted ({e})"
        log(incomplete)
    except Exception as e:
        incomplete = f"{type(e).__name__}: {e}"
        log(f"run aborted: {incomplete}")
        if args.verbose:
            import traceback
            traceback.print_exc()
    finally:
        mounts.unmount_all()
        _restore_uring_switch(uring_switch)
        for wl in workloads:   # e.g. the throttled workload's own MinIO
            try:
                wl.close()
            except Exception as e:
                log(f"closing {wl.name} failed: {e}")
        minio.stop()
        shutil.copytree(dirs.logs(), raw_dir / "logs", dirs_exist_ok=True)
        _cleanup(work, ramdisk, keep=args.keep_workdir)

    if meta:
        meta["duration_seconds"] = time.monotonic() - t_start
        meta["incomplete"] = incomplete
        meta["mounts"] = mounts.history
        summary = report.write_all(out, raw_dir, meta, records, workloads, tools)
        print(summary)
    return 1 if incomplete else 0


def _private_copy(binary: str, dest_dir: Path) -> str:
    """A copy of the bucketfs binary in the work directory (as it is, debug info included, so
    that loading it costs what it did before); the original if it is missing."""
    if not os.access(binary, os.X_OK):
        return binary
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / "bucketfs"
    shutil.copy2(binary, dest)
    return str(dest)


def _stripped_copy(binary: str, dest_dir: Path) -> str:
    """A copy of the direct client without debug info: 19 MB instead of 125 MB to load after
    every page-cache drop. Falls back to the original."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / Path(binary).name
    if shutil.which("strip"):
        cp = subprocess.run(["strip", "-o", str(dest), binary], capture_output=True)
        if cp.returncode == 0:
            return str(dest)
    return binary


def _cleanup(work: Path, ramdisk: Path, keep: bool) -> None:
    still = [p for p in mounted_paths() if p.startswith(str(work))]
    if still:
        log(f"WARNING: mounts left under {work}: {still}; not deleting it")
        return
    shutil.rmtree(ramdisk, ignore_errors=True)
    if keep:
        log(f"work directory kept: {work}")
        return
    shutil.rmtree(work, ignore_errors=True)


URING_SWITCH = Path("/sys/module/fuse/parameters/enable_uring")


def _read_uring_switch() -> Optional[str]:
    try:
        return URING_SWITCH.read_text().strip()
    except OSError:
        return None


def _restore_uring_switch(found: Optional[str]) -> None:
    if found is not None and _read_uring_switch() != found:
        try:
            URING_SWITCH.write_text(found)
        except OSError as e:
            log(f"could not set {URING_SWITCH} back to {found}: {e}")
