"""Deterministic data: large local files, the s3direct `put-gen` byte stream, small text files."""

from __future__ import annotations

import random
from pathlib import Path

_M64 = (1 << 64) - 1


def _mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def put_gen_bytes(seed: int, offset: int, length: int, stream: int = 0) -> bytes:
    """The bytes `s3direct put-gen --seed SEED` stores at [offset, offset+length).

    Mirrors gen_bytes() in crates/bucketfs/examples/s3direct.rs, so reads through a mount can
    be checked without downloading the object.
    """
    key = _mix(seed ^ _mix(stream))
    first, skip = divmod(offset, 8)
    words = (skip + length + 7) // 8
    out = b"".join(_mix(key ^ (((first + w) * 0xD6E8FEB86659FD93) & _M64)).to_bytes(8, "little")
                   for w in range(words))
    return out[skip:skip + length]


def write_large_file(path: Path, size: int, seed: int) -> None:
    """A file of `size` pseudo-random bytes; every 4 MiB chunk is distinct. Fast (~1 GB/s)."""
    rnd = random.Random(seed)
    chunk = 4 << 20
    block = bytearray(rnd.randbytes(chunk))
    with open(path, "wb") as f:
        written, index = 0, 0
        while written < size:
            block[0:16] = index.to_bytes(8, "little") + seed.to_bytes(8, "little")
            n = min(chunk, size - written)
            f.write(block if n == chunk else block[:n])
            written += n
            index += 1


_WORDS = ("alpha beta gamma delta sample read write buffer offset index count value error "
          "status queue cache block inode entry table node list page map lock flag size data "
          "result config device driver stream chunk range bucket object key prefix mount").split()


def write_small_text_files(root: Path, count: int, seed: int, needle: str = "123") -> dict:
    """`count` small text files in 10 sub-directories; returns counts for checking grep/find."""
    rnd = random.Random(seed)
    ndirs = max(1, min(10, count // 10))
    total = 0
    matching = 0
    for i in range(count):
        d = root / f"d{i % ndirs:02d}"
        d.mkdir(parents=True, exist_ok=True)
        size = int(min(64 << 10, max(200, rnd.lognormvariate(8.0, 0.8))))   # median ~3 KB
        lines = []
        n = 0
        while n < size:
            line = " ".join(rnd.choice(_WORDS) for _ in range(rnd.randint(3, 9)))
            line += f" {rnd.randint(0, 99_999)}"
            lines.append(line)
            n += len(line) + 1
        text = "\n".join(lines) + "\n"
        (d / f"file{i:05d}.txt").write_text(text)
        total += len(text)
        matching += needle in text
    return {"files": count, "dirs": ndirs, "bytes": total, "matching": matching}
