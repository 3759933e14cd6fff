//! Embeds the observer's eBPF object when it has been built.
//!
//! `cargo xtask build-ebpf` builds `ebpf/programs` into `ebpf/target/bpfel-unknown-none/<profile>/`
//! and sets `NRI_RESIZE_EBPF_OBJ` for the builds it runs. Without the variable the known output
//! paths are tried (release first). Without an object the plugin still builds; its observer then
//! reports "eBPF object not built into this binary" at start-up and polls cgroup files.

use std::path::PathBuf;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(nri_resize_ebpf_object)");
    println!("cargo::rerun-if-env-changed=NRI_RESIZE_EBPF_OBJ");
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    let out = manifest.join("../ebpf/target/bpfel-unknown-none");
    let candidates: Vec<PathBuf> = match std::env::var_os("NRI_RESIZE_EBPF_OBJ") {
        Some(path) => vec![PathBuf::from(path)],
        None => vec![
            out.join("release/nri-resize-ebpf"),
            out.join("debug/nri-resize-ebpf"),
        ],
    };
    for candidate in &candidates {
        println!("cargo::rerun-if-changed={}", candidate.display());
    }
    if let Some(object) = candidates.iter().find(|p| p.is_file()) {
        let object = object
            .canonicalize()
            .expect("canonicalize the eBPF object path");
        println!("cargo::rustc-cfg=nri_resize_ebpf_object");
        println!(
            "cargo::rustc-env=NRI_RESIZE_EBPF_OBJECT={}",
            object.display()
        );
    } else {
        println!(
            "cargo::warning=eBPF object not found ({}); the observer will poll cgroup files. Run `cargo xtask build-ebpf`.",
            candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
}
