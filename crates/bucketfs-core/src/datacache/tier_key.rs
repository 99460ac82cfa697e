//! The key of a shared cache (`--shared-cache-key-file`), which keeps the tier's blocks
//! to the machines that hold it. Anyone who can write the cache bucket could otherwise
//! store a well-framed block with any bytes for every machine to serve, and anyone who
//! can read it would read the plaintext of every object read through it (objects read
//! with SSE-C or SSE-KMS too). So each block is sealed with AES-256-GCM: its bytes are
//! encrypted, and its tag also covers the name of the object it belongs to and its
//! number, so a block moved to another place does not open either. A block that does
//! not open is a miss. Object names are keyed too (HMAC-SHA256 of the object's
//! identity), so a listing of the bucket does not tell which objects are cached, and
//! machines with another key never meet these blocks.
//!
//! A sealed frame is the block's encrypted bytes, then [`SEAL_LEN`] bytes: the tag and
//! the nonce, random for every frame (a block written twice never reuses a nonce).

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf::{Salt, HKDF_SHA256};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// Bytes a sealed frame adds to its block: the tag, then the nonce.
pub const SEAL_LEN: u64 = (TAG_LEN + NONCE_LEN) as u64;
const TAG_LEN: usize = 16;

/// Fewest bytes a key file may hold (after surrounding whitespace).
const SHORTEST_KEY: usize = 16;

/// The keys made from one key file.
pub struct TierKey {
    names: hmac::Key,
    blocks: LessSafeKey,
    random: SystemRandom,
}

impl std::fmt::Debug for TierKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TierKey(..)")
    }
}

impl TierKey {
    /// The keys of a key file's content: every machine sharing the tier uses the same
    /// file (a Kubernetes Secret, say). Surrounding whitespace is not part of the key.
    pub fn from_file_content(content: &[u8]) -> Result<Self, String> {
        let secret = content.trim_ascii();
        if secret.len() < SHORTEST_KEY {
            return Err(format!(
                "holds {} bytes, fewer than {SHORTEST_KEY}: make one with `head -c 32 /dev/urandom > FILE`",
                secret.len()
            ));
        }
        let master = Salt::new(HKDF_SHA256, b"bucketfs shared cache, version 1").extract(secret);
        let names = master.expand(&[b"object names"], hmac::HMAC_SHA256).map_err(|_| "cannot derive a key")?;
        let blocks = master.expand(&[b"blocks"], &AES_256_GCM).map_err(|_| "cannot derive a key")?;
        Ok(Self {
            names: hmac::Key::from(names),
            blocks: LessSafeKey::new(UnboundKey::from(blocks)),
            random: SystemRandom::new(),
        })
    }

    /// A key nobody holds (random): for what reads the tier's names alone (`bucketfs
    /// cache status`, `clear`).
    pub fn unheld() -> Result<Self, String> {
        let mut secret = [0u8; 32];
        SystemRandom::new().fill(&mut secret).map_err(|_| "no random bytes to be had")?;
        Self::from_file_content(hex::encode(secret).as_bytes())
    }

    /// The keyed hash of an object's identity.
    pub fn name_hash(&self, identity: &[u8]) -> hmac::Tag {
        hmac::sign(&self.names, identity)
    }

    /// Appends block `index` of the object `hash` as a sealed frame. `false` (nothing
    /// appended) if no random nonce could be had.
    pub fn seal_into(&self, frames: &mut bytes::BytesMut, hash: &str, index: u64, block: &[u8]) -> bool {
        let mut nonce = [0; NONCE_LEN];
        if self.random.fill(&mut nonce).is_err() {
            return false;
        }
        let start = frames.len();
        frames.extend_from_slice(block);
        let place = place(hash, index);
        let sealed = self.blocks.seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(&place),
            &mut frames[start..],
        );
        match sealed {
            Ok(tag) => {
                frames.extend_from_slice(tag.as_ref());
                frames.extend_from_slice(&nonce);
                true
            }
            Err(_) => {
                frames.truncate(start);
                false
            }
        }
    }

    /// Opens the sealed frame of block `index` of the object `hash` in place; the
    /// block's bytes, or `None` if it does not open (another key, another place, a
    /// changed byte, a cut frame).
    pub fn open<'f>(&self, hash: &str, index: u64, frame: &'f mut [u8]) -> Option<&'f [u8]> {
        let sealed_len = frame.len().checked_sub(NONCE_LEN)?;
        let (sealed, nonce) = frame.split_at_mut(sealed_len);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let place = place(hash, index);
        self.blocks.open_in_place(nonce, Aad::from(&place), sealed).ok().map(|block| &*block)
    }
}

/// What a frame's tag covers besides its bytes: the object it belongs to and its number.
fn place(hash: &str, index: u64) -> Vec<u8> {
    let mut place = Vec::with_capacity(hash.len() + 8);
    place.extend_from_slice(hash.as_bytes());
    place.extend_from_slice(&index.to_le_bytes());
    place
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> TierKey {
        TierKey::from_file_content(text.as_bytes()).expect("a key")
    }

    #[test]
    fn a_frame_opens_only_with_its_key_in_its_place() {
        let ours = key("0123456789abcdef0123456789abcdef\n");
        let mut frame = bytes::BytesMut::new();
        assert!(ours.seal_into(&mut frame, "h", 3, b"the block's bytes"));
        assert_eq!(frame.len() as u64, 17 + SEAL_LEN);
        assert!(!frame.windows(5).any(|w| w == b"block"), "the bytes are not there in the clear");
        let opened = |key: &TierKey, hash: &str, index: u64, mut frame: Vec<u8>| {
            key.open(hash, index, &mut frame).map(<[u8]>::to_vec)
        };
        assert_eq!(opened(&ours, "h", 3, frame.to_vec()).as_deref(), Some(&b"the block's bytes"[..]));
        assert_eq!(
            opened(&key("0123456789abcdef0123456789abcdef"), "h", 3, frame.to_vec()).as_deref(),
            Some(&b"the block's bytes"[..]),
            "whitespace is no part of the key"
        );
        assert_eq!(opened(&key("another key, as long as the first"), "h", 3, frame.to_vec()), None);
        assert_eq!(opened(&ours, "h", 4, frame.to_vec()), None, "another block's place");
        assert_eq!(opened(&ours, "g", 3, frame.to_vec()), None, "another object's");
        let mut flipped = frame.to_vec();
        flipped[2] ^= 1;
        assert_eq!(opened(&ours, "h", 3, flipped), None);
        assert_eq!(opened(&ours, "h", 3, frame[..frame.len() - 1].to_vec()), None, "cut");
        assert!(TierKey::from_file_content(b"  short \n").is_err());
    }
}
