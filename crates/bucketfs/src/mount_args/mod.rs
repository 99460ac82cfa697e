//! What a mount is given: `bucketfs mount`'s arguments ([`MountArgs`]), the store settings
//! they make ([`store_config`]), and a key passed on standard input ([`credentials`]).
//! `cli` mounts with them and the CSI driver builds them for its volumes; neither needs
//! the other for it.

pub mod credentials;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser};

use bucketfs_client::store::request_options::{CustomerKey, Encryption, RequestOptions, UploadChecksums};
use bucketfs_client::store::s3::StoreConfig;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum UploadChecksumsArg {
    Crc32,
    Crc32c,
    Crc64nvme,
    Off,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuseTransportArg {
    Auto,
    Uring,
    DevFuse,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// `s3://BUCKET[/PREFIX]` to mount at the root, or several `s3://BUCKET[/PREFIX]=DIR`
    /// each shown as directory DIR; the last argument is the mount point.
    #[arg(required = true, num_args = 2.., value_name = "SOURCE... MOUNTPOINT")]
    pub sources_and_mountpoint: Vec<String>,

    /// S3 endpoint URL (e.g. http://127.0.0.1:9000 for MinIO). Default: AWS, or AWS_ENDPOINT_URL.
    /// Several URLs of one store (its nodes or gateways), comma-separated or repeated:
    /// requests are spread over those that answer; one that stops answering is left out
    /// for a while.
    #[arg(long, value_name = "URL[,URL...]", value_delimiter = ',', value_parser = parse_endpoint_url)]
    pub endpoint_url: Vec<String>,
    /// Region of the buckets. Default: from the AWS config chain, else us-east-1.
    #[arg(long)]
    pub region: Option<String>,
    /// Named profile from the AWS shared config/credentials files.
    #[arg(long)]
    pub profile: Option<String>,
    /// Read the access key from standard input, as lines AWS_ACCESS_KEY_ID=...,
    /// AWS_SECRET_ACCESS_KEY=... and optionally AWS_SESSION_TOKEN=..., instead of the
    /// environment (where /proc/PID/environ shows it); the daemon is then made
    /// non-dumpable. The CSI driver passes a volume's Secret this way.
    #[arg(long, conflicts_with_all = ["profile", "no_sign_request"])]
    pub credentials_from_stdin: bool,
    /// The key read with --credentials-from-stdin.
    #[arg(skip)]
    pub credentials: Option<bucketfs_client::store::s3::StaticCredentials>,
    /// Address buckets as http://endpoint/bucket instead of http://bucket.endpoint (MinIO, Ceph).
    #[arg(long)]
    pub force_path_style: bool,
    /// Server-side encryption of the objects written: `AES256` (SSE-S3) or `aws:kms`
    /// (SSE-KMS; with `--sse-kms-key-id`, that key, else the bucket's).
    #[arg(long, value_name = "AES256|aws:kms", value_parser = ["AES256", "aws:kms"])]
    pub sse: Option<String>,
    #[arg(long, value_name = "KEY_ID")]
    pub sse_kms_key_id: Option<String>,
    /// SSE-C: every object is written and read with the 256-bit key in FILE (32 bytes, or
    /// their base64 text). Objects written without it cannot be read through the mount.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["sse", "sse_kms_key_id"])]
    pub sse_c_key_file: Option<PathBuf>,
    /// Storage class of the objects written (STANDARD, STANDARD_IA, INTELLIGENT_TIERING, ...).
    #[arg(long, value_name = "CLASS")]
    pub storage_class: Option<String>,
    /// The requester pays for requests and transfer (requester-pays buckets).
    #[arg(long)]
    pub requester_pays: bool,
    /// Send unsigned requests (public buckets; no credentials are looked for).
    #[arg(long)]
    pub no_sign_request: bool,
    /// Also trust the PEM certificates in FILE for the endpoint's TLS (a private CA).
    #[arg(long, value_name = "FILE")]
    pub ca_bundle: Option<PathBuf>,
    /// Refuse buckets owned by another account than ACCOUNT_ID (sent with every request).
    #[arg(long, value_name = "ACCOUNT_ID")]
    pub expected_bucket_owner: Option<String>,
    /// Checksum protecting uploads in transit; `off` for stores that refuse aws-chunked
    /// bodies with checksum trailers (bodies are then signed instead).
    #[arg(long, value_enum, default_value = "crc32")]
    pub upload_checksums: UploadChecksumsArg,
    /// Send the reads' ranged GETs and the small PUTs through the AWS SDK, as every other
    /// request, instead of signing them and sending them straight on its connections (a
    /// store given by URL).
    #[arg(long, alias = "sdk-reads")]
    pub sdk_requests: bool,

    /// Stay in the foreground instead of returning once the mount is ready.
    #[arg(short, long)]
    pub foreground: bool,
    /// Allow other users (and root) to access the mount (needs user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    pub allow_other: bool,
    /// Owner of files and directories whose metadata sets none. Default: the user running
    /// bucketfs.
    #[arg(long)]
    pub uid: Option<u32>,
    /// Group of files and directories whose metadata sets none. Default: the group running
    /// bucketfs.
    #[arg(long)]
    pub gid: Option<u32>,
    /// Permission bits of files whose metadata sets none, in octal.
    #[arg(long, default_value = "0644", value_parser = parse_mode)]
    pub file_mode: u16,
    /// Permission bits of directories whose metadata sets none, in octal.
    #[arg(long, default_value = "0755", value_parser = parse_mode)]
    pub dir_mode: u16,
    /// Show listed files and directories with the defaults above and Last-Modified,
    /// without a HEAD per entry for the mode, owner and mtime stored in its metadata
    /// (faster `ls -l` and `find` on large buckets; stored attributes then show only for
    /// entries looked up by name before they were listed).
    #[arg(long)]
    pub attributes_from_listing: bool,
    /// Do not list the subtrees a walk (`find`, `ls -R`, `du`) reaches with flat LISTs;
    /// each directory then costs its own LIST (see docs/SEMANTICS.md, "Listings").
    #[arg(long)]
    pub no_flat_listing: bool,
    /// Send every listed entry with its attributes, also to walks that only want names
    /// (by default, over io_uring, a `find -name` gets its files as names only, and the
    /// kernel builds no inode for them; see docs/SEMANTICS.md, "FUSE transport").
    #[arg(long)]
    pub whole_listings: bool,
    /// Do not ask MinIO for objects' metadata in listings (its `metadata=true` extension,
    /// used when the server says it is MinIO); stored attributes then cost a HEAD per
    /// file, as on other servers.
    #[arg(long)]
    pub no_listing_metadata: bool,
    /// Serve the tree from a listing index: each source is listed whole once (flat, in
    /// parallel), and `ls`, `find` and `stat` cost no request. The index is saved in
    /// --cache-dir and loaded by the next mount; keys changed by other clients show after
    /// the next refresh (see --index-refresh, `bucketfs refresh`, SIGHUP).
    #[arg(long)]
    pub index: bool,
    /// How often an --index mount lists its sources again, in seconds (0: only when
    /// asked, by SIGHUP or `bucketfs refresh`).
    #[arg(long, default_value = "300", value_parser = parse_seconds, value_name = "SECONDS", requires = "index")]
    pub index_refresh: Duration,
    /// With --index: files' stored attributes (mode, owner, times in object metadata)
    /// are fetched in the background after each listing, this many HEADs per second,
    /// and kept in the saved index; 0 fetches them on first `stat` only.
    #[arg(long, default_value_t = 100, value_name = "HEADS", requires = "index")]
    pub index_attributes_rate: u32,
    /// Versioned buckets: each directory has a read-only `.versions/` (reached by name,
    /// never listed): `.versions/NAME/` holds a file per stored version of NAME, named by
    /// the time it was stored, also for deleted files.
    #[arg(long)]
    pub show_versions: bool,
    /// Mount read-only: every change is refused with EROFS.
    #[arg(long)]
    pub read_only: bool,
    /// Programs on the mount cannot be executed (the kernel's `noexec`).
    #[arg(long)]
    pub noexec: bool,
    /// How the kernel carries FUSE requests: `uring` (io_uring, one queue per CPU, each
    /// request served on the CPU that made it; Linux 6.14 and later; turns on the fuse
    /// module's enable_uring switch if it is off, which needs root), `dev-fuse` (reads
    /// and writes of /dev/fuse), or `auto`: io_uring where that switch is already on.
    #[arg(long, value_enum, default_value = "auto", value_name = "HOW")]
    pub fuse_transport: FuseTransportArg,

    /// How long metadata (listings, sizes, ETags, missing names) is trusted before asking
    /// S3 again, in seconds (fractions allowed).
    #[arg(long, default_value = "5", value_parser = parse_seconds, value_name = "SECONDS")]
    pub metadata_ttl: Duration,
    /// Largest ranged GET used when reading ahead, and the first part size of uploads
    /// (at least 5MiB; parts grow so that 10,000 of them hold 5 TiB).
    #[arg(long, default_value = "8MiB", value_parser = parse_size, value_name = "BYTES")]
    pub part_size: u64,
    /// Store new files without a Content-Type (the store's default), rather than the one
    /// their name's extension calls for (`.html` text/html, `.jpg` image/jpeg...).
    #[arg(long)]
    pub no_content_type_from_name: bool,
    /// Most S3 requests in flight at once, per source.
    #[arg(long, default_value_t = 16)]
    pub max_concurrent_requests: usize,
    /// An S3 request that receives no data for this many seconds fails (and is retried
    /// within --retry-window), so a store that stops answering never hangs an operation
    /// (a response body already flowing: this or 5 s, whichever is shorter).
    #[arg(long, default_value = "20", value_parser = parse_seconds, value_name = "SECONDS")]
    pub read_timeout: Duration,
    /// How long a request that failed for a passing reason (connection refused or reset,
    /// timeout, 5xx, 503 SlowDown) is retried, with backoff, before the operation fails:
    /// a store restarting within it is invisible to programs.
    #[arg(long, default_value = "10", value_parser = parse_seconds, value_name = "SECONDS")]
    pub retry_window: Duration,
    /// Memory the daemon may use for buffered data (e.g. 2GiB). Default: 1/8 of RAM, at most 4 GiB.
    #[arg(long, value_parser = parse_size, value_name = "BYTES")]
    pub memory_limit: Option<u64>,
    /// Where staging files go (files changed in place: append, random writes, O_RDWR,
    /// truncate; unlinked as soon as created, so nothing is left behind), and the
    /// daemon's state, each in a directory only this user can open: the journal of
    /// uploads in progress, the --write-back log, saved listing indexes, logs. Default:
    /// /var/lib/bucketfs for root; $XDG_STATE_HOME/bucketfs, else ~/.local/state/bucketfs,
    /// for other users.
    #[arg(long, default_value_os_t = bucketfs_core::private_dir::default_cache_dir(), value_name = "DIR")]
    pub cache_dir: PathBuf,
    /// Keep the blocks of objects read in DIR, on local disk, for later reads and later
    /// mounts, and files written in one PUT once stored: every mount using DIR shares it
    /// (see docs/SEMANTICS.md, "Data cache").
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// A shared cache behind --cache, in a store near the machines (a MinIO in the rack,
    /// an S3 Express directory bucket): blocks missing from the local cache are asked
    /// there before the source, and blocks fetched from the source are written there, for
    /// every machine's mounts (see docs/CONFIGURATION.md, "Shared cache").
    #[arg(long, value_name = "s3://BUCKET[/PREFIX]", requires = "cache")]
    pub shared_cache: Option<String>,
    /// The shared cache's store (default: the sources' endpoint); same credentials as
    /// the sources.
    #[arg(long, value_name = "URL", requires = "shared_cache", value_parser = parse_endpoint_url)]
    pub shared_cache_endpoint_url: Option<String>,
    /// The shared cache's key, needed with --shared-cache: a file of at least 16 bytes
    /// (`head -c 32 /dev/urandom > FILE`; a Kubernetes Secret), the same on every machine
    /// sharing the cache. Blocks are encrypted and authenticated with it, so whoever can
    /// read or write the cache bucket without it can neither read them nor plant blocks
    /// (see docs/SECURITY.md).
    #[arg(long, value_name = "FILE", requires = "shared_cache")]
    pub shared_cache_key_file: Option<PathBuf>,
    /// Most bytes the data cache (--cache) may take on disk, all mounts using it
    /// together. Default: 10% of the disk holding it; it never leaves less than 5% free.
    #[arg(long, value_parser = parse_size, value_name = "BYTES", requires = "cache")]
    pub cache_size: Option<u64>,
    /// Read files whole in the data cache through the daemon rather than by FUSE
    /// passthrough (slower, but a file open for reading from the cache can then be opened
    /// for writing at the same time: with passthrough, that open fails with ETXTBSY).
    #[arg(long, requires = "cache")]
    pub no_passthrough: bool,
    /// Most bytes all staging files may hold together; a write past it fails with ENOSPC.
    #[arg(long, default_value = "16GiB", value_parser = parse_size, value_name = "BYTES")]
    pub staging_limit: u64,
    /// Return from close() before the file is uploaded, and upload in the background (up
    /// to 32 files at once), like rclone's write-back; mkdir and a directory's attribute
    /// changes are stored just after they return too. Each is first written to a log
    /// under --cache-dir (synced within --write-back-sync) that the next mount stores if
    /// this daemon dies; a file over one part is staged on local disk while written (up
    /// to half of --write-back-limit; past that it streams) and copied there at close.
    /// Faster for many small files and on a far store; an upload the store refuses is
    /// kept in that log and reported (`bucketfs status`, `bucketfs write-back`): use
    /// fsync() where an error must be seen. The next operation on the file waits for its
    /// upload; unmount waits for all.
    #[arg(long, conflicts_with = "read_only")]
    pub write_back: bool,
    /// Most bytes the write-back log may hold: files closed and not stored yet, and
    /// failed ones. A close waits while uploads free room; where failed files fill it, a
    /// close stores its file before returning (and returns the store's error).
    #[arg(long, default_value = "1GiB", value_parser = parse_size, value_name = "BYTES")]
    pub write_back_limit: u64,
    /// How long a file closed with --write-back may wait in the page cache before the
    /// write-back log reaches the disk (one sync covers every close of that time). A kill
    /// of the daemon loses nothing closed either way; a power cut may lose what was
    /// closed in the last interval and not stored yet. 0 syncs at every close.
    #[arg(long, default_value = "0.1", value_parser = parse_seconds, value_name = "SECONDS")]
    pub write_back_sync: Duration,

    /// Log level: error, warn, info, debug, trace (or a tracing filter such as bucketfs=debug).
    #[arg(long, default_value = "warn")]
    pub log_level: String,
    /// `text` (lines) or `json` (one object per event: timestamp, level, fields).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Write logs to this file instead of standard error.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// Serve metrics in Prometheus text format on HOST:PORT (e.g. 127.0.0.1:9464), at
    /// any path (`/metrics`).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// The store settings a mount with `args` uses for its sources.
pub fn store_config(args: &MountArgs) -> Result<StoreConfig> {
    let encryption = if let Some(file) = &args.sse_c_key_file {
        let content = std::fs::read(file).with_context(|| format!("reading the SSE-C key file {}", file.display()))?;
        let key = CustomerKey::from_file_content(&content)
            .map_err(|error| anyhow::anyhow!("SSE-C key file {}: {error}", file.display()))?;
        Some(Encryption::Customer(key))
    } else {
        match (args.sse.as_deref(), &args.sse_kms_key_id) {
            (Some("AES256"), None) => Some(Encryption::S3),
            (Some("AES256"), Some(_)) => bail!("--sse-kms-key-id goes with --sse aws:kms"),
            (Some(_), key_id) | (None, key_id @ Some(_)) => Some(Encryption::Kms { key_id: key_id.clone() }),
            (None, None) => None,
        }
    };
    let ca_bundle = match &args.ca_bundle {
        Some(file) => Some(std::fs::read(file).with_context(|| format!("reading the CA bundle {}", file.display()))?),
        None => None,
    };
    Ok(StoreConfig {
        bucket: String::new(),
        endpoint_urls: args.endpoint_url.clone(),
        region: args.region.clone(),
        profile: args.profile.clone(),
        force_path_style: args.force_path_style,
        max_concurrent_requests: args.max_concurrent_requests,
        read_timeout: args.read_timeout,
        retry_window: args.retry_window,
        listing_metadata: !args.no_listing_metadata,
        options: RequestOptions {
            encryption,
            storage_class: args.storage_class.clone(),
            requester_pays: args.requester_pays,
            expected_bucket_owner: args.expected_bucket_owner.clone(),
        },
        upload_checksums: match args.upload_checksums {
            UploadChecksumsArg::Crc32 => UploadChecksums::Crc32,
            UploadChecksumsArg::Crc32c => UploadChecksums::Crc32c,
            UploadChecksumsArg::Crc64nvme => UploadChecksums::Crc64Nvme,
            UploadChecksumsArg::Off => UploadChecksums::Off,
        },
        no_sign_request: args.no_sign_request,
        sdk_requests: args.sdk_requests,
        ca_bundle,
        credentials: args.credentials.clone(),
    })
}

/// The `MountArgs` of `bucketfs mount FLAGS... SOURCE /`: for commands that reach a store
/// with the settings a mount given the same flags would use (`bucketfs cache`, the CSI
/// controller), parsed as `bucketfs mount` parses them.
pub fn mount_args_for(flags: Vec<String>, source: &str) -> Result<Box<MountArgs>, clap::Error> {
    let line = ["bucketfs mount".to_owned()].into_iter().chain(flags).chain([source.to_owned(), "/".into()]);
    Ok(Box::new(MountLine::try_parse_from(line)?.args))
}

/// `bucketfs mount`'s arguments alone, for [`mount_args_for`].
#[derive(Parser)]
#[command(name = "bucketfs mount")]
struct MountLine {
    #[command(flatten)]
    args: MountArgs,
}

fn parse_mode(text: &str) -> Result<u16, String> {
    u16::from_str_radix(text.trim_start_matches("0o"), 8)
        .ok()
        .filter(|mode| *mode <= 0o7777)
        .ok_or_else(|| format!("'{text}' is not an octal mode such as 0644"))
}

/// One URL of `--endpoint-url`: `http://` or `https://` and a host (the SDK would take a
/// bare `host:port` as a scheme and fail at the first request instead).
pub(crate) fn parse_endpoint_url(text: &str) -> Result<String, String> {
    let text = text.trim();
    let host = text.strip_prefix("http://").or_else(|| text.strip_prefix("https://"));
    match host {
        Some(host) if !host.is_empty() && !host.starts_with('/') && !host.contains(char::is_whitespace) => {
            Ok(text.trim_end_matches('/').to_owned())
        }
        _ => Err(format!(
            "'{text}' is not an endpoint URL such as http://127.0.0.1:9000 (http:// or https://, then the host)"
        )),
    }
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 =
        text.trim_end_matches('s').parse().map_err(|_| format!("'{text}' is not a number of seconds"))?;
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("'{text}' is not a valid duration"))
}

/// Parses sizes such as `1048576`, `512KiB`, `8MiB`, `8M`, `2G`, `1.5GiB`: every unit is
/// binary (`8MB` is 8 MiB, as memory and part sizes are meant). Shared with the
/// benchmark client (`examples/s3direct.rs`), so both read sizes alike.
pub fn parse_size(text: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(text.trim())
        .map_err(|error| format!("'{text}' is not a size such as 8MiB ({error})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_modes_parse() {
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("8M"), Ok(8 << 20));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("8 parsecs").is_err());
        assert_eq!(parse_mode("0644"), Ok(0o644));
        assert_eq!(parse_mode("755"), Ok(0o755));
        assert!(parse_mode("0999").is_err());
        assert_eq!(parse_seconds("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_seconds("5s"), Ok(Duration::from_secs(5)));
    }
}
