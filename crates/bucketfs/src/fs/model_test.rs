//! A reference-model test of [`Fs`] without a mount: sequences of create, write, close,
//! unlink, rename, mkdir, rmdir, lookup and readdir on a few names in a few directories
//! run against an `Fs` over the in-memory store and against a plain model of a directory
//! tree; after each step the answers (and every listing) must equal the model's. The
//! store's listings may lag behind its writes (`MemoryStore::freeze_listings`), as a
//! LIST on its way while files are written does: what this mount did must show anyway.
//! At the end, with every file closed, the bucket holds exactly the model's files.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use fuser::Errno;
use proptest::prelude::*;

use super::*;
use crate::namespace::{Source, ROOT_INO};
use crate::store::memory::MemoryStore;

/// Long enough that nothing expires within a case: the promise is for the TTL.
const TTL: Duration = Duration::from_secs(600);
/// Directories ops happen in: the root, one the bucket holds at the start, one that
/// only a `mkdir` of the name `n` in the root makes.
const PARENTS: [&str; 3] = ["", "d", "n"];
const NAMES: [&str; 3] = ["x", "y", "n"];
/// A file the bucket holds at the start.
const STORED_AT_START: &str = "d/old";

#[derive(Clone, Debug)]
enum Op {
    /// Create and open for writing, write a line, keep open.
    Create(usize, usize),
    /// Close (flush, release) the oldest handle still open, if any.
    Close,
    Unlink(usize, usize),
    Rename {
        from: (usize, usize),
        to: (usize, usize),
    },
    Mkdir(usize, usize),
    Rmdir(usize, usize),
    Lookup(usize, usize),
    Readdir(usize),
    /// From now on the store's LISTs show the bucket as it is now, until `Thaw`.
    FreezeListings,
    ThawListings,
}

fn place() -> impl Strategy<Value = (usize, usize)> {
    (0..PARENTS.len(), 0..NAMES.len())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => place().prop_map(|(p, n)| Op::Create(p, n)),
        3 => Just(Op::Close),
        2 => place().prop_map(|(p, n)| Op::Unlink(p, n)),
        2 => (place(), place()).prop_map(|(from, to)| Op::Rename { from, to }),
        2 => place().prop_map(|(p, n)| Op::Mkdir(p, n)),
        1 => place().prop_map(|(p, n)| Op::Rmdir(p, n)),
        2 => place().prop_map(|(p, n)| Op::Lookup(p, n)),
        4 => (0..PARENTS.len()).prop_map(Op::Readdir),
        1 => Just(Op::FreezeListings),
        1 => Just(Op::ThawListings),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    File,
    Dir,
}

/// The reference: a POSIX directory tree, paths without a leading slash.
#[derive(Default)]
struct Model {
    entries: BTreeMap<String, Kind>,
}

impl Model {
    fn path(parent: &str, name: &str) -> String {
        if parent.is_empty() {
            name.to_owned()
        } else {
            format!("{parent}/{name}")
        }
    }

    fn is_dir(&self, path: &str) -> bool {
        path.is_empty() || self.entries.get(path) == Some(&Kind::Dir)
    }

    fn children(&self, dir: &str) -> BTreeSet<String> {
        let prefix = if dir.is_empty() { String::new() } else { format!("{dir}/") };
        self.entries
            .keys()
            .filter_map(|path| path.strip_prefix(&prefix))
            .filter(|rest| !rest.is_empty() && !rest.contains('/'))
            .map(str::to_owned)
            .collect()
    }
}

/// The filesystem under test, over an in-memory bucket.
struct Harness {
    fs: Arc<Fs>,
    caller: Caller,
    _staging: tempfile::TempDir,
}

impl Harness {
    fn new(store: Arc<MemoryStore>) -> Self {
        let staging = tempfile::tempdir().expect("a staging directory");
        let source = Source { mount_name: None, store, prefix: String::new() };
        let namespace = Namespace::new(vec![source], TTL);
        let presentation =
            Presentation { uid: 0, gid: 0, file_mode: 0o644, dir_mode: 0o755, attributes_from_listing: false };
        let read_config = ReadConfig { part_size: 8 << 20, initial_window: 1 << 20, max_window: 8 << 20 };
        let write_config = WriteConfig {
            read_only: false,
            part_size: 8 << 20,
            staging: StagingConfig {
                dir: staging.path().to_owned(),
                limit: MemoryLimiter::new(1 << 30),
                journal: None,
            },
            journal: None,
            write_back_log: None,
            write_back: false,
            content_type_from_name: true,
        };
        let fs = Fs::new(namespace, presentation, read_config, write_config, MemoryLimiter::new(1 << 30));
        // One thread of this process stands for the program: its close commits.
        let caller = Caller { thread: std::process::id(), uid: 0, gid: 0 };
        Self { fs: Arc::new(fs), caller, _staging: staging }
    }

    /// The inode of directory `path`, looked up from the root as the kernel would.
    async fn dir(&self, path: &str) -> Result<Ino, FsError> {
        let mut ino = ROOT_INO;
        for name in path.split('/').filter(|name| !name.is_empty()) {
            ino = self.fs.lookup(ino, name).await?.ino.0;
        }
        Ok(ino)
    }

    /// The inode of `path` if the model has a directory there (else the op is skipped).
    async fn dir_in(&self, model: &Model, path: &str) -> Result<Option<Ino>, FsError> {
        if !model.is_dir(path) {
            return Ok(None);
        }
        self.dir(path).await.map(Some)
    }

    async fn readdir(&self, dir: Ino) -> Result<BTreeSet<String>, FsError> {
        let (handle, _) = self.fs.opendir(dir)?;
        let mut names = BTreeSet::new();
        let mut offset = 0;
        loop {
            let mut batch = Vec::new();
            self.fs
                .readdir(dir, handle, offset, |entry| {
                    batch.push((entry.offset, entry.name.to_owned()));
                    false
                })
                .await?;
            let Some((last, _)) = batch.last() else { break };
            offset = *last;
            names.extend(batch.into_iter().map(|(_, name)| name).filter(|name| name != "." && name != ".."));
        }
        self.fs.releasedir(handle);
        Ok(names)
    }
}

fn errno_of<T>(result: Result<T, FsError>) -> Result<T, Errno> {
    result.map_err(|error| error.errno())
}

/// Runs `ops` on the harness and the model; the first difference fails the case.
async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let store = Arc::new(MemoryStore::with_keys([(STORED_AT_START.to_owned(), b"old".to_vec())]));
    let harness = Harness::new(store.clone());
    let mut model = Model::default();
    model.entries.insert("d".into(), Kind::Dir);
    model.entries.insert(STORED_AT_START.into(), Kind::File);
    // Handles open for writing, oldest first.
    let mut open: Vec<u64> = Vec::new();
    for (step, op) in ops.into_iter().enumerate() {
        let at = |parent: usize, name: usize| (PARENTS[parent], NAMES[name], Model::path(PARENTS[parent], NAMES[name]));
        match op {
            Op::Create(p, n) => {
                let (parent, name, path) = at(p, n);
                let Some(dir) = harness.dir_in(&model, parent).await.map_err(|e| fail(step, &op, e))? else { continue };
                let got = harness.fs.create(dir, name, 0o644, libc::O_WRONLY, harness.caller).await;
                match model.entries.contains_key(&path) {
                    true => prop_assert_eq!(errno_of(got.map(drop)), Err(Errno::EEXIST), "step {}: {:?}", step, op),
                    false => {
                        let (_, opened) = got.map_err(|e| fail(step, &op, e))?;
                        let line = format!("{path}\n");
                        let written = harness.fs.write(opened.handle, 0, line.as_bytes(), false).await;
                        prop_assert_eq!(errno_of(written), Ok(line.len() as u32), "step {}: write", step);
                        open.push(opened.handle);
                        model.entries.insert(path, Kind::File);
                    }
                }
            }
            Op::Close => {
                if open.is_empty() {
                    continue;
                }
                let handle = open.remove(0);
                let flushed = harness.fs.flush(handle, harness.caller.thread).await;
                prop_assert_eq!(errno_of(flushed), Ok(()), "step {}: close", step);
                harness.fs.release(handle).await;
            }
            Op::Unlink(p, n) => {
                let (parent, name, path) = at(p, n);
                let Some(dir) = harness.dir_in(&model, parent).await.map_err(|e| fail(step, &op, e))? else { continue };
                let expected = match model.entries.get(&path) {
                    None => Err(Errno::ENOENT),
                    Some(Kind::Dir) => Err(Errno::EISDIR),
                    Some(Kind::File) => Ok(()),
                };
                let got = errno_of(harness.fs.unlink(dir, name).await);
                prop_assert_eq!(got, expected, "step {}: {:?}", step, op);
                if expected.is_ok() {
                    model.entries.remove(&path);
                }
            }
            Op::Rename { from: (fp, fn_), to: (tp, tn) } => {
                let (from_parent, from_name, from_path) = at(fp, fn_);
                let (to_parent, to_name, to_path) = at(tp, tn);
                // Files only: directory renames have rules of their own (ENOTEMPTY, into
                // itself) that this test leaves to others.
                if !model.is_dir(from_parent)
                    || !model.is_dir(to_parent)
                    || model.entries.get(&from_path) != Some(&Kind::File)
                    || model.entries.get(&to_path) == Some(&Kind::Dir)
                {
                    continue;
                }
                let from_dir = harness.dir(from_parent).await.map_err(|e| fail(step, &op, e))?;
                let to_dir = harness.dir(to_parent).await.map_err(|e| fail(step, &op, e))?;
                let got = errno_of(harness.fs.rename((from_dir, from_name), (to_dir, to_name), false).await);
                prop_assert_eq!(got, Ok(()), "step {}: {:?}", step, op);
                if from_path != to_path {
                    model.entries.remove(&from_path);
                    model.entries.insert(to_path, Kind::File);
                }
            }
            Op::Mkdir(p, n) => {
                let (parent, name, path) = at(p, n);
                let Some(dir) = harness.dir_in(&model, parent).await.map_err(|e| fail(step, &op, e))? else { continue };
                let expected = if model.entries.contains_key(&path) { Err(Errno::EEXIST) } else { Ok(()) };
                let got = errno_of(harness.fs.mkdir(dir, name, 0o755, harness.caller).await.map(drop));
                prop_assert_eq!(got, expected, "step {}: {:?}", step, op);
                if expected.is_ok() {
                    model.entries.insert(path, Kind::Dir);
                }
            }
            Op::Rmdir(p, n) => {
                let (parent, name, path) = at(p, n);
                let Some(dir) = harness.dir_in(&model, parent).await.map_err(|e| fail(step, &op, e))? else { continue };
                let expected = match model.entries.get(&path) {
                    None => Err(Errno::ENOENT),
                    Some(Kind::File) => Err(Errno::ENOTDIR),
                    Some(Kind::Dir) if !model.children(&path).is_empty() => Err(Errno::ENOTEMPTY),
                    Some(Kind::Dir) => Ok(()),
                };
                let got = errno_of(harness.fs.rmdir(dir, name).await);
                prop_assert_eq!(got, expected, "step {}: {:?}", step, op);
                if expected.is_ok() {
                    model.entries.remove(&path);
                }
            }
            Op::Lookup(p, n) => {
                let (parent, name, path) = at(p, n);
                let Some(dir) = harness.dir_in(&model, parent).await.map_err(|e| fail(step, &op, e))? else { continue };
                let got = errno_of(harness.fs.lookup(dir, name).await).map(|attr| match attr.kind {
                    FileType::Directory => Kind::Dir,
                    _ => Kind::File,
                });
                let expected = model.entries.get(&path).copied().ok_or(Errno::ENOENT);
                prop_assert_eq!(got, expected, "step {}: {:?}", step, op);
            }
            Op::Readdir(p) => {
                let parent = PARENTS[p];
                let Some(dir) = harness.dir_in(&model, parent).await.map_err(|e| fail(step, &op, e))? else { continue };
                let got = harness.readdir(dir).await.map_err(|e| fail(step, &op, e))?;
                prop_assert_eq!(got, model.children(parent), "step {}: readdir of '{}'", step, parent);
            }
            Op::FreezeListings => store.freeze_listings(),
            Op::ThawListings => store.thaw_listings(),
        }
    }
    for handle in open {
        let flushed = harness.fs.flush(handle, harness.caller.thread).await;
        prop_assert_eq!(errno_of(flushed), Ok(()), "final close");
        harness.fs.release(handle).await;
    }
    store.thaw_listings();
    let stored: BTreeSet<String> = store.list_keys().into_iter().filter(|key| !key.ends_with('/')).collect();
    let files: BTreeSet<String> =
        model.entries.iter().filter(|(_, kind)| **kind == Kind::File).map(|(path, _)| path.clone()).collect();
    prop_assert_eq!(stored, files, "the bucket's files at the end");
    Ok(())
}

fn fail(step: usize, op: &Op, error: FsError) -> TestCaseError {
    TestCaseError::fail(format!("step {step}: {op:?}: {error}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Every answer and every listing is the model's, whatever the store's listings
    /// lag behind.
    #[test]
    fn the_filesystem_answers_as_a_directory_tree_would(ops in prop::collection::vec(op(), 1..60)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(run(ops))?;
    }
}
