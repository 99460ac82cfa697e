//! Tiny read-only in-memory tree: root (ino 1) with N files f0000.. (ino 2..), 4 KiB each,
//! content = byte (ino as u8). Transport-agnostic: gets (in header, per-op header, rest of args),
//! writes the reply args (without fuse_out_header) into `out`.

use crate::proto::*;

pub enum Reply {
    /// reply args of this many bytes are in `out`
    Ok(usize),
    /// positive errno
    Err(i32),
    /// no reply (FORGET, BATCH_FORGET, INTERRUPT)
    None,
}

pub struct MemFs {
    nfiles: usize,
    data: Vec<u8>,
    /// entry/attr timeout in seconds (0 = every stat goes to the server)
    ttl: u64,
}

const FILE_SIZE: u64 = 4096;

impl MemFs {
    pub fn new(nfiles: usize) -> Self {
        MemFs { nfiles, data: vec![0u8; FILE_SIZE as usize], ttl: 0 }
    }

    fn ino_of(&self, name: &[u8]) -> Option<u64> {
        if name.len() != 5 || name[0] != b'f' {
            return None;
        }
        let n: usize = std::str::from_utf8(&name[1..]).ok()?.parse().ok()?;
        (n < self.nfiles).then_some(n as u64 + 2)
    }

    fn valid(&self, ino: u64) -> bool {
        ino == 1 || (ino >= 2 && ino < 2 + self.nfiles as u64)
    }

    /// struct fuse_attr (88 bytes)
    fn attr(&self, ino: u64, b: &mut [u8]) {
        b[..ATTR_SIZE].fill(0);
        let dir = ino == 1;
        wr64(b, 0, ino);
        wr64(b, 8, if dir { 0 } else { FILE_SIZE });
        wr64(b, 16, if dir { 0 } else { FILE_SIZE / 512 });
        for o in [24, 32, 40] {
            wr64(b, o, 1_700_000_000); // atime mtime ctime
        }
        wr32(b, 60, if dir { libc::S_IFDIR | 0o755 } else { libc::S_IFREG | 0o444 });
        wr32(b, 64, if dir { 2 } else { 1 }); // nlink
        wr32(b, 80, 4096); // blksize
    }

    pub fn handle(&self, h: &InHeader, op_in: &[u8], payload: &[u8], out: &mut [u8]) -> Reply {
        match h.opcode {
            FUSE_LOOKUP => {
                if h.nodeid != 1 {
                    return Reply::Err(libc::ENOENT);
                }
                let name = payload.split(|&c| c == 0).next().unwrap_or(&[]);
                let Some(ino) = self.ino_of(name) else { return Reply::Err(libc::ENOENT) };
                out[..40].fill(0);
                wr64(out, 0, ino); // nodeid
                wr64(out, 8, 0); // generation
                wr64(out, 16, self.ttl); // entry_valid
                wr64(out, 24, self.ttl); // attr_valid
                self.attr(ino, &mut out[40..]);
                Reply::Ok(ENTRY_OUT_SIZE)
            }
            FUSE_GETATTR => {
                if !self.valid(h.nodeid) {
                    return Reply::Err(libc::ENOENT);
                }
                out[..16].fill(0);
                wr64(out, 0, self.ttl);
                self.attr(h.nodeid, &mut out[16..]);
                Reply::Ok(ATTR_OUT_SIZE)
            }
            FUSE_OPEN | FUSE_OPENDIR => {
                let dir = h.opcode == FUSE_OPENDIR;
                if dir != (h.nodeid == 1) {
                    return Reply::Err(if dir { libc::ENOTDIR } else { libc::EISDIR });
                }
                let flags = rd32(op_in, 0) as i32;
                if flags & libc::O_ACCMODE != libc::O_RDONLY {
                    return Reply::Err(libc::EROFS);
                }
                out[..OPEN_OUT_SIZE].fill(0);
                wr64(out, 0, h.nodeid); // fh
                // direct_io: every read reaches the server (no page cache)
                wr32(out, 8, if dir { 0 } else { FOPEN_DIRECT_IO });
                Reply::Ok(OPEN_OUT_SIZE)
            }
            FUSE_READ => {
                let off = rd64(op_in, 8);
                let size = rd32(op_in, 16) as u64;
                if off >= FILE_SIZE {
                    return Reply::Ok(0);
                }
                let n = size.min(FILE_SIZE - off) as usize;
                if n == 1 && off == 1 {
                    // "slow read" used by the INTERRUPT probe
                    std::thread::sleep(std::time::Duration::from_millis(300));
                }
                out[..n].fill(h.nodeid as u8);
                let _ = &self.data;
                Reply::Ok(n)
            }
            FUSE_READDIR => {
                let off = rd64(op_in, 8) as usize;
                let size = (rd32(op_in, 16) as usize).min(out.len());
                let mut pos = 0;
                let total = self.nfiles + 2;
                for i in off..total {
                    let (ino, name, typ): (u64, Vec<u8>, u32) = match i {
                        0 => (1, b".".to_vec(), libc::DT_DIR as u32),
                        1 => (1, b"..".to_vec(), libc::DT_DIR as u32),
                        n => (n as u64, format!("f{:04}", n - 2).into_bytes(), libc::DT_REG as u32),
                    };
                    // struct fuse_dirent { u64 ino; u64 off; u32 namelen; u32 type; char name[]; } padded to 8
                    let rec = (24 + name.len() + 7) & !7;
                    if pos + rec > size {
                        break;
                    }
                    let e = &mut out[pos..pos + rec];
                    e.fill(0);
                    wr64(e, 0, ino);
                    wr64(e, 8, (i + 1) as u64);
                    wr32(e, 16, name.len() as u32);
                    wr32(e, 20, typ);
                    e[24..24 + name.len()].copy_from_slice(&name);
                    pos += rec;
                }
                Reply::Ok(pos)
            }
            FUSE_RELEASE | FUSE_RELEASEDIR | FUSE_FLUSH | FUSE_DESTROY => Reply::Ok(0),
            FUSE_STATFS => {
                out[..STATFS_OUT_SIZE].fill(0);
                wr64(out, 0, 1000); // blocks
                wr64(out, 24, self.nfiles as u64 + 1); // files
                wr32(out, 40, 4096); // bsize
                wr32(out, 44, 255); // namelen
                wr32(out, 48, 4096); // frsize
                Reply::Ok(STATFS_OUT_SIZE)
            }
            FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT => Reply::None,
            _ => Reply::Err(libc::ENOSYS), // incl. ACCESS: kernel then stops sending it
        }
    }
}
