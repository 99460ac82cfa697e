"""W9 — throttled store (issue 32): 32 readers and 8 writers of 16 MiB files through one mount,
all at once, against a MinIO that refuses what it cannot serve at once. Every byte read must be
right, every file written must be stored, with no error, in at most 1.5x the time the AWS SDK's
own client takes for the same GETs and PUTs with its adaptive retries.

The throttled store is a second MinIO process started by the workload, with
`MINIO_API_REQUESTS_MAX` (profile field `throttle_requests_max`) and
`MINIO_API_REQUESTS_DEADLINE` (`throttle_deadline`) set. What that MinIO answers, found by
experiment with the MinIO the bench installs (`scripts/install-deps`, built from
github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c) and read in its source
(cmd/handler-api.go `maxClients`, cmd/api-response.go `writeErrorResponse`):

- A request that arrives while `requests_max` others are being served is refused at once with
  **HTTP 429 Too Many Requests**, S3 error code **`TooManyRequests`**, message "Please reduce
  your request rate", and the headers **`Retry-After: 60`**, `X-RateLimit-Limit: N` and
  `X-RateLimit-Remaining: 0` (every answer of a limited server carries the two `X-RateLimit-*`
  headers; no `x-amz-retry-after`). A HEAD gets the 429 with no body, so no code.
- A request holds its slot until its handler returns: a GET for as long as its body streams, a
  PUT while its body is read. Measured (s3direct `mixed`, one attempt per request, 32 GETs and
  8 PUTs of 16 MiB at once on loopback): `requests_max=4` refused 36 of the 40 (PUTs too: each
  a 429 with the XML body, no connection reset seen), 8 refused 26, 16 refused 24.
- `MINIO_API_REQUESTS_DEADLINE` is a deprecated key in this MinIO: it is accepted and ignored.
  Requests are not queued until a deadline; they are refused as soon as the slots are full.
- `requests_max` has no minimum: 0 means "computed from RAM" (thousands here), any N >= 1 is
  used as given (divided by the number of nodes: 1).

The AWS SDK for Rust does not retry a 429 `TooManyRequests` by itself: its throttling codes are
`Throttling`, `ThrottlingException`, `TooManyRequestsException`, `SlowDown`,
`RequestLimitExceeded`... and its transient statuses 500/502/503/504 (measured: with standard or
adaptive retries and 5 or 50 attempts, 32 to 35 of the 40 requests fail at once with
"unhandled error (TooManyRequests)"). The reference (`s3direct --adaptive mixed`) therefore adds
a retry classifier that calls HTTP 429 a throttling error, so that the SDK's adaptive mode
(backoff plus its client-side rate limiter) does the rest. That mode is slow here: its rate
limiter has measured no sending rate yet when the first 429s come, so it drops to its floor of
0.5 requests/s and climbs back slowly (measured at `requests_max=4`: 74-92 s for the 40
requests, against 3-4 s with the standard mode and the same classifier). The table also gives
the standard mode's time (`direct-standard`) for comparison.

Each repetition, per FUSE tool, on a fresh mount of the throttled store (page cache dropped):
`throttle_readers` processes each `sha256sum` one object and `throttle_writers` processes each
`cp` one file from a RAM disk into the mount, all started together. The time runs until all of
them have exited and every file whose `cp` succeeded is listed in the bucket with its full size
(ListObjectsV2 polled through the direct client, as the other write cases do); then, untimed,
the written objects are read back by the direct client and their SHA-256 compared. A run with
any read failed or wrong, any write failed or not stored, is recorded as failed, with its time
and what went wrong (stderr of the process: the errno text).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from ..context import Case, q
from ..datagen import write_large_file
from ..minio import MinIO
from ..s3 import S3Direct
from ..util import Settled, fmt_size, log, run_timed
from .base import Workload

BUCKET = "bench-throttled"
READ_PREFIX = "r/"
TAG = "throttled"
# The bound: elapsed at most this many times the reference's.
LIMIT = 1.5


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _normalize(msg: str) -> str:
    """An error line without its paths and keys, so that equal errors count together."""
    msg = re.sub(r"'[^']*'|\"[^\"]*\"|(?<![\w/])/\S+", "", msg.strip())
    msg = re.sub(r"\s+:", ":", re.sub(r"\s{2,}", " ", msg))
    return msg.strip()[:200] or "(no message)"


class Throttled(Workload):
    name = "throttled"
    number = 9
    title = "Throttled store"
    what = ("Issue 32: readers and writers at once through one mount against a MinIO that "
            "refuses requests over its `MINIO_API_REQUESTS_MAX` (HTTP 429 `TooManyRequests`, "
            "`Retry-After: 60`). Each reader `sha256sum`s one object, each writer `cp`s one file "
            "from a RAM disk, all started together on a fresh mount of that MinIO (the mount "
            "commands above with its endpoint; page cache dropped); timed "
            "until all have exited and every written file is listed in the bucket with its size; "
            "then the written objects' SHA-256 is checked (untimed). Every read must be right, "
            "every write stored, with no error, in at most "
            f"{LIMIT}× the reference: the same GETs and PUTs at once by the AWS SDK's own client "
            "in adaptive retry mode (`s3direct --adaptive mixed`, with a classifier making 429 "
            "a throttling error, which the SDK does not do by itself).")
    chart_metric = "seconds"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.server: Optional[MinIO] = None
        self.s3: Optional[S3Direct] = None
        self.targets: dict = {}

    def make_cases(self) -> list[Case]:
        r, w, s = self.p.throttle_readers, self.p.throttle_writers, self.p.throttle_size
        return [Case("mixed", f"{r} readers + {w} writers of {fmt_size(s)} at once, one mount, "
                              f"MinIO limited to {self.p.throttle_requests_max} requests",
                     kind="write", ref="direct", nbytes=(r + w) * s,
                     ref_title=f"s3direct --adaptive mixed: the {r} GETs and {w} PUTs at once, "
                               "SDK adaptive retries")]

    # -- set-up ---------------------------------------------------------------------------------

    def setup(self) -> None:
        ctx, p = self.ctx, self.p
        if not ctx.minio_bin:
            raise RuntimeError("no MinIO binary to start the throttled store with")
        self.server = MinIO(ctx.minio_bin, ctx.work / "minio-throttled-data",
                            ctx.work / "logs" / "minio-throttled.log",
                            extra_env={"MINIO_API_REQUESTS_MAX": str(p.throttle_requests_max),
                                       "MINIO_API_REQUESTS_DEADLINE": p.throttle_deadline})
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        ctx, p = self.ctx, self.p
        self.server.start()
        log(f"   throttled MinIO pid {self.server.proc.pid} on {self.server.url} "
            f"(MINIO_API_REQUESTS_MAX={p.throttle_requests_max}, "
            f"MINIO_API_REQUESTS_DEADLINE={p.throttle_deadline})")
        # Direct clients of the throttled store, both classifying HTTP 429 as throttling: the
        # reference (the SDK's adaptive retries), and one with its standard retries for the
        # set-up, the polls and checks (the adaptive mode's rate limiter drops to 0.5 requests/s
        # at its first 429 and would make a poll during a tool's uploads take seconds) and for
        # the comparison row.
        attempts = ("--max-attempts", str(p.throttle_max_attempts))
        self.s3 = S3Direct(ctx.s3.binary, self.server.url, ctx.s3.env["HOME"],
                           global_args=("--adaptive", *attempts))
        self.s3_standard = S3Direct(ctx.s3.binary, self.server.url, ctx.s3.env["HOME"],
                                    global_args=attempts)
        self.s3_standard.mb(BUCKET)
        size, n = p.throttle_size, p.throttle_readers
        # The objects to read: generated on disk, hashed, uploaded two at a time (fewer than
        # the store's slots, so set-up is not throttled; it would be retried if it were).
        src = ctx.work / "throttled-src"
        src.mkdir(parents=True, exist_ok=True)
        self.reads: list[tuple[str, str]] = []   # (key, sha256)
        for i in range(n):
            f = src / f"obj_{i:02d}.bin"
            write_large_file(f, size, seed=1000 + i)
            self.reads.append((f"{READ_PREFIX}{f.name}", _sha256(f)))
        self.s3_standard.call("put-dir", str(src), BUCKET, READ_PREFIX, "--concurrency", "2",
                              timeout=3600)
        shutil.rmtree(src, ignore_errors=True)
        listed = self.s3_standard.list(BUCKET, READ_PREFIX)
        if listed["objects"] != n or listed["bytes"] != n * size:
            raise RuntimeError(f"set-up of the throttled store: listed {listed}, expected {n} "
                               f"objects of {size} bytes")
        # The files to write: on the RAM disk, each its own bytes.
        wdir = ctx.ramdisk / "throttled-writes"
        wdir.mkdir(parents=True, exist_ok=True)
        self.writes: list[tuple[Path, str]] = []   # (source file, sha256)
        for j in range(p.throttle_writers):
            f = wdir / f"new_{j:02d}.bin"
            write_large_file(f, size, seed=2000 + j)
            self.writes.append((f, _sha256(f)))
        self.targets = {t.name: t.at_endpoint(self.server.url, TAG)
                        for t in ctx.tools if t.kind == "fuse" and not t.missing}
        self.facts = {"readers": n, "writers": p.throttle_writers, "file_size": size,
                      "requests_max": p.throttle_requests_max,
                      "requests_deadline": f"{p.throttle_deadline} (ignored by this MinIO)",
                      "reference_max_attempts": p.throttle_max_attempts,
                      "write_source": "RAM disk (/dev/shm)"}

    def teardown(self) -> None:
        self.close()
        shutil.rmtree(self.ctx.ramdisk / "throttled-writes", ignore_errors=True)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()

    # -- one repetition -------------------------------------------------------------------------

    def run(self, tool, rep: int) -> None:
        if tool.kind != "direct":
            return self._one(tool, rep)
        # The reference (the issue's: adaptive retries), then the same with the SDK's standard
        # retries, recorded apart (`direct-standard`) for comparison.
        self._one(tool, rep, self.s3)
        self._one(SdkStandard(), rep, self.s3_standard)

    def _one(self, tool, rep: int, client: Optional[S3Direct] = None) -> None:
        ctx, p = self.ctx, self.p
        case = self.case("mixed")
        prefix = f"w-{tool.name}-r{rep}-"
        keys = [f"{prefix}{j:02d}.bin" for j in range(p.throttle_writers)]
        res = ctx.ramdisk / "throttled-results" / f"{tool.name}-r{rep}"
        shutil.rmtree(res, ignore_errors=True)
        res.mkdir(parents=True)
        stored: dict = {}
        mount = None
        if tool.kind == "direct":
            ctx.drop_caches()
            cmd = client.cmd("mixed", BUCKET,
                             *[f"--get={k}={sha}" for k, sha in self.reads],
                             *[f"--put={src}={k}" for (src, _), k in zip(self.writes, keys)])
            cmd += f" >{q(res / 'mixed.json')} 2>{q(res / 'mixed.err')}"
            env = client.env
        else:
            if self.unsupported_writes(tool, rep, ["mixed"]):
                return
            mount = ctx.fresh_cold(self.targets[tool.name], BUCKET)
            jobs = []
            readers = [(i, mount.path / k) for i, (k, _) in enumerate(self.reads)]
            writers = [(j, src, mount.path / k) for j, ((src, _), k) in enumerate(zip(self.writes, keys))]
            # Writers spread among the readers, so that both kinds start together.
            every = max(1, len(readers) // max(1, len(writers)))
            for i, path in readers:
                jobs.append(f"( sha256sum -- {q(path)} >{q(res / f'r{i:02d}.out')} "
                            f"2>{q(res / f'r{i:02d}.err')}; echo $? >{q(res / f'r{i:02d}.rc')} ) &")
                if i % every == 0 and writers:
                    j, src, dest = writers.pop(0)
                    jobs.append(f"( cp -- {q(src)} {q(dest)} 2>{q(res / f'w{j:02d}.err')}; "
                                f"echo $? >{q(res / f'w{j:02d}.rc')} ) &")
            for j, src, dest in writers:
                jobs.append(f"( cp -- {q(src)} {q(dest)} 2>{q(res / f'w{j:02d}.err')}; "
                            f"echo $? >{q(res / f'w{j:02d}.rc')} ) &")
            cmd = " ".join(jobs) + " wait"
            env = ctx.local_env

        def written_ok() -> list[str]:
            """Keys whose writer reported success (the reference: PUTs not in its error list)."""
            if tool.kind == "direct":
                failed = " ".join(self._direct_errors(res))
                return [k for k in keys if f"PUT {k}:" not in failed]
            return [k for j, k in enumerate(keys) if _read(res / f"w{j:02d}.rc") == "0"]

        def settle(deadline: float) -> Settled:
            # Until every successfully written file is listed with its size; the outcome is
            # counted below (a write never stored is a failed write, not a lost time).
            stored.update(self._wait_listed(prefix, written_ok(), deadline))
            return Settled()

        # Its own limit: rclone, whose pacer slows all its requests down after 429s, takes minutes.
        timeout = max(p.timeout, p.throttle_timeout)
        run = run_timed(cmd, env=env, timeout=timeout, settle=settle,
                        daemon_pid=mount.pid if mount else None)
        if not stored:   # the command failed or timed out: what is there now
            stored.update(self._listed(prefix))
        reads_ok, writes_ok, read_errors, write_errors, examples = self._outcomes(
            tool, res, keys, stored, written_ok())
        extra: dict = {"reads": len(self.reads), "reads_ok": reads_ok,
                       "writes": len(keys), "writes_ok": writes_ok,
                       "read_errors": dict(read_errors), "write_errors": dict(write_errors),
                       "error_examples": examples[:6]}
        if run.returned_seconds is not None:
            extra["returned_seconds"] = run.returned_seconds
        if tool.kind == "direct":
            out = self._direct_json(res)
            for k in ("responses", "throttled_responses"):
                if k in out:
                    extra[k] = out[k]
        problems = []
        if run.timed_out:
            problems.append(run.error)
        elif run.error and tool.kind != "direct":
            problems.append(run.error)
        if mount is not None and not mount.alive():
            problems.append(f"{tool.name} daemon exited: {mount.log_tail()}")
            ctx.mounts.abort(mount)
        elif mount is not None and run.timed_out:
            ctx.mounts.abort(mount)
        nerr = sum(read_errors.values()) + sum(write_errors.values())
        if nerr:
            problems.insert(0, f"{len(self.reads) - reads_ok}/{len(self.reads)} reads and "
                               f"{len(keys) - writes_ok}/{len(keys)} writes failed: "
                               + "; ".join(f"{n}× {m}" for m, n in
                                           (read_errors + write_errors).most_common(3)))
        status = "failed" if problems else "ok"
        ctx.record(self.name, case, tool, rep, status,
                   seconds=None if run.timed_out else run.seconds,
                   daemon_rss_kb=run.daemon_rss_kb, client_rss_kb=run.client_rss_kb,
                   error="; ".join(problems) or None, extra=extra)
        if mount is not None:
            ctx.mounts.unmount(self.targets[tool.name], BUCKET)
        self.s3_standard.rm_prefix(BUCKET, prefix)
        shutil.rmtree(res, ignore_errors=True)

    # -- helpers --------------------------------------------------------------------------------

    def _listed(self, prefix: str) -> dict:
        out = self.s3_standard.call("list", BUCKET, prefix, "--keys", timeout=600)
        return {k: size for k, size in out.get("keys", [])}

    def _wait_listed(self, prefix: str, keys: list[str], deadline: float) -> dict:
        size = self.p.throttle_size
        while True:
            listed = self._listed(prefix)
            if all(listed.get(k) == size for k in keys) or time.monotonic() > deadline:
                return listed
            time.sleep(0.1)

    @staticmethod
    def _direct_json(res: Path) -> dict:
        try:
            return json.loads((res / "mixed.json").read_text().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            return {}

    def _direct_errors(self, res: Path) -> list[str]:
        out = self._direct_json(res)
        if "error_list" in out:
            return list(out["error_list"])
        err = _read(res / "mixed.err")
        return [err or "s3direct printed no result"]

    def _outcomes(self, tool, res: Path, keys: list[str], stored: dict, written: list[str]):
        """Counts reads right and writes stored; errors grouped by their text without paths."""
        read_errors: Counter = Counter()
        write_errors: Counter = Counter()
        examples: list[str] = []
        size = self.p.throttle_size
        if tool.kind == "direct":
            errors = self._direct_errors(res)
            for e in errors:
                (write_errors if e.startswith("PUT ") else read_errors)[_normalize(
                    e.split(":", 1)[-1])] += 1
                examples.append(e[:300])
            reads_ok = len(self.reads) - sum(read_errors.values())
        else:
            reads_ok = 0
            for i, (key, sha) in enumerate(self.reads):
                rc = _read(res / f"r{i:02d}.rc")
                out = _read(res / f"r{i:02d}.out")
                if rc == "0" and out.split(" ", 1)[0] == sha:
                    reads_ok += 1
                    continue
                if rc == "0":
                    msg = "wrong bytes (SHA-256 differs)"
                elif rc is None:
                    msg = "no result (reader killed)"
                else:
                    err = _read(res / f"r{i:02d}.err") or f"exit {rc}"
                    msg = _normalize(err.splitlines()[-1])
                    examples.append(f"read {key}: exit {rc}: {err.strip()[-200:]}")
                read_errors[msg] += 1
            for j, key in enumerate(keys):
                rc = _read(res / f"w{j:02d}.rc")
                if rc is None:
                    write_errors["no result (writer killed)"] += 1
                elif rc != "0":
                    err = _read(res / f"w{j:02d}.err") or f"exit {rc}"
                    write_errors[_normalize(err.splitlines()[-1])] += 1
                    examples.append(f"write {key}: exit {rc}: {err.strip()[-200:]}")
        # Every write the writer took for done must be stored whole with its bytes.
        listed_right = [k for k in written if stored.get(k) == size]
        for k in written:
            if k not in stored:
                write_errors["not stored (not listed)"] += 1
            elif stored[k] != size:
                write_errors[f"stored with {stored[k]} bytes"] += 1
        writes_ok = 0
        if listed_right:
            # Read back by the direct client: the SHA-256 of what is stored.
            want = {k: self.writes[keys.index(k)][1] for k in listed_right}
            check = self.s3_standard.call("mixed", BUCKET,
                                          *[f"--get={k}={sha}" for k, sha in want.items()],
                                          timeout=3600, check=False)
            if check.get("exit") and "error_list" not in check:
                write_errors[f"could not check: {_normalize(check.get('stderr', ''))}"] += \
                    len(listed_right)
                return reads_ok, 0, read_errors, write_errors, examples
            failed = {e[4:].split(":", 1)[0]: e for e in check.get("error_list", [])}
            for k in listed_right:
                if k not in failed:
                    writes_ok += 1
                elif "SHA-256" in failed[k]:
                    write_errors["stored with other bytes (SHA-256 differs)"] += 1
                else:
                    write_errors[f"stored but unreadable: {_normalize(failed[k])}"] += 1
        return reads_ok, writes_ok, read_errors, write_errors, examples


class SdkStandard:
    """The row of the SDK's standard retry mode (same classifier, same attempts), for comparison
    with the reference's adaptive mode; not a reference of any table."""
    name = "direct-standard"
    kind = "direct"
    label = "direct S3, SDK standard retries"


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def summarize(records: list[dict], wl: str, case: str, tools: list[str]) -> Optional[dict]:
    """The issue-32 table of a case: one row per tool and run (the reference last), with the
    elapsed time, its ratio to the reference's median, reads right, writes stored, errors."""
    recs = [r for r in records if r["workload"] == wl and r["case"] == case
            and "reads" in (r.get("extra") or {})]
    if not recs:
        return None
    def ok_median(name: str) -> Optional[float]:
        ok = [r["seconds"] for r in recs if r["tool"] == name and r["status"] == "ok"
              and r["seconds"]]
        return statistics.median(ok) if ok else None

    ref_median = ok_median("direct")
    std_median = ok_median(SdkStandard.name)
    rows = []
    for name in [*tools, "direct", SdkStandard.name]:
        for r in sorted((r for r in recs if r["tool"] == name), key=lambda r: r["rep"]):
            x = r["extra"]
            errors = Counter(x.get("read_errors", {})) + Counter(x.get("write_errors", {}))
            nerr = sum(errors.values())
            ratio = r["seconds"] / ref_median if r["seconds"] and ref_median else None
            if name == "direct":
                verdict = "reference" if r["status"] == "ok" else "reference failed"
            elif name == SdkStandard.name:
                verdict = "for comparison" if r["status"] == "ok" else "failed"
            elif nerr or r["status"] != "ok":
                verdict = "no: errors"
            elif ratio is None:
                verdict = "no reference"
            else:
                verdict = "yes" if ratio <= LIMIT else f"no: over {LIMIT}×"
            rows.append({"tool": name, "rep": r["rep"], "status": r["status"],
                         "seconds": r["seconds"], "x_ref": ratio,
                         "x_standard": (r["seconds"] / std_median
                                        if r["seconds"] and std_median else None),
                         "reads_ok": x["reads_ok"], "reads": x["reads"],
                         "writes_ok": x["writes_ok"], "writes": x["writes"],
                         "errors": nerr,
                         "read_errors": x.get("read_errors", {}),
                         "write_errors": x.get("write_errors", {}),
                         "error": r.get("error"),
                         "responses": x.get("responses"),
                         "throttled_responses": x.get("throttled_responses"),
                         "returned_seconds": x.get("returned_seconds"),
                         "meets": verdict})
    return {"limit": LIMIT, "ref_median": ref_median, "standard_median": std_median, "rows": rows}
