//! Feasibility spike: FUSE over io_uring (Linux 6.14+, FUSE 7.42+) vs classic /dev/fuse,
//! same in-memory read-only filesystem behind both transports. No `fuser`, no libfuse.
//!
//!   uring-spike serve --mode uring|dev --mnt DIR [--files N] [--depth D] [--threads T]
//!   uring-spike bench [--runs 3] [--files 1000] [--stat-iters 20] [--reads 100000] [--depth 4]
//!   uring-spike probe-disabled        (uring mode with enable_uring=N: show the kernel refusal)

mod fs;
mod proto;

use proto::*;
use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

// ---------------------------------------------------------------- small helpers

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn arg_str(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

/// Number of possible CPUs (= nr_cpu_ids as the kernel's num_possible_cpus() sees it).
fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or("0".into());
    let mut n = 0;
    for part in s.trim().split(',') {
        let mut it = part.split('-');
        let a: usize = it.next().unwrap().parse().unwrap();
        let b: usize = it.next().map(|x| x.parse().unwrap()).unwrap_or(a);
        n = n.max(b + 1);
    }
    n
}

fn pin_to_cpu(cpu: usize) {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            eprintln!("[serve] pin to cpu {cpu} failed: errno {}", errno());
        }
    }
}

// ---------------------------------------------------------------- counters

pub struct Stats {
    pub via_dev: [AtomicU64; 64],
    pub via_ring: [AtomicU64; 64],
}
impl Stats {
    fn new() -> Self {
        Stats {
            via_dev: std::array::from_fn(|_| AtomicU64::new(0)),
            via_ring: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
    fn bump(&self, ring: bool, opcode: u32) {
        let i = (opcode as usize).min(63);
        let a = if ring { &self.via_ring[i] } else { &self.via_dev[i] };
        a.fetch_add(1, Ordering::Relaxed);
    }
    fn dump(&self) -> String {
        let mut s = String::new();
        for (label, arr) in [("dev", &self.via_dev), ("ring", &self.via_ring)] {
            let mut parts = vec![];
            for (i, a) in arr.iter().enumerate() {
                let v = a.load(Ordering::Relaxed);
                if v > 0 {
                    parts.push(format!("{}={}", opname(i as u32), v));
                }
            }
            s += &format!("  via {label}: {}\n", if parts.is_empty() { "-".into() } else { parts.join(" ") });
        }
        s
    }
}

// ---------------------------------------------------------------- mount / init

fn mount_fuse(mnt: &Path) -> i32 {
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(fd >= 0, "open /dev/fuse: errno {}", errno());
    let src = c"uring-spike";
    let fstype = c"fuse";
    let target = CString::new(mnt.as_os_str().as_bytes()).unwrap();
    let opts = CString::new(format!("fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other")).unwrap();
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_RDONLY,
            opts.as_ptr() as *const libc::c_void,
        )
    };
    assert!(r == 0, "mount: errno {}", errno());
    fd
}

/// Read FUSE_INIT from /dev/fuse and reply. Returns the negotiated minor.
fn do_init(fd: i32, want_uring: bool, stats: &Stats) -> u32 {
    let mut buf = vec![0u8; 1 << 20];
    let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut _, buf.len()) };
    assert!(n > 0, "read INIT: errno {}", errno());
    let h = InHeader::parse(&buf);
    assert_eq!(h.opcode, FUSE_INIT, "first request must be INIT");
    stats.bump(false, h.opcode);
    let body = &buf[IN_HEADER_SIZE..n as usize];
    let major = rd32(body, 0);
    let kminor = rd32(body, 4);
    let kflags = rd32(body, 12) as u64 | ((rd32(body, 16) as u64) << 32);
    eprintln!(
        "[serve] INIT from kernel: {major}.{kminor} flags=0x{kflags:x} (kernel offers FUSE_OVER_IO_URING: {})",
        kflags & FUSE_OVER_IO_URING != 0
    );
    let minor = kminor.min(FUSE_KERNEL_MINOR_VERSION);
    let mut want: u64 = FUSE_BIG_WRITES | FUSE_MAX_PAGES | FUSE_PARALLEL_DIROPS | FUSE_INIT_EXT;
    if want_uring {
        want |= FUSE_OVER_IO_URING;
    }
    let flags = want & (kflags | FUSE_INIT_EXT);
    let mut out = [0u8; INIT_OUT_SIZE];
    wr32(&mut out, 0, FUSE_KERNEL_VERSION);
    wr32(&mut out, 4, minor);
    wr32(&mut out, 8, 128 * 1024); // max_readahead
    wr32(&mut out, 12, flags as u32);
    wr16(&mut out, 16, 16); // max_background
    wr16(&mut out, 18, 12); // congestion_threshold
    wr32(&mut out, 20, MAX_WRITE as u32);
    wr32(&mut out, 24, 1); // time_gran
    wr16(&mut out, 28, MAX_PAGES); // max_pages
    wr32(&mut out, 32, (flags >> 32) as u32); // flags2
    dev_reply(fd, h.unique, 0, &out);
    eprintln!("[serve] INIT reply: {FUSE_KERNEL_VERSION}.{minor} flags=0x{flags:x} max_write={MAX_WRITE} max_pages={MAX_PAGES}");
    minor
}

fn dev_reply(fd: i32, unique: u64, error: i32, body: &[u8]) -> isize {
    let mut hdr = [0u8; OUT_HEADER_SIZE];
    wr32(&mut hdr, 0, (OUT_HEADER_SIZE + body.len()) as u32);
    wr32(&mut hdr, 4, error as u32);
    wr64(&mut hdr, 8, unique);
    let iov = [
        libc::iovec { iov_base: hdr.as_ptr() as *mut _, iov_len: hdr.len() },
        libc::iovec { iov_base: body.as_ptr() as *mut _, iov_len: body.len() },
    ];
    let r = unsafe { libc::writev(fd, iov.as_ptr(), if body.is_empty() { 1 } else { 2 }) };
    if r < 0 {
        let e = errno();
        // ENOENT: request was interrupted/aborted meanwhile, fine.
        if e != libc::ENOENT {
            eprintln!("[serve] writev reply unique={unique}: errno {e}");
        }
    }
    r
}

// ---------------------------------------------------------------- classic /dev/fuse loop

fn dev_loop(fd: i32, fs: &fs::MemFs, stats: &Stats, who: &str) {
    let mut buf = vec![0u8; MAX_WRITE + 4096];
    let mut out = vec![0u8; MAX_WRITE + 4096];
    loop {
        let n = unsafe { libc::read(fd, buf.as_mut_ptr() as *mut _, buf.len()) };
        if n < 0 {
            match errno() {
                libc::EINTR | libc::EAGAIN | libc::ENOENT => continue,
                libc::ENODEV => break, // unmounted
                e => {
                    eprintln!("[serve] {who}: read /dev/fuse errno {e}");
                    break;
                }
            }
        }
        let n = n as usize;
        let h = InHeader::parse(&buf);
        stats.bump(false, h.opcode);
        // Classic transport: the per-op header and the rest of the args are contiguous.
        // Split at the per-op header size so the fs sees the same (op_in, payload) pair as over the ring.
        let body = &buf[IN_HEADER_SIZE..n];
        let split = op_in_size(h.opcode).min(body.len());
        let (op_in, payload) = body.split_at(split);
        match fs.handle(&h, op_in, payload, &mut out) {
            fs::Reply::None => {}
            fs::Reply::Err(e) => {
                dev_reply(fd, h.unique, -e, &[]);
            }
            fs::Reply::Ok(len) => {
                dev_reply(fd, h.unique, 0, &out[..len]);
            }
        }
    }
}

fn clone_fd(fd: i32) -> i32 {
    let nfd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    assert!(nfd >= 0);
    let mut src = fd as u32;
    let r = unsafe { libc::ioctl(nfd, FUSE_DEV_IOC_CLONE as _, &mut src) };
    assert!(r == 0, "FUSE_DEV_IOC_CLONE: errno {}", errno());
    nfd
}

// ---------------------------------------------------------------- io_uring transport

/// One registered ring entry: header buffer (struct fuse_uring_req_header, 288 B) + payload buffer.
struct RingEnt {
    header: Box<[u8; URING_REQ_HEADER_SIZE]>,
    payload: Vec<u8>,
    iov: [libc::iovec; 2],
}

fn uring_cmd_sqe(fd: i32, cmd_op: u32, qid: u16, commit_id: u64, iov: Option<&[libc::iovec; 2]>, ud: u64) -> squeue::Entry128 {
    // struct fuse_uring_cmd_req lives in the 80-byte command area of the 128-byte SQE.
    let mut cmd = [0u8; 80];
    wr64(&mut cmd, 0, 0); // flags
    wr64(&mut cmd, 8, commit_id);
    wr16(&mut cmd, 16, qid);
    let mut b = opcode::UringCmd80::new(types::Fd(fd), cmd_op).cmd(cmd);
    if let Some(iov) = iov {
        b = b.addr(Some(iov.as_ptr() as u64));
    }
    let e = b.build().user_data(ud);
    if iov.is_some() {
        // io-uring 0.7.16's UringCmd80 has no `len` setter, but FUSE REGISTER requires
        // sqe->len == 2 (number of iovecs). Entry128 is #[repr(C)] (64-byte io_uring_sqe + 64 bytes),
        // so patch the `len` field (offset 24 of struct io_uring_sqe) in place.
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        return unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) };
    }
    e
}

fn ring_queue_thread(fd: i32, qid: usize, depth: usize, fs: Arc<fs::MemFs>, stats: Arc<Stats>, ready: std::sync::mpsc::Sender<Result<(), String>>) {
    pin_to_cpu(qid);
    let mut b = IoUring::<squeue::Entry128, cqueue::Entry>::builder();
    b.setup_single_issuer();
    match std::env::var("SPIKE_TASKRUN").as_deref() {
        Ok("defer") => {
            b.setup_defer_taskrun();
        }
        Ok("none") => {}
        _ => {
            b.setup_coop_taskrun();
        }
    }
    if qid == 0 {
        eprintln!("[serve] ring flags: SQE128 SINGLE_ISSUER taskrun={}", std::env::var("SPIKE_TASKRUN").unwrap_or("coop".into()));
    }
    let mut ring = match b.build(depth as u32 * 2) {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(format!("qid {qid}: io_uring setup: {e}")));
            return;
        }
    };
    let mut ents: Vec<RingEnt> = (0..depth)
        .map(|_| {
            let mut e = RingEnt { header: Box::new([0u8; URING_REQ_HEADER_SIZE]), payload: vec![0u8; RING_PAYLOAD], iov: unsafe { std::mem::zeroed() } };
            e.iov[0] = libc::iovec { iov_base: e.header.as_mut_ptr() as *mut _, iov_len: URING_REQ_HEADER_SIZE };
            e.iov[1] = libc::iovec { iov_base: e.payload.as_mut_ptr() as *mut _, iov_len: RING_PAYLOAD };
            e
        })
        .collect();
    for (i, e) in ents.iter().enumerate() {
        let sqe = uring_cmd_sqe(fd, FUSE_IO_URING_CMD_REGISTER, qid as u16, 0, Some(&e.iov), i as u64);
        unsafe { ring.submission().push(&sqe).expect("sq full") };
    }
    // REGISTER returns -EIOCBQUEUED inside the kernel: the SQE stays pending until a request
    // arrives. A synchronous error (EINVAL, EOPNOTSUPP, EAGAIN ...) shows up as a CQE right away.
    if let Err(e) = ring.submit() {
        let _ = ready.send(Err(format!("qid {qid}: submit REGISTER: {e}")));
        return;
    }
    std::thread::sleep(Duration::from_millis(20));
    let first = ring.completion().next();
    if let Some(c) = first {
        if c.result() < 0 {
            let _ = ready.send(Err(format!(
                "qid {qid}: REGISTER failed: {} ({})",
                c.result(),
                std::io::Error::from_raw_os_error(-c.result())
            )));
            return;
        }
        // A real request already completed: put it back for normal processing below.
        handle_cqe(fd, qid, &mut ring, &mut ents, &c, &fs, &stats);
    }
    let _ = ready.send(Ok(()));

    let mut alive = depth;
    let mut cqes: Vec<cqueue::Entry> = Vec::with_capacity(depth);
    while alive > 0 {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) || e.raw_os_error() == Some(libc::EBUSY) => continue,
            Err(e) => {
                eprintln!("[serve] qid {qid}: submit_and_wait: {e}");
                break;
            }
        }
        cqes.clear();
        cqes.extend(ring.completion());
        for c in &cqes {
            if c.result() < 0 {
                // -ENOTCONN on unmount/abort: the kernel tore this entry down.
                if c.result() != -libc::ENOTCONN {
                    eprintln!("[serve] qid {qid}: ent {} cqe res {}", c.user_data(), c.result());
                }
                alive -= 1;
                continue;
            }
            handle_cqe(fd, qid, &mut ring, &mut ents, c, &fs, &stats);
        }
    }
}

fn handle_cqe(
    fd: i32,
    qid: usize,
    ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
    ents: &mut [RingEnt],
    c: &cqueue::Entry,
    fs: &fs::MemFs,
    stats: &Stats,
) {
    let i = c.user_data() as usize;
    let ent = &mut ents[i];
    let hdr = &mut ent.header[..];
    let h = InHeader::parse(&hdr[URING_IN_OUT_OFF..]);
    let commit_id = rd64(hdr, URING_ENT_IN_OUT_OFF + 8);
    let payload_sz = rd32(hdr, URING_ENT_IN_OUT_OFF + 16) as usize;
    stats.bump(true, h.opcode);
    let op_in: [u8; URING_OP_IN_OUT_SIZE] = hdr[URING_OP_IN_OFF..URING_OP_IN_OFF + URING_OP_IN_OUT_SIZE].try_into().unwrap();
    let op_len = op_in_size(h.opcode);
    // in_header.len is computed by the kernel as if the args were contiguous (/dev/fuse layout):
    // 40 + op_in + payload. An adapter for a contiguous-buffer parser (fuser) relies on this.
    if h.len as usize != IN_HEADER_SIZE + op_len + payload_sz {
        eprintln!("[serve] len mismatch op {} len {} op_in {} payload {}", opname(h.opcode), h.len, op_len, payload_sz);
    }
    // Request args beyond the per-op header (e.g. the LOOKUP name) are in the payload buffer.
    let payload_in: Vec<u8> = ent.payload[..payload_sz].to_vec();
    let (err, len) = match fs.handle(&h, &op_in[..op_len], &payload_in, &mut ent.payload) {
        fs::Reply::Ok(len) => (0, len),
        fs::Reply::Err(e) => (-e, 0),
        fs::Reply::None => {
            // FORGET etc. never come over the ring (kernel sends them on /dev/fuse); if one did,
            // there is no way to give the entry back without a commit, so answer anyway.
            (0, 0)
        }
    };
    // Reply: fuse_out_header in in_out, reply args in the payload buffer, their size in ring_ent_in_out.payload_sz.
    wr32(hdr, URING_IN_OUT_OFF, (OUT_HEADER_SIZE + len) as u32);
    wr32(hdr, URING_IN_OUT_OFF + 4, err as u32);
    wr64(hdr, URING_IN_OUT_OFF + 8, h.unique);
    wr32(hdr, URING_ENT_IN_OUT_OFF + 16, len as u32);
    let sqe = uring_cmd_sqe(fd, FUSE_IO_URING_CMD_COMMIT_AND_FETCH, qid as u16, commit_id, None, i as u64);
    unsafe { ring.submission().push(&sqe).expect("sq full") };
}

// ---------------------------------------------------------------- serve

fn serve(args: &[String]) {
    let mode = arg_str(args, "--mode").unwrap_or("uring".into());
    let mnt = PathBuf::from(arg_str(args, "--mnt").expect("--mnt"));
    let nfiles: usize = arg(args, "--files", 1000);
    let depth: usize = arg(args, "--depth", 4);
    let nq = possible_cpus();
    let threads: usize = arg(args, "--threads", nq);
    let uring = mode == "uring";

    let fs = Arc::new(fs::MemFs::new(nfiles));
    let stats = Arc::new(Stats::new());
    let fd = mount_fuse(&mnt);
    eprintln!("[serve] mounted {} mode={mode} fd={fd} possible_cpus={nq}", mnt.display());
    if args.iter().any(|a| a == "--register-before-init") {
        // Experiment: REGISTER before the INIT reply has been written.
        let mut ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(4).unwrap();
        let mut e = RingEnt { header: Box::new([0u8; URING_REQ_HEADER_SIZE]), payload: vec![0u8; RING_PAYLOAD], iov: unsafe { std::mem::zeroed() } };
        e.iov[0] = libc::iovec { iov_base: e.header.as_mut_ptr() as *mut _, iov_len: URING_REQ_HEADER_SIZE };
        e.iov[1] = libc::iovec { iov_base: e.payload.as_mut_ptr() as *mut _, iov_len: RING_PAYLOAD };
        let sqe = uring_cmd_sqe(fd, FUSE_IO_URING_CMD_REGISTER, 0, 0, Some(&e.iov), 0);
        unsafe { ring.submission().push(&sqe).unwrap() };
        ring.submit_and_wait(1).unwrap();
        let c = ring.completion().next().unwrap();
        eprintln!("[serve] REGISTER before INIT reply -> cqe res {} ({})", c.result(), std::io::Error::from_raw_os_error(-c.result()));
    }
    let want_flag = uring && !args.iter().any(|a| a == "--no-uring-flag");
    do_init(fd, want_flag, &stats);

    let mut handles = vec![];
    if uring {
        // REGISTER only after the INIT reply was written: before that fc->initialized is false
        // and fuse_uring_cmd() returns -EAGAIN.
        let (tx, rx) = std::sync::mpsc::channel();
        for qid in 0..nq {
            let (fs, stats, tx) = (fs.clone(), stats.clone(), tx.clone());
            handles.push(std::thread::Builder::new().name(format!("fuse-ring-{qid}")).spawn(move || ring_queue_thread(fd, qid, depth, fs, stats, tx)).unwrap());
        }
        drop(tx);
        let mut ok = true;
        for r in rx.iter().take(nq) {
            if let Err(e) = r {
                eprintln!("[serve] {e}");
                println!("ring-error {e}");
                ok = false;
            }
        }
        if ok {
            println!("ready uring queues={nq} depth={depth}");
        }
    } else {
        for t in 1..threads {
            let (fs, stats) = (fs.clone(), stats.clone());
            let cfd = clone_fd(fd);
            let pin = args.iter().any(|a| a == "--dev-pin");
            handles.push(std::thread::spawn(move || {
                if pin {
                    pin_to_cpu(t % nq);
                }
                dev_loop(cfd, &fs, &stats, &format!("dev-{t}"))
            }));
        }
        if args.iter().any(|a| a == "--dev-pin") {
            pin_to_cpu(0);
        }
        println!("ready dev threads={threads}");
    }
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    // Main thread keeps reading /dev/fuse: in uring mode this is where FORGET/BATCH_FORGET,
    // INTERRUPT (and anything sent before the ring was ready) arrive.
    dev_loop(fd, &fs, &stats, "dev-0");
    for h in handles {
        let _ = h.join();
    }
    eprintln!("[serve] exit mode={mode}; requests:\n{}", stats.dump());
}

// ---------------------------------------------------------------- bench

struct Server {
    child: std::process::Child,
    mnt: PathBuf,
}

fn start_server(mode: &str, nfiles: usize, depth: usize, extra: &[&str]) -> Result<Server, String> {
    let mnt = std::env::temp_dir().join(format!("uring-spike-mnt-{}-{mode}", std::process::id()));
    let _ = std::fs::create_dir_all(&mnt);
    let exe = std::env::current_exe().unwrap();
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["serve", "--mode", mode, "--mnt", mnt.to_str().unwrap(), "--files", &nfiles.to_string(), "--depth", &depth.to_string()]);
    cmd.args(extra);
    cmd.stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).map_err(|e| e.to_string())?;
    let srv = Server { child, mnt };
    if !line.starts_with("ready") {
        // The server keeps serving over /dev/fuse after a failed REGISTER; show that, then clean up.
        let usable = std::fs::metadata(srv.mnt.join("f0000")).is_ok();
        stop_server(srv);
        return Err(format!("server said: {} (fs still usable over /dev/fuse: {usable})", line.trim()));
    }
    Ok(srv)
}

fn stop_server(mut s: Server) {
    let t = CString::new(s.mnt.as_os_str().as_bytes()).unwrap();
    if unsafe { libc::umount2(t.as_ptr(), 0) } != 0 {
        eprintln!("umount2 {}: errno {}, retrying with MNT_DETACH", s.mnt.display(), errno());
        unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
    }
    let t0 = Instant::now();
    loop {
        match s.child.try_wait() {
            Ok(Some(_)) => break,
            _ if t0.elapsed() > Duration::from_secs(10) => {
                eprintln!("server did not exit, killing pid {}", s.child.id());
                let _ = s.child.kill();
                let _ = s.child.wait();
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    let _ = std::fs::remove_dir(&s.mnt);
}

fn stat_bench(mnt: &Path, nfiles: usize, iters: usize) -> f64 {
    let paths: Vec<CString> = (0..nfiles).map(|i| CString::new(mnt.join(format!("f{i:04}")).as_os_str().as_bytes()).unwrap()).collect();
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // warm-up
    for p in &paths {
        assert_eq!(unsafe { libc::stat(p.as_ptr(), &mut st) }, 0);
    }
    let t0 = Instant::now();
    for _ in 0..iters {
        for p in &paths {
            let r = unsafe { libc::stat(p.as_ptr(), &mut st) };
            debug_assert_eq!(r, 0);
            assert_eq!(st.st_size, 4096);
        }
    }
    t0.elapsed().as_nanos() as f64 / (iters * nfiles) as f64
}

fn read_bench(mnt: &Path, reads: usize) -> (f64, f64, f64) {
    let p = CString::new(mnt.join("f0000").as_os_str().as_bytes()).unwrap();
    let fd = unsafe { libc::open(p.as_ptr(), libc::O_RDONLY | libc::O_DIRECT) };
    assert!(fd >= 0, "open O_DIRECT: errno {}", errno());
    let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
    let buf = unsafe { std::alloc::alloc(layout) };
    for _ in 0..1000 {
        assert_eq!(unsafe { libc::pread(fd, buf as *mut _, 4096, 0) }, 4096);
    }
    let mut lat = Vec::with_capacity(reads);
    let t0 = Instant::now();
    for _ in 0..reads {
        let a = Instant::now();
        let r = unsafe { libc::pread(fd, buf as *mut _, 4096, 0) };
        lat.push(a.elapsed().as_nanos() as u32);
        assert_eq!(r, 4096);
    }
    let mean = t0.elapsed().as_nanos() as f64 / reads as f64;
    assert_eq!(unsafe { *buf }, 2u8, "content check (ino 2 => byte 2)");
    unsafe { std::alloc::dealloc(buf, layout) };
    unsafe { libc::close(fd) };
    lat.sort_unstable();
    (mean, lat[reads / 2] as f64, lat[reads * 99 / 100] as f64)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

fn set_param(v: &str) {
    std::fs::write(PARAM, v).expect("write enable_uring");
}

extern "C" fn noop_handler(_: libc::c_int) {}

/// Make the kernel emit FORGET/BATCH_FORGET (drop dentries+inodes) and INTERRUPT (signal a
/// thread blocked in a slow READ), to see which transport carries them.
fn forget_and_interrupt_probe(mnt: &Path) {
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "2");
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = noop_handler as *const () as usize;
        sa.sa_flags = 0; // no SA_RESTART
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    let p = CString::new(mnt.join("f0003").as_os_str().as_bytes()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let fd = unsafe { libc::open(p.as_ptr(), libc::O_RDONLY) };
        tx.send(unsafe { libc::pthread_self() }).unwrap();
        let mut b = [0u8; 1];
        let r = unsafe { libc::pread(fd, b.as_mut_ptr() as *mut _, 1, 1) };
        unsafe { libc::close(fd) };
        r
    });
    let th = rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    unsafe { libc::pthread_kill(th, libc::SIGUSR1) };
    let r = t.join().unwrap();
    eprintln!("[bench] interrupted slow read returned {r}");
}

fn sanity(mnt: &Path, nfiles: usize) {
    let names: Vec<_> = std::fs::read_dir(mnt).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), nfiles, "readdir count");
    let data = std::fs::read(mnt.join("f0001")).unwrap();
    assert_eq!(data.len(), 4096);
    assert!(data.iter().all(|&b| b == 3));
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    let p = CString::new(mnt.as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::statfs(p.as_ptr(), &mut sfs) }, 0);
    assert_eq!(unsafe { libc::access(CString::new(mnt.join("f0002").as_os_str().as_bytes()).unwrap().as_ptr(), libc::R_OK) }, 0);
}

fn bench(args: &[String]) {
    let runs: usize = arg(args, "--runs", 3);
    let nfiles: usize = arg(args, "--files", 1000);
    let iters: usize = arg(args, "--stat-iters", 20);
    let reads: usize = arg(args, "--reads", 100_000);
    let depth: usize = arg(args, "--depth", 4);
    let pin: i64 = arg(args, "--pin-client", -1);
    let dev_threads: usize = arg(args, "--dev-threads", possible_cpus());
    if pin >= 0 {
        pin_to_cpu(pin as usize);
    }
    let orig = std::fs::read_to_string(PARAM).unwrap_or_default();
    set_param("Y");
    let modes = ["dev", "uring"];
    let mut res: std::collections::BTreeMap<&str, (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>)> = Default::default();
    for run in 0..runs {
        // alternate order to spread drift
        let order: Vec<&str> = if run % 2 == 0 { modes.to_vec() } else { modes.iter().rev().cloned().collect() };
        for mode in order {
            let mut extra: Vec<String> = if mode == "dev" { vec!["--threads".into(), dev_threads.to_string()] } else { vec![] };
            if mode == "dev" && args.iter().any(|a| a == "--dev-pin") {
                extra.push("--dev-pin".into());
            }
            let extra: Vec<&str> = extra.iter().map(|s| s.as_str()).collect();
            let srv = match start_server(mode, nfiles, depth, &extra) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("run {run} {mode}: {e}");
                    continue;
                }
            };
            sanity(&srv.mnt, nfiles);
            if run == 0 {
                forget_and_interrupt_probe(&srv.mnt);
            }
            let st = stat_bench(&srv.mnt, nfiles, iters);
            let (rm, r50, r99) = read_bench(&srv.mnt, reads);
            println!("run {} {:5}: stat {:8.0} ns/stat | pread4k O_DIRECT mean {:7.0} ns p50 {:7.0} ns p99 {:7.0} ns", run + 1, mode, st, rm, r50, r99);
            let e = res.entry(mode).or_default();
            e.0.push(st);
            e.1.push(rm);
            e.2.push(r50);
            e.3.push(r99);
            stop_server(srv);
        }
    }
    set_param(if orig.trim() == "Y" { "Y" } else { "N" });
    println!("\nmedians over {runs} runs (files={nfiles}, stat iters={iters}, reads={reads}, ring depth={depth}, dev threads={dev_threads}, client pinned to cpu {pin}):");
    let mut med = std::collections::BTreeMap::new();
    for (m, (a, b, c, d)) in res.iter_mut() {
        let v = (median(a), median(b), median(c), median(d));
        println!("  {:5}: stat {:8.0} ns | pread mean {:7.0} ns p50 {:7.0} ns p99 {:7.0} ns", m, v.0, v.1, v.2, v.3);
        med.insert(*m, v);
    }
    if let (Some(d), Some(u)) = (med.get("dev"), med.get("uring")) {
        println!("  ratio uring/dev: stat {:.3} | pread mean {:.3} p50 {:.3} p99 {:.3}", u.0 / d.0, u.1 / d.1, u.2 / d.2, u.3 / d.3);
    }
    println!("enable_uring restored to {}", std::fs::read_to_string(PARAM).unwrap_or_default().trim());
}

/// Show what the kernel does when the server asks for io_uring while enable_uring=N.
fn probe_disabled() {
    let orig = std::fs::read_to_string(PARAM).unwrap_or_default();
    set_param("N");
    match start_server("uring", 10, 1, &[]) {
        Ok(s) => {
            println!("unexpected: ring registered with enable_uring=N");
            stop_server(s);
        }
        Err(e) => {
            println!("enable_uring=N -> {e}");
        }
    }
    set_param(if orig.trim() == "Y" { "Y" } else { "N" });
}

/// Run one server with extra flags, do a few ops, print its log.
fn experiment(args: &[String]) {
    let orig = std::fs::read_to_string(PARAM).unwrap_or_default();
    set_param("Y");
    let extra: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    match start_server("uring", 10, 1, &extra) {
        Ok(s) => {
            sanity(&s.mnt, 10);
            println!("experiment {extra:?}: ring ready, fs works");
            stop_server(s);
        }
        Err(e) => println!("experiment {extra:?}: {e}"),
    }
    set_param(if orig.trim() == "Y" { "Y" } else { "N" });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(|s| s.as_str()) {
        Some("serve") => serve(&args[2..]),
        Some("bench") => bench(&args[2..]),
        Some("probe-disabled") => probe_disabled(),
        Some("experiment") => experiment(&args[2..]),
        _ => {
            eprintln!("usage: uring-spike serve --mode uring|dev --mnt DIR | bench [--runs N] | probe-disabled");
            std::process::exit(2);
        }
    }
}
