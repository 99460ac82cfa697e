/// Allocations from this size on are their own mappings, given back to the system when
/// freed. glibc's default threshold rises to the size of each big block freed, after which
/// freed 8 MiB part buffers stay in the heap: 100 writers of 64 MiB under a 512 MiB budget
/// peaked at 1,127 MiB RSS with it and 680 MiB with 2 MiB fixed. FUSE's write and read
/// buffers (at most 1 MiB) stay below it, so they do not pay a mapping each.
const MMAP_THRESHOLD: i32 = 2 << 20;

fn main() {
    // glibc gives each thread that allocates its own arena (up to 8 per core), and freed
    // part buffers stay resident in them: 100 readers and 100 writers under a 512 MiB
    // budget peaked at 1.6 GiB RSS with the default, 1.3 GiB with two arenas (tests/load.rs).
    // SAFETY: mallopt only sets tunables; it is called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
    std::process::exit(bucketfs::cli::main());
}
