"""A synthetic source tree shaped like linux-5.12.13, generated deterministically.

The real tree (what the reference article untars, finds and removes) has about 71k files in
4.7k directories, about 1 GB, 14 KB per file on average, a third of the files `*.h`, and a very
uneven layout: drivers/ and arch/ hold two thirds of the files, some directories are deep,
most are small and a few hold hundreds of files. This module reproduces those statistics from
a seed; no download, and the same seed and scale always give the same bytes.

    python3 -m bfsbench.treegen --scale 1 --stats      # print the shape without writing
    python3 -m bfsbench.treegen --scale 0.05 --out DIR  # write it
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
from collections import Counter
from pathlib import Path

FULL_FILES = 71_000
ROOT_NAME = "linux-synth"

# Share of all files in each top-level directory, and which mix of file types it holds.
TOP_DIRS = [
    ("drivers", 0.430, "src"), ("arch", 0.250, "arch"), ("Documentation", 0.105, "doc"),
    ("include", 0.068, "include"), ("tools", 0.060, "tools"), ("sound", 0.036, "src"),
    ("fs", 0.034, "src"), ("net", 0.026, "src"), ("lib", 0.008, "src"),
    ("kernel", 0.007, "src"), ("scripts", 0.007, "scripts"), ("samples", 0.004, "src"),
    ("security", 0.004, "src"), ("crypto", 0.003, "src"), ("mm", 0.0016, "src"),
    ("block", 0.001, "src"), ("virt", 0.0008, "src"), ("LICENSES", 0.0005, "license"),
    ("ipc", 0.0002, "src"), ("init", 0.0002, "src"), ("usr", 0.0002, "src"),
    ("certs", 0.0002, "src"),
]

ROOT_FILES = [("COPYING", 500), ("CREDITS", 100_000), ("Kbuild", 1_300), ("Kconfig", 600),
              ("MAINTAINERS", 590_000), ("Makefile", 65_000), ("README", 730),
              (".gitignore", 1_800), (".mailmap", 18_000), (".clang-format", 16_000),
              (".cocciconfig", 60), (".get_maintainer.ignore", 70), (".gitattributes", 60)]

# suffix: (weight, median bytes, log-normal sigma). Names without a dot are whole file names.
MIXES = {
    "src": {".c": (0.58, 9000, 1.2), ".h": (0.30, 3500, 1.3), "Makefile": (0.045, 700, 0.9),
            "Kconfig": (0.03, 2500, 1.0), ".S": (0.012, 5000, 1.0), ".sh": (0.01, 2000, 1.0),
            ".txt": (0.008, 3000, 1.0), ".json": (0.005, 5000, 1.3), ".py": (0.01, 4000, 1.0)},
    "arch": {".c": (0.25, 7000, 1.2), ".h": (0.30, 3000, 1.3), ".dts": (0.14, 5000, 1.0),
             ".dtsi": (0.16, 6000, 1.2), ".S": (0.08, 5000, 1.0), "Makefile": (0.04, 800, 0.9),
             "Kconfig": (0.01, 3000, 1.0), "_defconfig": (0.02, 2500, 0.6)},
    "include": {".h": (0.97, 3500, 1.3), "Kbuild": (0.01, 600, 0.8), ".S": (0.02, 2000, 1.0)},
    "doc": {".rst": (0.55, 6000, 1.1), ".txt": (0.17, 5000, 1.1), ".yaml": (0.20, 2500, 0.8),
            "Makefile": (0.02, 500, 0.8), ".svg": (0.02, 15000, 1.0), ".py": (0.01, 4000, 1.0),
            ".dot": (0.03, 1500, 0.8)},
    "tools": {".c": (0.38, 8000, 1.3), ".h": (0.25, 2500, 1.3), ".json": (0.12, 6000, 1.5),
              ".sh": (0.08, 2000, 1.0), ".py": (0.05, 5000, 1.1), "Makefile": (0.05, 1500, 1.0),
              ".txt": (0.03, 2000, 1.0), ".tc": (0.03, 800, 0.6), ".S": (0.01, 3000, 1.0)},
    "scripts": {".c": (0.2, 8000, 1.2), ".sh": (0.2, 3000, 1.0), ".pl": (0.1, 15000, 1.2),
                ".py": (0.1, 6000, 1.1), "Makefile": (0.1, 1500, 0.9), ".h": (0.1, 3000, 1.2),
                ".cocci": (0.2, 1500, 0.7)},
    "license": {"": (1.0, 3000, 0.8)},
}

MAX_FILE = 4 << 20
SIZE_SCALE = 1.2   # calibrates the mean file size to ~14 KB

_WORDS = """
acpi adc amd arm ast ata atomic audio backlight base bcm bio bits blk bluetooth bpf bridge
bus cache can cdrom ceph chip clk clock cmd codec common compat core cpu crc crypto ctl dai
dax dccp debug dev devfreq dma dmi dpu drm dsa dsi dvb edac efi eisa eth event ext extcon
fault fb fc fdt firmware fpga fs fsi gadget gpio gpu gre hash hdmi hid host hsi hw hwmon
i2c i3c ib ice idle iio input intel iommu ioport ipc ipv4 ipv6 irq isdn kbd kvm lan led lib
link lm loop mac mailbox mb mc mdio media mei mem mfd misc mlx mm mmc mmu mod mpt msi mtd
mux nand net nfc nfs nvme of opp page panel pci perf phy pin pinctrl pm pmu power ppc
pps ptp pwm qcom qos queue radio raid ras rdma regmap regulator remote reset rng rpmsg rtc
s390 sata scsi sdhci sensor serial sh sched smc snd soc spi ssb staging str sunxi switch
sync tcp tee thermal thunder timer tpm trace tty tun uart ufs uio usb vdpa vfio vhost video
virtio vme w1 watchdog wifi wire wmi x86 xen xfrm xhci zone
""".split()


@dataclasses.dataclass
class TreePlan:
    dirs: list[str]                    # relative paths, parents before children
    files: list[tuple[str, int]]       # (relative path, size)

    def stats(self) -> dict:
        sizes = [s for _, s in self.files]
        exts = Counter(_suffix(p) for p, _ in self.files)
        total = sum(sizes)
        return {
            "files": len(self.files), "dirs": len(self.dirs), "bytes": total,
            "avg_file_bytes": round(total / max(1, len(sizes))),
            "median_file_bytes": sorted(sizes)[len(sizes) // 2] if sizes else 0,
            "max_file_bytes": max(sizes, default=0),
            "h_files": exts.get(".h", 0),
            "max_depth": max((p.count("/") for p in self.dirs), default=0),
            "top_suffixes": dict(exts.most_common(8)),
        }


def _suffix(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return "." + name.rsplit(".", 1)[-1] if "." in name.lstrip(".") else name


def _split(n: int, k: int, rnd: random.Random) -> list[int]:
    """Splits n into k positive parts with heavy-tailed weights (largest remainder)."""
    weights = [rnd.paretovariate(1.2) for _ in range(k)]
    total = sum(weights)
    raw = [1 + (n - k) * w / total for w in weights]
    parts = [int(x) for x in raw]
    short = n - sum(parts)
    for i in sorted(range(k), key=lambda i: raw[i] - parts[i], reverse=True)[:short]:
        parts[i] += 1
    return parts


def _name(rnd: random.Random, taken: set[str], suffix: str = "") -> str:
    for attempt in range(100):
        if suffix and not suffix.startswith((".", "_")):      # fixed names: Makefile, Kconfig...
            base, suffix_ = suffix, ""
            if attempt:
                base = f"{suffix}.{rnd.choice(_WORDS)}"
        else:
            parts = [rnd.choice(_WORDS) for _ in range(rnd.choice((1, 1, 2, 2, 3)))]
            base = rnd.choice(("_", "-", "_")).join(parts)
            if rnd.random() < 0.15:
                base += str(rnd.randint(0, 99))
            suffix_ = suffix
        name = base + suffix_
        if name not in taken:
            taken.add(name)
            return name
    name = f"{base}{len(taken)}{suffix_}"
    taken.add(name)
    return name


def plan_tree(scale: float, seed: int = 5_12_13) -> TreePlan:
    rnd = random.Random(seed)
    n_total = max(20, round(FULL_FILES * scale))
    dirs: list[str] = []
    files: list[tuple[str, int]] = []

    # Root files keep their real sizes at any scale (they are few).
    root_files = ROOT_FILES if scale >= 0.05 else ROOT_FILES[:4]
    for name, size in root_files:
        files.append((f"{ROOT_NAME}/{name}", size))
    n_rest = n_total - len(root_files)

    shares = [s for _, s, _ in TOP_DIRS]
    counts = [int(n_rest * s / sum(shares)) for s in shares]
    for i in sorted(range(len(counts)), key=lambda i: shares[i], reverse=True)[:n_rest - sum(counts)]:
        counts[i] += 1

    def pick_suffix(mix: dict) -> tuple[str, int, float]:
        r = rnd.random() * sum(w for w, _, _ in mix.values())
        for suffix, (w, median, sigma) in mix.items():
            r -= w
            if r <= 0:
                return suffix, median, sigma
        return suffix, median, sigma

    def build(path: str, n: int, depth: int, mix: dict) -> None:
        dirs.append(path)
        taken: set[str] = set()
        leaf_limit = rnd.randint(8, 40)
        if n <= leaf_limit or depth >= 7:
            here = n
        else:
            here = min(n - 2, max(1, round(n * rnd.uniform(0.03, 0.3))))
        for _ in range(here):
            suffix, median, sigma = pick_suffix(mix)
            size = int(min(MAX_FILE, max(16, rnd.lognormvariate(math.log(median * SIZE_SCALE), sigma))))
            files.append((f"{path}/{_name(rnd, taken, suffix)}", size))
        rest = n - here
        if rest <= 0:
            return
        k = max(1, min(rest, 48, round(rest / rnd.uniform(14, 50))))
        if k == 1 and rest > 1:
            k = 2
        for part in _split(rest, k, rnd):
            build(f"{path}/{_name(rnd, taken)}", part, depth + 1, mix)

    dirs.append(ROOT_NAME)
    for (top, _, mixname), n in zip(TOP_DIRS, counts):
        if n > 0:
            build(f"{ROOT_NAME}/{top}", n, 1, MIXES[mixname])
    return TreePlan(dirs=dirs, files=files)


def _text_pool(seed: int, size: int = 1 << 21) -> bytes:
    rnd = random.Random(seed ^ 0x5EED)
    kw = ["static", "int", "struct", "return", "if", "else", "for", "unsigned", "long", "const",
          "void", "u32", "u64", "#define", "#include", "sizeof", "goto", "err", "NULL", "while"]
    out, n = [], 0
    while n < size:
        indent = "\t" * rnd.randint(0, 3)
        toks = [rnd.choice(kw if rnd.random() < 0.4 else _WORDS) for _ in range(rnd.randint(2, 10))]
        line = indent + " ".join(toks) + rnd.choice((";", " {", "", ");", " = 0;", "}")) + "\n"
        out.append(line)
        n += len(line)
    return "".join(out).encode()[:size]


def write_tree(root: Path, plan: TreePlan, seed: int = 5_12_13) -> None:
    """Writes the planned tree under `root` (which must not exist yet)."""
    pool = _text_pool(seed)
    plen = len(pool)
    rnd = random.Random(seed ^ 0xC0DE)
    for d in plan.dirs:
        (root / d).mkdir(parents=True, exist_ok=True)
    for rel, size in plan.files:
        header = f"/* {rel} */\n".encode()
        body_len = max(0, size - len(header))
        off = rnd.randrange(plen)
        chunks = [header]
        while body_len > 0:
            take = min(body_len, plen - off)
            chunks.append(pool[off:off + take])
            body_len -= take
            off = 0
        with open(root / rel, "wb") as f:
            f.write(b"".join(chunks)[:size])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=5_12_13)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--stats", action="store_true")
    a = ap.parse_args()
    plan = plan_tree(a.scale, a.seed)
    if a.stats or not a.out:
        for k, v in plan.stats().items():
            print(f"{k}: {v}")
    if a.out:
        write_tree(a.out, plan, a.seed)


if __name__ == "__main__":
    main()
