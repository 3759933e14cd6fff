//! `cargo xtask image`: the daemon as an OCI image archive, built without a Docker engine.
//!
//! One gzip layer holds `/usr/bin/nri-resize` and the shared libraries `ldd` lists for it, at
//! the paths the dynamic loader looks them up (the binary is glibc-dynamic), plus the empty
//! directories the `DaemonSet` mounts over. The observer's eBPF object is embedded in the binary
//! at build time (`plugin/build.rs` picks up what `cargo xtask build-ebpf` built), so the image
//! needs no separate object file. The archive is an OCI image layout in a tar (`oci-layout`,
//! `index.json`, `blobs/sha256/…`) whose index names the image through the
//! `io.containerd.image.name` annotation, which both containerd 1.7 and 2.x `ctr images import`
//! use: `ctr -n k8s.io images import target/image/nri-resize.oci.tar`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr as _;

use anyhow::{bail, Context as _};
use flate2::write::GzEncoder;
use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, DescriptorBuilder, Digest, ImageConfigurationBuilder,
    ImageIndexBuilder, ImageManifestBuilder, MediaType, Os, PlatformBuilder, RootFsBuilder,
};
use sha2::{Digest as _, Sha256};

/// The image's name inside containerd (and in `deploy/daemonset.yaml`).
pub fn image_name() -> String {
    format!("localhost/nri-resize:{}", env!("CARGO_PKG_VERSION"))
}

/// Where `cargo xtask image` writes the archive.
pub fn default_archive(root: &Path) -> PathBuf {
    root.join("target/image/nri-resize.oci.tar")
}

/// Directories the image carries empty (mount points of the `DaemonSet` and `ctr run`).
const DIRS: &[&str] = &[
    "usr",
    "usr/bin",
    "etc",
    "etc/nri-resize",
    "dev",
    "proc",
    "sys",
    "tmp",
    "run",
    "run/nri-resize",
    "var",
    "var/run",
    "var/run/nri",
    "var/lib",
    "var/lib/nri-resize",
];

fn sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn digest(data: &[u8]) -> anyhow::Result<Digest> {
    Digest::from_str(&format!("sha256:{}", sha256(data))).context("sha256 digest")
}

/// The shared objects `ldd` lists for `binary`: (path the loader uses, file to copy).
fn shared_libraries(binary: &Path) -> anyhow::Result<BTreeMap<PathBuf, PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("run ldd (Debian package libc-bin)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        if text.contains("not a dynamic executable") {
            return Ok(BTreeMap::new());
        }
        bail!(
            "ldd {} failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut libs = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`, `/lib64/ld-linux-x86-64.so.2 (0x...)`,
        // `linux-vdso.so.1 (0x...)` (in the kernel: nothing to copy).
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        let Some(path) = path.filter(|p| p.starts_with('/')) else {
            if line.contains("not found") {
                bail!("ldd {}: {line}", binary.display());
            }
            continue;
        };
        let path = PathBuf::from(path);
        let real = path
            .canonicalize()
            .with_context(|| format!("resolve {}", path.display()))?;
        libs.insert(path, real);
    }
    Ok(libs)
}

/// Deterministic tar entries: mtime 0, root-owned.
fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(size);
    h
}

/// The uncompressed layer tar.
fn layer(binary: &Path) -> anyhow::Result<(Vec<u8>, Vec<String>)> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut listing = Vec::new();
    let libs = shared_libraries(binary)?;
    let mut dirs: Vec<String> = DIRS.iter().map(|d| (*d).to_string()).collect();
    for lib in libs.keys() {
        let mut parent = lib.parent();
        while let Some(p) = parent.filter(|p| *p != Path::new("/")) {
            dirs.push(p.to_string_lossy().trim_start_matches('/').to_string());
            parent = p.parent();
        }
    }
    dirs.sort();
    dirs.dedup();
    for d in &dirs {
        let mode = if d == "tmp" { 0o1777 } else { 0o755 };
        let mut h = header(tar::EntryType::Directory, mode, 0);
        tar.append_data(&mut h, format!("{d}/"), std::io::empty())?;
    }
    let mut add_file = |inside: &str, from: &Path, shown: &str, mode: u32| -> anyhow::Result<()> {
        let data = std::fs::read(from).with_context(|| format!("read {}", from.display()))?;
        let mut h = header(tar::EntryType::Regular, mode, data.len() as u64);
        tar.append_data(&mut h, inside, data.as_slice())?;
        listing.push(format!("/{inside} ({} bytes, from {shown})", data.len()));
        Ok(())
    };
    // The binary without its debug sections: a test build's are four fifths of it (195 MiB of
    // a 35 MiB program), which every `ctr images import` hashes and unpacks (minutes in the VM
    // tier's emulated guests). Symbols stay, so a panic's backtrace still names functions.
    let stripped = std::env::temp_dir().join(format!("nri-resize-image-{}", std::process::id()));
    let status = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(binary)
        .arg(&stripped)
        .status()
        .context("run objcopy (binutils) to strip the binary's debug sections")?;
    if !status.success() {
        bail!(
            "objcopy --strip-debug {} failed: {status}",
            binary.display()
        );
    }
    let shown = format!("{} without debug sections", binary.display());
    let added = add_file("usr/bin/nri-resize", &stripped, &shown, 0o755);
    let _ = std::fs::remove_file(&stripped);
    added?;
    for (path, real) in &libs {
        add_file(
            path.to_string_lossy().trim_start_matches('/'),
            real,
            &real.display().to_string(),
            0o755,
        )?;
    }
    Ok((tar.into_inner()?, listing))
}

/// What was built.
#[derive(Debug)]
pub struct Built {
    pub archive: PathBuf,
    pub name: String,
    pub manifest_digest: String,
    pub files: Vec<String>,
}

/// Writes the OCI image archive of `binary` to `out` (atomically).
pub fn build_archive(binary: &Path, out: &Path, name: &str) -> anyhow::Result<Built> {
    if std::env::consts::ARCH != "x86_64" {
        bail!(
            "the image is built for linux/amd64; this machine is {}",
            std::env::consts::ARCH
        );
    }
    let (layer_tar, files) = layer(binary)?;
    let diff_id = digest(&layer_tar)?;
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&layer_tar)?;
    let layer_gz = gz.finish()?;
    let layer_desc = Descriptor::new(
        MediaType::ImageLayerGzip,
        layer_gz.len() as u64,
        digest(&layer_gz)?,
    );

    let config = ImageConfigurationBuilder::default()
        .architecture(Arch::Amd64)
        .os(Os::Linux)
        .config(
            ConfigBuilder::default()
                .entrypoint(vec!["/usr/bin/nri-resize".to_string()])
                .cmd(vec!["run".to_string()])
                .env(vec![
                    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
                ])
                .exposed_ports(vec!["9464/tcp".to_string()])
                .labels(std::collections::HashMap::from([(
                    "org.opencontainers.image.title".to_string(),
                    "nri-resize".to_string(),
                )]))
                .build()?,
        )
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(vec![diff_id.to_string()])
                .build()?,
        )
        .build()?;
    let config_json = config.to_string()?.into_bytes();
    let config_desc = Descriptor::new(
        MediaType::ImageConfig,
        config_json.len() as u64,
        digest(&config_json)?,
    );
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config_desc.clone())
        .layers(vec![layer_desc.clone()])
        .build()?;
    let manifest_json = manifest.to_string()?.into_bytes();
    let manifest_digest = digest(&manifest_json)?;
    let tag = name.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![DescriptorBuilder::default()
            .media_type(MediaType::ImageManifest)
            .size(manifest_json.len() as u64)
            .digest(manifest_digest.clone())
            .platform(
                PlatformBuilder::default()
                    .architecture(Arch::Amd64)
                    .os(Os::Linux)
                    .build()?,
            )
            .annotations(std::collections::HashMap::from([
                ("io.containerd.image.name".to_string(), name.to_string()),
                (
                    "org.opencontainers.image.ref.name".to_string(),
                    tag.to_string(),
                ),
            ]))
            .build()?])
        .build()?;
    let index_json = index.to_string()?.into_bytes();

    let mut archive = tar::Builder::new(Vec::new());
    let mut add = |p: &str, data: &[u8]| -> anyhow::Result<()> {
        let mut h = header(tar::EntryType::Regular, 0o644, data.len() as u64);
        archive.append_data(&mut h, p, data)?;
        Ok(())
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json", &index_json)?;
    for (desc, data) in [(&layer_desc, &layer_gz), (&config_desc, &config_json)] {
        add(&format!("blobs/sha256/{}", desc.digest().digest()), data)?;
    }
    add(
        &format!("blobs/sha256/{}", manifest_digest.digest()),
        &manifest_json,
    )?;
    let bytes = archive.into_inner()?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let tmp = out.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, &bytes).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, out).with_context(|| format!("rename to {}", out.display()))?;
    Ok(Built {
        archive: out.to_path_buf(),
        name: name.to_string(),
        manifest_digest: manifest_digest.to_string(),
        files,
    })
}
