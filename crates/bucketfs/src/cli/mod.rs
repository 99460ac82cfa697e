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
