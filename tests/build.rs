//! Generates a CRI client from the CRI `api.proto` of cri-api 0.36 (Debian sid's
//! `golang-k8s-cri-api-dev`, fetched by `cargo xtask setup` into the cache dir): it has
//! `UpdatePodSandboxResources`, which `k8s-cri` 0.11 predates. The proto is never committed.
//!
//! Debian 12's `protoc` (3.21) does not know the `debug_redact` field option (protobuf 22+),
//! which four `AuthConfig` fields carry; it only marks them for redaction in logs and changes
//! nothing on the wire, so the copy compiled here (in `OUT_DIR`) goes without it.

use std::path::PathBuf;

const REL: &str = "cri-api/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1";

fn main() {
    println!("cargo:rerun-if-env-changed=NRI_RESIZE_CACHE");
    let cache = std::env::var_os("NRI_RESIZE_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/nri-resize"), PathBuf::from);
    let proto = cache.join(REL).join("api.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    let text = std::fs::read_to_string(&proto).unwrap_or_default();
    assert!(
        text.contains("rpc UpdatePodSandboxResources"),
        "no CRI api.proto with UpdatePodSandboxResources at {}: run `cargo xtask setup` \
         (it unpacks Debian sid's golang-k8s-cri-api-dev there)",
        proto.display()
    );
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("cri-v036");
    std::fs::create_dir_all(&out).expect("create OUT_DIR/cri-v036");
    let copy = out.join("api.proto");
    std::fs::write(&copy, text.replace(" [debug_redact = true]", ""))
        .expect("write the proto copy");
    if let Err(e) = tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&[&copy], &[&out])
    {
        panic!("generating the CRI client from {}: {e}", proto.display());
    }
}
