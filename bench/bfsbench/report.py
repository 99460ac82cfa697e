"""Aggregates the measurements and writes SUMMARY.md, one PNG per workload and results.json."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Optional

from .util import fmt_secs, fmt_size, log

FUSE_ORDER = ["bucketfs", "bucketfs-wb", "bucketfs-index", "s3fs", "rclone", "geesefs",
              "mountpoint-s3"]
STATUS_TEXT = {"unsupported": "not supported yet", "missing": "missing", "failed": "failed"}


def aggregate(records: list[dict], wl: str, case: str, tool: str) -> dict:
    recs = [r for r in records if r["workload"] == wl and r["case"] == case and r["tool"] == tool]
    ok = [r for r in recs if r["status"] == "ok"]
    agg: dict = {"tool": tool, "runs": len(recs), "ok_runs": len(ok)}
    rss = [r["daemon_rss_kb"] for r in recs if r.get("daemon_rss_kb")]
    agg["peak_rss_kb"] = max(rss) if rss else None
    client_rss = [r["client_rss_kb"] for r in recs if r.get("client_rss_kb")]
    agg["client_rss_kb"] = max(client_rss) if client_rss else None
    if ok:
        secs = [r["seconds"] for r in ok]
        agg.update(status="ok", median=statistics.median(secs), min=min(secs), max=max(secs))
        nbytes = ok[0].get("bytes")
        agg["bytes"] = nbytes
        agg["throughput"] = nbytes / agg["median"] if nbytes and agg["median"] > 0 else None
        lats = [x for r in ok for x in r["extra"].get("latencies", [])]
        if lats:
            lats.sort()
            agg["lat_p50"] = lats[len(lats) // 2]
            agg["lat_p95"] = lats[min(len(lats) - 1, round(0.95 * (len(lats) - 1)))]
            agg["lat_max"] = lats[-1]
        outputs = sorted({r["extra"]["output"] for r in ok if r["extra"].get("output")})
        if outputs:
            agg["outputs"] = outputs
        # The `cached` workload: the cache directory on disk, what the store sent and the
        # daemon's CPU time during the command, how long the cache took to be complete.
        for key in ("cache_disk_bytes", "cache_cap", "store_bytes", "daemon_cpu_seconds",
                    "whole_after_seconds"):
            values = [r["extra"][key] for r in ok if r["extra"].get(key) is not None]
            if values:
                agg[key] = max(values)
        # The `cached` workload: each run over the local read timed next to it.
        paired = [r["seconds"] / r["extra"]["paired_local_seconds"] for r in ok
                  if r["extra"].get("paired_local_seconds")]
        if paired:
            agg["x_paired_local"] = statistics.median(paired)
            agg["paired_runs"] = len(paired)
        returned = [r["extra"]["returned_seconds"] for r in ok if r["extra"].get("returned_seconds") is not None]
        if returned:
            agg["returned_median"] = statistics.median(returned)
        not_whole = [r["extra"]["not_whole"] for r in ok if r["extra"].get("not_whole")]
        if not_whole:
            agg["not_whole"] = f"{len(not_whole)}/{len(ok)} runs: {not_whole[0]}"
        bad = [r for r in recs if r["status"] != "ok"]
        if bad:
            agg["note"] = f"{len(bad)}/{len(recs)} runs failed: {bad[0]['error']}"
    elif recs:
        statuses = {r["status"] for r in recs}
        status = next(s for s in ("missing", "unsupported", "failed") if s in statuses)
        agg.update(status=status, error=next(r["error"] for r in recs if r["status"] == status))
    else:
        agg.update(status="not run")
    return agg


def is_bucketfs(tool: str) -> bool:
    """bucketfs or one of its modes (bucketfs-wb, bucketfs-index): compared with the peers,
    never one of them."""
    return tool == "bucketfs" or tool.startswith("bucketfs-")


def headline(row: dict, best_peer: Optional[dict]) -> dict:
    """One row of 'bucketfs against the best peer': a bucketfs mode against the fastest peer."""
    return {
        "tool": row["tool"],
        "bucketfs": row,
        "best_peer": best_peer["tool"] if best_peer else None,
        "best_peer_median": best_peer["median"] if best_peer else None,
        "ratio": (row["median"] / best_peer["median"]
                  if row["status"] == "ok" and best_peer else None),
        "x_ref": row.get("x_ref"),
        "x_ref2": row.get("x_ref2"),
    }


def case_headlines(case: dict) -> list[dict]:
    """The headline rows of a case; results.json written before bucketfs-wb had one at most."""
    if "headlines" in case:
        return case["headlines"]
    return [case["headline"]] if case.get("headline") else []


def build_tables(records: list[dict], workloads: list, tools: list) -> list[dict]:
    """One table per workload: for every case, a row per FUSE tool and one for the reference."""
    fuse = [t.name for t in tools if t.kind == "fuse"]
    out = []
    for wl in workloads:
        table = {"workload": wl.name, "number": wl.number, "title": wl.title, "what": wl.what,
                 "facts": wl.facts, "metric": wl.chart_metric, "cases": []}
        for case in wl.cases():
            rows = [aggregate(records, wl.name, case.id, name) for name in fuse]
            ok = [r for r in rows if r["status"] == "ok"]
            best = min((r["median"] for r in ok), default=None)
            ref = aggregate(records, wl.name, case.id, case.ref) if case.ref else None
            ref_median = ref["median"] if ref and ref["status"] == "ok" else None
            ref2 = aggregate(records, wl.name, case.id, case.ref2) if case.ref2 else None
            ref2_median = ref2["median"] if ref2 and ref2["status"] == "ok" else None
            for r in rows:
                if r["status"] == "ok":
                    r["x_best"] = r["median"] / best if best else None
                    r["x_ref"] = r["median"] / ref_median if ref_median else None
                    if case.ref2:
                        r["x_ref2"] = r["median"] / ref2_median if ref2_median else None
            if ref2 is not None and ref is not None and ref["status"] == "ok":
                # The two references against each other (the direct client against local disk).
                ref["x_ref2"] = ref["median"] / ref2_median if ref2_median else None
            # Peers are the other programs: a bucketfs mode beating another is not a peer result.
            peers = [r for r in ok if not is_bucketfs(r["tool"])]
            best_peer = min(peers, key=lambda r: r["median"]) if peers else None
            headlines = [headline(r, best_peer) for r in rows if is_bucketfs(r["tool"])]
            entry = {"id": case.id, "title": case.title, "kind": case.kind, "ref": case.ref,
                     "ref_title": case.ref_title, "rows": rows, "ref_row": ref,
                     "headlines": headlines}
            if case.ref2:
                entry.update(ref2=case.ref2, ref2_title=case.ref2_title, ref2_row=ref2)
            throttle = throttle_table(records, wl.name, case.id, fuse)
            if throttle:
                entry["throttle"] = throttle
            table["cases"].append(entry)
        out.append(table)
    return out


def throttle_table(records: list[dict], wl: str, case: str, fuse: list[str]) -> Optional[dict]:
    """The `throttled` workload's run-by-run table (reads right, writes stored...), if any."""
    from .workloads.throttled import summarize
    return summarize(records, wl, case, fuse)


# ---- markdown ---------------------------------------------------------------------------------


def _ratio(x: Optional[float]) -> str:
    if x is None:
        return "—"
    if x < 0.1:
        return f"{x:.2g}×"
    return f"{x:.2f}×" if x < 100 else f"{x:.0f}×"


def _mib(kb: Optional[int]) -> str:
    return "—" if not kb else f"{kb / 1024:.0f}"


def _rate(bps: Optional[float]) -> str:
    if not bps:
        return "—"
    return f"{bps / (1 << 20):.0f} MiB/s" if bps >= (1 << 20) else f"{bps / 1024:.0f} KiB/s"


def _status_cell(r: dict) -> str:
    if r["status"] == "unsupported":
        return "not supported yet"
    if r["status"] == "missing":
        return f"missing: {r.get('error', '')}"
    if r["status"] == "not run":
        return "not run"
    err = (r.get("error") or "").replace("|", "/").replace("\n", " ")
    return f"failed: {err[:160]}"


def _notes(r: dict) -> str:
    parts = []
    if "lat_p50" in r:
        parts.append(f"per read p50 {fmt_secs(r['lat_p50'])}, p95 {fmt_secs(r['lat_p95'])}, "
                     f"max {fmt_secs(r['lat_max'])}")
    if r.get("outputs"):
        parts.append("output " + ", ".join(f"`{o}`" for o in r["outputs"]))
    if r.get("x_paired_local") is not None:
        parts.append(f"**× paired local {_ratio(r['x_paired_local'])}** "
                     f"(median of {r['paired_runs']})")
    if "cache_disk_bytes" in r:
        cap = f"cap {fmt_size(r['cache_cap'])}" if r.get("cache_cap") else "no cap"
        parts.append(f"cache on disk {fmt_size(r['cache_disk_bytes'])} ({cap})")
    if "store_bytes" in r:
        parts.append(f"from S3 {fmt_size(r['store_bytes'])}")
    if "daemon_cpu_seconds" in r:
        parts.append(f"daemon CPU {r['daemon_cpu_seconds']:.2f} s")
    if r.get("returned_median") is not None:
        parts.append(f"command returned at {fmt_secs(r['returned_median'])} (median)")
    if "whole_after_seconds" in r:
        parts.append(f"whole {fmt_secs(r['whole_after_seconds'])} after the fill")
    if r.get("not_whole"):
        parts.append(f"**not whole**: {r['not_whole']}".replace("|", "/")[:200])
    if r.get("note"):
        parts.append(r["note"].replace("|", "/")[:160])
    return "; ".join(parts)


def _row(label: str, r: dict, ref_label: str, ref2_col: bool = False) -> str:
    """One table row; `ref2_col`: the table has a second ratio column (× the second reference)."""
    if r["status"] != "ok":
        dashes = "— | — |" + (" — |" if ref2_col else "")
        return (f"| {label} | — | — | — | — | {_mib(r.get('peak_rss_kb'))} | {dashes} "
                f"{_status_cell(r)} |")
    x_ref2 = f" {_ratio(r.get('x_ref2'))} |" if ref2_col else ""
    return (f"| {label} | {fmt_secs(r['median'])} | {fmt_secs(r['min'])} | {fmt_secs(r['max'])} | "
            f"{_rate(r.get('throughput'))} | {_mib(r.get('peak_rss_kb'))} | "
            f"{_ratio(r.get('x_best'))} | {_ratio(r.get('x_ref'))} |{x_ref2} {_notes(r)} |")


def tool_info(tools: list) -> list[dict]:
    """What the summary says about each FUSE tool (stored in results.json for --render)."""
    repo = str(Path(__file__).resolve().parents[2]) + "/"
    return [{"name": t.name, "label": t.label, "setup_note": t.setup_note,
             "cmd": t.redacted_cmd().replace(repo, ""), "missing": t.missing}
            for t in tools if t.kind == "fuse"]


def markdown(meta: dict, tables: list[dict], chart_files: dict) -> str:
    tools = meta["tools"]
    L: list[str] = []
    prof = meta["profile"]
    L.append("# bucketfs benchmark results\n")
    L.append(f"Written by `{meta['command']}` on {meta['started_utc']} (UTC); the run took "
             f"{meta['duration_seconds'] / 60:.1f} min. Every number below comes from that run "
             f"(raw measurements: `results.json`).")
    if meta.get("incomplete"):
        L.append(f"\n**INCOMPLETE RUN**: {meta['incomplete']}")
    L.append("")
    L.append("## Machine and versions\n")
    m = meta["machine"]
    L.append("| | |\n|---|---|")
    L.append(f"| cores | {m['cores']} ({m['cpu']}) |")
    L.append(f"| RAM | {fmt_size(m['ram_bytes'])} |")
    L.append(f"| kernel | {m['kernel']} |")
    L.append(f"| OS | {m['os']} |")
    L.append(f"| MinIO data on | {m['minio_data_fs']} (single drive, loopback) |")
    L.append(f"| RAM disk | /dev/shm ({m['ramdisk_fs']}) |")
    for k, v in meta["versions"].items():
        L.append(f"| {k} | {v} |")
    L.append("")
    L.append("## How it was run\n")
    L.append(f"- Profile `{prof['name']}`; each case repeated {meta['runs_text']}, tools interleaved "
             f"in every repetition ({', '.join(meta['tool_order'])}, then again). Seconds are the "
             "median of the runs, with min and max.")
    L.append("- All tools talk to the same MinIO process over loopback, reading the same objects, "
             "uploaded once at set-up by the direct client.")
    drop = ("`sync; echo 3 > /proc/sys/vm/drop_caches`" if meta["can_drop_caches"]
            else "**not available (not root): cold runs are only fresh mounts**")
    L.append(f"- *Cold* = a new mount (new daemon, empty caches) and {drop} just before; "
             "*warm* = the same command again right after, on the same mount.")
    L.append("- Writes through a mount are timed until every object has its full size in the "
             "bucket (polled with ListObjectsV2), so a tool that uploads after close() is not "
             "credited for work it has not done (the notes say when the command itself returned). "
             "Whether a tool can write is found by trying; "
             "a write that fails with EROFS marks its write rows *not supported yet*.")
    L.append("- Peak RSS: `VmHWM` of the FUSE daemon (reset through `/proc/PID/clear_refs` before "
             "each command), in MiB; the maximum over the runs. Reference rows show nothing there.")
    names = [t["name"] for t in tools]
    modes = [t for t in tools if is_bucketfs(t["name"]) and t["name"] != "bucketfs"]
    every_row = (" Every FUSE row counts there, bucketfs modes included; the comparison with the "
                 "other programs alone is *bucketfs against the best peer*." if modes else "")
    L.append("- **× best** = median / the best median among the FUSE tools in that row group "
             "(1.00× is the fastest). **× ref** = median / the reference row (direct S3 client or "
             f"local file system, named in each group). Lower is better for both.{every_row}")
    if any(c.get("ref2") for t in tables for c in t["cases"]):
        L.append("- **× local** (tables that have it) = median / the local file system's median "
                 "for the same commands on a copy of the data on the local disk (cold = page "
                 "cache dropped): what the mount costs over a local file system. In the "
                 "reference row it is the direct client's median / local.")
    L.append("- Mount options:")
    for t in tools:
        state = f" — **missing: {t['missing']}**" if t["missing"] else ""
        L.append(f"  - {t['label']}: {t['setup_note']}; `{t['cmd']}`{state}")
    L.append("")

    # Headline
    L.append("## bucketfs against the best peer\n")
    labels = {t["name"]: t["label"] for t in tools}
    peer_names = [n for n in names if not is_bucketfs(n)]
    mode_text = ("" if not modes else
                 " One row per bucketfs mode: rows of "
                 + ", ".join(f"`{t['name']}` (*{t['label']}*)" for t in modes)
                 + " are marked in the case column. The peers are only "
                 + (", ".join(peer_names) or "the non-bucketfs tools")
                 + ", so every mode is measured against the same best peer.")
    L.append("Ratio = bucketfs median / best median among the other FUSE tools (below 1 means "
             f"bucketfs is faster).{mode_text}\n")
    if not any(is_bucketfs(n) for n in names):
        L.append("bucketfs was not among `--tools` in this run.\n")
    any_ref2 = any(c.get("ref2") for t in tables for c in t["cases"])
    L.append("| workload | case | bucketfs | best peer | ratio | bucketfs × ref |"
             + (" bucketfs × local |" if any_ref2 else ""))
    L.append("|---|---|---|---|---|---|" + ("---|" if any_ref2 else ""))
    for t in tables:
        for c in t["cases"]:
            for h in case_headlines(c):
                b = h["bucketfs"]
                bcell = fmt_secs(b["median"]) if b["status"] == "ok" else _status_cell(b)
                peer = (f"{h['best_peer']} {fmt_secs(h['best_peer_median'])}" if h["best_peer"]
                        else "no peer result")
                tool = h.get("tool", "bucketfs")
                case = c["title"] if tool == "bucketfs" else \
                    f"{c['title']} — *{labels.get(tool, tool)}*"
                x_local = f" {_ratio(h.get('x_ref2'))} |" if any_ref2 else ""
                L.append(f"| {t['number']}. {t['title']} | {case} | {bcell} | {peer} | "
                         f"{_ratio(h['ratio'])} | {_ratio(h['x_ref'])} |{x_local}")
    L.append("")

    for t in tables:
        L.append(f"## {t['number']}. {t['title']} (`--workloads {t['workload']}`)\n")
        L.append(t["what"] + "\n")
        if t["facts"]:
            facts = ", ".join(f"{k} = {_fact(k, v)}" for k, v in t["facts"].items())
            L.append(f"Data: {facts}.\n")
        ref2_col = any(c.get("ref2") for c in t["cases"])
        L.append("| case / tool | median | min | max | throughput | peak RSS MiB | × best | × ref |"
                 + (" × local |" if ref2_col else "") + " notes |")
        L.append("|---|---|---|---|---|---|---|---|---|" + ("---|" if ref2_col else ""))
        for c in t["cases"]:
            L.append(f"| **{c['title']}** | | | | | | | | |" + (" |" if ref2_col else ""))
            for r in c["rows"]:
                L.append(_row(r["tool"], r, c["ref"] or "", ref2_col))
            if c["ref_row"] is not None:
                label = f"*ref: {c['ref']}* ({c['ref_title']})"
                L.append(_row(label, c["ref_row"], "", ref2_col))
            if c.get("ref2_row") is not None:
                label = f"*ref: {c['ref2']}* ({c['ref2_title']})"
                L.append(_row(label, c["ref2_row"], "", ref2_col))
        L.append("")
        for c in t["cases"]:
            if c.get("throttle"):
                L.extend(_throttle_md(c["throttle"]))
        if t["workload"] in chart_files:
            L.append(f"![{t['title']}]({chart_files[t['workload']]})\n")

    if meta.get("mounts"):
        L.append("## Mount time and memory right after mounting\n")
        L.append("Time from starting the daemon until the mount point answers `stat`, and the "
                 "daemon's RSS at that moment; medians over every fresh mount of the run.\n")
        L.append("| tool | bucket | mounts | median mount time | max | median RSS after mount MiB |")
        L.append("|---|---|---|---|---|---|")
        groups: dict = {}
        for h in meta["mounts"]:
            groups.setdefault((h["tool"], h["bucket"], h.get("purpose", "")), []).append(h)
        for (tool, bucket, purpose), hs in sorted(groups.items()):
            secs = [h["seconds"] for h in hs]
            rss = [h["rss_kb"] for h in hs if h["rss_kb"]]
            label = f"{tool} ({purpose}, untimed)" if purpose else tool
            L.append(f"| {label} | {bucket} | {len(hs)} | {fmt_secs(statistics.median(secs))} | "
                     f"{fmt_secs(max(secs))} | {_mib(statistics.median(rss)) if rss else '—'} |")
        L.append("")
        if any(h.get("index_status") for h in meta["mounts"]):
            L.append("The rows of `bucketfs-index` without a note are the mounts the cold cases "
                     "ran on: each loaded the index that a preparatory mount had just saved "
                     "(so their time includes reading it from disk after a page-cache drop); "
                     "the preparatory mounts are the *index build* rows.\n")
        builds = [h for h in meta["mounts"] if "refresh_seconds" in h]
        if builds:
            L.append("### Listing index builds (`bucketfs-index`, preparatory mounts)\n")
            L.append("`bucketfs refresh MOUNTPOINT` on a fresh `--index` mount: lists the bucket "
                     "whole, swaps the new index in and saves it. The first mount of a bucket "
                     "also starts a build of its own at mount, which this command waits for "
                     "before running its own, so the max can be two builds. With "
                     "`--index-prep stat`, `du -s` of the mount follows (a stat of every entry: "
                     "the files' stored attributes are fetched and kept in the saved index).\n")
            L.append("| tool | bucket | builds | median `bucketfs refresh` | max | median `du -s` | "
                     "daemon RSS after MiB | saved index | refresh output |")
            L.append("|---|---|---|---|---|---|---|---|---|")
            bgroups: dict = {}
            for h in builds:
                bgroups.setdefault((h["tool"], h["bucket"]), []).append(h)
            for (tool, bucket), hs in sorted(bgroups.items()):
                secs = [h["refresh_seconds"] for h in hs]
                stats = [h["stat_seconds"] for h in hs if "stat_seconds" in h]
                stat = fmt_secs(statistics.median(stats)) if stats else "not run"
                rss = [h.get("rss_after_stat_kb") or h.get("rss_after_refresh_kb") for h in hs]
                rss = [x for x in rss if x]
                out = hs[-1].get("refresh_output", "").replace("|", "/").replace("\n", "; ")
                L.append(f"| {tool} | {bucket} | {len(hs)} | {fmt_secs(statistics.median(secs))} "
                         f"| {fmt_secs(max(secs))} | {stat} | {_mib(max(rss)) if rss else '—'} | "
                         f"{fmt_size(hs[-1].get('index_bytes'))} | {out[:200]} |")
            L.append("")

    missing = [t for t in tools if t["missing"]]
    L.append("## Missing tools and unsupported operations\n")
    if not missing and not any(r["status"] == "unsupported" for t in tables for c in t["cases"]
                               for r in c["rows"]):
        L.append("None.")
    for t in missing:
        L.append(f"- {t['label']}: missing — {t['missing']}")
    for t in tables:
        for c in t["cases"]:
            for r in c["rows"]:
                if r["status"] == "unsupported":
                    L.append(f"- {r['tool']}: {t['title']} / {c['title']}: {r['error']}")
    if meta.get("chart_note"):
        L.append(f"\n{meta['chart_note']}")
    L.append("")
    return "\n".join(L)


def _errors_cell(r: dict) -> str:
    if not r["errors"]:
        return "0" if r["status"] == "ok" else (r.get("error") or "failed").replace("|", "/")[:160]
    parts = [f"{n}× read: {m}" for m, n in sorted(r["read_errors"].items(), key=lambda x: -x[1])]
    parts += [f"{n}× write: {m}" for m, n in sorted(r["write_errors"].items(), key=lambda x: -x[1])]
    return f"**{r['errors']}**: " + "; ".join(parts).replace("|", "/")[:300]


def _throttle_md(th: dict) -> list[str]:
    """Issue 32, run by run: elapsed, × the reference's median, reads right, writes stored."""
    limit = th["limit"]
    L = ["Run by run (issue 32). *elapsed*: until every reader and writer has exited and every "
         "written file is listed with its size (also for a run with errors). *× ref*: elapsed / "
         f"the reference's median ({fmt_secs(th['ref_median'])}, the SDK in adaptive retry "
         "mode); *× SDK std*: elapsed / the median of the same requests with the SDK's standard "
         f"retry mode ({fmt_secs(th.get('standard_median'))}; same classifier, same attempts). "
         "*reads right*: SHA-256 equal to the object's. *writes stored*: listed with its size "
         "and read back with the source's SHA-256. *errors*: the processes' stderr without "
         "paths, counted. *meets issue 32*: no error and elapsed ≤ "
         f"{limit}× the reference.\n",
         "| tool | run | elapsed | × ref | × SDK std | reads right | writes stored | errors | "
         "meets issue 32 | notes |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    labels = {"direct": "*ref: direct, SDK adaptive*",
              "direct-standard": "*direct, SDK standard*"}
    for r in th["rows"]:
        notes = []
        if r.get("responses") is not None:
            notes.append(f"{r['responses']} responses, {r['throttled_responses']} of them 429")
        if r.get("returned_seconds") is not None and not r["tool"].startswith("direct"):
            notes.append(f"processes done at {fmt_secs(r['returned_seconds'])}")
        L.append(f"| {labels.get(r['tool'], r['tool'])} | {r['rep'] + 1} | "
                 f"{fmt_secs(r['seconds'])} | {_ratio(r['x_ref'])} | "
                 f"{_ratio(r.get('x_standard'))} | {r['reads_ok']}/{r['reads']} | "
                 f"{r['writes_ok']}/{r['writes']} | {_errors_cell(r)} | {r['meets']} | "
                 f"{'; '.join(notes)} |")
    L.append("")
    return L


def _fact(key: str, v) -> str:
    if key == "workload_seconds":
        return f"{v} s (set-up + all runs)"
    if isinstance(v, int) and ("bytes" in key or "size" in key or key == "single_file"):
        return fmt_size(v)
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


# ---- charts -----------------------------------------------------------------------------------

# bucketfs-wb and bucketfs-index: a light and a dark shade of bucketfs's blue, so the modes read as
# one program.
COLORS = {"bucketfs": "#1f77b4", "bucketfs-wb": "#aec7e8", "bucketfs-index": "#08306b",
          "s3fs": "#ff7f0e", "rclone": "#2ca02c", "geesefs": "#d62728", "mountpoint-s3": "#8c564b",
          "direct": "#7f7f7f", "local": "#9467bd"}


def charts(tables: list[dict], out: Path) -> tuple[dict, Optional[str]]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}, "Charts were not drawn: matplotlib is not installed (pip install -r bench/requirements.txt)."
    files = {}
    for t in tables:
        through = t["metric"] == "throughput"
        labels, series = [], {}
        tool_names: list[str] = []
        for c in t["cases"]:
            refs = [x for x in (c["ref_row"], c.get("ref2_row")) if x]
            for r in c["rows"] + refs:
                if r["tool"] not in tool_names:
                    tool_names.append(r["tool"])
        for c in t["cases"]:
            labels.append(c["title"])
            rows = {r["tool"]: r for r in c["rows"]}
            for x in (c["ref_row"], c.get("ref2_row")):
                if x:
                    rows[x["tool"]] = x
            for name in tool_names:
                series.setdefault(name, []).append(rows.get(name))
        n_cases, n_tools = len(labels), max(1, len(tool_names))
        fig, ax = plt.subplots(figsize=(10, 1.0 + 0.42 * n_cases * n_tools))
        height = 0.8 / n_tools
        values_all = []
        for i, name in enumerate(tool_names):
            ys, vals, lo, hi, texts = [], [], [], [], []
            for j, r in enumerate(series[name]):
                y = j + i * height
                if r is None:
                    continue
                if r["status"] == "ok":
                    if through:
                        v = r["throughput"] / (1 << 20) if r.get("throughput") else None
                        vmin = r["bytes"] / r["max"] / (1 << 20) if r.get("bytes") else None
                        vmax = r["bytes"] / r["min"] / (1 << 20) if r.get("bytes") else None
                    else:
                        v, vmin, vmax = r["median"], r["min"], r["max"]
                    if v:
                        ys.append(y)
                        vals.append(v)
                        lo.append(max(0, v - (vmin or v)))
                        hi.append(max(0, (vmax or v) - v))
                        values_all.append(v)
                        continue
                texts.append((y, STATUS_TEXT.get(r["status"], r["status"])))
            ax.barh(ys, vals, height=height * 0.95, xerr=[lo, hi] if vals else None,
                    color=COLORS.get(name, None), label=name, capsize=2)
            for y, text in texts:
                ax.text(0, y, f"  {name}: {text}", va="center", fontsize=7, color="#aa0000")
        ax.set_yticks([j + (n_tools - 1) * height / 2 for j in range(n_cases)])
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        if values_all and max(values_all) / max(min(values_all), 1e-9) > 30:
            ax.set_xscale("log")
        ax.set_xlabel("MiB/s (higher is better; median, bars = min..max)" if through
                      else "seconds (lower is better; median, bars = min..max)")
        ax.set_title(f"{t['number']}. {t['title']}")
        ax.legend(fontsize=8, loc="best")
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        name = f"{t['number']}-{t['workload']}.png"
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        files[t["workload"]] = name
    return files, None


def write_all(out: Path, raw_dir: Path, meta: dict, records: list[dict], workloads: list,
              tools: list) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    tables = build_tables(records, workloads, tools)
    meta = dict(meta, tools=tool_info(tools))
    compact = {"meta": meta, "tables": tables, "measurements": records}
    (out / "results.json").write_text(json.dumps(compact, indent=1, default=str) + "\n")
    raw_dir.mkdir(parents=True, exist_ok=True)
    (raw_dir / "results.json").write_text(json.dumps(compact, indent=1, default=str) + "\n")
    return render(out)


def render(out: Path) -> Path:
    """(Re)writes SUMMARY.md and the charts of `out` from its results.json alone."""
    data = json.loads((out / "results.json").read_text())
    chart_files, note = charts(data["tables"], out)
    meta = dict(data["meta"], chart_note=note)
    summary = out / "SUMMARY.md"
    summary.write_text(markdown(meta, data["tables"], chart_files))
    log(f"wrote {summary}, {len(chart_files)} charts and results.json")
    return summary
