//! Who may access the mount: --allow-other.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use common::*;

const NOBODY: u32 = 65534;

/// `cat FILE` as user nobody: Ok(stdout) or Err(stderr).
fn cat_as_nobody(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let out =
        Command::new("cat").arg(path).uid(NOBODY).gid(NOBODY).stdin(Stdio::null()).output().expect("run cat as nobody");
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn other_users_need_allow_other() {
    let b = create_bucket("allow-other");
    put(&b, "f.txt", b"shared".to_vec());

    let m = MountBuilder::new().bucket(&b).mount();
    let r = cat_as_nobody(&m.join("f.txt"));
    assert!(r.is_err(), "user nobody could read a mount made without --allow-other");
    drop(m);

    let m = MountBuilder::new().bucket(&b).arg("--allow-other").mount();
    let opts = mount_options(m.path()).unwrap();
    assert!(opts.contains("allow_other"), "mount options: {opts}");
    match cat_as_nobody(&m.join("f.txt")) {
        Ok(data) => assert_eq!(data, b"shared"),
        Err(e) => panic!("user nobody cannot read with --allow-other: {e}\n{}", m.diagnostics()),
    }
}
