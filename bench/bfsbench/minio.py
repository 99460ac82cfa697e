"""A private MinIO server on a free loopback port, stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Optional

from .util import first_line, log

ACCESS_KEY = "bfsbench"
SECRET_KEY = "bfsbench-secret-key"   # a throwaway server on 127.0.0.1 only


def find_minio(explicit: Optional[str]) -> Optional[str]:
    for cand in (explicit, os.environ.get("BUCKETFS_MINIO"),
                 os.path.expanduser("~/.cache/bucketfs-deps/bin/minio"), shutil.which("minio")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MinIO:
    """`extra_env`: more environment for the server, e.g. `MINIO_API_REQUESTS_MAX` for the
    throttled store of the `throttled` workload."""

    def __init__(self, binary: str, data_dir: Path, log_path: Path,
                 extra_env: Optional[dict] = None):
        self.binary = binary
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_env = dict(extra_env or {})
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def version(self) -> str:
        return first_line([self.binary, "--version"])

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.data_dir.parent),
            "MINIO_ROOT_USER": ACCESS_KEY,
            "MINIO_ROOT_PASSWORD": SECRET_KEY,
            "MINIO_BROWSER": "off",
            "MINIO_UPDATE": "off",
            # The request counters (`/minio/metrics/v3/api/requests`) readable without a
            # token: S3Direct.wait_for watches them to tell when the writes have stopped.
            "MINIO_PROMETHEUS_AUTH_TYPE": "public",
            **self.extra_env,
        }
        for attempt in range(3):
            self.port = free_port()
            console = free_port()
            logf = open(self.log_path, "ab")
            self.proc = subprocess.Popen(
                [self.binary, "server", str(self.data_dir), "--address", f"127.0.0.1:{self.port}",
                 "--console-address", f"127.0.0.1:{console}", "--quiet"],
                env=env, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
            logf.close()
            if self._wait_ready(60):
                log(f"MinIO pid {self.proc.pid} on {self.url}, data in {self.data_dir}")
                return
            self.stop()
        raise RuntimeError(f"MinIO did not start; see {self.log_path}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with opener.open(f"{self.url}/minio/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
