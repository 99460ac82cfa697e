//! `bucketfs write-back list|retry|discard MOUNTPOINT`: the files closed with
//! `--write-back` that the store refused, asked of and acted on by the daemon through the
//! root's attribute `bucketfs.write-back` (see `fs::write_back`).

use std::io::Write as _;
use std::path::Path;

use anyhow::Result;

use super::args::WriteBackAction;
use crate::mounts::attributes;
use bucketfs_core::fs::WRITE_BACK;

pub fn run(action: WriteBackAction) -> Result<()> {
    let (mountpoint, command) = match &action {
        WriteBackAction::List { mountpoint } => (mountpoint, None),
        WriteBackAction::Retry { mountpoint } => (mountpoint, Some("retry".to_owned())),
        WriteBackAction::Discard { mountpoint, keys, .. } => (
            mountpoint,
            Some(std::iter::once("discard").chain(keys.iter().map(String::as_str)).collect::<Vec<_>>().join("\n")),
        ),
    };
    if let Some(command) = command {
        attributes::set(mountpoint, WRITE_BACK, command.as_bytes()).map_err(|error| explain(mountpoint, error))?;
    }
    let failed = attributes::get(mountpoint, WRITE_BACK).map_err(|error| explain(mountpoint, error))?;
    // A closed pipe (`| head`) is no error of ours.
    let mut out = std::io::stdout().lock();
    if failed.is_empty() {
        let _ = writeln!(out, "no refused files");
    } else {
        let _ = out.write_all(&failed);
    }
    Ok(())
}

fn explain(mountpoint: &Path, error: std::io::Error) -> anyhow::Error {
    if attributes::not_bucketfs(&error) {
        anyhow::anyhow!("{} is not a bucketfs mount", mountpoint.display())
    } else {
        anyhow::Error::new(error).context(format!("asking {}", mountpoint.display()))
    }
}
