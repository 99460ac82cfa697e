//! FUSE kernel ABI subset (include/uapi/linux/fuse.h, protocol 7.42+), written from the header's
//! field list. Structs are handled as little byte-offset accessors to keep the spike free of unsafe casts.
#![allow(dead_code)]

pub const FUSE_KERNEL_VERSION: u32 = 7;
pub const FUSE_KERNEL_MINOR_VERSION: u32 = 45;

// opcodes
pub const FUSE_LOOKUP: u32 = 1;
pub const FUSE_FORGET: u32 = 2;
pub const FUSE_GETATTR: u32 = 3;
pub const FUSE_OPEN: u32 = 14;
pub const FUSE_READ: u32 = 15;
pub const FUSE_STATFS: u32 = 17;
pub const FUSE_RELEASE: u32 = 18;
pub const FUSE_FLUSH: u32 = 25;
pub const FUSE_INIT: u32 = 26;
pub const FUSE_OPENDIR: u32 = 27;
pub const FUSE_READDIR: u32 = 28;
pub const FUSE_RELEASEDIR: u32 = 29;
pub const FUSE_ACCESS: u32 = 34;
pub const FUSE_INTERRUPT: u32 = 36;
pub const FUSE_DESTROY: u32 = 38;
pub const FUSE_BATCH_FORGET: u32 = 42;
pub const FUSE_READDIRPLUS: u32 = 44;

// INIT flags (64-bit view; bits 32..63 travel in init_in/out.flags2)
pub const FUSE_BIG_WRITES: u64 = 1 << 5;
pub const FUSE_PARALLEL_DIROPS: u64 = 1 << 18;
pub const FUSE_MAX_PAGES: u64 = 1 << 22;
pub const FUSE_INIT_EXT: u64 = 1 << 30;
pub const FUSE_OVER_IO_URING: u64 = 1 << 41; // flags2 bit 9

pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;

// _IOR(229, 0, uint32_t)
pub const FUSE_DEV_IOC_CLONE: u64 = 0x8004_e500;

// io_uring commands (enum fuse_uring_cmd)
pub const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
pub const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;

// struct fuse_uring_req_header { char in_out[128]; char op_in[128]; struct fuse_uring_ent_in_out ring_ent_in_out; }
pub const URING_IN_OUT_HEADER_SIZE: usize = 128;
pub const URING_OP_IN_OUT_SIZE: usize = 128;
pub const URING_IN_OUT_OFF: usize = 0;
pub const URING_OP_IN_OFF: usize = 128;
pub const URING_ENT_IN_OUT_OFF: usize = 256;
// struct fuse_uring_ent_in_out { u64 flags; u64 commit_id; u32 payload_sz; u32 padding; u64 reserved; } = 32 bytes
pub const URING_ENT_IN_OUT_SIZE: usize = 32;
pub const URING_REQ_HEADER_SIZE: usize = 256 + URING_ENT_IN_OUT_SIZE; // 288

pub const IN_HEADER_SIZE: usize = 40;
pub const OUT_HEADER_SIZE: usize = 16;
pub const INIT_OUT_SIZE: usize = 64;
pub const ATTR_SIZE: usize = 88;
pub const ENTRY_OUT_SIZE: usize = 40 + ATTR_SIZE; // 128
pub const ATTR_OUT_SIZE: usize = 16 + ATTR_SIZE; // 104
pub const OPEN_OUT_SIZE: usize = 16;
pub const STATFS_OUT_SIZE: usize = 80;

pub const MAX_PAGES: u16 = 32;
pub const MAX_WRITE: usize = 128 * 1024;
/// Kernel requires payload iov_len >= max(FUSE_MIN_READ_BUFFER=8192, max_write, max_pages*PAGE_SIZE).
pub const RING_PAYLOAD: usize = MAX_WRITE;

pub fn rd16(b: &[u8], o: usize) -> u16 {
    u16::from_ne_bytes(b[o..o + 2].try_into().unwrap())
}
pub fn rd32(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes(b[o..o + 4].try_into().unwrap())
}
pub fn rd64(b: &[u8], o: usize) -> u64 {
    u64::from_ne_bytes(b[o..o + 8].try_into().unwrap())
}
pub fn wr16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_ne_bytes())
}
pub fn wr32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_ne_bytes())
}
pub fn wr64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_ne_bytes())
}

/// struct fuse_in_header (40 bytes)
#[derive(Debug, Clone, Copy)]
pub struct InHeader {
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    pub total_extlen: u16,
}
impl InHeader {
    pub fn parse(b: &[u8]) -> Self {
        InHeader {
            len: rd32(b, 0),
            opcode: rd32(b, 4),
            unique: rd64(b, 8),
            nodeid: rd64(b, 16),
            uid: rd32(b, 24),
            gid: rd32(b, 28),
            pid: rd32(b, 32),
            total_extlen: rd16(b, 36),
        }
    }
}

/// Size of the first ("per-op header") in-arg. Over io_uring the kernel copies exactly this
/// arg into fuse_uring_req_header.op_in and everything after it into the payload buffer.
/// LOOKUP has a zero-size arg0 since 6.14 (fuse_set_zero_arg0), so its name goes to the payload.
pub fn op_in_size(op: u32) -> usize {
    match op {
        FUSE_GETATTR => 16,                  // fuse_getattr_in
        FUSE_OPEN | FUSE_OPENDIR => 8,       // fuse_open_in
        FUSE_READ | FUSE_READDIR | FUSE_READDIRPLUS => 40, // fuse_read_in
        FUSE_RELEASE | FUSE_RELEASEDIR => 24, // fuse_release_in
        FUSE_FLUSH => 24,                    // fuse_flush_in
        FUSE_ACCESS => 8,                    // fuse_access_in
        FUSE_FORGET => 8,                    // fuse_forget_in
        FUSE_BATCH_FORGET => 8,              // fuse_batch_forget_in (+ forget_one[] after)
        FUSE_INTERRUPT => 8,                 // fuse_interrupt_in
        FUSE_INIT => 64,                     // fuse_init_in
        52 => 24,                            // FUSE_STATX: fuse_statx_in
        _ => 0,
    }
}

pub fn opname(op: u32) -> String {
    let n = opname_s(op);
    if n == "OTHER" { format!("op{op}") } else { n.to_string() }
}

fn opname_s(op: u32) -> &'static str {
    match op {
        FUSE_LOOKUP => "LOOKUP",
        FUSE_FORGET => "FORGET",
        FUSE_GETATTR => "GETATTR",
        FUSE_OPEN => "OPEN",
        FUSE_READ => "READ",
        FUSE_STATFS => "STATFS",
        FUSE_RELEASE => "RELEASE",
        FUSE_FLUSH => "FLUSH",
        FUSE_INIT => "INIT",
        FUSE_OPENDIR => "OPENDIR",
        FUSE_READDIR => "READDIR",
        FUSE_RELEASEDIR => "RELEASEDIR",
        FUSE_ACCESS => "ACCESS",
        FUSE_INTERRUPT => "INTERRUPT",
        FUSE_DESTROY => "DESTROY",
        FUSE_BATCH_FORGET => "BATCH_FORGET",
        FUSE_READDIRPLUS => "READDIRPLUS",
        4 => "SETATTR",
        22 => "GETXATTR",
        23 => "LISTXATTR",
        46 => "LSEEK",
        _ => "OTHER",
    }
}
