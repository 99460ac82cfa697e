//! What /proc says: mount points (mountinfo), processes by command line, peak RSS.

use std::path::Path;

fn unescape_mountinfo(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo (octal)
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && b.len() >= i + 4 && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// (mount point, filesystem type, source) of every entry of /proc/self/mountinfo.
pub fn mount_entries() -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    text.lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let mp = unescape_mountinfo(fields.get(4)?);
            let sep = fields.iter().position(|f| *f == "-")?;
            let fstype = fields.get(sep + 1)?.to_string();
            let source = unescape_mountinfo(fields.get(sep + 2).unwrap_or(&""));
            Some((mp, fstype, source))
        })
        .collect()
}

/// Mount options + super options of the top-most mount on `path` (comma-separated, merged).
pub fn mount_options(path: &Path) -> Option<String> {
    let p = path.to_str().expect("UTF-8 path");
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    text.lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            if unescape_mountinfo(fields.get(4)?) != p {
                return None;
            }
            let sep = fields.iter().position(|f| *f == "-")?;
            Some(format!("{},{}", fields.get(5)?, fields.get(sep + 3).unwrap_or(&"")))
        })
        .next_back()
}

/// How many mounts are stacked on `path`.
pub fn mount_count(path: &Path) -> usize {
    let p = path.to_str().expect("UTF-8 path");
    mount_entries().iter().filter(|(mp, _, _)| mp == p).count()
}

pub fn is_mounted(path: &Path) -> bool {
    mount_count(path) > 0
}

/// Filesystem type of the top-most mount on `path` (e.g. `fuse.bucketfs`, `fuse`).
pub fn mount_fstype(path: &Path) -> Option<String> {
    let p = path.to_str().expect("UTF-8 path");
    mount_entries().into_iter().rfind(|(mp, _, _)| mp == p).map(|(_, t, _)| t)
}

/// Pids of live processes (other than us) whose command line has an argument containing
/// `needle` (used to find the background daemon of a mount point).
pub fn pids_with_arg_containing(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if cmdline.split(|b| *b == 0).any(|a| {
            let a = String::from_utf8_lossy(a);
            a.contains(needle)
        }) {
            // zombies have an empty cmdline already, but be explicit
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.chars().next().unwrap_or('?')));
            if state != Some('Z') {
                out.push(pid);
            }
        }
    }
    out
}

/// Peak resident memory of a process, from /proc (KiB).
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmHWM value")
}
