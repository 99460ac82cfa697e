"""The direct client (crates/bucketfs/examples/s3direct.rs): set-up helper and baseline."""

from __future__ import annotations

import json
import shlex
import time
from typing import Optional

from .minio import ACCESS_KEY, SECRET_KEY
from .util import debug, run_quiet

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class S3Direct:
    """`global_args`: options before the subcommand, e.g. `--adaptive --max-attempts 50` for a
    client of the throttled store."""

    def __init__(self, binary: str, endpoint: str, home: str, global_args: tuple[str, ...] = ()):
        self.binary = binary
        self.endpoint = endpoint
        self.global_args = tuple(global_args)
        self.env = {
            "PATH": BASE_PATH,
            "HOME": home,
            "LANG": "C",
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        }

    def cmd(self, *args: str) -> str:
        """A shell command line running s3direct (for timed runs through run_timed)."""
        return " ".join(shlex.quote(a) for a in (self.binary, *self.global_args, *args))

    def call(self, *args: str, timeout: float = 3600, check: bool = True) -> dict:
        """Runs s3direct and returns its JSON line; with check=False a failed command returns
        its JSON line too when it printed one (`mixed` does), else {"exit": N, "stderr": ...}."""
        cp = run_quiet([self.binary, *self.global_args, *args], env=self.env, timeout=timeout,
                       check=check)
        debug(f"s3direct {' '.join(args[:3])}: {cp.stdout.strip()[:200]}")
        lines = cp.stdout.strip().splitlines()
        if not check and (cp.returncode != 0 and not lines):
            return {"exit": cp.returncode, "stderr": cp.stderr.strip()[-500:]}
        out = json.loads(lines[-1])
        if not check:
            out["exit"] = cp.returncode
        return out

    def mb(self, bucket: str) -> None:
        self.call("mb", bucket)

    def list(self, bucket: str, prefix: str = "") -> dict:
        return self.call("list", bucket, prefix, timeout=600)

    def rm_prefix(self, bucket: str, prefix: str) -> None:
        if not prefix:
            raise ValueError("refusing to empty a whole bucket")
        self.call("rm-prefix", bucket, prefix, timeout=3600)

    def wait_for(self, bucket: str, prefix: str, *, objects: int, nbytes: Optional[int] = None,
                 deadline: float) -> Optional[str]:
        """Polls until `prefix` holds exactly `objects` files (and `nbytes` bytes when given).

        Used after writes through a mount, so that a tool which uploads after close() is timed
        until its data is really in the bucket. Returns None when reached, else an error text.
        """
        last = None
        while True:
            try:
                last = self.list(bucket, prefix)
            except RuntimeError as e:
                return f"listing failed: {e}"
            if last["objects"] == objects and (nbytes is None or last["bytes"] == nbytes):
                return None
            if time.monotonic() > deadline:
                want = f"{objects} objects" + (f" / {nbytes} bytes" if nbytes is not None else "")
                return f"bucket never reached {want} (has {last['objects']} / {last['bytes']})"
            time.sleep(0.05)
