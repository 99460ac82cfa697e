//! Command-line arguments: names follow mount-s3 and s3fs where they overlap.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::mount_args::{parse_endpoint_url, MountArgs};

#[derive(Parser, Debug)]
#[command(name = "bucketfs", version, about = "Mount S3-compatible object storage as a directory")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Mount one or several buckets (or prefixes) on a directory.
    Mount(Box<MountArgs>),
    /// Unmount a bucketfs mount point.
    Unmount {
        /// The mount point to unmount.
        mountpoint: PathBuf,
    },
    /// Restore a deleted file from its latest version (a bucket with versioning on).
    Undelete {
        /// The file's path in the mount.
        path: PathBuf,
    },
    /// What each bucketfs mount (or this one) is doing: uploads, memory, cache, requests.
    Status {
        /// One mount point (default: every bucketfs mount).
        mountpoint: Option<PathBuf>,
    },
    /// Change the log level of a running mount (e.g. `debug`, `bucketfs=debug`, `warn`).
    LogLevel {
        /// The mount point.
        mountpoint: PathBuf,
        /// The new level, or a tracing filter.
        level: String,
    },
    /// List the sources of an `--index` mount again now, and wait until the new index is
    /// in use (the daemon also does this on SIGHUP, without waiting).
    Refresh {
        /// The mount point.
        mountpoint: PathBuf,
    },
    /// Mount sources, run one command in the mount, store what it wrote, unmount, and
    /// exit with the command's exit code: `bucketfs run [MOUNT OPTIONS] SOURCE... --
    /// COMMAND [ARGS]...`.
    Run(Box<RunArgs>),
    /// Show or empty a data cache directory (what mounts with `--cache DIR` share).
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
    /// List, store again, or drop the files closed with --write-back that the store
    /// refused (kept in the write-back log until then).
    WriteBack {
        #[command(subcommand)]
        action: WriteBackAction,
    },
    /// Serve the Kubernetes CSI driver on a unix socket (docs/KUBERNETES.md).
    Csi(crate::csi::CsiArgs),
}

#[derive(Subcommand, Debug)]
pub enum WriteBackAction {
    /// Print the refused files: key, size, the store's answer.
    List {
        /// The mount point.
        mountpoint: PathBuf,
    },
    /// Store the refused files now, where nothing changed since their close (else as
    /// KEY.conflict-TIME), and print those still refused.
    Retry {
        /// The mount point.
        mountpoint: PathBuf,
    },
    /// Drop refused files from the log: they will never be stored.
    Discard {
        /// The mount point.
        mountpoint: PathBuf,
        /// The keys to drop.
        #[arg(required_unless_present = "all")]
        keys: Vec<String>,
        /// Drop every refused file.
        #[arg(long, conflicts_with = "keys")]
        all: bool,
    },
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Mount here (an existing empty directory) instead of in a private temporary one;
    /// must come before the mount options.
    #[arg(long, value_name = "DIR")]
    pub mountpoint: Option<PathBuf>,
    /// Options of `bucketfs mount` (without `--foreground`) and the sources, as for
    /// `bucketfs mount` but without the mount point; then `--` and the command to run
    /// (its working directory is the mount point, also given to it as BUCKETFS_MOUNT).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "MOUNT OPTIONS... SOURCE... -- COMMAND"
    )]
    pub line: Vec<String>,
}

impl RunArgs {
    /// The mount options and sources, and the command (after the first `--`).
    pub fn split(&self) -> Result<(&[String], &[String]), String> {
        let Some(at) = self.line.iter().position(|a| a == "--") else {
            return Err("no command: bucketfs run [OPTIONS] SOURCE... -- COMMAND [ARGS]...".into());
        };
        let (mount, command) = (&self.line[..at], &self.line[at + 1..]);
        if command.is_empty() {
            return Err("no command after --".into());
        }
        Ok((mount, command))
    }
}

#[derive(Subcommand, Debug)]
pub enum CacheAction {
    /// Print what a cache holds: for a directory, the objects cached, the bytes they take
    /// on disk, and the cap; for a shared cache, the objects, blocks and bytes there.
    Status(CacheTarget),
    /// Delete everything cached: a directory's content, or a shared cache's blocks (other
    /// keys under its prefix are left). Mounts using it go on, and fill it again.
    Clear(CacheTarget),
}

/// A cache: the directory given to `--cache`, or the shared cache given to
/// `--shared-cache` and how to reach it.
#[derive(Args, Debug, Clone)]
pub struct CacheTarget {
    /// The directory given to `--cache`, or the `s3://BUCKET[/PREFIX]` given to
    /// `--shared-cache`.
    #[arg(value_name = "DIR|s3://BUCKET[/PREFIX]")]
    pub target: String,
    /// A shared cache's endpoint (what `--shared-cache-endpoint-url` names). Default:
    /// AWS, or AWS_ENDPOINT_URL.
    #[arg(long, value_name = "URL", value_parser = parse_endpoint_url)]
    pub endpoint_url: Option<String>,
    /// A shared cache's region. Default: from the AWS config chain, else us-east-1.
    #[arg(long)]
    pub region: Option<String>,
    /// Named profile from the AWS shared config/credentials files.
    #[arg(long)]
    pub profile: Option<String>,
    /// Address the bucket as http://endpoint/bucket (MinIO, Ceph).
    #[arg(long)]
    pub force_path_style: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(line: &str) -> Result<RunArgs, String> {
        match Cli::try_parse_from(line.split(' ')) {
            Ok(Cli { command: Command::Run(args) }) => Ok(*args),
            Ok(other) => Err(format!("not run: {other:?}")),
            Err(error) => Err(error.to_string()),
        }
    }

    #[test]
    fn run_takes_mount_options_sources_and_a_command() {
        let args = run_args("bucketfs run --mountpoint /m --index --cache-size 1GiB s3://b/in=in -- sh -c true")
            .expect("parsed");
        assert_eq!(args.mountpoint, Some(PathBuf::from("/m")));
        let (mount, command) = args.split().expect("split");
        assert_eq!(mount, ["--index", "--cache-size", "1GiB", "s3://b/in=in"]);
        assert_eq!(command, ["sh", "-c", "true"]);
        let args = run_args("bucketfs run s3://b -- ls -- -l").expect("parsed");
        assert_eq!(args.split(), Ok((&["s3://b".to_owned()][..], &["ls".to_owned(), "--".into(), "-l".into()][..])));
        assert!(run_args("bucketfs run s3://b").expect("parsed").split().is_err(), "no command");
        assert!(run_args("bucketfs run s3://b --").expect("parsed").split().is_err(), "no command");
    }
}
