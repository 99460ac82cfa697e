//! The bytes of a write-back log file: what is written, and how a file is read back.
//!
//! A record is a JSON line (its header, with the CRC-32 of the file's bytes) followed by
//! the file's bytes, or, for a file over one part, by nothing: its bytes are in a data
//! file of their own that the header names, with their length and CRC-32 ([`DataFile`]); a done mark is a line `{"done":ID}`; a change of a file not stored
//! yet (a rename, new attributes) is a line `{"amended":ID,"key":…,"metadata":…}`; a
//! failed record's file ends
//! with `{"failed":ID,"error":"…"}`. A segment is written over zeros laid ahead of its
//! records (see the log), so a file is read up to the first of: a zero byte where a line
//! would start (nothing written there yet), a line that is not whole, or a record whose
//! bytes do not match its checksum (a torn write: a power cut before `close` returned,
//! which may leave any of the record's pages unwritten, or before a failure was noted).

use bytes::Bytes;

use bucketfs_client::store::Metadata;

/// A line of a log file.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub(super) enum Line {
    Done {
        done: u64,
    },
    /// Record `amended` is to be stored as `amendment` says.
    Amended {
        amended: u64,
        #[serde(flatten)]
        amendment: Amendment,
    },
    Failed {
        failed: u64,
        error: String,
    },
    Record(Header),
}

/// What changed of a file closed and not stored yet: its name (a rename: it goes to `key`,
/// in place of what the rename replaced there, `over`), its attributes (`metadata`), or
/// its existence (`discarded`: unlinked).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Amendment {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// What the rename to `key` replaced. Written with every `key` since this field
    /// exists; a record amended by an earlier version has none (see [`Header::amend`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over: Option<RenamedOver>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    /// Unlinked before it was stored: nothing is to be stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub discarded: bool,
}

/// What was at the new name of a rename of a file not stored yet: a replay stores the
/// file there only if that is still so (else as a conflict), as for any other record.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RenamedOver {
    /// Nothing: the file is stored where the key is free.
    Nothing,
    /// The object of this ETag: the file replaces it, if it is still that version.
    Object(String),
}

impl Amendment {
    /// A rename to `key`, over what was there (`None`: not known).
    pub fn renamed(key: String, over: Option<RenamedOver>) -> Self {
        Self { key: Some(key), over, ..Self::default() }
    }

    /// This amendment, then `later` over it.
    pub fn and(&mut self, later: Amendment) {
        if later.key.is_some() {
            self.key = later.key;
            self.over = later.over;
        }
        if later.metadata.is_some() {
            self.metadata = later.metadata;
        }
        self.discarded |= later.discarded;
    }
}

/// The line before a file's bytes.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct Header {
    /// Numbers the records of one daemon in the order of their closes: a replay follows it.
    pub id: u64,
    pub len: u64,
    /// The store, as `ObjectStore::location` names it.
    pub location: String,
    pub key: String,
    pub create_only: bool,
    pub replaces: Option<String>,
    pub metadata: Metadata,
    /// A delete, not a file (see `PendingFile::delete`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delete: bool,
    /// CRC-32 of the file's bytes, as read back (`encode` writes it); records written
    /// before it existed have none.
    #[serde(default, skip_serializing)]
    pub crc: Option<u32>,
    /// Where the file's bytes are when they are not after the header (`len` is then 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_file: Option<DataFile>,
}

/// The bytes of a large record, in a file of the log's directory: written before the
/// record's line, checked against `crc` when read back (a power cut may leave the line
/// and not all of these bytes, see `WriteBackLog::record`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataFile {
    /// Its name in the log's directory, `DAEMON.data-ID.bytes`.
    pub name: String,
    pub len: u64,
    pub crc: u32,
}

/// A header as written: with the checksum of the bytes that follow it.
#[derive(serde::Serialize)]
struct Checked<'a> {
    #[serde(flatten)]
    header: &'a Header,
    crc: u32,
}

/// What a log file holds that is not done: its records in order. (A failed record's
/// error line is for whoever reads the file: a retry gets an answer of its own.)
#[derive(Default)]
pub(super) struct Parsed {
    pub records: Vec<(Header, Bytes)>,
}

/// The header line and the bytes of a record, as appended.
pub(super) fn encode(header: &Header, data: &[u8]) -> std::io::Result<Vec<u8>> {
    // `Line::Record` is untagged: it is written as the header itself (no copy of it).
    let mut record = serde_json::to_vec(&Checked { header, crc: crc32fast::hash(data) })?;
    record.push(b'\n');
    record.extend_from_slice(data);
    Ok(record)
}

/// CRC-32 of the first `len` bytes of `source` (an error if it is shorter), copying them
/// to `copy_to` on the way (a large record's data file).
pub(super) fn crc_of_file(source: &std::fs::File, len: u64, copy_to: Option<&std::fs::File>) -> std::io::Result<u32> {
    use std::os::unix::fs::FileExt;
    let mut crc = crc32fast::Hasher::new();
    let mut buffer = vec![0; (1 << 20).min(len as usize)];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(buffer.len() as u64) as usize;
        source.read_exact_at(&mut buffer[..n], at)?;
        crc.update(&buffer[..n]);
        if let Some(out) = copy_to {
            out.write_all_at(&buffer[..n], at)?;
        }
        at += n as u64;
    }
    Ok(crc.finalize())
}

/// A line without a record (done or failed).
pub(super) fn line(line: &Line) -> std::io::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec(line)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The records of a log file not marked done, in order, up to the end of what was
/// written (see the module documentation): a torn last record is left out, so is one
/// discarded; an amended one is as its amendments made it.
pub(super) fn parse(bytes: &[u8]) -> Parsed {
    let mut parsed = Parsed::default();
    let mut done = std::collections::HashSet::new();
    let mut amended: std::collections::HashMap<u64, Amendment> = std::collections::HashMap::new();
    let mut at = 0;
    while bytes.get(at).is_some_and(|&b| b != 0) {
        let Some(end) = bytes[at..].iter().position(|&b| b == b'\n').map(|n| at + n) else { break };
        match serde_json::from_slice::<Line>(&bytes[at..end]) {
            Ok(Line::Done { done: id }) => {
                done.insert(id);
                at = end + 1;
            }
            Ok(Line::Amended { amended: id, amendment }) => {
                amended.entry(id).or_default().and(amendment);
                at = end + 1;
            }
            Ok(Line::Failed { .. }) => at = end + 1,
            Ok(Line::Record(header)) => {
                let Some(data_end) = usize::try_from(header.len).ok().and_then(|len| (end + 1).checked_add(len)) else {
                    break;
                };
                if data_end > bytes.len() {
                    break; // torn: its close never returned
                }
                let data = &bytes[end + 1..data_end];
                if header.crc.is_some_and(|crc| crc != crc32fast::hash(data)) {
                    break; // torn inside: some of its pages never reached the disk
                }
                parsed.records.push((header, Bytes::copy_from_slice(data)));
                at = data_end;
            }
            Err(_) => break,
        }
    }
    parsed.records.retain(|(header, _)| !done.contains(&header.id));
    parsed.records.retain(|(header, _)| !amended.get(&header.id).is_some_and(|a| a.discarded));
    for (header, _) in &mut parsed.records {
        if let Some(amendment) = amended.remove(&header.id) {
            header.amend(amendment);
        }
    }
    parsed
}

impl Header {
    /// The file's bytes, wherever they are.
    pub(super) fn bytes(&self) -> u64 {
        self.len + self.data_file.as_ref().map_or(0, |data| data.len)
    }

    /// The file changed before it was stored. Renamed, it goes to the new key in place
    /// of what the rename replaced there: where the key was free, create-only; over an
    /// object, if it is still that version. (An amendment of an earlier version, which
    /// did not say, leaves it to a replay's rule for an unknown version: a conflict copy
    /// where an object is there.)
    pub(super) fn amend(&mut self, amendment: Amendment) {
        if let Some(key) = amendment.key {
            self.key = key;
            (self.create_only, self.replaces) = match amendment.over {
                Some(RenamedOver::Nothing) => (true, None),
                Some(RenamedOver::Object(etag)) => (false, Some(etag)),
                None => (false, None),
            };
        }
        if let Some(metadata) = amendment.metadata {
            self.metadata = metadata;
        }
    }
}
