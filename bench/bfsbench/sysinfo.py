"""Machine facts and tool versions, recorded with every run."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from .util import first_line

REPO = Path(__file__).resolve().parents[2]


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total() -> int:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _os_release() -> str:
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return platform.platform()


def _fs_of(path: Path) -> str:
    cp = subprocess.run(["df", "--output=fstype", str(path)], capture_output=True, text=True)
    lines = cp.stdout.strip().splitlines()
    return lines[-1].strip() if len(lines) > 1 else "unknown"


def _git_rev() -> str:
    cp = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                        capture_output=True, text=True)
    rev = cp.stdout.strip() or "no commit"
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return rev + (" (with uncommitted changes)" if dirty else "")


def _cargo_lock_version(crate: str) -> str:
    try:
        text = (REPO / "Cargo.lock").read_text()
    except OSError:
        return "unknown"
    m = re.search(r'name = "%s"\nversion = "([^"]+)"' % re.escape(crate), text)
    return m.group(1) if m else "unknown"


def machine(work: Path) -> dict:
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "ram_bytes": _mem_total(),
        "kernel": platform.release(),
        "os": _os_release(),
        "minio_data_fs": _fs_of(work),
        "ramdisk_fs": _fs_of(Path("/dev/shm")),
    }


def versions(tools, minio_version: str) -> dict:
    v = {}
    for t in tools:
        if t.kind == "fuse":
            v[t.name] = t.version() if not t.missing else f"missing: {t.missing}"
    v["s3direct"] = f"aws-sdk-s3 {_cargo_lock_version('aws-sdk-s3')} (crates/bucketfs/examples/s3direct.rs)"
    v["bucketfs source"] = _git_rev()
    v["minio"] = minio_version
    v["fuse3 (fusermount3)"] = first_line(["fusermount3", "--version"])
    v["kernel FUSE"] = platform.release()
    v["rustc"] = first_line(["rustc", "--version"]) if shutil.which("rustc") else "not found"
    v["python"] = platform.python_version()
    try:
        import matplotlib
        v["matplotlib"] = matplotlib.__version__
    except ImportError:
        v["matplotlib"] = "not installed"
    v["tar"] = first_line(["tar", "--version"])
    v["grep"] = first_line(["grep", "--version"])
    v["find"] = first_line(["find", "--version"])
    v["coreutils (cat, cp, ls, stat)"] = first_line(["cat", "--version"])
    return v
