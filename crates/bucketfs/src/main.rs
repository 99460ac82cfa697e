fn main() {
    // glibc gives each thread that allocates its own arena (up to 8 per core), and freed
    // part buffers stay resident in them: 100 readers and 100 writers under a 512 MiB
    // budget peaked at 1.6 GiB RSS with the default, 1.3 GiB with two arenas (tests/load.rs).
    // (A fixed 2 MiB mmap threshold took another ~150 MiB off that peak, but every 8 MiB
    // buffer then costs fresh page faults: 60% more daemon CPU per GiB read or written.)
    // SAFETY: mallopt only sets a tunable; it is called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    std::process::exit(bucketfs::cli::main());
}
