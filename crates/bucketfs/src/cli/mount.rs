//! `bucketfs mount` and `bucketfs unmount`.
//!
//! Without `--foreground`, `mount` re-runs itself as a detached daemon and waits until
//! the daemon reports that the mount answers (or prints the daemon's error and fails):
//! a script can use the mount as soon as the command returns. The re-exec, rather than
//! `fork()`, keeps the tokio runtime and the AWS SDK out of a forked child.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsFd as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use fuser::{Config, MountOption, SessionACL};
use sd_notify::NotifyState;

use super::logging::LogDestination;
use super::source::{check_layout, SourceSpec};
use super::status::MountState;
use crate::fuse::{dev_fuse, ring, DevFuse, FuseAdapter};
use crate::mount_args::{store_config, FuseTransportArg, MountArgs};
use crate::mounts::attributes;
use crate::mounts::{is_mount_point, mount_device};
use bucketfs_client::store::request_options::RequestOptions;
use bucketfs_client::store::s3::{S3Store, StaticCredentials, StoreConfig};
use bucketfs_client::store::{ObjectStore, StoreError};
use bucketfs_core::datacache::DataCache;
use bucketfs_core::fs::INDEX_REFRESH;
use bucketfs_core::fs::{Fs, Presentation, WriteConfig};
use bucketfs_core::memory::MemoryLimiter;
use bucketfs_core::namespace::index::{IndexOptions, Indexes};
use bucketfs_core::namespace::{Namespace, Source};
use bucketfs_core::read::ReadConfig;
use bucketfs_core::write::journal::Journal;
use bucketfs_core::write::recovery;
use bucketfs_core::write::staging::StagingConfig;
use bucketfs_core::write::write_back::WriteBackLog;

/// Set in the environment of the daemon child: write "ready" to stdout once mounted.
const READY_ENV: &str = "BUCKETFS_NOTIFY_READY";
/// How long an exiting daemon waits for blocks on their way to the data cache.
const CACHE_WRITES_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(30);

pub fn run(mut args: MountArgs) -> Result<()> {
    if args.credentials_from_stdin {
        // Before the key is in memory: no core dump, no ptrace or /proc/PID/mem by
        // processes of the same user.
        nix::sys::prctl::set_dumpable(false).context("making the process non-dumpable")?;
        args.credentials = Some(crate::mount_args::credentials::read_stdin()?);
    }
    let (mountpoint, sources) = split_arguments(&args.sources_and_mountpoint)?;
    let mountpoint = check_mountpoint(Path::new(mountpoint))?;
    bucketfs_core::private_dir::prepare_cache_dir(&args.cache_dir)
        .with_context(|| format!("cache directory {}", args.cache_dir.display()))?;
    if !args.read_only {
        // A staging directory we cannot write to would only show up at the first append.
        tempfile::tempfile_in(&args.cache_dir)
            .with_context(|| format!("cache directory {} is not writable", args.cache_dir.display()))?;
    }
    if let Some(dir) = &args.cache {
        // Checked before the daemon starts, so that the error reaches the terminal.
        open_data_cache(dir, args.cache_size)?;
    }
    let daemon = std::env::var_os(READY_ENV).is_some();
    let logs = LogDestination::for_args(&args, &mountpoint, daemon);
    if !args.foreground {
        return spawn_daemon(&mountpoint, args.credentials.as_ref());
    }
    let log_level = super::logging::init(&args, &logs)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("bucketfs-io")
        .build()
        .context("starting the I/O runtime")?;

    let namespace_sources = runtime.block_on(connect_sources(&args, &sources))?;
    let stores = namespace_sources.iter().map(|source| source.store.clone()).collect();
    let memory_limit = args.memory_limit.unwrap_or_else(default_memory_limit);
    let read_config = ReadConfig {
        part_size: args.part_size.max(64 * 1024),
        initial_window: 1024 * 1024,
        max_window: (args.part_size * args.max_concurrent_requests.clamp(1, 8) as u64)
            .min(memory_limit / 4)
            .max(1024 * 1024),
    };
    let presentation = Presentation {
        uid: args.uid.unwrap_or_else(|| nix::unistd::getuid().as_raw()),
        gid: args.gid.unwrap_or_else(|| nix::unistd::getgid().as_raw()),
        file_mode: args.file_mode,
        dir_mode: args.dir_mode,
        attributes_from_listing: args.attributes_from_listing,
    };
    let (journal, write_back_log) = if args.read_only {
        (None, None)
    } else {
        let (journal, log) = recover_stopped_daemons(&args, &runtime, &namespace_sources)?;
        (Some(journal), Some(log))
    };
    let staging = StagingConfig {
        dir: args.cache_dir.clone(),
        limit: MemoryLimiter::new(args.staging_limit),
        journal: journal.clone(),
    };
    let write_config = WriteConfig {
        read_only: args.read_only,
        part_size: args.part_size,
        staging,
        journal,
        write_back_log,
        write_back: args.write_back,
        content_type_from_name: !args.no_content_type_from_name,
    };
    let namespace = namespace(&args, namespace_sources);
    let indexes = namespace.indexes().cloned();
    let memory = MemoryLimiter::new(memory_limit);
    let budget = memory.clone();
    bucketfs_client::store::buffer_pool::POOL
        .set_limit((memory_limit / 8) as usize, move || budget.limit().saturating_sub(budget.used()));
    let mut fs = Fs::new(namespace, presentation, read_config, write_config, memory.clone());
    if let Some(dir) = &args.cache {
        let cache = open_data_cache(dir, args.cache_size)?;
        tracing::info!(dir = %dir.display(), cap = cache.cap(), "data cache");
        if let Some(tier) = runtime.block_on(connect_shared_cache(&args))? {
            tracing::info!(tier = tier.location(), "shared cache");
            cache.set_shared_tier(tier);
        }
        fs = fs.with_data_cache(cache);
    }
    let fs = Arc::new(fs);
    let sweeper = fs.clone();
    runtime.spawn(async move {
        let mut every = tokio::time::interval(bucketfs_core::namespace::SWEEP_INTERVAL);
        loop {
            every.tick().await;
            sweeper.sweep();
            bucketfs_client::store::buffer_pool::POOL.release_idle();
            // glibc keeps freed small blocks (the entries just dropped) for reuse; give
            // what it can back, so a mount that walked a huge tree once shrinks again.
            // SAFETY: malloc_trim only returns free heap pages to the system.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    });
    if let Some(address) = args.metrics_addr {
        bucketfs_client::metrics::serve(address).map_err(anyhow::Error::msg)?;
    }
    let fsname = sources.iter().map(SourceSpec::describe).collect::<Vec<_>>().join(",");
    let state = MountState::new(fs.clone(), memory, fsname.clone(), stores);
    runtime.spawn(state.clone().tick_every_second());
    // Listened for before the mount shows: a SIGHUP sent as soon as it does must not meet
    // the default action (ending the daemon) while a spawned task has yet to start.
    let hangups = {
        let _in_runtime = runtime.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
    };
    runtime.spawn(refresh_on_sighup(hangups, indexes.clone()));
    if let Some(indexes) = &indexes {
        runtime.spawn(indexes.clone().refresh_periodically());
        runtime.spawn(indexes.clone().fetch_attributes_in_background());
    }
    let ring_wanted = ring_wanted(args.fuse_transport)?;
    let passthrough_wanted = args.cache.is_some() && !args.no_passthrough;
    let mut adapter = FuseAdapter::new(fs.clone(), runtime.handle().clone(), passthrough_wanted, ring_wanted)
        .with_names_only(!args.whole_listings)
        .with_log_level(Box::new(move |level| log_level.set(level)))
        .with_status(Box::new(move || state.report()));
    if let Some(indexes) = &indexes {
        adapter = adapter.with_index_refreshes(indexes.refreshes());
    }

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(fsname),
        // Shown as type `fuse.bucketfs` (mountinfo, `findmnt -t`, `umount -t`). fuser's
        // own `Subtype` reaches only fusermount3, not the mount(2) it makes as root; the
        // kernel takes the option itself, and so does fusermount3.
        MountOption::CUSTOM("subtype=bucketfs".into()),
        if args.read_only { MountOption::RO } else { MountOption::RW },
        MountOption::NoAtime,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::DefaultPermissions,
    ];
    if args.noexec {
        config.mount_options.push(MountOption::NoExec);
    }
    config.acl = if args.allow_other { SessionACL::All } else { SessionACL::Owner };
    let adapter = Arc::new(adapter);
    // Mounts and answers INIT; requests after it are read by `dev_fuse::serve` below.
    let mut session = fuser::Session::new(DevFuse(adapter.clone()), &mountpoint, &config)
        .with_context(|| format!("cannot mount on {}", mountpoint.display()))?;
    let device = Arc::new(session.as_fd().try_clone_to_owned().context("cannot share /dev/fuse")?);
    adapter.session_started(session.notifier(), device.clone());
    raise_read_ahead(&mountpoint);
    start_ring(&adapter);

    let mut unmounter = session.unmount_callable();
    let signal_mountpoint = mountpoint.clone();
    runtime.spawn(async move {
        wait_for_termination().await;
        tracing::info!("signal received, unmounting");
        if let Err(error) = unmounter.unmount() {
            tracing::warn!("unmount failed ({error}); detaching the mount instead");
            let _ = Command::new("fusermount3").arg("-uz").arg(&signal_mountpoint).status();
        }
    });
    notify_ready(&logs)?;
    let serving = format!("serving {}", mountpoint.display());
    notify_service_manager(&[NotifyState::Ready, NotifyState::Status(&serving)]);
    tracing::info!(mountpoint = %mountpoint.display(), "mounted");
    // Whatever ended the session, what was closed is stored before the daemon exits.
    let served = dev_fuse::serve(adapter.clone(), &device);
    drop(session); // as fuser's own loop does when it ends: unmounts if still mounted
    match &served {
        Ok(()) => tracing::info!("unmounted"),
        Err(error) if ended_by_unmount(error) => tracing::info!("unmounted ({error})"),
        Err(error) => tracing::error!("the mount ended: {error}"),
    }
    notify_service_manager(&[NotifyState::Stopping, NotifyState::Status("storing files still uploading")]);
    // Uploads still running (release, --write-back) would be lost with the runtime.
    runtime.block_on(fs.finish_uploads());
    // Blocks of what programs read just before the unmount, still on their way to the
    // data cache: bounded, a cache is never worth a hung exit.
    if !runtime.block_on(fs.finish_cache_writes(CACHE_WRITES_AT_EXIT)) {
        tracing::warn!("data cache: blocks still being written after {CACHE_WRITES_AT_EXIT:?} are left out");
    }
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    if let Some(indexes) = indexes {
        indexes.save_all(); // with what this mount changed and fetched since the last refresh
    }
    report_unstored(&fs)?;
    match served {
        Err(error) if !ended_by_unmount(&error) => Err(error).context("serving the mount"),
        _ => Ok(()),
    }
}

/// Whether the session's error is only the mount going away: the kernel aborts the
/// connection when it is unmounted with requests pending, and the device is gone
/// (ENODEV, fuser's `NotConnected`) when it is unmounted before INIT arrived, as a
/// `fusermount3 -u` right after the mount can be.
fn ended_by_unmount(error: &std::io::Error) -> bool {
    matches!(error.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::NotConnected)
}

/// Fails (so the daemon exits non-zero: `bucketfs run` tells its caller) if files were
/// closed whose upload then failed, naming them.
fn report_unstored(fs: &Fs) -> Result<()> {
    let (failed, more) = fs.unstored();
    let kept = fs.write_back_failed();
    let mut parts = Vec::new();
    if !failed.is_empty() || more > 0 {
        let mut list: Vec<String> = failed.iter().map(|(key, error)| format!("{key} ({error})")).collect();
        if more > 0 {
            list.push(format!("and {more} more"));
        }
        parts.push(format!("{} closed file(s) could not be stored: {}", failed.len() + more, list.join(", ")));
    }
    if !kept.is_empty() {
        let dir = fs.write_back_dir().map(|dir| dir.display().to_string()).unwrap_or_default();
        parts.push(format!(
            "{} file(s) closed with --write-back are kept in {dir} for the next mount of their bucket to store",
            kept.len()
        ));
    }
    if parts.is_empty() {
        return Ok(());
    }
    let message = parts.join("; ");
    tracing::error!("{message}");
    bail!(message)
}

fn open_data_cache(dir: &Path, cap: Option<u64>) -> Result<Arc<DataCache>> {
    DataCache::open(dir, cap).with_context(|| format!("data cache directory {} is not usable", dir.display()))
}

fn namespace(args: &MountArgs, sources: Vec<Source>) -> Namespace {
    let namespace = Namespace::new(sources, args.metadata_ttl)
        .with_flat_listing(!args.no_flat_listing)
        .with_contents_on_disk(args.cache.is_some())
        .with_versions(args.show_versions);
    if !args.index {
        return namespace;
    }
    let options = IndexOptions {
        cache_dir: args.cache_dir.clone(),
        refresh_every: args.index_refresh,
        attributes_rate: args.index_attributes_rate,
    };
    namespace.with_index(&options)
}

/// SIGHUP: list the indexed sources again (as `bucketfs refresh`, without a caller).
/// Without `--index` there is nothing to reload, and the signal is only logged: its
/// default action would kill the daemon and leave a dead mount behind (a terminal that
/// closes on a foreground mount, a `kill -HUP` meant as "reload").
async fn refresh_on_sighup(hangups: std::io::Result<tokio::signal::unix::Signal>, indexes: Option<Arc<Indexes>>) {
    let Ok(mut hangups) = hangups else {
        tracing::warn!("cannot listen for SIGHUP");
        return;
    };
    while hangups.recv().await.is_some() {
        let Some(indexes) = &indexes else {
            tracing::info!("SIGHUP: nothing to refresh (the mount has no --index)");
            continue;
        };
        match indexes.refresh().await {
            Ok(done) => {
                tracing::info!(
                    files = done.files,
                    dirs = done.dirs,
                    "index refreshed on SIGHUP in {:.2?}",
                    done.elapsed
                )
            }
            Err(error) => tracing::warn!("index refresh on SIGHUP failed: {error}"),
        }
    }
}

/// `bucketfs undelete PATH`: asks the daemon serving PATH's directory to make the
/// latest version of the deleted file current again.
pub fn undelete(path: &Path) -> Result<()> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        bail!("{} names no file", path.display());
    };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let shown = path.display();
    match attributes::set(dir, crate::fuse::UNDELETE, name.as_encoded_bytes()) {
        Ok(()) => {
            // The daemon drops the kernel's negative entry for the name just after it
            // answers (the kernel holds the directory's lock during this call): wait for
            // that, so that the next command (`bucketfs undelete f && cat f`) finds it.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::fs::symlink_metadata(path).is_err() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            println!("bucketfs: {shown} restored from its latest version");
            Ok(())
        }
        Err(error) => Err(match error.raw_os_error() {
            Some(libc::ENOENT) => {
                anyhow::anyhow!("{shown} has no earlier version to restore (is versioning on for the bucket?)")
            }
            Some(libc::EEXIST) => anyhow::anyhow!("{shown} is not deleted"),
            Some(libc::EROFS) => anyhow::anyhow!("{shown} is on a read-only mount"),
            _ if attributes::not_bucketfs(&error) => anyhow::anyhow!("{} is not in a bucketfs mount", dir.display()),
            _ => anyhow::Error::new(error).context(format!("restoring {shown}")),
        }),
    }
}

/// `bucketfs log-level`: sets the attribute the daemon serving `mountpoint` takes as its
/// new log level (see `logging`).
pub fn set_log_level(mountpoint: &Path, level: &str) -> Result<()> {
    attributes::set(mountpoint, crate::fuse::LOG_LEVEL, level.as_bytes()).map_err(|error| {
        match error.raw_os_error() {
            Some(libc::EINVAL) => anyhow::anyhow!(
                "{level:?} is not a log level (error, warn, info, debug, trace, or a filter such as bucketfs=debug)"
            ),
            Some(libc::EPERM) | Some(libc::EACCES) => {
                anyhow::anyhow!("only root or the user running the mount may change its log level")
            }
            _ if attributes::not_bucketfs(&error) => {
                anyhow::anyhow!("{} is not a bucketfs mount", mountpoint.display())
            }
            _ => anyhow::Error::new(error).context(format!("setting the log level of {}", mountpoint.display())),
        }
    })?;
    println!("bucketfs: {} logs at {level} now", mountpoint.display());
    Ok(())
}

/// `bucketfs refresh`: asks the daemon serving `mountpoint` to list its sources again
/// (by reading an attribute of the mount's root that only bucketfs answers), waits, and
/// prints the new index's size.
pub fn refresh(mountpoint: &Path) -> Result<()> {
    let started = std::time::Instant::now();
    let status = attributes::get(mountpoint, INDEX_REFRESH).map_err(|error| {
        if attributes::not_bucketfs(&error) {
            anyhow::anyhow!("{} is not a bucketfs mount with --index", mountpoint.display())
        } else {
            anyhow::Error::new(error).context(format!("refreshing the index of {}", mountpoint.display()))
        }
    })?;
    // A closed standard output (`bucketfs refresh MNT | head -1`) is not an error of the
    // refresh, which is done: the report is best effort.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "bucketfs: index refreshed in {:.2?}", started.elapsed());
    let _ = out.write_all(&status);
    Ok(())
}

fn split_arguments(all: &[String]) -> Result<(&str, Vec<SourceSpec>)> {
    let Some((mountpoint, sources)) = all.split_last() else {
        bail!("usage: bucketfs mount SOURCE... MOUNTPOINT");
    };
    if sources.is_empty() {
        bail!("usage: bucketfs mount SOURCE... MOUNTPOINT (no source given)");
    }
    let specs =
        sources.iter().map(|s| SourceSpec::parse(s)).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
    check_layout(&specs).map_err(anyhow::Error::msg)?;
    Ok((mountpoint, specs))
}

/// The mount point must be an existing, empty directory that is not already mounted.
/// Returns its canonical path.
fn check_mountpoint(path: &Path) -> Result<PathBuf> {
    let shown = path.display();
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("mount point {shown} does not exist"),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            bail!(
                "mount point {shown} is already mounted (by a filesystem that stopped; run `bucketfs unmount {shown}`)"
            )
        }
        Err(e) => bail!("mount point {shown}: {e}"),
    };
    if !metadata.is_dir() {
        bail!("mount point {shown} is not a directory");
    }
    let canonical = path.canonicalize().with_context(|| format!("mount point {shown}"))?;
    if is_mount_point(&canonical)? {
        bail!("mount point {shown} is already mounted");
    }
    if std::fs::read_dir(&canonical)?.next().is_some() {
        bail!("mount point {shown} is not empty");
    }
    Ok(canonical)
}

/// Whether to ask the kernel for FUSE over io_uring (`--fuse-transport`): `uring` turns
/// the kernel's switch on if it is off, or fails saying why.
fn ring_wanted(transport: FuseTransportArg) -> Result<bool> {
    let wanted = match transport {
        FuseTransportArg::DevFuse => false,
        FuseTransportArg::Auto => ring::kernel_allows(),
        FuseTransportArg::Uring if ring::kernel_allows() => true,
        FuseTransportArg::Uring => {
            ring::allow_in_kernel().with_context(|| {
                format!(
                    "--fuse-transport uring: the kernel's switch {} is off and could not be turned on \
                     (it needs root and Linux 6.14 or later; or use --fuse-transport dev-fuse)",
                    ring::KERNEL_SWITCH
                )
            })?;
            tracing::info!("turned on {} for --fuse-transport uring", ring::KERNEL_SWITCH);
            true
        }
    };
    // Only where this process can make an io_uring: otherwise nothing could register the
    // ring's queues, or give up on them, and requests would wait forever.
    if let (true, Err(error)) = (wanted, ring::usable()) {
        tracing::warn!("FUSE over io_uring could not start (io_uring: {error}); requests go through /dev/fuse");
        return Ok(false);
    }
    Ok(wanted)
}

/// Starts the ring's queues if the kernel was asked for io_uring at INIT; otherwise, or if
/// they cannot start (the kernel is then told to go on with /dev/fuse), requests come on
/// /dev/fuse. The queues' threads end with the connection (not waited for at exit).
fn start_ring(adapter: &Arc<FuseAdapter>) {
    let (Some(max_write), Some(device)) = (adapter.ring_asked(), adapter.device()) else { return };
    match ring::serve(adapter.clone(), device, max_write) {
        Ok(queues) => tracing::info!(queues, "FUSE requests go over io_uring"),
        Err(error) => tracing::warn!("FUSE over io_uring could not start ({error}); requests go through /dev/fuse"),
    }
}

/// Sets the read-ahead of the new mount to the largest read request (1 MiB). The kernel
/// cuts reads of a FUSE file into requests no larger than its read-ahead, 128 KiB by
/// default, and INIT can only lower it: a 256 KiB random read then came as two requests,
/// the second of which looked sequential and started read-ahead (40 random 256 KiB
/// reads of a 1 GiB object: 394 GETs and 410 MB fetched, 0.40 s; with 1 MiB: 40 GETs,
/// 10.6 MB, 0.047 s). The setting is root's to change; for others it stays as it is.
fn raise_read_ahead(mountpoint: &Path) {
    let device = match mount_device(mountpoint) {
        Ok(Some(device)) => device,
        Ok(None) => return,
        Err(error) => return tracing::debug!("read-ahead left as it is: {error:#}"),
    };
    let setting = format!("/sys/class/bdi/{device}/read_ahead_kb");
    match std::fs::write(&setting, (crate::fuse::MAX_REQUEST / 1024).to_string()) {
        Ok(()) => tracing::debug!(setting, "read-ahead raised to {} KiB", crate::fuse::MAX_REQUEST / 1024),
        Err(error) => tracing::info!(
            "read-ahead left at the kernel's default ({setting}: {error}): reads arrive in pieces of 128 KiB"
        ),
    }
}

/// What stopped daemons left in these sources' buckets, dealt with before the mount
/// answers (so what it shows includes it): the uploads they left unfinished are aborted
/// (upload journal), and the files they closed with `--write-back` and had not stored
/// are stored (write-back log; at every mount, with the option or not). Daemons still
/// running are watched, and what they leave is dealt with once they stop
/// (`write::recovery`). Returns both, for this daemon's own records. A cache directory
/// that cannot hold them fails the mount: without them an upload cut by a crash would be
/// left behind, and files closed with `--write-back` lost.
fn recover_stopped_daemons(
    args: &MountArgs,
    runtime: &tokio::runtime::Runtime,
    sources: &[Source],
) -> Result<(Arc<Journal>, Arc<WriteBackLog>)> {
    let stores: Vec<_> = sources.iter().map(|s| s.store.clone()).collect();
    let unusable = |what: &str| {
        let dir = args.cache_dir.display();
        format!("cannot keep the {what} in {dir} (--cache-dir: a directory of this user's own)")
    };
    let journal = Journal::open(&args.cache_dir).with_context(|| unusable("journal of uploads"))?;
    let journal = Arc::new(journal.marked_running());
    let log = WriteBackLog::open(&args.cache_dir, args.write_back_limit, args.write_back_sync)
        .with_context(|| unusable("write-back log"))?;
    log.record_uploads_in(journal.clone());
    log.replay_only(sources.iter().map(|source| (source.store.location(), source.prefix.clone())).collect());
    let running = recovery::running_daemons(&journal, &log);
    let recovered = runtime.block_on(recovery::recover(&journal, &log, &stores));
    if recovered.aborted > 0 {
        tracing::info!("aborted {} unfinished uploads left by stopped daemons", recovered.aborted);
    }
    if recovered.stored > 0 {
        tracing::info!("stored {} files closed with --write-back by stopped daemons", recovered.stored);
    }
    if args.cache_dir == bucketfs_core::private_dir::default_cache_dir() {
        if let Some(earlier) = bucketfs_core::private_dir::earlier_default_cache_dir() {
            recover_from_earlier_default(&earlier, args, runtime, &stores);
        }
    }
    runtime.spawn(recovery::watch(journal.clone(), log.clone(), stores, running));
    Ok((journal, log))
}

/// What stopped daemons of an earlier version left where that version kept state by
/// default (`/var/tmp` for root), so that an upgrade loses no file closed with
/// `--write-back`: dealt with once, where the state directories there are this user's
/// own and private (anyone could have made them in `/var/tmp`).
fn recover_from_earlier_default(
    earlier: &std::path::Path,
    args: &MountArgs,
    runtime: &tokio::runtime::Runtime,
    stores: &[Arc<dyn bucketfs_client::store::ObjectStore>],
) {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let trusted = |name: &str| {
        std::fs::symlink_metadata(earlier.join(name))
            .is_ok_and(|found| found.is_dir() && found.uid() == me && found.mode() & 0o077 == 0)
    };
    if !trusted("bucketfs-uploads") || !trusted("bucketfs-write-back") {
        return;
    }
    let (Ok(journal), Ok(log)) =
        (Journal::open(earlier), WriteBackLog::open(earlier, args.write_back_limit, args.write_back_sync))
    else {
        return;
    };
    let journal = Arc::new(journal);
    log.record_uploads_in(journal.clone());
    let recovered = runtime.block_on(recovery::recover(&journal, &log, stores));
    if recovered != recovery::Recovered::default() {
        tracing::info!(
            "in {} (where an earlier version kept state): stored {} files closed with --write-back, aborted {} uploads",
            earlier.display(),
            recovered.stored,
            recovered.aborted
        );
    }
}

/// Builds one store client per source and checks, with one LIST each, that the bucket
/// exists and can be read with these credentials.
async fn connect_sources(args: &MountArgs, specs: &[SourceSpec]) -> Result<Vec<Source>> {
    let template = store_config(args)?;
    let checks = specs.iter().map(|spec| {
        let config = StoreConfig { bucket: spec.bucket.clone(), ..template.clone() };
        async move {
            let store = S3Store::new(&config).await.map_err(|error| anyhow::anyhow!("--ca-bundle: {error}"))?;
            check_source(spec, store).await
        }
    });
    futures::future::join_all(checks).await.into_iter().collect()
}

/// The store settings of every source (each then names its bucket); reads the SSE-C key
/// and CA bundle files.
/// The `--shared-cache` tier, if asked for. Its requests fail fast (2 s without data, no
/// retries past 1 s): a slow or absent shared cache must not slow reads, which then go
/// to the source. Checked with one LIST: a bucket that does not exist or refuses us
/// fails the mount (a mistake in the command line); one that does not answer now is
/// said in the log, and used once it answers.
async fn connect_shared_cache(args: &MountArgs) -> Result<Option<Arc<bucketfs_core::datacache::SharedCache>>> {
    let Some(location) = &args.shared_cache else { return Ok(None) };
    let key = shared_cache_key(args, location).context("--shared-cache")?;
    let endpoint_url = args.shared_cache_endpoint_url.as_ref();
    let tier = shared_cache(args, location, endpoint_url, key).await.context("--shared-cache")?;
    tier.check().await.map_err(|error| {
        anyhow::anyhow!("--shared-cache {location}: cannot list it at {}: {error}", tier.location())
    })?;
    Ok(Some(tier))
}

/// A client of the shared cache at `location` (`s3://BUCKET[/PREFIX]`), with the
/// sources' settings and credentials, at `endpoint_url` if given, sealing with `key`.
pub(crate) async fn shared_cache(
    args: &MountArgs,
    location: &str,
    endpoint_url: Option<&String>,
    key: bucketfs_core::datacache::TierKey,
) -> Result<Arc<bucketfs_core::datacache::SharedCache>> {
    let spec = SourceSpec::parse(location).map_err(|error| anyhow::anyhow!("{location}: {error}"))?;
    let mut config = store_config(args)?;
    config.bucket = spec.bucket.clone();
    if let Some(url) = endpoint_url {
        config.endpoint_urls = vec![url.clone()];
    }
    config.read_timeout = std::time::Duration::from_secs(2).min(config.read_timeout);
    config.retry_window = std::time::Duration::from_secs(1);
    config.listing_metadata = false;
    // The source's encryption and storage class are the source's business: the tier's
    // blocks are sealed with its own key.
    config.options =
        RequestOptions { encryption: None, storage_class: None, requester_pays: false, expected_bucket_owner: None };
    let store = S3Store::new(&config).await.map_err(|error| anyhow::anyhow!("{location}: {error}"))?;
    Ok(bucketfs_core::datacache::SharedCache::new(store, &spec.prefix, key))
}

/// The key of the shared cache at `location` (`--shared-cache-key-file`), which a tier
/// cannot go without.
fn shared_cache_key(args: &MountArgs, location: &str) -> Result<bucketfs_core::datacache::TierKey> {
    let Some(key_file) = &args.shared_cache_key_file else {
        bail!(
            "{location} needs --shared-cache-key-file: without a key, whoever can write the cache bucket could \
             plant blocks every machine serves, and whoever can read it would read every block (docs/SECURITY.md)"
        );
    };
    let key = std::fs::read(key_file).with_context(|| format!("reading the key file {}", key_file.display()))?;
    bucketfs_core::datacache::TierKey::from_file_content(&key)
        .map_err(|error| anyhow::anyhow!("the key file {}: {error}", key_file.display()))
}

/// Checks with one LIST that the source's bucket exists and can be read.
async fn check_source(spec: &SourceSpec, store: Arc<S3Store>) -> Result<Source> {
    match store.list(&spec.prefix, None, Some(1), false).await {
        Ok(_) => Ok(Source {
            mount_name: spec.mount_name.clone(),
            store: store as Arc<dyn ObjectStore>,
            prefix: spec.prefix.clone(),
        }),
        Err(error) => Err(explain(spec, error)),
    }
}

fn explain(spec: &SourceSpec, error: StoreError) -> anyhow::Error {
    let source = spec.describe();
    match error {
        StoreError::NoSuchBucket(bucket) => anyhow::anyhow!("bucket \"{bucket}\" does not exist ({source})"),
        StoreError::AccessDenied(_) => anyhow::anyhow!("access denied listing {source}: check the credentials' permissions"),
        StoreError::BadCredentials(code) => anyhow::anyhow!(
            "credentials rejected by the server for {source} ({code}): check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or --profile"
        ),
        StoreError::NoCredentials(detail) => anyhow::anyhow!(
            "no credentials to sign requests for {source} ({detail}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
             use --profile, or --no-sign-request for a public bucket"
        ),
        StoreError::Unreachable { endpoint, detail } => anyhow::anyhow!("cannot reach {endpoint} ({detail})"),
        other => anyhow::anyhow!("cannot list {source}: {other}"),
    }
}

fn default_memory_limit() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("MemTotal:"))?.to_owned();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map(|kib| kib * 1024)
        .unwrap_or(8 << 30);
    (total / 8).clamp(256 << 20, 4 << 30)
}

async fn wait_for_termination() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::warn!("cannot listen for signals");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Re-runs this command as a detached daemon and waits for it to be mounted; hands it
/// `credentials` (read with `--credentials-from-stdin`) on its standard input.
fn spawn_daemon(mountpoint: &Path, credentials: Option<&StaticCredentials>) -> Result<()> {
    let exe = std::env::current_exe().context("finding the bucketfs executable")?;
    let mut arguments: Vec<_> = super::command_line().into_iter().skip(1).collect();
    let position = arguments.iter().position(|a| a == "mount").map_or(0, |p| p + 1);
    arguments.insert(position, "--foreground".into());
    let mut child = Command::new(exe);
    let stdin = if credentials.is_some() { Stdio::piped() } else { Stdio::null() };
    child.args(arguments).env(READY_ENV, "1").stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: setsid() is async-signal-safe; the child leaves our session and terminal.
    unsafe {
        child.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    let mut child = child.spawn().context("starting the bucketfs daemon")?;
    if let (Some(credentials), Some(mut stdin)) = (credentials, child.stdin.take()) {
        // A daemon that fails before reading its input says why on stderr, read below.
        let _ = stdin.write_all(crate::mount_args::credentials::text(credentials).as_bytes());
    }
    let stdout = child.stdout.take().context("daemon stdout")?;
    let mut stderr = child.stderr.take().context("daemon stderr")?;
    let mut line = String::new();
    let _ = BufReader::new(stdout).read_line(&mut line);
    if let Some(logs) = line.trim_end().strip_prefix("ready ") {
        println!("bucketfs: mounted on {}; warnings and errors are logged to {logs}", mountpoint.display());
        return Ok(());
    }
    let mut message = String::new();
    let _ = stderr.read_to_string(&mut message);
    let status = child.wait().context("waiting for the bucketfs daemon")?;
    // The daemon already wrote a complete "bucketfs: error: ..." line.
    eprint!("{message}");
    std::process::exit(status.code().unwrap_or(1).max(1));
}

/// Under systemd with `Type=notify` (`NOTIFY_SOCKET` set), tells it the mount's state;
/// elsewhere does nothing.
fn notify_service_manager(states: &[NotifyState]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::warn!("cannot notify the service manager: {error}");
    }
}

/// In a daemon started by [`spawn_daemon`]: detach standard output and error (logs go
/// to `logs`), then tell the waiting parent that the mount is up, and where the logs are.
fn notify_ready(logs: &LogDestination) -> Result<()> {
    if std::env::var_os(READY_ENV).is_none() {
        return Ok(());
    }
    let parent = nix::unistd::dup(std::io::stdout()).context("keeping the pipe to the parent")?;
    let null = File::options().read(true).write(true).open("/dev/null").context("opening /dev/null")?;
    nix::unistd::dup2_stdout(&null).context("detaching standard output")?;
    nix::unistd::dup2_stderr(&null).context("detaching standard error")?;
    let line = format!("ready {}\n", logs.describe());
    File::from(parent).write_all(line.as_bytes()).context("notifying the parent")?;
    Ok(())
}
