//! Real programs in a mount, as users run them: what each leaves behind is read back at
//! once, through the same mount, and must be whole.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::common::*;

/// Runs `command`, failing the test with its output if it fails; returns its stdout.
fn run(command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}",
        describe_status(&out.status),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// A tarball of a tree, and the sorted relative paths of its files and of its directories.
type Tarball = (PathBuf, Vec<String>, Vec<String>);

/// A tarball of the bench's linux-shaped tree at 1/10 scale (7,100 files in 604
/// directories, 14 KB a file on average). Made once per test process.
fn linux_shaped_tarball() -> &'static Tarball {
    static TREE: OnceLock<(tempfile::TempDir, Tarball)> = OnceLock::new();
    let (_, made) = TREE.get_or_init(|| {
        let work = tempfile::tempdir().expect("tempdir");
        let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench");
        let tree = work.path().join("tree");
        run(Command::new("python3")
            .args(["-m", "bfsbench.treegen", "--scale", "0.1", "--out"])
            .arg(&tree)
            .current_dir(&bench));
        let archive = work.path().join("tree.tar");
        run(Command::new("tar").arg("cf").arg(&archive).arg("-C").arg(&tree).arg("."));
        let files = find(&tree, "f");
        let dirs = find(&tree, "d");
        (work, (archive, files, dirs))
    });
    made
}

/// The sorted paths (relative to `root`) of the entries of type `kind` (`find -type`).
fn find(root: &Path, kind: &str) -> Vec<String> {
    let out = run(Command::new("find").arg(root).args(["-mindepth", "1", "-type", kind, "-printf", "%P\n"]));
    let mut paths: Vec<String> = out.lines().map(str::to_owned).collect();
    paths.sort();
    paths
}

/// `tar x` of 7,100 files into a fresh directory, then `find` of it at once: every file
/// and directory is listed, by the mount that just wrote them. (Before, a listing the
/// mount kept from a LIST sent while files were still being written lacked them until
/// it expired: `find` listed 5,672 to 7,098 of the 7,100, and `tar` once failed to make
/// a directory inside one it had just made.)
fn untar_then_find(bucket: &str, args: &[&str]) {
    let (archive, files, dirs) = linux_shaped_tarball();
    assert_eq!(files.len(), 7_100, "the 1/10 tree's files");
    let b = create_bucket(bucket);
    let m = MountBuilder::new().bucket(&b).args(args.iter().copied()).mount();
    let into = m.join("untar");
    std::fs::create_dir(&into).expect("mkdir");
    run(Command::new("tar").arg("xf").arg(archive).arg("-C").arg(&into));
    let listed_files = find(&into, "f");
    let listed_dirs = find(&into, "d");
    assert_same_tree(&listed_files, files, "files listed right after tar x");
    assert_same_tree(&listed_dirs, dirs, "directories listed right after tar x");
}

#[test]
fn untar_then_find_lists_every_file() {
    untar_then_find("prog-untar", &[]);
}

#[test]
fn untar_then_find_lists_every_file_with_write_back() {
    let (_cache, cache_dir) = temp_cache_dir();
    untar_then_find("prog-untar-wb", &["--write-back", "--cache-dir", &cache_dir]);
}

/// The options of each mode a program is run in: the default, and `--write-back` (with
/// a cache directory of its own, kept for the next mount).
fn modes() -> Vec<(&'static str, Vec<String>, Option<tempfile::TempDir>)> {
    let (cache, cache_dir) = temp_cache_dir();
    vec![
        ("default", Vec::new(), None),
        ("write-back", vec!["--write-back".to_owned(), "--cache-dir".to_owned(), cache_dir], Some(cache)),
    ]
}

/// `git` with a fixed identity and no system or user configuration.
fn git(dir: &Path) -> Command {
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com");
    command
}

/// A local repository of 20 commits of 20 new files each (about 440 loose objects).
fn make_repository(dir: &Path) {
    std::fs::create_dir_all(dir).expect("mkdir");
    run(git(dir).args(["init", "-q", "-b", "main"]));
    for commit in 0..20 {
        for file in 0..20 {
            let path = dir.join(format!("d{}/f{commit}-{file}.txt", file % 4));
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, format!("commit {commit} file {file}\n").repeat(file + 1)).expect("write");
        }
        run(git(dir).args(["add", "-A"]));
        run(git(dir).args(["commit", "-q", "-m"]).arg(format!("commit {commit}")));
    }
}

/// `git clone --no-hardlinks` into a mount, then at once `fsck --full` and a clean
/// `status`; a commit and `gc` there, `fsck` again; after a remount `log` has every
/// commit and `fsck` passes. In each mode.
#[test]
fn git_clone_fsck_commit_gc_and_remount() {
    let work = tempfile::tempdir().expect("tempdir");
    let origin = work.path().join("origin");
    make_repository(&origin);
    for (mode, args, _cache) in modes() {
        let b = create_bucket(&format!("prog-git-{mode}"));
        let m = MountBuilder::new().bucket(&b).args(args.clone()).mount();
        let clone = m.join("clone");
        run(git(work.path()).args(["clone", "-q", "--no-hardlinks"]).arg(&origin).arg(&clone));
        run(git(&clone).args(["fsck", "--full", "--strict"]));
        assert_eq!(run(git(&clone).args(["status", "--porcelain"])), "", "{mode}: status right after clone");
        std::fs::write(clone.join("d0/new.txt"), "a change made in the mount\n").expect("write");
        run(git(&clone).args(["add", "-A"]));
        run(git(&clone).args(["commit", "-q", "-m", "in the mount"]));
        run(git(&clone).args(["gc", "-q"]));
        run(git(&clone).args(["fsck", "--full", "--strict"]));
        drop(m);

        let m = MountBuilder::new().bucket(&b).args(args).mount();
        let clone = m.join("clone");
        let log = run(git(&clone).args(["log", "--oneline"]));
        assert_eq!(log.lines().count(), 21, "{mode}: every commit after a remount:\n{log}");
        run(git(&clone).args(["fsck", "--full", "--strict"]));
        assert_eq!(run(git(&clone).args(["status", "--porcelain"])), "", "{mode}: status after a remount");
    }
}

/// Whether a database is whole, and how many rows its table `t` holds.
const SQLITE_CHECK: &str = "PRAGMA integrity_check; SELECT count(*) FROM t;";

/// Runs `sql` (on standard input: a long script does not fit in one argument) in
/// `sqlite3 DB`, failing the test if it fails; returns its output.
fn sqlite(db: &Path, sql: &str) -> String {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new("sqlite3")
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sqlite3");
    child.stdin.take().expect("stdin").write_all(sql.as_bytes()).expect("write the script");
    let out = child.wait_with_output().expect("sqlite3");
    assert!(out.status.success(), "sqlite3 {}: {}", db.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// sqlite in its default (rollback journal) mode: 20 transactions of 500 rows, then
/// `PRAGMA integrity_check` and a count, and again after a remount. In each mode.
#[test]
fn sqlite_transactions_and_remount() {
    for (mode, args, _cache) in modes() {
        let b = create_bucket(&format!("prog-sqlite-{mode}"));
        let m = MountBuilder::new().bucket(&b).args(args.clone()).mount();
        let db = m.join("test.db");
        let mut script = String::from("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);\n");
        for transaction in 0..20 {
            script.push_str("BEGIN;\n");
            for row in 0..500 {
                script.push_str(&format!("INSERT INTO t (v) VALUES ('row {transaction}-{row}');\n"));
            }
            script.push_str("COMMIT;\n");
        }
        sqlite(&db, &script);
        assert_eq!(sqlite(&db, SQLITE_CHECK), "ok\n10000\n", "{mode}");
        drop(m);
        let m = MountBuilder::new().bucket(&b).args(args).mount();
        assert_eq!(sqlite(&m.join("test.db"), SQLITE_CHECK), "ok\n10000\n", "{mode}: remount");
    }
}

/// What `rsync -a --checksum` would change to make `into` a copy of `source` (a dry run).
fn rsync_changes(source: &Path, into: &Path) -> String {
    run(Command::new("rsync")
        .args(["-a", "--checksum", "--dry-run", "--itemize-changes"])
        .arg(format!("{}/", source.display()))
        .arg(format!("{}/", into.display())))
}

/// `rsync -a` of a tree with modes, a symlink and old mtimes into a mount; then a
/// `--checksum` dry run finds nothing to do, before and after a remount; and `tar c` of
/// the tree from the mount holds what one made from local disk, file by file. In each
/// mode.
#[test]
fn rsync_and_tar_of_a_tree_round_trip() {
    let work = tempfile::tempdir().expect("tempdir");
    let source = work.path().join("src");
    for (path, mode) in [("bin/run.sh", 0o755), ("etc/secret", 0o600), ("doc/a.txt", 0o644), ("doc/deep/b.txt", 0o640)]
    {
        let file = source.join(path);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(&file, format!("content of {path}\n")).expect("write");
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(mode)).expect("chmod");
        let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_500_000_000);
        std::fs::File::options().write(true).open(&file).expect("open").set_modified(old).expect("mtime");
    }
    std::os::unix::fs::symlink("../doc/a.txt", source.join("bin/link")).expect("symlink");
    // An old time, as the files': rsync leaves a link made within the same second as it is.
    run(Command::new("touch").args(["-h", "-d", "@1500000000"]).arg(source.join("bin/link")));
    // Each file and link: name, size, type and mode, mtime, link target.
    let listing = |root: &Path| {
        run(Command::new("find").arg(root).args([
            "-mindepth",
            "1",
            "-not",
            "-type",
            "d",
            "-printf",
            "%P %s %M %T@ %l\n",
        ]))
    };
    let want = {
        let mut lines: Vec<String> = listing(&source).lines().map(str::to_owned).collect();
        lines.sort();
        lines
    };
    let tar_listing = |root: &Path| {
        let archive = run(Command::new("sh").arg("-c").arg(format!(
            "tar cf - --sort=name --owner=0 --group=0 --numeric-owner -C '{}' . | tar tvf -",
            root.display()
        )));
        archive.lines().filter(|line| !line.starts_with('d')).map(str::to_owned).collect::<Vec<_>>()
    };
    for (mode, args, _cache) in modes() {
        let b = create_bucket(&format!("prog-rsync-{mode}"));
        let m = MountBuilder::new().bucket(&b).args(args.clone()).mount();
        let into = m.join("copy");
        run(Command::new("rsync").arg("-a").arg(format!("{}/", source.display())).arg(&into));
        assert_eq!(rsync_changes(&source, &into), "", "{mode}: rsync --checksum finds nothing to do");
        let mut got: Vec<String> = listing(&into).lines().map(str::to_owned).collect();
        got.sort();
        assert_eq!(got, want, "{mode}: names, sizes, modes, mtimes and links");
        assert_eq!(tar_listing(&into), tar_listing(&source), "{mode}: tar c of the mount");
        drop(m);
        let m = MountBuilder::new().bucket(&b).args(args).mount();
        let into = m.join("copy");
        assert_eq!(rsync_changes(&source, &into), "", "{mode}: nothing to do after a remount");
        assert_eq!(tar_listing(&into), tar_listing(&source), "{mode}: tar c after a remount");
    }
}

/// sqlite's WAL mode needs its `-shm` file mapped shared and writable: it works, and
/// what it wrote reads back after a remount (SEMANTICS, "Programs").
#[test]
fn sqlite_wal_mode() {
    for (mode, args, _cache) in modes() {
        let b = create_bucket(&format!("prog-wal-{mode}"));
        let m = MountBuilder::new().bucket(&b).args(args.clone()).mount();
        let db = m.join("wal.db");
        let setup = "PRAGMA journal_mode=WAL; CREATE TABLE t (v TEXT); INSERT INTO t VALUES ('a'), ('b');";
        assert_eq!(sqlite(&db, setup), "wal\n", "{mode}");
        assert_eq!(sqlite(&db, SQLITE_CHECK), "ok\n2\n", "{mode}");
        drop(m);
        let m = MountBuilder::new().bucket(&b).args(args).mount();
        assert_eq!(sqlite(&m.join("wal.db"), SQLITE_CHECK), "ok\n2\n", "{mode}: remount");
    }
}

/// A small C project built with `make -j2` in a mount: the program runs from there, and
/// after `touch` of one source a rebuild compiles that one alone. In each mode.
#[test]
fn make_builds_and_rebuilds_only_what_changed() {
    for (mode, args, _cache) in modes() {
        let b = create_bucket(&format!("prog-make-{mode}"));
        let m = MountBuilder::new().bucket(&b).args(args).mount();
        let project = m.join("project");
        std::fs::create_dir(&project).expect("mkdir");
        let files = [
            ("Makefile", "app: main.o util.o\n\tcc -o app main.o util.o\n%.o: %.c util.h\n\tcc -c -o $@ $<\n"),
            ("util.h", "int twice(int);\n"),
            ("util.c", "#include \"util.h\"\nint twice(int x) { return 2 * x; }\n"),
            (
                "main.c",
                "#include <stdio.h>\n#include \"util.h\"\nint main(void) { printf(\"%d\\n\", twice(21)); return 0; }\n",
            ),
        ];
        for (name, content) in files {
            std::fs::write(project.join(name), content).expect("write");
        }
        let built = run(Command::new("make").arg("-j2").current_dir(&project));
        assert!(built.contains("main.c") && built.contains("util.c"), "{mode}: first build:\n{built}");
        assert_eq!(run(&mut Command::new(project.join("app"))), "42\n", "{mode}: the program runs from the mount");
        // make compares mtimes at the file system's precision: a second passes first.
        std::thread::sleep(Duration::from_millis(1100));
        run(Command::new("touch").arg(project.join("util.c")));
        let rebuilt = run(Command::new("make").arg("-j2").current_dir(&project));
        assert!(
            rebuilt.contains("util.c") && !rebuilt.contains("main.c"),
            "{mode}: rebuild after touch util.c:\n{rebuilt}"
        );
        assert_eq!(run(Command::new("make").arg("-q").current_dir(&project)), "", "{mode}: up to date");
    }
}

/// `python3 -m venv` in a mount (with pip): the venv's python runs from there and
/// imports pip.
#[test]
fn python_venv_runs_from_the_mount() {
    for (mode, args, _cache) in modes() {
        let b = create_bucket(&format!("prog-venv-{mode}"));
        let m = MountBuilder::new().bucket(&b).args(args).mount();
        let venv = m.join("venv");
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
        let python = venv.join("bin/python");
        let prefix = run(Command::new(&python).args(["-c", "import sys, pip; print(sys.prefix)"]));
        assert_eq!(prefix.trim(), venv.to_str().expect("utf-8"), "{mode}");
    }
}
