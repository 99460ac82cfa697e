//! The `bucketfs` command: argument parsing, mount-time checks, going to the background,
//! signals, `unmount` and `refresh`.

pub mod args;
mod cache;
mod logging;
pub mod mount;
mod mount_options;
mod run;
pub mod source;
mod status;
mod write_back;

use clap::Parser;

use args::{Cli, Command};

/// The command line as parsed: `bucketfs mount ...` also when it came in the mount(8)
/// form (see `mount_options`). A mount going to the background runs it again.
static COMMAND_LINE: std::sync::OnceLock<Vec<std::ffi::OsString>> = std::sync::OnceLock::new();

fn command_line() -> Vec<std::ffi::OsString> {
    COMMAND_LINE.get().cloned().unwrap_or_else(|| std::env::args_os().collect())
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let args = match mount_options::rewrite(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("bucketfs: error: {error}");
            return 2; // clap's code for a bad command line
        }
    };
    let _ = COMMAND_LINE.set(args.clone());
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Command::Mount(args) => mount::run(*args),
        Command::Unmount { mountpoint } => crate::mounts::unmount(&mountpoint),
        Command::Refresh { mountpoint } => mount::refresh(&mountpoint),
        Command::LogLevel { mountpoint, level } => mount::set_log_level(&mountpoint, &level),
        Command::Status { mountpoint } => status::run(mountpoint.as_deref()),
        Command::Undelete { path } => mount::undelete(&path),
        Command::Cache { action } => cache::run(action),
        Command::WriteBack { action } => write_back::run(action),
        Command::Csi(args) => crate::csi::run(args),
        Command::Run(args) => return run::run(*args),
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
