//! The `bucketfs` command: argument parsing, mount-time checks, going to the background,
//! signals, `unmount` and `refresh`.

pub mod args;
pub mod mount;
pub mod source;

use clap::Parser;

use args::{Cli, Command};

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Mount(args) => mount::run(*args),
        Command::Unmount { mountpoint } => mount::unmount(&mountpoint),
        Command::Refresh { mountpoint } => mount::refresh(&mountpoint),
        Command::Cache { action } => cache_command(action),
    };
    match result {
        Ok(()) => 0,
        Err(error) => {
            // One line, the whole chain of causes: what failed and why.
            let message = format!("{error:#}").replace('\n', " ");
            eprintln!("bucketfs: error: {message}");
            1
        }
    }
}

/// `bucketfs cache status|clear DIR`.
fn cache_command(action: args::CacheAction) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use std::io::Write as _;
    match action {
        args::CacheAction::Status { dir } => {
            let status = crate::datacache::status(&dir).with_context(|| format!("reading {}", dir.display()))?;
            let cap = status.cap.map_or("not set".to_owned(), |cap| format!("{cap} bytes"));
            // A closed pipe (`| head`) is no error of ours.
            let _ = writeln!(
                std::io::stdout(),
                "{}: {} objects, {} whole, {} bytes on disk, cap {cap}",
                dir.display(),
                status.objects,
                status.whole,
                status.bytes
            );
        }
        args::CacheAction::Clear { dir } => {
            crate::datacache::clear(&dir).with_context(|| format!("clearing {}", dir.display()))?;
            let _ = writeln!(std::io::stdout(), "{}: cleared", dir.display());
        }
    }
    Ok(())
}
