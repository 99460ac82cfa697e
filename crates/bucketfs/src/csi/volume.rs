//! What a CSI volume is to bucketfs: a bucket and a prefix, where the store is, and the
//! `bucketfs mount` options it is mounted with. Built from what the kubelet and the
//! provisioner send (volume attributes, the PV's mount options, the access mode, the
//! secret), checked here once, and turned into one `bucketfs mount` command line: the
//! node mounts with it, and the controller parses the same line into its store settings.

use std::collections::HashMap;
use std::path::Path;

use super::proto::volume_capability::access_mode::Mode;
use super::proto::volume_capability::AccessType;
use super::proto::VolumeCapability;
use crate::mount_args::credentials::{ACCESS_KEY_ID, SECRET_ACCESS_KEY, SESSION_TOKEN};
use bucketfs_client::store::s3::StaticCredentials;

/// Volume attributes (a PV's `volumeAttributes`, or a StorageClass's `parameters`).
pub const BUCKET: &str = "bucket";
pub const PREFIX: &str = "prefix";
pub const ENDPOINT_URL: &str = "endpointUrl";
pub const REGION: &str = "region";
const ATTRIBUTES: [&str; 4] = [BUCKET, PREFIX, ENDPOINT_URL, REGION];

/// The keys a credentials Secret may hold: the environment variables the S3 client
/// reads. The daemon gets the key on its standard input, the rest as its environment.
pub const SECRET_KEYS: [&str; 5] = [ACCESS_KEY_ID, SECRET_ACCESS_KEY, SESSION_TOKEN, ENDPOINT_URL_KEY, REGION_KEY];
const ENDPOINT_URL_KEY: &str = "AWS_ENDPOINT_URL";
const REGION_KEY: &str = "AWS_REGION";

/// Mount options the driver sets itself, or that would keep a mount from starting
/// in the background as the driver needs.
const OPTIONS_REFUSED: [&str; 4] = ["foreground", "f", "help", "version"];

/// One volume, as the node mounts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeSpec {
    pub bucket: String,
    /// Empty, or a key prefix ending in `/`.
    pub prefix: String,
    pub endpoint_url: Option<String>,
    pub region: Option<String>,
    /// `bucketfs mount` arguments from the PV's mount options, each `--NAME [VALUE]`.
    pub options: Vec<String>,
    pub read_only: bool,
}

impl VolumeSpec {
    /// From a volume's attributes, its mount options and its read-only flag. Attributes
    /// with a `/` in their name belong to Kubernetes (`csi.storage.k8s.io/...`) and are
    /// left alone; any other unknown one is refused, so that a typo is not silently lost.
    pub fn new(attributes: &HashMap<String, String>, mount_flags: &[String], read_only: bool) -> Result<Self, String> {
        if let Some(unknown) = attributes.keys().find(|key| !key.contains('/') && !ATTRIBUTES.contains(&key.as_str())) {
            return Err(format!("unknown volume attribute {unknown:?} (known: {})", ATTRIBUTES.join(", ")));
        }
        let bucket = attributes.get(BUCKET).map(|b| b.trim()).filter(|b| !b.is_empty());
        let bucket = bucket.ok_or_else(|| format!("the volume attribute {BUCKET:?} is missing"))?;
        if bucket.contains('/') {
            return Err(format!("bucket {bucket:?}: a bucket name has no '/' (a key prefix goes in {PREFIX:?})"));
        }
        let not_empty = |key| attributes.get(key).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let mut options = Vec::new();
        for flag in mount_flags {
            options.extend(mount_option(flag)?);
        }
        Ok(Self {
            bucket: bucket.to_owned(),
            prefix: normal_prefix(attributes.get(PREFIX).map_or("", String::as_str)),
            endpoint_url: not_empty(ENDPOINT_URL),
            region: not_empty(REGION),
            options,
            read_only,
        })
    }

    /// `s3://BUCKET/PREFIX`, as `bucketfs mount` takes it.
    pub fn source(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    /// The `bucketfs mount` arguments (after `mount`) that mount this volume at `target`,
    /// logging to `log_file` and keeping its work files (the `--write-back` log, uploads
    /// in progress) in `cache_dir`, unless the mount options name others: the driver
    /// gives directories on the node's disk, which outlive its container.
    pub fn mount_arguments(&self, target: &Path, log_file: &Path, cache_dir: &Path) -> Vec<String> {
        let mut arguments = Vec::new();
        if let Some(url) = &self.endpoint_url {
            arguments.extend(["--endpoint-url".to_owned(), url.clone()]);
        }
        if let Some(region) = &self.region {
            arguments.extend(["--region".to_owned(), region.clone()]);
        }
        if self.read_only && !self.options.iter().any(|o| o == "--read-only") {
            arguments.push("--read-only".to_owned());
        }
        for (option, default) in [("--log-file", log_file), ("--cache-dir", cache_dir)] {
            if !self.options.iter().any(|o| o == option) {
                arguments.extend([option.to_owned(), default.display().to_string()]);
            }
        }
        arguments.extend(self.options.iter().cloned());
        arguments.push(self.source());
        arguments.push(target.display().to_string());
        arguments
    }
}

/// A key prefix as bucketfs mounts it: no leading `/`, one trailing `/` (or empty).
pub fn normal_prefix(prefix: &str) -> String {
    let prefix = prefix.trim().trim_matches('/');
    if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    }
}

/// One PV mount option (`write-back`, `cache /var/cache/x`, `uid=1000`, `--read-only`)
/// as `bucketfs mount` arguments: `--NAME` and its value, if any.
fn mount_option(flag: &str) -> Result<Vec<String>, String> {
    let flag = flag.trim();
    let (name, value) = match flag.find([' ', '=']) {
        Some(at) => (&flag[..at], Some(flag[at + 1..].trim())),
        None => (flag, None),
    };
    let name = name.trim_start_matches('-');
    if name.is_empty() {
        return Err(format!("mount option {flag:?}: no option name"));
    }
    if OPTIONS_REFUSED.contains(&name) {
        return Err(format!("mount option {flag:?}: the driver runs every mount in the background"));
    }
    let mut arguments = vec![format!("--{name}")];
    arguments.extend(value.map(str::to_owned));
    Ok(arguments)
}

/// Whether `capability` is one a bucketfs volume can serve (a file system, any access
/// mode), and whether it asks for read-only. `Err` says why not.
pub fn check_capability(capability: &VolumeCapability) -> Result<bool, String> {
    match &capability.access_type {
        Some(AccessType::Mount(_)) => {}
        Some(AccessType::Block(_)) => return Err("block volumes are not supported: bucketfs serves files".into()),
        None => return Err("the volume capability has no access type".into()),
    }
    let mode = capability.access_mode.as_ref().map(|m| m.mode()).unwrap_or(Mode::Unknown);
    match mode {
        Mode::Unknown => Err("the volume capability has no access mode".into()),
        Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly => Ok(true),
        Mode::SingleNodeWriter
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter
        | Mode::MultiNodeSingleWriter
        | Mode::MultiNodeMultiWriter => Ok(false),
    }
}

/// What a volume's Secret holds: where the store is, and the key to sign with.
#[derive(Debug, Default)]
pub struct VolumeSecret {
    pub endpoint_url: Option<String>,
    pub region: Option<String>,
    /// Handed to the daemon on its standard input, never in its environment.
    pub credentials: Option<StaticCredentials>,
}

impl VolumeSecret {
    /// Only [`SECRET_KEYS`]; any other key is refused (a misspelt key would otherwise
    /// leave the daemon on the node's credentials), and so is half a key pair.
    pub fn new(secrets: &HashMap<String, String>) -> Result<Self, String> {
        if let Some(unknown) = secrets.keys().find(|key| !SECRET_KEYS.contains(&key.as_str())) {
            return Err(format!("unknown key {unknown:?} in the volume's secret (known: {})", SECRET_KEYS.join(", ")));
        }
        let value = |key: &str| secrets.get(key).filter(|value| !value.is_empty()).cloned();
        let credentials = match (value(ACCESS_KEY_ID), value(SECRET_ACCESS_KEY)) {
            (Some(access_key_id), Some(secret_access_key)) => {
                Some(StaticCredentials { access_key_id, secret_access_key, session_token: value(SESSION_TOKEN) })
            }
            (None, None) => None,
            _ => {
                return Err(
                    "the volume's secret needs both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or neither".into()
                )
            }
        };
        Ok(Self { endpoint_url: value(ENDPOINT_URL_KEY), region: value(REGION_KEY), credentials })
    }

    /// The daemon's environment: where the store is (no secret in it).
    pub fn environment(&self) -> Vec<(&'static str, String)> {
        let endpoint = self.endpoint_url.clone().map(|url| (ENDPOINT_URL_KEY, url));
        endpoint.into_iter().chain(self.region.clone().map(|region| (REGION_KEY, region))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::proto::volume_capability::{AccessMode, BlockVolume, MountVolume};

    fn attributes(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn attributes_and_mount_options_make_one_mount_command_line() {
        let flags = ["write-back".to_owned(), "cache /var/cache/b".to_owned(), "uid=1000".to_owned()];
        let spec = VolumeSpec::new(
            &attributes(&[("bucket", "data"), ("prefix", "/runs/7"), ("endpointUrl", "http://s:9000")]),
            &flags,
            true,
        )
        .unwrap();
        assert_eq!(spec.source(), "s3://data/runs/7/");
        let line = spec.mount_arguments(Path::new("/t"), Path::new("/l.log"), Path::new("/w"));
        let expected = "--endpoint-url http://s:9000 --read-only --log-file /l.log --cache-dir /w --write-back \
                        --cache /var/cache/b --uid 1000 s3://data/runs/7/ /t";
        assert_eq!(line.join(" "), expected);
    }

    #[test]
    fn a_log_file_or_cache_dir_among_the_mount_options_replaces_the_drivers() {
        let flags = ["log-file=/x.log".to_owned(), "cache-dir /c".to_owned()];
        let spec = VolumeSpec::new(&attributes(&[("bucket", "b")]), &flags, false).unwrap();
        let line = spec.mount_arguments(Path::new("/t"), Path::new("/l"), Path::new("/w")).join(" ");
        assert_eq!(line, "--log-file /x.log --cache-dir /c s3://b/ /t");
    }

    #[test]
    fn bad_attributes_and_options_are_refused_with_a_reason() {
        let error = |pairs: &[(&str, &str)], flags: &[&str]| {
            let flags: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
            VolumeSpec::new(&attributes(pairs), &flags, false).unwrap_err()
        };
        assert!(error(&[], &[]).contains("\"bucket\" is missing"));
        assert!(error(&[("bucket", "a/b")], &[]).contains("no '/'"));
        assert!(error(&[("bucket", "b"), ("prefx", "p")], &[]).contains("unknown volume attribute \"prefx\""));
        assert!(error(&[("bucket", "b")], &["foreground"]).contains("background"));
        assert!(error(&[("bucket", "b")], &["=x"]).contains("no option name"));
        // Kubernetes' own attributes pass.
        let ours = attributes(&[("bucket", "b"), ("csi.storage.k8s.io/pod.name", "p")]);
        assert!(VolumeSpec::new(&ours, &[], false).is_ok());
    }

    #[test]
    fn reader_modes_mount_read_only_and_block_volumes_are_refused() {
        let capability = |mode: Mode, block: bool| VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume::default())
            }),
        };
        assert_eq!(check_capability(&capability(Mode::MultiNodeReaderOnly, false)), Ok(true));
        assert_eq!(check_capability(&capability(Mode::MultiNodeMultiWriter, false)), Ok(false));
        assert!(check_capability(&capability(Mode::MultiNodeMultiWriter, true)).is_err());
        assert!(check_capability(&capability(Mode::Unknown, false)).is_err());
    }

    #[test]
    fn a_secret_holds_only_the_clients_variables_and_both_halves_of_a_key() {
        let secret = attributes(&[("AWS_ACCESS_KEY_ID", "a"), ("AWS_SECRET_ACCESS_KEY", "s"), ("AWS_REGION", "r")]);
        let secret = VolumeSecret::new(&secret).unwrap();
        assert_eq!(secret.credentials.as_ref().map(|key| key.secret_access_key.as_str()), Some("s"));
        assert_eq!(secret.environment(), [("AWS_REGION", "r".to_owned())], "no key in the environment");
        assert!(VolumeSecret::new(&attributes(&[("AWS_ACCESS_KEY_ID", "a")])).unwrap_err().contains("both"));
        assert!(VolumeSecret::new(&attributes(&[("accessKey", "a")])).unwrap_err().contains("unknown key"));
        assert!(VolumeSecret::new(&HashMap::new()).unwrap().credentials.is_none());
    }
}
