//! Checks through the mount point with plain system calls: close(2) with its result,
//! positional reads, whole-file comparisons, directory listings and walks, errno asserts.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// close(2) of `file` with its result (dropping a `File` ignores it). This is where
/// bucketfs commits a file written through the mount.
pub fn close(file: File) -> io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = file.into_raw_fd();
    if unsafe { libc::close(fd) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// utimensat(2) of `path` by name (as `touch -d`, rsync and `cp -p` of a closed file do:
/// no descriptor opened), access and modification time both `time`.
pub fn set_times_by_name(path: &Path, time: std::time::SystemTime) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let since = time.duration_since(std::time::UNIX_EPOCH).map_err(io::Error::other)?;
    let spec = libc::timespec { tv_sec: since.as_secs() as libc::time_t, tv_nsec: since.subsec_nanos() as _ };
    let path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    if unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), [spec, spec].as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Memory aligned for O_DIRECT reads (to a page), `len` bytes of it usable.
pub struct AlignedBuffer {
    memory: Vec<u8>,
    len: usize,
}

impl AlignedBuffer {
    const ALIGN: usize = 4096;

    pub fn new(len: usize) -> Self {
        Self { memory: vec![0; len + Self::ALIGN], len }
    }

    pub fn bytes(&mut self) -> &mut [u8] {
        let skip = self.memory.as_ptr().align_offset(Self::ALIGN);
        &mut self.memory[skip..skip + self.len]
    }
}

/// `len` bytes at `offset` with pread (`read_exact_at`).
pub fn read_at(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

/// Up to `len` bytes at `offset` with pread, stopping early only at end of file (a short
/// result means EOF was reached).
pub fn pread_full(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    buf.truncate(done);
    Ok(buf)
}

/// Reads `path` sequentially with `read(2)` calls of `buf_size` bytes and compares every chunk
/// with `expected` as it goes (reports the first differing offset).
#[track_caller]
pub fn assert_file_content(path: &Path, buf_size: usize, expected: &[u8]) {
    let mut f = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut buf = vec![0u8; buf_size];
    let mut off = 0usize;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("read {} at offset {off}: {e}", path.display()),
        };
        assert!(
            off + n <= expected.len(),
            "{}: read past the expected size {} (got {} bytes at offset {off})",
            path.display(),
            expected.len(),
            n
        );
        if buf[..n] != expected[off..off + n] {
            let d = buf[..n].iter().zip(&expected[off..off + n]).position(|(a, b)| a != b).unwrap();
            panic!("{}: content differs at offset {} (buffer size {buf_size})", path.display(), off + d);
        }
        off += n;
    }
    assert_eq!(off, expected.len(), "{}: short read (buffer size {buf_size})", path.display());
}

/// Sorted names of a directory, or the error of the first failing call.
pub fn try_ls(dir: &Path) -> io::Result<Vec<String>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        v.push(e?.file_name().into_string().expect("non-UTF-8 name"));
    }
    v.sort();
    Ok(v)
}

/// Sorted names of a directory (what `ls -A` shows).
pub fn ls(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap_or_else(|e| panic!("read_dir {} entry: {e}", dir.display())))
        .map(|e| e.file_name().into_string().expect("non-UTF-8 name"))
        .collect();
    v.sort();
    v
}

/// Names of a directory in the order readdir returned them (to detect duplicates).
pub fn ls_unsorted(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap_or_else(|e| panic!("read_dir {} entry: {e}", dir.display())))
        .map(|e| e.file_name().into_string().expect("non-UTF-8 name"))
        .collect()
}

/// Recursive walk (like `find ROOT -type f`): relative paths of the regular files, plus the
/// relative paths of the directories.
pub fn walk(root: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut files = BTreeSet::new();
    let mut dirs = BTreeSet::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = root.join(&rel);
        for e in std::fs::read_dir(&abs).unwrap_or_else(|e| panic!("read_dir {}: {e}", abs.display())) {
            let e = e.unwrap();
            let name = e.file_name().into_string().expect("non-UTF-8 name");
            let r = if rel.as_os_str().is_empty() { PathBuf::from(&name) } else { rel.join(&name) };
            let md = std::fs::symlink_metadata(root.join(&r)).unwrap();
            let rs = r.to_str().unwrap().to_string();
            if md.is_dir() {
                assert!(dirs.insert(rs.clone()), "directory {rs} seen twice");
                stack.push(r);
            } else {
                assert!(md.is_file(), "{rs} is neither a file nor a directory");
                assert!(files.insert(rs.clone()), "file {rs} seen twice");
            }
        }
    }
    (files, dirs)
}

/// Asserts that `r` failed with errno `errno`.
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(r: io::Result<T>, errno: i32, what: &str) {
    match r {
        Ok(v) => panic!("{what}: expected errno {errno} ({}), got success: {v:?}", errno_name(errno)),
        Err(e) => assert_eq!(
            e.raw_os_error(),
            Some(errno),
            "{what}: expected errno {errno} ({}), got {e:?}",
            errno_name(errno)
        ),
    }
}

pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EROFS => "EROFS",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::EEXIST => "EEXIST",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => "?",
    }
}
