//! `bucketfs cache status|clear`: what a data cache holds, and emptying it. The target is
//! the directory of `--cache`, or the shared cache of `--shared-cache` (an
//! `s3://BUCKET[/PREFIX]`, reached with the given endpoint, region and profile).

use std::io::Write as _;

use anyhow::{bail, Context as _, Result};

use super::args::{CacheAction, CacheTarget};

pub fn run(action: CacheAction) -> Result<()> {
    // A closed pipe (`| head`) is no error of ours: output is written with `let _ =`.
    let mut out = std::io::stdout();
    match action {
        CacheAction::Status(target) if is_shared(&target) => {
            let target_name = target.target.clone();
            let usage = with_shared_cache(target, |tier| async move { Ok(tier.usage().await?) })?;
            let oldest =
                usage.oldest.map_or("-".to_owned(), |time| humantime::format_rfc3339_seconds(time).to_string());
            let _ = writeln!(
                out,
                "{target_name}: {} objects, {} blocks, {} bytes, oldest block written {oldest}",
                usage.objects, usage.blocks, usage.bytes
            );
            if usage.other_keys > 0 {
                let _ = writeln!(out, "{target_name}: {} other keys under the prefix (not blocks)", usage.other_keys);
            }
        }
        CacheAction::Clear(target) if is_shared(&target) => {
            let target_name = target.target.clone();
            let deleted = with_shared_cache(target, |tier| async move { Ok(tier.clear().await?) })?;
            let _ = writeln!(out, "{target_name}: cleared ({deleted} blocks deleted)");
        }
        CacheAction::Status(target) => {
            let dir = local_dir(&target)?;
            let status =
                bucketfs_core::datacache::status(&dir).with_context(|| format!("reading {}", dir.display()))?;
            let cap = status.cap.map_or("not set".to_owned(), |cap| format!("{cap} bytes"));
            let _ = writeln!(
                out,
                "{}: {} objects, {} whole, {} bytes on disk, cap {cap}",
                dir.display(),
                status.objects,
                status.whole,
                status.bytes
            );
        }
        CacheAction::Clear(target) => {
            let dir = local_dir(&target)?;
            bucketfs_core::datacache::clear(&dir).with_context(|| format!("clearing {}", dir.display()))?;
            let _ = writeln!(out, "{}: cleared", dir.display());
        }
    }
    Ok(())
}

fn is_shared(target: &CacheTarget) -> bool {
    target.target.starts_with("s3://")
}

fn local_dir(target: &CacheTarget) -> Result<std::path::PathBuf> {
    if target.endpoint_url.is_some() || target.region.is_some() || target.profile.is_some() || target.force_path_style {
        bail!(
            "--endpoint-url, --region, --profile and --force-path-style are for a shared cache (s3://BUCKET[/PREFIX])"
        );
    }
    Ok(target.target.clone().into())
}

/// Runs `work` on a client of the shared cache `target` names, with the settings a
/// mount given the same options would use.
fn with_shared_cache<T, F, W>(target: CacheTarget, work: W) -> Result<T>
where
    W: FnOnce(std::sync::Arc<bucketfs_core::datacache::SharedCache>) -> F,
    F: std::future::Future<Output = Result<T>>,
{
    let mut flags = Vec::new();
    flags.extend(target.endpoint_url.iter().flat_map(|url| ["--endpoint-url".to_owned(), url.clone()]));
    flags.extend(target.region.iter().flat_map(|region| ["--region".to_owned(), region.clone()]));
    flags.extend(target.profile.iter().flat_map(|profile| ["--profile".to_owned(), profile.clone()]));
    if target.force_path_style {
        flags.push("--force-path-style".into());
    }
    let args = crate::mount_args::mount_args_for(flags, &target.target)?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        // Status and clear read names only: no block is opened or sealed.
        let key = bucketfs_core::datacache::TierKey::unheld().map_err(anyhow::Error::msg)?;
        let tier = super::mount::shared_cache(&args, &target.target, None, key).await?;
        let location = tier.location();
        work(tier).await.with_context(|| location)
    })
}
