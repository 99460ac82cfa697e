//! `bucketfs csi --supervise`: the node plugin container's main process. It runs the
//! driver as a child and starts it again when it ends (a crash, an OOM kill of that
//! process), so the container, and the `bucketfs mount` daemons in it, live on: the pods'
//! mounts keep serving, and the new driver finds them (see `publications`).
//!
//! It is the daemons' reaper too: they are detached from the driver that started them,
//! so they become this process's children (it is PID 1 in the container, and a child
//! subreaper elsewhere), and their exit statuses are collected here.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use nix::errno::Errno;
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::CsiArgs;

/// The first wait before a driver that ended is started again; it doubles up to
/// [`MAX_BACKOFF`] while the driver keeps ending, and starts over once one has run
/// [`STEADY`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
const STEADY: Duration = Duration::from_secs(60);
/// How often the driver's end, the daemons' ends and a stop signal are looked for.
const POLL: Duration = Duration::from_millis(50);

/// The signal that asked this process to stop (SIGTERM from the kubelet, SIGINT), 0 if none.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop(signal: libc::c_int) {
    STOP_SIGNAL.store(signal, Ordering::SeqCst);
}

/// Runs the driver (`bucketfs csi` with the same settings, without `--supervise`) until
/// SIGTERM or SIGINT, which it passes on to the driver; the mounts are left serving.
pub fn supervise(args: &CsiArgs) -> Result<()> {
    nix::sys::prctl::set_child_subreaper(true).context("becoming the daemons' reaper")?;
    let stop = SigAction::new(SigHandler::Handler(on_stop), SaFlags::empty(), SigSet::empty());
    for stop_signal in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { signal::sigaction(stop_signal, &stop) }.context("handling SIGTERM and SIGINT")?;
    }
    let bucketfs = std::env::current_exe().context("finding the bucketfs executable")?;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let started = Instant::now();
        let driver = start_driver(&bucketfs, args)?;
        let ended = wait_for(driver)?;
        if STOP_SIGNAL.load(Ordering::SeqCst) != 0 {
            return Ok(());
        }
        if started.elapsed() >= STEADY {
            backoff = FIRST_BACKOFF;
        }
        eprintln!(
            "bucketfs csi: the driver ended ({ended}); starting it again in {backoff:?}; the mounts keep serving"
        );
        if !sleep_unless_stopped(backoff) {
            return Ok(());
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn start_driver(bucketfs: &Path, args: &CsiArgs) -> Result<Pid> {
    let mut command = Command::new(bucketfs);
    command.args(["csi", "--endpoint", &args.endpoint]).arg("--state-dir").arg(&args.state_dir);
    if let Some(node_id) = &args.node_id {
        command.args(["--node-id", node_id]);
    }
    let child = command.spawn().context("starting the driver")?;
    Ok(Pid::from_raw(child.id() as i32))
}

/// Waits until `driver` ends, reaping the daemons that end meanwhile, and passes a stop
/// signal on to it. How it ended.
fn wait_for(driver: Pid) -> Result<String> {
    let mut passed_on = false;
    loop {
        let stop_signal = STOP_SIGNAL.load(Ordering::SeqCst);
        if stop_signal != 0 && !passed_on {
            let _ = signal::kill(driver, Signal::try_from(stop_signal).unwrap_or(Signal::SIGTERM));
            passed_on = true;
        }
        // Polled, not blocking: a signal that lands between the check above and a
        // blocking wait would not be passed on until some child ended.
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(status) if status.pid() == Some(driver) => return Ok(format!("{status:?}")),
            Ok(WaitStatus::StillAlive) => std::thread::sleep(POLL),
            Ok(_) | Err(Errno::EINTR) => {} // a daemon reaped
            Err(error) => return Err(error).context("waiting for the driver"),
        }
    }
}

/// Sleeps `wait`, unless asked to stop meanwhile; whether it slept it all.
fn sleep_unless_stopped(wait: Duration) -> bool {
    let until = Instant::now() + wait;
    while Instant::now() < until {
        if STOP_SIGNAL.load(Ordering::SeqCst) != 0 {
            return false;
        }
        std::thread::sleep(POLL.min(until.saturating_duration_since(Instant::now())));
    }
    STOP_SIGNAL.load(Ordering::SeqCst) == 0
}
