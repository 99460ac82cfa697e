"""Markdown tables from results.json (run-all.sh): per mode, FUSE requests per file and S3
requests per file, before / after.

    python3 tables.py [results.json] [BEFORE_LABEL AFTER_LABEL]
"""

import json
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "results.json"
runs = json.load(open(path))
before, after = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else ("3f100d3", "e9f2c3d")
PROGRAMS = ["tar", "cp", "rsync", "git", "pip"]
MODES = ["default", "write-back"]
OP_ORDER = ["lookup", "getattr", "create", "mknod", "mkdir", "open", "write", "setattr", "getxattr",
            "setxattr", "listxattr", "flush", "fsync", "release", "rename", "unlink", "opendir",
            "readdir", "readdirplus", "releasedir", "forget", "read", "symlink", "statfs"]
by = {(r["build"], r["mode"], r["program"]): r for r in runs}


def per(r, d, k):
    return r[d].get(k, 0) / r["files"] if r and r.get("files") else None


def cell(a, b, fmt="{:.2f}"):
    f = lambda x: "—" if x is None else fmt.format(x)
    if (a or 0) == 0 and (b or 0) == 0:
        return "0"
    return f"{f(a)} / {f(b)}"


def status(r):
    if r is None:
        return "missing"
    if r.get("run_failed"):
        return "run failed"
    if r["exit_code"]:
        return f"exit {r['exit_code']}"
    return ""


for mode in MODES:
    rs = [by.get((b, mode, p)) for p in PROGRAMS for b in (before, after)]
    rs = [r for r in rs if r and not r.get("run_failed")]
    ops = set()
    for r in rs:
        ops |= {k for k, v in r["fuse"].items() if r["files"] and v / r["files"] >= 0.05}
    ops = [o for o in OP_ORDER if o in ops] + sorted(ops - set(OP_ORDER))
    print(f"\n### {mode}: FUSE requests per file ({before} / {after})\n")
    print("| program | files | total | " + " | ".join(o.upper() for o in ops) + " |")
    print("|---|---|---|" + "---|" * len(ops))
    for p in PROGRAMS:
        a, b = by.get((before, mode, p)), by.get((after, mode, p))
        files = " / ".join(str(x["files"]) if x and not x.get("run_failed") else "—" for x in (a, b))
        if a and b and a.get("files") == b.get("files"):
            files = str(a["files"])
        note = "; ".join(f"{lab}: {s}" for lab, x in ((before, a), (after, b)) if (s := status(x)))
        ta = a["fuse_total"] / a["files"] if a and a.get("files") else None
        tb = b["fuse_total"] / b["files"] if b and b.get("files") else None
        row = [p + (f" ({note})" if note else ""), files, cell(ta, tb)]
        row += [cell(per(a, "fuse", o), per(b, "fuse", o)) for o in ops]
        print("| " + " | ".join(row) + " |")

    s3ops = set()
    for r in rs:
        s3ops |= set(r["s3_settled"]) | set(r["s3"])
    s3ops = sorted(s3ops)
    print(f"\n### {mode}: S3 requests per file ({before} / {after}); seconds\n")
    print("| program | S3 at return | S3 all stored | " + " | ".join(f"{o} (stored)" for o in s3ops)
          + " | program s | settle s | objects |")
    print("|---|---|---|" + "---|" * len(s3ops) + "---|---|---|")
    for p in PROGRAMS:
        a, b = by.get((before, mode, p)), by.get((after, mode, p))
        ok = lambda x: x and not x.get("run_failed") and x.get("files")
        row = [p,
               cell(a["s3_total"] / a["files"] if ok(a) else None, b["s3_total"] / b["files"] if ok(b) else None),
               cell(a["s3_settled_total"] / a["files"] if ok(a) else None,
                    b["s3_settled_total"] / b["files"] if ok(b) else None)]
        row += [cell(per(a, "s3_settled", o) if ok(a) else None, per(b, "s3_settled", o) if ok(b) else None)
                for o in s3ops]
        row += [cell(a["program_seconds"] if ok(a) else None, b["program_seconds"] if ok(b) else None, "{:.1f}"),
                cell(a["settle_seconds"] if ok(a) else None, b["settle_seconds"] if ok(b) else None, "{:.1f}"),
                " / ".join(str(x["bucket_objects"]) if ok(x) else "—" for x in (a, b))]
        print("| " + " | ".join(row) + " |")
