"""Smoke test of the bench driver: `bench/run --smoke` end to end, at tiny sizes.

    python3 -m pytest -q bench/test_bench_smoke.py

Needs MinIO (scripts/install-deps) and fusermount3; uses whatever of bucketfs, s3fs and rclone
is present (the others must be reported as missing, not dropped). Set BENCH_SMOKE_NO_BUILD=1 to
skip the cargo build step when the binaries are already built, and BENCH_BUCKETFS_BIN /
BENCH_S3DIRECT_BIN to use copies of them (so that a concurrent cargo build cannot swap them).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from bfsbench.minio import find_minio  # noqa: E402
from bfsbench.workloads import ALL  # noqa: E402


def test_treegen_is_deterministic_and_linux_shaped():
    from bfsbench.treegen import plan_tree

    a, b = plan_tree(0.01), plan_tree(0.01)
    assert a.files == b.files and a.dirs == b.dirs
    full = plan_tree(1.0).stats()
    assert 70_000 <= full["files"] <= 72_000
    assert 4_300 <= full["dirs"] <= 5_100
    assert 12_000 <= full["avg_file_bytes"] <= 16_000
    assert 0.25 <= full["h_files"] / full["files"] <= 0.4


def test_ls_lr_line_count_matches_ls(tmp_path):
    # The check of the tree's `ls -lR | wc -l` case, on a small tree with hidden names (the
    # full shape has dot-files at its top, which ls -l does not show).
    import types
    from bfsbench.workloads.tree import ls_lr_lines

    dirs = ["r", "r/a", "r/a/b", "r/.hidden", "r/.hidden/c"]
    files = [("r/x.h", 1), ("r/.gitignore", 1), ("r/a/y.c", 2), ("r/a/b/z", 3),
             ("r/.hidden/w", 1), ("r/.hidden/c/v", 1)]
    root = tmp_path / "src"
    for d in dirs:
        (root / d).mkdir(parents=True)
    for f, n in files:
        (root / f).write_bytes(b"x" * n)
    out = subprocess.run(f"ls -lR {root} | wc -l", shell=True, capture_output=True, text=True,
                         check=True, env={"PATH": os.environ["PATH"], "LC_ALL": "C"})
    assert int(out.stdout) == ls_lr_lines(types.SimpleNamespace(files=files, dirs=dirs))


def test_put_gen_mirror_is_offset_consistent():
    from bfsbench.datagen import put_gen_bytes

    whole = put_gen_bytes(7, 0, 100)
    assert len(whole) == 100
    assert put_gen_bytes(7, 13, 37) == whole[13:50]
    assert put_gen_bytes(8, 0, 100) != whole


def run_smoke(out: Path, *args: str) -> None:
    """bench/run --smoke into `out`, with the binaries and build choice from the environment."""
    assert find_minio(None) is not None, "MinIO not installed: run scripts/install-deps"
    cmd = [sys.executable, str(BENCH / "run"), "--smoke", "--out", str(out), *args]
    if os.environ.get("BENCH_SMOKE_NO_BUILD"):
        cmd.append("--no-build")
    for var, opt in (("BENCH_BUCKETFS_BIN", "--bucketfs-bin"),
                     ("BENCH_S3DIRECT_BIN", "--s3direct-bin")):
        if os.environ.get(var):
            cmd += [opt, os.environ[var]]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert cp.returncode == 0, cp.stderr[-3000:]


def test_smoke_run_writes_a_table_per_workload(tmp_path):
    run_smoke(tmp_path)

    summary = (tmp_path / "SUMMARY.md").read_text()
    for wl in ALL:
        heading = f"## {wl.number}. {wl.title} (`--workloads {wl.name}`)"
        assert heading in summary, f"no section for {wl.name}"
        section = summary.split(heading, 1)[1].split("\n## ", 1)[0]
        assert "| case / tool | median |" in section, f"no table for {wl.name}"
        assert (tmp_path / f"{wl.number}-{wl.name}.png").exists() or "matplotlib" in summary

    data = json.loads((tmp_path / "results.json").read_text())
    statuses = {m["status"] for m in data["measurements"]}
    assert statuses <= {"ok", "failed", "unsupported", "missing"}
    # Every requested FUSE tool appears in every case: measured, unsupported or missing.
    for table in data["tables"]:
        for case in table["cases"]:
            assert [r["tool"] for r in case["rows"]] == ["bucketfs", "s3fs", "rclone"]
            assert all(r["status"] != "not run" for r in case["rows"]), case["id"]
    # The reference rows ran (the direct client and the local file system are always present).
    refs = [c[key] for t in data["tables"] for c in t["cases"] for key in ("ref_row", "ref2_row")
            if c.get(key)]
    assert refs and all(r["status"] == "ok" for r in refs), [r for r in refs if r["status"] != "ok"]
    # The tree's read cases have the local file system as a second reference.
    tree = next(t for t in data["tables"] if t["workload"] == "tree")
    assert {c["id"] for c in tree["cases"] if c.get("ref2") == "local"} == \
        {"find_cold", "find_warm", "ls_lr", "du"}
    # The cached group's measured rows say what the cache took on disk (bucketfs's within its
    # cap), what MinIO sent during the timed read, and how it compares with the local read
    # timed next to it.
    cached = next(t for t in data["tables"] if t["workload"] == "cached")
    for case in cached["cases"]:
        for r in case["rows"]:
            if r["status"] != "ok":
                continue
            assert r["cache_disk_bytes"] > 0 and r["store_bytes"] >= 0, (case["id"], r)
            assert r["x_paired_local"] > 0 and r["paired_runs"] == r["ok_runs"], (case["id"], r)
            if r["tool"] == "bucketfs":
                assert r["cache_disk_bytes"] <= r["cache_cap"], (case["id"], r)
    assert "cache on disk" in summary and "× paired local" in summary
    # The throttled store (issue 32): every measured run has its counts (a tool failing there,
    # e.g. bucketfs with EIO before its throttling fix, is a row with errors, not a crash);
    # the reference, the SDK's adaptive retries, reads and writes everything right.
    throttled = next(t for t in data["tables"] if t["workload"] == "throttled")
    th = throttled["cases"][0]["throttle"]
    for r in th["rows"]:
        assert 0 <= r["reads_ok"] <= r["reads"] and 0 <= r["writes_ok"] <= r["writes"], r
        assert r["seconds"] is None or r["seconds"] > 0, r
    ref_runs = [r for r in th["rows"] if r["tool"] == "direct"]
    assert ref_runs and all(r["errors"] == 0 and r["reads_ok"] == r["reads"]
                            and r["writes_ok"] == r["writes"] for r in ref_runs), ref_runs
    assert "| tool | run | elapsed | × ref |" in summary
    assert re.search(r"\| cores \| \d+", summary) and "| kernel |" in summary

    # The report can be rebuilt from results.json alone.
    (tmp_path / "SUMMARY.md").unlink()
    cp = subprocess.run([sys.executable, str(BENCH / "run"), "--render", str(tmp_path)],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert (tmp_path / "SUMMARY.md").read_text() == summary


def test_write_back_variant_is_its_own_row_and_never_a_peer(tmp_path):
    # One workload with reads and writes is enough, and keeps this under 30 s.
    run_smoke(tmp_path, "--tools", "bucketfs,bucketfs-wb", "--workloads", "large")
    data = json.loads((tmp_path / "results.json").read_text())
    for case in data["tables"][0]["cases"]:
        assert [r["tool"] for r in case["rows"]] == ["bucketfs", "bucketfs-wb"]
        assert all(r["status"] != "not run" for r in case["rows"]), case["id"]
        # Both modes are in the headline, and neither is the other's "best peer".
        assert [h["tool"] for h in case["headlines"]] == ["bucketfs", "bucketfs-wb"]
        assert all(h["best_peer"] is None for h in case["headlines"]), case["id"]
    assert "--write-back" in data["meta"]["mount_commands"]["bucketfs-wb"]
    assert "--write-back" not in data["meta"]["mount_commands"]["bucketfs"]
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert "— *bucketfs --write-back* |" in summary
    assert "| bucketfs-wb |" in summary


def test_uring_variant_mounts_over_io_uring_and_the_others_over_dev_fuse(tmp_path):
    switch = Path("/sys/module/fuse/parameters/enable_uring")
    before = switch.read_text().strip()
    run_smoke(tmp_path, "--tools", "bucketfs,bucketfs+uring", "--workloads", "large")
    data = json.loads((tmp_path / "results.json").read_text())
    for case in data["tables"][0]["cases"]:
        assert [r["tool"] for r in case["rows"]] == ["bucketfs", "bucketfs+uring"]
        assert all(r["status"] == "ok" for r in case["rows"]), case["id"]
    commands = data["meta"]["mount_commands"]
    assert "--fuse-transport uring" in commands["bucketfs+uring"]
    assert "--fuse-transport dev-fuse" in commands["bucketfs"]
    assert switch.read_text().strip() == before, "the kernel's switch is put back"


def test_index_variant_cold_cases_load_a_saved_index(tmp_path):
    # The tree's read cases: each cold one on a fresh mount loading the index a preparatory
    # mount saved (bucketfs refresh), checked through the bucketfs.index attribute.
    run_smoke(tmp_path, "--tools", "bucketfs,bucketfs-index", "--workloads", "tree",
              "--set", "tree_writes=no")
    data = json.loads((tmp_path / "results.json").read_text())
    cases = {c["id"]: c for c in data["tables"][0]["cases"]}
    for cid in ("find_cold", "find_warm", "ls_lr", "du"):
        rows = cases[cid]["rows"]
        assert [r["tool"] for r in rows] == ["bucketfs", "bucketfs-index"]
        assert all(r["status"] == "ok" for r in rows), (cid, rows)
        assert cases[cid]["ref2_row"]["status"] == "ok"
    assert "--index" in data["meta"]["mount_commands"]["bucketfs-index"]
    mounts = [h for h in data["meta"]["mounts"] if h["tool"] == "bucketfs-index"]
    builds = [h for h in mounts if h.get("purpose") == "index build"]
    cold = [h for h in mounts if not h.get("purpose")]
    assert len(builds) == len(cold) == 3   # find, ls -lR, du: one cold mount each
    assert all(h["refresh_seconds"] > 0 and h["index_bytes"] > 0 for h in builds)
    assert all("files=" in h["index_status"] for h in cold), cold
    assert "Listing index builds" in (tmp_path / "SUMMARY.md").read_text()


def test_peers_without_binary_are_rows_marked_missing(tmp_path):
    # geesefs and mountpoint-s3 are chosen by name; without their binary every case has their
    # row, marked missing with the reason, and the run goes on (one small workload is enough).
    run_smoke(tmp_path, "--tools", "bucketfs,geesefs,mountpoint-s3", "--workloads", "metadata",
              "--geesefs-bin", str(tmp_path / "no-geesefs"),
              "--mount-s3-bin", str(tmp_path / "no-mount-s3"))
    data = json.loads((tmp_path / "results.json").read_text())
    for case in data["tables"][0]["cases"]:
        rows = {r["tool"]: r for r in case["rows"]}
        assert list(rows) == ["bucketfs", "geesefs", "mountpoint-s3"], case["id"]
        for peer in ("geesefs", "mountpoint-s3"):
            assert rows[peer]["status"] == "missing" and "not found" in rows[peer]["error"]
    versions = data["meta"]["versions"]
    assert versions["geesefs"].startswith("missing") and versions["mountpoint-s3"].startswith("missing")


def test_waiting_for_uploads_lists_once_they_stop_and_times_the_last_one(tmp_path):
    # Listing the bucket again and again while a tool uploads takes the store's CPU from the
    # uploads being timed; the wait watches MinIO's count of writes instead, lists once they
    # stop, and ends the timed span at the last write it saw.
    import threading
    import time
    from bfsbench.minio import MinIO
    from bfsbench.s3 import S3Direct, minio_request_counts

    s3direct = os.environ.get("BENCH_S3DIRECT_BIN") or str(BENCH.parent / "target/release/examples/s3direct")
    server = MinIO(find_minio(None), tmp_path / "data", tmp_path / "minio.log")
    server.start()
    try:
        s3 = S3Direct(s3direct, server.url, str(tmp_path))
        s3.mb("settle")
        (tmp_path / "f").write_bytes(b"x" * 10)
        ended: list[float] = []

        def upload() -> None:
            for i in range(8):
                time.sleep(0.1)   # gaps shorter than S3Direct.QUIET: one run of uploads
                s3.call("put-file", str(tmp_path / "f"), "settle", f"p/k{i}")
                ended.append(time.monotonic())

        def lists() -> float:
            return sum(n for name, n in minio_request_counts(server.url).items() if name.startswith("List"))

        lists_before = lists()
        uploader = threading.Thread(target=upload)
        uploader.start()
        settled = s3.wait_for("settle", "p/", objects=8, nbytes=80, deadline=time.monotonic() + 60)
        uploader.join()
        listed = lists() - lists_before
    finally:
        server.stop()
    assert settled.error is None
    assert settled.last_write is not None
    # Seen by a poll every S3Direct.POLL, after the store answered and before s3direct exited.
    assert ended[-1] - 0.2 <= settled.last_write <= ended[-1] + S3Direct.POLL + 0.2, \
        (settled.last_write, ended)
    # Listing every 50 ms through the second of uploads would have sent a dozen or more.
    assert listed <= 3, listed
