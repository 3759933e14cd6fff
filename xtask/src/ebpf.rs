//! `cargo xtask build-ebpf`: builds the observer's kernel programs (`ebpf/programs`).
//!
//! The programs build for `bpfel-unknown-none` with Debian's `rustc-web` (its precompiled `core`
//! for that target replaces `-Z build-std`, which needs `rust-src`) and link with `bpf-linker`.
//! `RUSTC_BOOTSTRAP=aya_ebpf,nri_resize_ebpf` unlocks the nightly feature gates of those two
//! crates only (`asm!` on the BPF target: aya-ebpf's helpers and the programs' atomic add).
//! See `ebpf/README.md`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};

/// Debian's compiler that ships `core` for `bpfel-unknown-none` (and, with
/// `libstd-rust-web-dev:<arch>`, the standard library of foreign targets: `cross.rs`).
pub const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
/// The object's name in the target directory (the programs crate's binary).
const OBJECT: &str = "nri-resize-ebpf";
const TARGET: &str = "bpfel-unknown-none";
/// The crates whose feature gates are unlocked (a list of crate names, not `1`).
const RUSTC_BOOTSTRAP: &str = "aya_ebpf,nri_resize_ebpf";
const RUSTFLAGS: [&str; 3] = [
    "--cfg=bpf_target_arch=\"x86_64\"",
    "-Cdebuginfo=2",
    "-Clink-arg=--btf",
];

/// The object path `build_ebpf` produces (whether or not it exists yet).
pub fn object_path(workspace_root: &Path, release: bool) -> PathBuf {
    workspace_root
        .join("ebpf/target")
        .join(TARGET)
        .join(if release { "release" } else { "debug" })
        .join(OBJECT)
}

/// Builds `ebpf/programs` and returns the path of the object. Fails with the list of what is
/// missing when the toolchain is not installed.
pub fn build_ebpf(workspace_root: &Path, release: bool) -> anyhow::Result<PathBuf> {
    check_toolchain()?;
    let programs = workspace_root.join("ebpf/programs");
    let mut rustflags = String::new();
    for flag in RUSTFLAGS {
        if !rustflags.is_empty() {
            rustflags.push('\x1f');
        }
        rustflags.push_str(flag);
    }
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(&programs)
        .args(["build", "--locked", "--target", TARGET, "--target-dir"])
        .arg(workspace_root.join("ebpf/target"))
        .env("RUSTC", DEBIAN_RUSTC)
        .env("RUSTC_BOOTSTRAP", RUSTC_BOOTSTRAP)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        // Settings of the outer (user-space) build must not leak into the BPF build.
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_TARGET_DIR");
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .with_context(|| format!("run cargo in {}", programs.display()))?;
    if !status.success() {
        bail!("building the eBPF programs failed ({status}); command: {cmd:?}");
    }
    let object = object_path(workspace_root, release);
    if !object.is_file() {
        bail!(
            "the eBPF build succeeded but {} is missing",
            object.display()
        );
    }
    Ok(object)
}

/// Whether Debian's compiler has a precompiled library of `target` whose file name starts with
/// `prefix` (`libcore-`, `libstd-`) in its sysroot.
pub fn debian_rustlib_has(target: &str, prefix: &str) -> bool {
    let Ok(out) = Command::new(DEBIAN_RUSTC)
        .args(["--print", "sysroot"])
        .output()
    else {
        return false;
    };
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        .join("lib/rustlib")
        .join(target)
        .join("lib");
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(prefix))
    })
}

/// Checks for Debian's `rustc-web` with the bpfel `core` and for `bpf-linker` on LLVM 22.
fn check_toolchain() -> anyhow::Result<()> {
    let mut missing = Vec::new();
    let rustc_ok = Command::new(DEBIAN_RUSTC)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !rustc_ok {
        missing.push(format!(
            "{DEBIAN_RUSTC} (Debian packages rustc-web cargo-web)"
        ));
    }
    if rustc_ok && !debian_rustlib_has(TARGET, "libcore-") {
        missing.push(format!(
            "core for {TARGET} (Debian package libstd-rust-web-dev-bpf)"
        ));
    }
    let linker = Command::new("bpf-linker").arg("--version").output();
    match linker {
        Ok(o) if o.status.success() => {}
        _ => missing.push(
            "bpf-linker 0.13 on LLVM 22 (Debian package llvm-22-dev, then `LLVM_PREFIX=/usr/lib/llvm-22 \
             LLVM_SYS_221_PREFIX=/usr/lib/llvm-22 cargo install --locked bpf-linker@0.13.0 \
             --no-default-features --features llvm-22`)"
                .to_owned(),
        ),
    }
    if missing.is_empty() {
        return Ok(());
    }
    bail!(
        "the eBPF toolchain is incomplete; missing:\n  - {}\n`xtask/scripts/setup-host.sh --ebpf` installs all of it \
         (apt-get install -y --no-install-recommends rustc-web cargo-web libstd-rust-web-dev-bpf llvm-22-dev)",
        missing.join("\n  - ")
    )
}
