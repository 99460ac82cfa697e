fn main() {
    std::process::exit(bucketfs::cli::main());
}
