//! Compiles the `.proto` files with protox (no system `protoc`), generates the prost messages and
//! tonic stubs, and writes the encoded descriptor set that reflection and dynamic clients use.

use std::{env, fs, path::PathBuf};

const PROTO_ROOT: &str = "proto";

const FILES: &[&str] = &[
    "resd/resource/v1/resource.proto",
    "resd/cluster/v1/cluster.proto",
    "resd/tenancy/v1/tenancy.proto",
    "resd/policy/v1/policy.proto",
    "resd/acl/v1/acl.proto",
    "resd/registry/v1/registry.proto",
    "resd/coordination/v1/coordination.proto",
    "resd/events/v1/events.proto",
    "resd/internal/v1/tombstone.proto",
    "resd/demo/v1/demo.proto",
    "resd/demo/v2/demo.proto",
    "resd/raft/v1/raft.proto",
    "google/rpc/status.proto",
    "google/rpc/error_details.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}");

    let mut compiler = protox::Compiler::new([PROTO_ROOT])?;
    compiler.include_imports(true).include_source_info(true);
    for file in FILES {
        compiler.open_file(file)?;
    }
    let descriptor_set = compiler.file_descriptor_set();

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    // The published set carries no source info: it is for reflection and dynamic codecs, and
    // comments would only make it larger.
    let mut published = descriptor_set.clone();
    for file in &mut published.file {
        file.source_code_info = None;
    }
    fs::write(
        out_dir.join("resd_descriptor.bin"),
        prost::Message::encode_to_vec(&published),
    )?;

    let mut config = tonic_prost_build::Config::new();
    config.enable_type_names();
    // Ordered maps encode deterministically: equal resources give equal bytes.
    config.btree_map(["."]);
    // Shared, not copied, by every ListTypes answer.
    config.bytes([".resd.cluster.v1.ListTypesResponse.file_descriptor_set"]);
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds_with_config(descriptor_set, config)?;
    Ok(())
}
