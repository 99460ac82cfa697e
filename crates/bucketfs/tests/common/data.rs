//! Test data: deterministic pseudo-random bytes, a small PRNG, sha256 digests, and byte
//! comparisons with readable failure messages.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use sha2::{Digest, Sha256};

/// Deterministic pseudo-random bytes (xorshift64*), fast enough for 100 MiB in a debug build.
pub fn gen_data(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    if state == 0 {
        state = 0x2545_F491_4F6C_DD1D;
    }
    let mut v = vec![0u8; len];
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        c.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    let rem = chunks.into_remainder();
    if !rem.is_empty() {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let w = state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        let n = rem.len();
        rem.copy_from_slice(&w[..n]);
    }
    v
}

/// Small deterministic PRNG for offsets/lengths (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform-ish in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// sha256 of a file, read sequentially with `read(2)` calls of `buf_size` bytes.
/// Returns the digest and the number of bytes read.
pub fn sha256_file(path: &Path, buf_size: usize) -> io::Result<(String, u64)> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; buf_size];
    let mut total = 0u64;
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        total += n as u64;
    }
    Ok((hex::encode(h.finalize()), total))
}

/// Like `assert_eq!` for big byte slices: reports lengths and the first difference instead of
/// dumping megabytes.
#[track_caller]
pub fn assert_same_bytes(actual: &[u8], expected: &[u8], what: &str) {
    if actual == expected {
        return;
    }
    let first_diff = actual.iter().zip(expected).position(|(a, b)| a != b);
    panic!(
        "{what}: bytes differ (actual len {}, expected len {}, first differing offset {:?})",
        actual.len(),
        expected.len(),
        first_diff.or(Some(actual.len().min(expected.len())))
    );
}
