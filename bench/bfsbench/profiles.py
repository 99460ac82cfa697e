"""Size profiles. `full` reproduces the sizes of the published articles; `quick` keeps the
same shapes at a size that runs in minutes on 2 cores; `smoke` only checks the machinery."""

from __future__ import annotations

import dataclasses

from .util import parse_size

GiB = 1 << 30
MiB = 1 << 20


@dataclasses.dataclass
class Profile:
    name: str
    runs: int                       # repetitions of every case (median/min/max over them)
    runs_per_workload: dict         # overrides of `runs` for expensive workloads
    large_size: int                 # W1: the single large object read cold and warm (1 GiB)
    large_count: int                # W1: files read/written serially and in parallel (article: 24)
    multi_size: int                 # W1: size of each of those files (article: 1 GB)
    tree_scale: float               # W2: fraction of the linux-5.12.13-like tree (1.0 = 71k files)
    rand_size: int                  # W3: the big object read at random offsets (article: 8 GiB)
    rand_reads: int                 # W3: number of reads (article: 100 of 100 bytes)
    rand_len: int
    small_count: int                # W4: small objects for grep/find (article: 1000)
    flat_count: int                 # W5: objects in one flat directory (brief: 100k)
    flat_size: int                  # W5: bytes per flat object
    overhead_size: int              # W6: large file re-read from cache (article: 5 GB)
    timeout: float                  # per command, seconds
    tree_writes: bool = True        # W2: also untar into and rm -rf from the mount (at full
                                    # scale the peers take hours; `--set tree_writes=no`)
    tree_write_scale: float = 0.0   # W2: the tree untarred and removed, if not the one read
                                    # (0: the same), e.g. find over 71k keys, untar of 7,100
    fio_size: int = 2 * GiB         # W7: each of the 4 objects fio reads (mountpoint-s3: 2 GiB)
    fio_reads: int = 400            # W7: random reads per random case
    cached_size: int = GiB          # W8: the object read again from each tool's disk cache
    cached_files: int = 1000        # W8: small files grepped again from the disk cache
    # W9 (issue 32): readers and writers at once through one mount against a MinIO that
    # refuses requests over `throttle_requests_max` (see workloads/throttled.py)
    throttle_readers: int = 32      # processes each reading (and hashing) one object
    throttle_writers: int = 8       # processes each writing one new file (cp from a RAM disk)
    throttle_size: int = 16 * MiB   # bytes of every object read and file written
    throttle_requests_max: int = 4  # MINIO_API_REQUESTS_MAX of the throttled MinIO
    throttle_deadline: str = "100ms"  # MINIO_API_REQUESTS_DEADLINE (ignored by the MinIO installed)
    throttle_max_attempts: int = 50   # the reference's (s3direct --adaptive) attempts per request
    throttle_timeout: float = 900   # limit of one timed run (rclone: 183-245 s at quick size)
    # W10 (issue 49): real programs, each in a fresh mount of an empty bucket (workloads/programs.py)
    programs_tree_scale: float = 0.1     # the tree `tar xf` unpacks (0.1 = 7,100 files)
    programs_git_commits: int = 20       # commits of the repository `git clone` copies...
    programs_git_files: int = 20         # ... each adding this many files
    programs_sqlite_transactions: int = 20
    programs_sqlite_rows: int = 500      # rows inserted by each transaction
    programs_rsync_files: int = 300      # files of the tree `rsync -a` copies
    # W11 (issue 52): many readers at once through one mount (workloads/many_readers.py)
    readers_counts: str = "16,64,256"    # one case per count: that many readers at once
    readers_size: int = 16 * MiB         # bytes of each file a reader hashes

    def runs_for(self, workload: str) -> int:
        return self.runs_per_workload.get(workload, self.runs)

    def describe(self) -> dict:
        d = dataclasses.asdict(self)
        return d


PROFILES = {
    "smoke": Profile(
        name="smoke", runs=1, runs_per_workload={},
        large_size=8 * MiB, large_count=2, multi_size=4 * MiB, tree_scale=0.001,
        rand_size=32 * MiB, rand_reads=30, rand_len=100, small_count=40, flat_count=200,
        flat_size=64, overhead_size=32 * MiB, timeout=60, fio_size=8 * MiB, fio_reads=20,
        cached_size=4 * MiB, cached_files=20, throttle_readers=4, throttle_writers=2,
        throttle_size=MiB, throttle_timeout=300, programs_tree_scale=0.001, programs_git_commits=3,
        programs_git_files=5, programs_sqlite_transactions=2, programs_sqlite_rows=50,
        programs_rsync_files=30, readers_counts="4,8", readers_size=MiB),
    "quick": Profile(
        name="quick", runs=2, runs_per_workload={"randread": 3},
        large_size=GiB, large_count=2, multi_size=256 * MiB, tree_scale=0.01, rand_size=GiB,
        rand_reads=100, rand_len=100, small_count=1000, flat_count=5_000, flat_size=64,
        overhead_size=512 * MiB, timeout=300, fio_size=512 * MiB, fio_reads=100,
        cached_size=512 * MiB, cached_files=1000),
    "full": Profile(
        name="full", runs=5, runs_per_workload={"large": 3, "tree": 3, "throttled": 3},
        large_size=GiB, large_count=24, multi_size=GiB, tree_scale=1.0, rand_size=8 * GiB,
        rand_reads=100, rand_len=100, small_count=1000, flat_count=100_000, flat_size=64,
        overhead_size=4 * GiB, timeout=4 * 3600),
}


def get_profile(name: str, overrides: dict) -> Profile:
    p = dataclasses.replace(PROFILES[name])
    for key, value in overrides.items():
        field = {f.name: f for f in dataclasses.fields(Profile)}.get(key)
        if field is None:
            raise SystemExit(f"unknown profile field {key!r}")
        if key.endswith("_size"):
            value = parse_size(value)
        elif field.type in ("int",):
            value = int(value)
        elif field.type in ("float",):
            value = float(value)
        elif field.type in ("bool",):
            value = value.lower() in ("1", "yes", "true", "on")
        setattr(p, key, value)
    return p
