//! Generates the CSI driver's gRPC types and services (`src/csi/`) from the CSI spec's
//! own protobuf file, vendored in `proto/` (v1.12.0, Apache-2.0). `protox` compiles it
//! in Rust, so a build needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let descriptors = protox::compile(["csi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        // Servers for the driver; clients for the tests, which call it as the kubelet would.
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
