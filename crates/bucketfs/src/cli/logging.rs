//! The daemon's logs: where they go, in which format (`--log-format text|json`), and the
//! level, which can be changed while the mount runs (`bucketfs log-level MOUNTPOINT
//! LEVEL`, which sets the attribute `bucketfs.log-level` on the mount's root; the FUSE
//! adapter hands the new filter to [`LogLevel::set`]).
//!
//! An attribute rather than a signal: it carries the new level (a signal could only
//! toggle or cycle), the kernel checks that the caller may write the mount's root, and
//! the adapter also requires root or the daemon's own user.

use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

use crate::mount_args::{LogFormat, MountArgs};

/// Where a daemon's logs go when `--log-file` does not say: journald where it runs,
/// else a file (rotated daily, 7 kept) under the cache directory, named after the mount
/// point. A background mount is never silent: a failed upload after `close()` must be
/// findable. `bucketfs mount` prints where.
pub(super) enum LogDestination {
    Stderr,
    File(PathBuf),
    Journald,
}

const JOURNALD_SOCKET: &str = "/run/systemd/journal/socket";

impl LogDestination {
    pub(super) fn for_args(args: &MountArgs, mountpoint: &Path, daemon: bool) -> Self {
        if let Some(path) = &args.log_file {
            return LogDestination::File(path.clone());
        }
        if !daemon {
            return LogDestination::Stderr;
        }
        if Path::new(JOURNALD_SOCKET).exists() {
            return LogDestination::Journald;
        }
        let name = mountpoint.to_string_lossy().trim_matches('/').replace('/', "-");
        let name = if name.is_empty() { "root".to_owned() } else { name };
        LogDestination::File(args.cache_dir.join("bucketfs-logs").join(format!("{name}.log")))
    }

    pub(super) fn describe(&self) -> String {
        match self {
            LogDestination::Stderr => "standard error".to_owned(),
            LogDestination::File(path) => path.display().to_string(),
            LogDestination::Journald => "journald (journalctl -t bucketfs)".to_owned(),
        }
    }
}

/// Changes the level of the logs installed by [`init`].
#[derive(Clone)]
pub struct LogLevel {
    handle: reload::Handle<EnvFilter, Registry>,
}

impl LogLevel {
    /// Logs from now on at `level` (`debug`, or a filter such as `bucketfs=debug`).
    pub fn set(&self, level: &str) -> Result<(), String> {
        let filter = filter(level).map_err(|error| format!("{error:#}"))?;
        self.handle.reload(filter).map_err(|error| error.to_string())?;
        tracing::info!("log level now {level}");
        Ok(())
    }
}

/// `level` as a filter; fuser logs every unimplemented request and a harmless unmount
/// race at warn level, so it is kept at error unless `level` names it.
fn filter(level: &str) -> Result<EnvFilter> {
    let mut directives = level.to_owned();
    if !directives.contains("fuser") {
        directives.push_str(",fuser=error");
    }
    EnvFilter::try_new(&directives).with_context(|| format!("log level {level}"))
}

/// Installs the logger of a mount: `--log-level` and `--log-format` to `destination`.
pub(super) fn init(args: &MountArgs, destination: &LogDestination) -> Result<LogLevel> {
    let (filter, handle) = reload::Layer::new(filter(&args.log_level)?);
    let json = args.log_format == LogFormat::Json;
    let output: Box<dyn Layer<Registry> + Send + Sync> = match destination {
        LogDestination::File(path) if args.log_file.is_some() => {
            // Logs name keys: a new log file is the user's alone (0600).
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("opening log file {}", path.display()))?;
            formatted(BoxMakeWriter::new(std::sync::Mutex::new(file)), json, false)
        }
        LogDestination::File(path) => {
            let (dir, name) = (path.parent().unwrap_or(Path::new(".")), path.file_name().unwrap_or_default());
            bucketfs_core::private_dir::ensure(dir).with_context(|| format!("the log directory {}", dir.display()))?;
            let appender = tracing_appender::rolling::Builder::new()
                .rotation(tracing_appender::rolling::Rotation::DAILY)
                .filename_prefix(name.to_string_lossy())
                .max_log_files(7)
                .build(dir)
                .with_context(|| format!("opening the log directory {}", dir.display()))?;
            formatted(BoxMakeWriter::new(appender), json, false)
        }
        LogDestination::Journald => tracing_journald::layer()
            .context("connecting to journald")?
            .with_syslog_identifier("bucketfs".into())
            .boxed(),
        LogDestination::Stderr => formatted(BoxMakeWriter::new(std::io::stderr), json, !json),
    };
    tracing_subscriber::registry().with(output.with_filter(filter)).init();
    Ok(LogLevel { handle })
}

/// Lines of text (colored on a terminal) or one JSON object per event.
fn formatted(writer: BoxMakeWriter, json: bool, ansi: bool) -> Box<dyn Layer<Registry> + Send + Sync> {
    let layer = tracing_subscriber::fmt::layer().with_target(false).with_writer(writer);
    if json {
        layer.json().boxed()
    } else {
        layer.with_ansi(ansi).boxed()
    }
}
