//! Embeds the observer's eBPF object when it has been built.
//!
//! `cargo xtask build-ebpf` builds `ebpf/programs` into `ebpf/target/bpfel-unknown-none/<profile>/`
//! and sets `NRI_RESIZE_EBPF_OBJ` for the builds it runs. Without the variable the known output
//! paths are tried (release first). Without an object the plugin still builds; its observer then
//! reports "eBPF object not built into this binary" at start-up and polls cgroup files.
//!
//! Also records the commit the binary is built from, for `--version` and the `build_info`
//! metric (`NRI_RESIZE_COMMIT` at compile time): `git rev-parse --short HEAD` where the sources
//! are a git checkout, else the `NRI_RESIZE_COMMIT` environment variable (a build from a
//! tarball, or one that wants to name the commit itself), else `unknown`. A build never fails
//! for want of git.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The commit, as `git` names it in `dir`; `None` outside a checkout or without git.
fn git_commit(dir: &Path) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()?;
    let commit = String::from_utf8(out.stdout).ok()?.trim().to_string();
    let plausible = !commit.is_empty() && commit.bytes().all(|b| b.is_ascii_hexdigit());
    (out.status.success() && plausible).then_some(commit)
}

/// The files whose change moves HEAD (HEAD itself, the branch it names, packed refs), so that a
/// new commit rebuilds with its name. Only existing ones: cargo reruns on every build for a
/// path that does not exist.
fn git_watch(dir: &Path) -> Vec<PathBuf> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let mut paths = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        paths.push(branch);
    }
    paths
        .iter()
        .filter_map(|p| git(&["rev-parse", "--path-format=absolute", "--git-path", p]))
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .collect()
}

fn commit(manifest: &Path) {
    println!("cargo::rerun-if-env-changed=NRI_RESIZE_COMMIT");
    for path in git_watch(manifest) {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    let commit = git_commit(manifest)
        .or_else(|| {
            std::env::var("NRI_RESIZE_COMMIT")
                .ok()
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo::rustc-env=NRI_RESIZE_COMMIT={commit}");
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(nri_resize_ebpf_object)");
    println!("cargo::rerun-if-env-changed=NRI_RESIZE_EBPF_OBJ");
    let manifest = PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"),
    );
    commit(&manifest);
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
