//! Building the daemon for another architecture than the build machine's (the arm64 half of
//! the multi-architecture image, `cargo xtask image`).
//!
//! rustup has no standard library for a foreign target here (and cannot download one), so a
//! foreign build uses Debian's `rustc-web` (`/usr/bin/rustc`, the compiler that also builds the
//! eBPF programs) with Debian's multi-arch standard library of that target
//! (`libstd-rust-web-dev:arm64`) and the GNU cross linker (`gcc-aarch64-linux-gnu`).
//!
//! A foreign binary is linked **statically** (`-C target-feature=+crt-static`, glibc's `libc.a`
//! from `libc6-dev-arm64-cross`): the image then needs no shared library of that architecture,
//! which `ldd` cannot list for a foreign binary, and the binary runs under `qemu-aarch64`
//! without a sysroot. The daemon resolves no host names (it binds a `SocketAddr` and unix
//! sockets) and loads no NSS module, the parts of glibc that a static link cannot carry.
//!
//! The eBPF object embedded in the binary is the same for every architecture: the programs are
//! `fentry`/`fexit`/`tp_btf`/`tracepoint` programs that read BTF-typed arguments, tracepoint
//! records at offsets from tracefs and struct fields at offsets from the running kernel's BTF.
//! `bpf_target_arch` only selects aya-ebpf's `pt_regs` layout (kprobes, uprobes), which they do
//! not use; both builds (`x86_64` and `aarch64`) give identical program sections.
//!
//! The build goes to its own target directory (`target/cross-static`): neither the host's
//! `target/` nor the VM tier's dynamically linked test binaries (`target/cross`) are rebuilt
//! because of the different flags.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};

use crate::ebpf::{debian_rustlib_has, DEBIAN_RUSTC};

/// Target directory of foreign builds (below the workspace root).
const CROSS_TARGET_DIR: &str = "target/cross-static";

/// An architecture the image is built for (the names are Kubernetes' `kubernetes.io/arch` and
/// the OCI platform's `architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// Every architecture of the image, in the order of the image index.
    pub const ALL: [Self; 2] = [Self::Amd64, Self::Arm64];

    /// The OCI / Go / Debian / Kubernetes name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Amd64 => "amd64",
            Self::Arm64 => "arm64",
        }
    }

    /// The Rust target triple.
    pub fn rust_target(self) -> &'static str {
        match self {
            Self::Amd64 => "x86_64-unknown-linux-gnu",
            Self::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// The GNU triplet (prefix of the cross tools, Debian's multi-arch directory).
    fn gnu_triplet(self) -> &'static str {
        match self {
            Self::Amd64 => "x86_64-linux-gnu",
            Self::Arm64 => "aarch64-linux-gnu",
        }
    }

    /// Debian's name of the triplet in package names (`gcc-<this>`, `libc6-dev-<arch>-cross`).
    fn debian_cross_suffix(self) -> &'static str {
        match self {
            Self::Amd64 => "x86-64-linux-gnu",
            Self::Arm64 => "aarch64-linux-gnu",
        }
    }

    /// The ELF `e_machine` of its executables.
    pub fn elf_machine(self) -> u16 {
        match self {
            Self::Amd64 => 62,  // EM_X86_64
            Self::Arm64 => 183, // EM_AARCH64
        }
    }

    /// The architecture of the machine this runs on, if it is one of ours.
    pub fn host() -> Option<Self> {
        Self::from_rust_arch(std::env::consts::ARCH)
    }

    fn from_rust_arch(arch: &str) -> Option<Self> {
        match arch {
            "x86_64" => Some(Self::Amd64),
            "aarch64" => Some(Self::Arm64),
            _ => None,
        }
    }

    /// The cross linker (and C compiler) of this target.
    fn cross_gcc(self) -> String {
        format!("{}-gcc", self.gnu_triplet())
    }

    /// The `objcopy` that handles this architecture's executables on this machine (Debian's
    /// plain `objcopy` knows only the host's; `binutils-<triplet>` comes with the cross gcc).
    pub fn objcopy(self) -> String {
        if Self::host() == Some(self) {
            "objcopy".to_string()
        } else {
            format!("{}-objcopy", self.gnu_triplet())
        }
    }

    /// Debian packages that make up the cross toolchain for this target.
    fn cross_packages(self) -> [String; 4] {
        [
            "rustc-web".to_string(),
            format!("libstd-rust-web-dev:{}", self.name()),
            format!("gcc-{}", self.debian_cross_suffix()),
            format!("libc6-dev-{}-cross", self.name()),
        ]
    }

    /// The exact commands that install the cross toolchain.
    pub fn install_command(self) -> String {
        format!(
            "dpkg --add-architecture {} && apt-get update && apt-get install -y --no-install-recommends {}",
            self.name(),
            self.cross_packages().join(" ")
        )
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Arch {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .with_context(|| format!("unknown architecture {s:?} (known: amd64, arm64)"))
    }
}

/// What an ELF executable was built for, from its headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElfInfo {
    /// `e_machine`.
    pub machine: u16,
    /// Whether it names a program interpreter (`PT_INTERP`: the dynamic loader), i.e. needs
    /// shared libraries at run time. A static PIE has none.
    pub needs_loader: bool,
}

impl ElfInfo {
    /// The architecture of the executable, if it is one of ours.
    pub fn arch(self) -> Option<Arch> {
        Arch::ALL
            .into_iter()
            .find(|a| a.elf_machine() == self.machine)
    }
}

/// Reads the ELF header and program headers of a 64-bit little-endian executable.
pub fn inspect_elf(data: &[u8]) -> anyhow::Result<ElfInfo> {
    const PT_INTERP: u32 = 3;
    let u16_at = |off: usize| -> anyhow::Result<u16> {
        data.get(off..off + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .context("ELF file truncated")
    };
    let u32_at = |off: usize| -> anyhow::Result<u32> {
        data.get(off..off + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .context("ELF file truncated")
    };
    let u64_at = |off: usize| -> anyhow::Result<u64> {
        let b = data.get(off..off + 8).context("ELF file truncated")?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    };
    if data.get(..4) != Some(b"\x7fELF".as_slice()) {
        bail!("not an ELF file");
    }
    // EI_CLASS 2 = 64-bit, EI_DATA 1 = little-endian.
    if data.get(4) != Some(&2) || data.get(5) != Some(&1) {
        bail!("not a 64-bit little-endian ELF file");
    }
    let machine = u16_at(18)?;
    let phoff = usize::try_from(u64_at(32)?).context("e_phoff")?;
    let phentsize = usize::from(u16_at(54)?);
    let phnum = usize::from(u16_at(56)?);
    let mut needs_loader = false;
    for i in 0..phnum {
        if u32_at(phoff + i * phentsize)? == PT_INTERP {
            needs_loader = true;
        }
    }
    Ok(ElfInfo {
        machine,
        needs_loader,
    })
}

/// [`inspect_elf`] of a file (its first 64 KiB, where linkers put the program headers).
pub fn inspect_elf_file(path: &Path) -> anyhow::Result<ElfInfo> {
    use std::io::Read as _;
    let mut data = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(64 * 1024).read_to_end(&mut data))
        .with_context(|| format!("read {}", path.display()))?;
    inspect_elf(&data).with_context(|| path.display().to_string())
}

/// Where [`build_daemon`] puts the daemon for `arch`.
pub fn daemon_path(root: &Path, arch: Arch, release: bool) -> PathBuf {
    let profile = if release { "release" } else { "debug" };
    if Arch::host() == Some(arch) {
        root.join("target").join(profile).join("nri-resize")
    } else {
        root.join(CROSS_TARGET_DIR)
            .join(arch.rust_target())
            .join(profile)
            .join("nri-resize")
    }
}

/// Builds the daemon (package `nri-resize`, binary `nri-resize`) for `arch` and returns its
/// path. On the build machine's own architecture this is the ordinary build into `target/`;
/// for another one, a static cross build into `target/cross-static` after checking the
/// toolchain (failing with what is missing and the command that installs it).
///
/// The eBPF object is embedded as `plugin/build.rs` finds it (`NRI_RESIZE_EBPF_OBJ`, set by
/// `cargo xtask build-ebpf`'s callers, else `ebpf/target/bpfel-unknown-none/…`).
pub fn build_daemon(root: &Path, arch: Arch, release: bool) -> anyhow::Result<PathBuf> {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root)
        .args(["build", "-p", "nri-resize", "--bin", "nri-resize"]);
    if release {
        cmd.arg("--release");
    }
    let native = Arch::host() == Some(arch);
    if !native {
        check_toolchain(arch)?;
        let target_env = arch.rust_target().replace('-', "_");
        let gcc = arch.cross_gcc();
        cmd.args(["--target", arch.rust_target(), "--target-dir"])
            .arg(root.join(CROSS_TARGET_DIR))
            .env("RUSTC", DEBIAN_RUSTC)
            .env(
                format!("CARGO_TARGET_{}_LINKER", target_env.to_uppercase()),
                &gcc,
            )
            .env(
                format!("CARGO_TARGET_{}_RUSTFLAGS", target_env.to_uppercase()),
                "-C target-feature=+crt-static",
            )
            .env(format!("CC_{target_env}"), &gcc)
            // These would replace (RUSTFLAGS) or redirect the settings above.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_BUILD_RUSTFLAGS")
            .env_remove("RUSTC_WRAPPER")
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .env_remove("CARGO_BUILD_TARGET")
            .env_remove("CARGO_TARGET_DIR");
    }
    crate::run(&format!("build the daemon for linux/{arch}"), &mut cmd)?;
    let binary = daemon_path(root, arch, release);
    let info = inspect_elf_file(&binary)?;
    if info.arch() != Some(arch) {
        bail!(
            "{} is not a linux/{arch} executable (ELF machine {})",
            binary.display(),
            info.machine
        );
    }
    if !native && info.needs_loader {
        bail!(
            "{} is dynamically linked; the cross build must be static (+crt-static)",
            binary.display()
        );
    }
    Ok(binary)
}

/// Runs `binary --version` (an executable of `arch`): directly on its own architecture, under
/// QEMU's user-mode emulator (`qemu-<arch>-static`, Debian package `qemu-user-static`, or
/// `qemu-<arch>`) on another. Returns what it printed and how it ran, `None` when no emulator is
/// installed; fails when it runs and does not succeed (a binary that cannot start on its
/// architecture).
pub fn smoke_run(arch: Arch, binary: &Path) -> anyhow::Result<Option<(String, String)>> {
    let mut cmd = if Arch::host() == Some(arch) {
        Command::new(binary)
    } else {
        let cpu = arch.gnu_triplet().split('-').next().unwrap_or_default();
        let Some(qemu) = [format!("qemu-{cpu}-static"), format!("qemu-{cpu}")]
            .into_iter()
            .find(|q| {
                Command::new(q)
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
        else {
            return Ok(None);
        };
        let mut c = Command::new(qemu);
        c.arg(binary);
        c
    };
    cmd.arg("--version");
    let how = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("run {how}"))?;
    if !out.status.success() {
        bail!(
            "{how} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(Some((
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        how,
    )))
}

/// What is missing of the cross toolchain for `arch` (empty: complete).
fn missing_toolchain(arch: Arch) -> Vec<String> {
    let mut missing = Vec::new();
    let ok = |cmd: &mut Command| cmd.output().is_ok_and(|o| o.status.success());
    let rustc_ok = ok(Command::new(DEBIAN_RUSTC).arg("--version"));
    if !rustc_ok {
        missing.push(format!("{DEBIAN_RUSTC} (Debian package rustc-web)"));
    }
    let has_std = debian_rustlib_has(arch.rust_target(), "libstd-");
    if rustc_ok && !has_std {
        missing.push(format!(
            "the standard library for {} (Debian package libstd-rust-web-dev:{}, after \
             `dpkg --add-architecture {}`)",
            arch.rust_target(),
            arch.name(),
            arch.name()
        ));
    }
    if rustc_ok && has_std {
        // rustc refuses a standard library of another compiler version.
        let version = |pkg: &str| {
            Command::new("dpkg-query")
                .args(["-W", "-f", "${Version}", pkg])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        };
        let std_pkg = format!("libstd-rust-web-dev:{}", arch.name());
        if let (Some(c), Some(s)) = (version("rustc-web"), version(&std_pkg)) {
            if c != s {
                missing.push(format!(
                    "{std_pkg} of the compiler's version (rustc-web {c}, {std_pkg} {s}: \
                     install both from the same suite)"
                ));
            }
        }
    }
    let gcc = arch.cross_gcc();
    if !ok(Command::new(&gcc).arg("--version")) {
        missing.push(format!(
            "{gcc} (Debian package gcc-{})",
            arch.debian_cross_suffix()
        ));
    }
    // glibc's static archive for the target (the link is static).
    let libc_a = Path::new("/usr")
        .join(arch.gnu_triplet())
        .join("lib/libc.a");
    if !libc_a.is_file() {
        missing.push(format!(
            "{} (Debian package libc6-dev-{}-cross)",
            libc_a.display(),
            arch.name()
        ));
    }
    missing
}

/// The error for an incomplete toolchain: what is missing and the command that installs it.
fn toolchain_error(arch: Arch, missing: &[String]) -> String {
    format!(
        "the cross toolchain for linux/{arch} is incomplete; missing:\n  - {}\n\
         `xtask/scripts/setup-host.sh --ebpf` installs it ({})",
        missing.join("\n  - "),
        arch.install_command()
    )
}

/// Fails with the list of what is missing and the command that installs it.
fn check_toolchain(arch: Arch) -> anyhow::Result<()> {
    let missing = missing_toolchain(arch);
    if missing.is_empty() {
        return Ok(());
    }
    bail!(toolchain_error(arch, &missing))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal 64-bit little-endian ELF: header plus `types` as program headers.
    fn elf(machine: u16, types: &[u32]) -> Vec<u8> {
        let mut d = vec![0u8; 64 + 56 * types.len()];
        d[..4].copy_from_slice(b"\x7fELF");
        d[4] = 2;
        d[5] = 1;
        d[18..20].copy_from_slice(&machine.to_le_bytes());
        d[32..40].copy_from_slice(&64u64.to_le_bytes());
        d[54..56].copy_from_slice(&56u16.to_le_bytes());
        d[56..58].copy_from_slice(&u16::try_from(types.len()).unwrap().to_le_bytes());
        for (i, t) in types.iter().enumerate() {
            d[64 + 56 * i..68 + 56 * i].copy_from_slice(&t.to_le_bytes());
        }
        d
    }

    #[test]
    fn elf_machine_and_loader() {
        // PT_PHDR, PT_INTERP, PT_LOAD, PT_DYNAMIC: a dynamic executable.
        let dynamic = inspect_elf(&elf(62, &[6, 3, 1, 2])).unwrap();
        assert_eq!(dynamic.arch(), Some(Arch::Amd64));
        assert!(dynamic.needs_loader);
        // A static PIE has PT_DYNAMIC but no PT_INTERP.
        let static_pie = inspect_elf(&elf(183, &[6, 1, 2])).unwrap();
        assert_eq!(static_pie.arch(), Some(Arch::Arm64));
        assert!(!static_pie.needs_loader);
        assert_eq!(inspect_elf(&elf(243, &[1])).unwrap().arch(), None);
    }

    #[test]
    fn elf_rejects_garbage() {
        assert!(inspect_elf(b"#!/bin/sh\n").is_err());
        let mut truncated = elf(183, &[1, 3]);
        truncated.truncate(100);
        assert!(inspect_elf(&truncated).is_err());
    }

    /// The host's own daemon binary, when one was built, is what it claims to be.
    #[test]
    fn host_binary_is_host_arch() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let Some(host) = Arch::host() else { return };
        let bin = daemon_path(root, host, false);
        if bin.is_file() {
            assert_eq!(inspect_elf_file(&bin).unwrap().arch(), Some(host));
        }
    }

    #[test]
    fn toolchain_error_lists_what_is_missing_and_the_command() {
        let msg = toolchain_error(
            Arch::Arm64,
            &["a (Debian package a)".to_string(), "b".to_string()],
        );
        assert!(
            msg.contains("missing:\n  - a (Debian package a)\n  - b\n"),
            "{msg}"
        );
        assert!(
            msg.ends_with(&format!("({})", Arch::Arm64.install_command())),
            "{msg}"
        );
    }

    #[test]
    fn names_and_paths() {
        assert_eq!("arm64".parse::<Arch>().unwrap(), Arch::Arm64);
        assert!("riscv64".parse::<Arch>().is_err());
        assert_eq!(Arch::from_rust_arch("aarch64"), Some(Arch::Arm64));
        assert_eq!(
            Arch::Arm64.install_command(),
            "dpkg --add-architecture arm64 && apt-get update && apt-get install -y \
             --no-install-recommends rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu \
             libc6-dev-arm64-cross"
        );
        let root = Path::new("/w");
        let foreign = if Arch::host() == Some(Arch::Amd64) {
            Arch::Arm64
        } else {
            Arch::Amd64
        };
        assert_eq!(
            daemon_path(root, foreign, true),
            Path::new("/w/target/cross-static")
                .join(foreign.rust_target())
                .join("release/nri-resize")
        );
    }
}
