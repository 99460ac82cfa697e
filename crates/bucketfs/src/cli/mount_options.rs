//! The command line as mount(8) and `/etc/fstab` give it: `bucketfs SOURCE MOUNTPOINT -o
//! OPTIONS`, without a subcommand (fuse3's `mount.fuse3` runs exactly that for
//! `mount -t fuse.bucketfs`), with every long option of `mount` also accepted as
//! `-o name=value` or `-o name` and the options mount(8) users write by habit (`ro`,
//! `allow_other`, `uid=`, `gid=`, `umask=`, `_netdev`, `x-systemd.*`, ...).
//!
//! This rewrites such a command line into the `bucketfs mount ...` one before clap
//! parses it, so there is one parser and one set of names.

use std::ffi::OsString;

use clap::CommandFactory;

use super::args::Cli;

/// Options that only mean something to mount(8), systemd or the kernel's generic mount
/// code, or that ask for what bucketfs does anyway (it always mounts `nodev,nosuid,
/// noatime`). `mount.fuse3` drops some of them itself; bucketfs run directly takes them
/// too, so one fstab line works both ways.
const IGNORED: &[&str] = &[
    "rw",
    "defaults",
    "auto",
    "noauto",
    "user",
    "users",
    "nouser",
    "owner",
    "_netdev",
    "nofail",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "atime",
    "noatime",
    "relatime",
    "strictatime",
    "nodiratime",
    "async",
];

/// Rewrites `args` (the whole command line, program name first) into a `bucketfs mount`
/// command line when it is in the mount(8) form or carries `-o`; other command lines are
/// returned as they are.
pub fn rewrite(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let mut args = args.into_iter();
    let program = args.next().unwrap_or_else(|| "bucketfs".into());
    let rest: Vec<OsString> = args.collect();
    let Some(first) = rest.first().and_then(|a| a.to_str()) else {
        return Ok(std::iter::once(program).chain(rest).collect());
    };
    let subcommands: Vec<String> = Cli::command().get_subcommands().map(|c| c.get_name().to_owned()).collect();
    let (mut out, rest) = if first == "mount" {
        (vec![program, first.into()], rest[1..].to_vec())
    } else if first.starts_with('-') || subcommands.iter().any(|s| s == first) || first == "help" {
        return Ok(std::iter::once(program).chain(rest).collect());
    } else {
        (vec![program, "mount".into()], rest)
    };
    let mut rest = rest.into_iter();
    while let Some(arg) = rest.next() {
        let list = match arg.to_str() {
            Some("-o") => rest.next().ok_or("-o needs a list of options, such as -o ro,allow_other")?,
            Some(joined) if joined.starts_with("-o") => joined[2..].into(),
            _ => {
                out.push(arg);
                continue;
            }
        };
        let list = list.into_string().map_err(|list| format!("-o {list:?} is not UTF-8"))?;
        for option in list.split(',').filter(|o| !o.is_empty()) {
            out.extend(translate(option)?.into_iter().map(OsString::from));
        }
    }
    Ok(out)
}

/// The long options one `-o` option stands for.
fn translate(option: &str) -> Result<Vec<String>, String> {
    let (name, value) = match option.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (option, None),
    };
    if IGNORED.contains(&name) || name.starts_with("x-") || name == "comment" {
        return Ok(Vec::new());
    }
    match (name, value) {
        ("ro", None) => return Ok(vec!["--read-only".into()]),
        ("umask", Some(umask)) => {
            let umask = u16::from_str_radix(umask, 8)
                .ok()
                .filter(|u| *u <= 0o777)
                .ok_or_else(|| format!("-o umask={umask} is not an octal mask such as 022"))?;
            return Ok(vec![format!("--file-mode={:o}", 0o666 & !umask), format!("--dir-mode={:o}", 0o777 & !umask)]);
        }
        _ => {}
    }
    let long = name.replace('_', "-");
    let cli = Cli::command();
    let known = cli
        .find_subcommand("mount")
        .and_then(|m| m.get_arguments().find(|a| a.get_long() == Some(long.as_str())).cloned());
    let Some(known) = known else {
        return Err(format!("unknown mount option '{name}' in -o (see bucketfs mount --help)"));
    };
    let takes_value = known.get_action().takes_values();
    match (value, takes_value) {
        (Some(value), true) => Ok(vec![format!("--{long}={value}")]),
        (None, false) => Ok(vec![format!("--{long}")]),
        (Some(_), false) => Err(format!("mount option '{name}' in -o takes no value")),
        (None, true) => Err(format!("mount option '{name}' in -o needs a value: -o {name}=...")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(line: &str) -> Result<String, String> {
        let args = line.split(' ').map(OsString::from).collect();
        rewrite(args).map(|out| out.iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" "))
    }

    #[test]
    fn the_mount_helper_form_becomes_a_mount_command() {
        assert_eq!(
            rewritten("bucketfs s3://b/p /data -o ro,endpoint-url=http://h:9,force_path_style,allow_other,uid=1000,gid=1000,umask=027,dev,suid").as_deref(),
            Ok("bucketfs mount s3://b/p /data --read-only --endpoint-url=http://h:9 --force-path-style --allow-other --uid=1000 --gid=1000 --file-mode=640 --dir-mode=750")
        );
        assert_eq!(
            rewritten("bucketfs s3://b /data -o rw,_netdev,nofail,x-systemd.automount -f").as_deref(),
            Ok("bucketfs mount s3://b /data -f")
        );
        assert_eq!(
            rewritten("bucketfs mount s3://b /d -ometadata-ttl=60").as_deref(),
            Ok("bucketfs mount s3://b /d --metadata-ttl=60")
        );
    }

    #[test]
    fn other_command_lines_are_left_alone() {
        for line in [
            "bucketfs mount s3://b /d --read-only",
            "bucketfs unmount /d",
            "bucketfs --help",
            "bucketfs cache status /c",
        ] {
            assert_eq!(rewritten(line).as_deref(), Ok(line));
        }
    }

    #[test]
    fn bad_options_say_what_is_wrong() {
        let error = |line| rewritten(line).expect_err(line);
        assert!(error("bucketfs s3://b /d -o fast").contains("unknown mount option 'fast'"));
        assert!(error("bucketfs s3://b /d -o allow_other=1").contains("takes no value"));
        assert!(error("bucketfs s3://b /d -o uid").contains("needs a value"));
        assert!(error("bucketfs s3://b /d -o umask=999").contains("octal"));
        assert!(error("bucketfs s3://b /d -o").contains("needs a list"));
    }
}
