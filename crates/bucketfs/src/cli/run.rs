//! `bucketfs run`: one command wrapped in a mount, for a pipeline step that wants files.
//!
//! It mounts the sources (a `bucketfs mount --foreground` child) in a private temporary
//! directory or `--mountpoint`, runs the command there with `BUCKETFS_MOUNT` set, waits for
//! it, unmounts (the daemon stores every file still being uploaded before it exits), and
//! exits with the command's exit code (128 + N if a signal N ended it). If the daemon could
//! not store a file the command closed, it names it, and `run` fails even when the command
//! succeeded.
//!
//! Signals: SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to `run` go to the command, which
//! decides when to end; SIGINT and SIGQUIT from the terminal reach the command directly
//! (same process group), and `run` itself ignores them so that it stays to clean up.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;

use super::args::RunArgs;
use crate::mount_args::MountArgs;
use crate::mounts::{is_mount_point, unmount};

/// How long the mount may take to answer.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(60);
/// Exit code when `run` itself fails (bad arguments, the mount fails, outputs not stored)
/// and the command did not fail first.
const RUN_FAILED: i32 = 1;

/// `bucketfs mount`'s options and sources as a parser alone, to check them before anything
/// is started.
#[derive(Parser, Debug)]
#[command(name = "bucketfs run")]
struct MountLine {
    #[command(flatten)]
    args: MountArgs,
}

/// Runs `bucketfs run`; returns the process exit code.
pub fn run(args: RunArgs) -> i32 {
    match run_command(args) {
        Ok(code) => code,
        Err(error) => {
            let message = format!("{error:#}").replace('\n', " ");
            eprintln!("bucketfs run: error: {message}");
            RUN_FAILED
        }
    }
}

fn run_command(args: RunArgs) -> Result<i32> {
    let (mount, command) = args.split().map_err(anyhow::Error::msg)?;
    if mount.iter().any(|a| a == "--mountpoint") {
        bail!(
            "--mountpoint goes before the mount options: bucketfs run --mountpoint DIR [OPTIONS] SOURCE... -- COMMAND"
        );
    }
    if mount.iter().any(|a| a == "--foreground" || a == "-f") {
        bail!("bucketfs run keeps its mount in the foreground itself: leave out --foreground");
    }
    // Removed when `run` ends, after the unmount.
    let mut private = None;
    let mountpoint: PathBuf = match &args.mountpoint {
        Some(dir) => dir.canonicalize().with_context(|| format!("mount point {}", dir.display()))?,
        None => {
            let dir = tempfile::Builder::new().prefix("bucketfs-run-").tempdir().context("making a mount point")?;
            private.insert(dir).path().to_owned()
        }
    };
    // `bucketfs mount`'s arguments; bad options fail here, with clap's message, before
    // anything starts.
    let mut mount_line: Vec<OsString> = vec!["--foreground".into()];
    mount_line.extend(mount.iter().map(OsString::from));
    mount_line.push(mountpoint.clone().into_os_string());
    if let Err(error) =
        MountLine::try_parse_from(std::iter::once(OsString::from("bucketfs run")).chain(mount_line.clone()))
    {
        error.exit();
    }

    let mut daemon = start_mount(&mount_line, &mountpoint)?;
    let outcome = run_in_mount(command, &mountpoint);
    let stored = stop_mount(&mut daemon, &mountpoint);
    let command_code = match outcome {
        Ok(status) => exit_code(status),
        Err(error) => {
            eprintln!("bucketfs run: error: {error:#}");
            127 // as a shell says of a command it cannot run
        }
    };
    match stored {
        Ok(()) => Ok(command_code),
        Err(error) => {
            eprintln!("bucketfs run: error: {error:#}");
            Ok(if command_code != 0 { command_code } else { RUN_FAILED })
        }
    }
}

/// Starts `bucketfs mount MOUNT_LINE` (`--foreground OPTIONS SOURCES MOUNTPOINT`) and
/// waits until the mount answers; the daemon's messages go to our standard error.
fn start_mount(mount_line: &[OsString], mountpoint: &Path) -> Result<std::process::Child> {
    let exe = std::env::current_exe().context("finding the bucketfs executable")?;
    let mut command = Command::new(exe);
    command.arg("mount").args(mount_line).stdin(Stdio::null()).stdout(Stdio::null());
    // SAFETY: prctl only sets a process attribute; it is async-signal-safe. If `run` dies,
    // the daemon gets SIGTERM, unmounts and stores what was written.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut daemon = command.spawn().context("starting the mount")?;
    let started = Instant::now();
    loop {
        if let Some(status) = daemon.try_wait().context("waiting for the mount")? {
            bail!("the mount failed ({status})"); // the daemon said why on standard error
        }
        if is_mount_point(mountpoint)? && std::fs::metadata(mountpoint).is_ok() {
            return Ok(daemon);
        }
        if started.elapsed() > MOUNT_TIMEOUT {
            let _ = daemon.kill();
            let _ = daemon.wait();
            bail!("the mount did not answer within {MOUNT_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `command` in the mount and waits for it, passing on the signals meant for it.
fn run_in_mount(command: &[String], mountpoint: &Path) -> Result<ExitStatus> {
    let Some((program, arguments)) = command.split_first() else { bail!("no command to run") };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting a runtime")?;
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        // Listening replaces the default action (ending `run`) for all of them.
        let mut forwarded = Vec::new();
        for kind in
            [SignalKind::terminate(), SignalKind::hangup(), SignalKind::user_defined1(), SignalKind::user_defined2()]
        {
            forwarded.push((kind, signal(kind).context("listening for signals")?));
        }
        let _terminal = [signal(SignalKind::interrupt()), signal(SignalKind::quit())];
        let mut child = tokio::process::Command::new(program)
            .args(arguments)
            .current_dir(mountpoint)
            .env("BUCKETFS_MOUNT", mountpoint)
            .spawn()
            .with_context(|| format!("cannot run {program}"))?;
        let pid = child.id().map(|pid| pid as i32);
        loop {
            let next_signal = futures::future::select_all(forwarded.iter_mut().map(|(kind, stream)| {
                let kind = *kind;
                Box::pin(async move {
                    stream.recv().await;
                    kind
                })
            }));
            tokio::select! {
                status = child.wait() => return status.context("waiting for the command"),
                (kind, _, _) = next_signal => {
                    if let Some(pid) = pid {
                        // SAFETY: kill only sends a signal to our own child.
                        unsafe { libc::kill(pid, kind.as_raw_value()) };
                    }
                }
            }
        }
    })
}

/// Unmounts and waits for the daemon, which stores what is still being uploaded first;
/// fails if it could not store everything (it named the files on standard error).
fn stop_mount(daemon: &mut std::process::Child, mountpoint: &Path) -> Result<()> {
    if let Err(error) = unmount(mountpoint) {
        // Still in use (a process the command left behind): detach it; the daemon ends
        // once the last file there is closed.
        eprintln!("bucketfs run: {error:#}; detaching the mount");
        let _ = Command::new("fusermount3").arg("-uz").arg(mountpoint).status();
    }
    let status = daemon.wait().context("waiting for the mount to end")?;
    if !status.success() {
        bail!("the mount ended with {status}: not every file written was stored");
    }
    Ok(())
}

/// The command's exit code, or 128 + the signal that ended it, as shells report it.
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|signal| 128 + signal)).unwrap_or(RUN_FAILED)
}
