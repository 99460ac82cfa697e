//! Which S3 key components can be shown as file names, and why the others cannot.
//!
//! S3 keys are arbitrary UTF-8 strings of at most 1024 bytes; a file name is a non-empty
//! byte string without `/`, and `.`/`..` are taken. A key whose components break these
//! rules is hidden (and logged once per listing), never mangled: showing `a//b` as `a/b`
//! would make two keys collide, and a mangled name could not be mapped back.
//!
//! Names longer than `NAME_MAX` (255) are shown and usable, as s3fs shows them: FUSE
//! passes names up to 1024 bytes, and the kernel is the judge of what a program may ask
//! for. What S3 cannot hold is a key longer than [`MAX_KEY`]: creating one is refused
//! with ENAMETOOLONG before it reaches the store.

/// Longest name FUSE passes to a file system (the kernel's `FUSE_NAME_MAX`).
pub const MAX_NAME: usize = 1024;

/// Longest key S3 (and MinIO) accepts, in bytes.
pub const MAX_KEY: usize = 1024;

/// Why a key component is not shown as a directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hidden {
    /// From `a//b` (or a key starting with `/`): no name to show.
    Empty,
    /// `.` or `..`: the kernel reserves them.
    Dot,
    /// Longer than [`MAX_NAME`] bytes: FUSE cannot pass it (only a prefix of a key can
    /// make a component that long, as keys end at 1024 bytes).
    TooLong,
    /// Contains NUL, which no file name can hold.
    Nul,
}

impl std::fmt::Display for Hidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Hidden::Empty => "it has an empty path component (\"//\")",
            Hidden::Dot => "it has a \".\" or \"..\" path component",
            Hidden::TooLong => "a path component is longer than 1024 bytes",
            Hidden::Nul => "it contains a NUL byte",
        })
    }
}

/// Checks one path component (the text between two `/` of a key).
pub fn check_component(name: &str) -> Result<(), Hidden> {
    if name.is_empty() {
        Err(Hidden::Empty)
    } else if name == "." || name == ".." {
        Err(Hidden::Dot)
    } else if name.len() > MAX_NAME {
        Err(Hidden::TooLong)
    } else if name.contains('\0') {
        Err(Hidden::Nul)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_odd_names_are_shown() {
        for name in ["a b", "100%", "a+b", "é", "日本", "#?&", " ", "...", ".hidden"] {
            assert_eq!(check_component(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn names_the_kernel_cannot_take_are_hidden() {
        assert_eq!(check_component(""), Err(Hidden::Empty));
        assert_eq!(check_component("."), Err(Hidden::Dot));
        assert_eq!(check_component(".."), Err(Hidden::Dot));
        assert_eq!(check_component(&"x".repeat(1025)), Err(Hidden::TooLong));
        // Longer than NAME_MAX is shown, as s3fs shows it.
        assert_eq!(check_component(&"x".repeat(256)), Ok(()));
        assert_eq!(check_component(&"x".repeat(1024)), Ok(()));
        // 1024 bytes is the limit, not 1024 characters.
        assert_eq!(check_component(&"é".repeat(513)), Err(Hidden::TooLong));
        assert_eq!(check_component("a\0b"), Err(Hidden::Nul));
    }
}
