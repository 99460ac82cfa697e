"""The direct client (crates/bucketfs/examples/s3direct.rs): set-up helper and baseline."""

from __future__ import annotations

import json
import re
import shlex
import time
import urllib.request
from typing import Callable, Optional

from .minio import ACCESS_KEY, SECRET_KEY
from .util import Settled, debug, run_quiet

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def minio_request_counts(endpoint: str) -> dict[str, float]:
    """How many requests of each S3 API (`PutObject`, `ListObjectsV2`, ...) a MinIO has
    answered, from its metrics (`/minio/metrics/v3/api/requests`, public on the bench's own
    server); empty if it does not say."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(endpoint.rstrip("/") + "/minio/metrics/v3/api/requests", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        found = re.match(r'minio_api_requests_total\{.*name="([^"]+)".*\} (\S+)$', line)
        if found:
            counts[found[1]] = counts.get(found[1], 0.0) + float(found[2])
    return counts


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

    # Listing is no light probe: a LIST of the tree workload's 7,700 keys costs MinIO about
    # 0.36 CPU-seconds and half a second. Listed again and again while a tool uploads, it
    # takes the store's CPU from those uploads, and most from the tool whose command returned
    # first. So where the store counts its requests (MinIO's metrics, public on the bench's
    # own server), `wait_for` watches the count of writes and lists only once it has not
    # moved for QUIET seconds.
    QUIET = 0.3
    POLL = 0.05
    READ_REQUESTS = re.compile(r"Get|Head|List")

    def wait_for(self, bucket: str, prefix: str, *, objects: int, nbytes: Optional[int] = None,
                 deadline: float) -> Settled:
        """Polls until `prefix` holds exactly `objects` files (and `nbytes` bytes when given).

        Used after writes through a mount, so that a tool which uploads after close() is timed
        until its data is really in the bucket: until the store's last write, where it counts
        them (then the time spent making sure is not the tool's), else until the listing
        shows them. Its `error` is None once they are there.
        """
        writes = self._write_counter()
        if writes is None:
            return self._poll_listing(bucket, prefix, objects, nbytes, deadline)
        seen, last_write = writes(), time.monotonic()
        while True:
            time.sleep(self.POLL)
            count, now = writes(), time.monotonic()
            if count is None:   # the counters went away: fall back on listing
                return self._poll_listing(bucket, prefix, objects, nbytes, deadline)
            if count != seen:
                seen, last_write = count, now
                continue
            if now - last_write < self.QUIET and now <= deadline:
                continue
            complete, last = self._complete(bucket, prefix, objects, nbytes)
            if complete and writes() == seen:
                return Settled(last_write=last_write)
            if last is None:
                return Settled(error="listing failed")
            if time.monotonic() > deadline:
                return Settled(error=self._short_of(objects, nbytes, last))
            # Not there yet (a tool that pauses between writes): list again after the next
            # quiet spell.
            last_write = time.monotonic()

    def _write_counter(self) -> Optional[Callable[[], Optional[float]]]:
        """A function that returns how many writes (requests other than GET, HEAD and LIST)
        the store has answered, or None if the store does not say (not MinIO, or its metrics
        are not public)."""
        def count() -> Optional[float]:
            counts = minio_request_counts(self.endpoint)
            writes = [n for name, n in counts.items() if not self.READ_REQUESTS.match(name)]
            # A store that answered no write yet lists none; a bench run has made buckets.
            return sum(writes) if writes else None

        return count if count() is not None else None

    def _complete(self, bucket: str, prefix: str, objects: int,
                  nbytes: Optional[int]) -> tuple[bool, Optional[dict]]:
        """Whether `prefix` holds exactly that, and what the listing showed (None if it failed)."""
        try:
            last = self.list(bucket, prefix)
        except RuntimeError:
            return False, None
        return last["objects"] == objects and (nbytes is None or last["bytes"] == nbytes), last

    @staticmethod
    def _short_of(objects: int, nbytes: Optional[int], last: dict) -> str:
        want = f"{objects} objects" + (f" / {nbytes} bytes" if nbytes is not None else "")
        return f"bucket never reached {want} (has {last['objects']} / {last['bytes']})"

    def _poll_listing(self, bucket: str, prefix: str, objects: int, nbytes: Optional[int],
                      deadline: float) -> Settled:
        while True:
            complete, last = self._complete(bucket, prefix, objects, nbytes)
            if complete:
                return Settled()
            if last is None:
                return Settled(error="listing failed")
            if time.monotonic() > deadline:
                return Settled(error=self._short_of(objects, nbytes, last))
            time.sleep(self.POLL)
