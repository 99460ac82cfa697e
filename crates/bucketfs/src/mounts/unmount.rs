//! `bucketfs unmount`: detach a mount, show the uploads its daemon still runs, and wait
//! for that daemon to exit (it stores what it still holds first).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// `bucketfs unmount`: detaches the mount, then waits for the daemon that served it to
/// exit, because it first stores what is still being uploaded (files still open, and
/// with `--write-back` files already closed): once this returns, they are in the bucket.
pub fn unmount(mountpoint: &Path) -> Result<()> {
    wait_for_uploads_after_close(mountpoint);
    let daemons = daemons_serving(mountpoint);
    let started = std::time::Instant::now();
    loop {
        let output = Command::new("fusermount3")
            .arg("-u")
            .arg(mountpoint)
            .output()
            .context("running fusermount3 (is fuse3 installed?)")?;
        if output.status.success() {
            break;
        }
        let reason = String::from_utf8_lossy(&output.stderr).trim().to_owned();
        // Busy for a moment (a file closed as the command started, a `df` passing by, a
        // process forked with a file of the mount open and not yet exec'd): try again.
        if reason.contains("busy") && started.elapsed() < UNMOUNT_BUSY_RETRIES {
            std::thread::sleep(std::time::Duration::from_millis(100));
            continue;
        }
        bail!("cannot unmount {}: {reason}", mountpoint.display());
    }
    wait_for_exit(&daemons);
    Ok(())
}

/// How long `bucketfs unmount` tries again while the mount is busy.
const UNMOUNT_BUSY_RETRIES: std::time::Duration = std::time::Duration::from_secs(1);

/// Shows the uploads `close()` left running (`--write-back`) while they end, before the
/// unmount (which would wait for them without a word): a bar on a terminal, a line per
/// change otherwise. Best effort: a mount that does not answer is unmounted at once.
fn wait_for_uploads_after_close(mountpoint: &Path) {
    use std::io::IsTerminal as _;
    let left = || super::attributes::read_status(mountpoint).ok().as_deref().and_then(super::attributes::uploads_left);
    let Some((files, bytes)) = left().filter(|(files, _)| *files > 0) else { return };
    let total = bytes.max(1);
    let bar = indicatif::ProgressBar::new(total);
    let terminal = std::io::stderr().is_terminal();
    if terminal {
        let style = indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes}");
        bar.set_style(style.unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
    }
    let mut shown = None;
    let mut now = (files, bytes);
    while now.0 > 0 {
        let files = if now.0 == 1 { "1 file".to_owned() } else { format!("{} files", now.0) };
        let message = format!("bucketfs: storing {files} closed before the unmount");
        if terminal {
            bar.set_length(total.max(now.1));
            bar.set_position(total.saturating_sub(now.1));
            bar.set_message(message);
        } else if shown != Some(now) {
            eprintln!("{message} ({} bytes left)", now.1);
            shown = Some(now);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        match left() {
            Some(next) => now = next,
            None => break,
        }
    }
    bar.finish_and_clear();
}

/// The `bucketfs mount` processes whose mount point (their last argument) is `mountpoint`.
fn daemons_serving(mountpoint: &Path) -> Vec<i32> {
    let Some(wanted) = resolve_parent(mountpoint) else { return Vec::new() };
    let Ok(processes) = std::fs::read_dir("/proc") else { return Vec::new() };
    processes
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != std::process::id() as i32)
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
            let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
            let is_mount = args.first().is_some_and(|a| Path::new(OsStr::from_bytes(a)).ends_with("bucketfs"))
                && args.get(1).is_some_and(|a| *a == b"mount");
            let Some(last) = args.last().filter(|_| is_mount) else { return false };
            let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else { return false };
            resolve_parent(&cwd.join(OsStr::from_bytes(last))).as_ref() == Some(&wanted)
        })
        .collect()
}

/// `path` with its parent directory resolved, without touching `path` itself (a mount
/// point whose daemon is stuck would not answer).
fn resolve_parent(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Some(parent.canonicalize().ok()?.join(name))
}

/// Waits until none of `pids` runs any more (a zombie counts as gone).
fn wait_for_exit(pids: &[i32]) {
    let running = |pid: &i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
            .unwrap_or(false)
    };
    let started = std::time::Instant::now();
    let mut told = false;
    while pids.iter().any(running) {
        if !told && started.elapsed() > std::time::Duration::from_secs(1) {
            eprintln!("bucketfs: waiting for the daemon to store the files still being uploaded");
            told = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
