//! `cargo xtask image`: the daemon as an OCI image archive, built without a Docker engine.
//!
//! One archive holds an image per architecture (linux/amd64 and linux/arm64): `index.json`
//! names one image index that lists each platform's manifest with its `platform`, each with
//! its own config and layer; `ctr images import` unpacks the machine's own platform, and a
//! node pulls its own. The single-platform archives of the test tiers (`build_archive`) name
//! their one manifest directly.
//!
//! A layer holds `/usr/bin/nri-resize` and the shared libraries it needs at the paths the
//! dynamic loader looks them up, plus the empty directories the `DaemonSet` mounts over. The
//! host's own build is glibc-dynamic: `ldd` lists its libraries. The cross-built one is static
//! (`cross.rs`): `ldd` cannot list a foreign binary's libraries, and it needs none. The
//! observer's eBPF object is embedded in the binary at build time (`plugin/build.rs` picks up
//! what `cargo xtask build-ebpf` built; one object serves both architectures), so the image
//! needs no separate object file. The archive is an OCI image layout in a tar (`oci-layout`,
//! `index.json`, `blobs/sha256/…`) whose index names the image through the
//! `io.containerd.image.name` annotation, which both containerd 1.7 and 2.x `ctr images import`
//! use: `ctr -n k8s.io images import target/image/nri-resize.oci.tar`.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr as _;

use anyhow::{bail, Context as _};
use flate2::write::GzEncoder;
use oci_spec::image::{
    Arch as OciArch, ConfigBuilder, Descriptor, DescriptorBuilder, Digest,
    ImageConfigurationBuilder, ImageIndexBuilder, ImageManifestBuilder, MediaType, Os,
    PlatformBuilder, RootFsBuilder,
};
use sha2::{Digest as _, Sha256};

use crate::cross::{self, Arch};

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
    use std::fmt::Write as _;
    Sha256::digest(data)
        .iter()
        .fold(String::with_capacity(64), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
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

/// The shared objects the layer must carry for `binary` of `arch`: `ldd`'s list for a dynamic
/// binary of this machine's architecture, none for a static one. A dynamic binary of another
/// architecture is refused (`ldd` cannot list its libraries): cross builds are static
/// (`cross.rs`).
fn layer_libraries(binary: &Path, arch: Arch) -> anyhow::Result<BTreeMap<PathBuf, PathBuf>> {
    let elf = cross::inspect_elf_file(binary)?;
    if elf.arch() != Some(arch) {
        bail!(
            "{} is not a linux/{arch} executable (ELF machine {})",
            binary.display(),
            elf.machine
        );
    }
    if !elf.needs_loader {
        return Ok(BTreeMap::new());
    }
    if Arch::host() != Some(arch) {
        bail!(
            "{} is a dynamically linked linux/{arch} executable: its shared libraries cannot be \
             listed on this machine; build it static (`cross::build_daemon` does)",
            binary.display()
        );
    }
    shared_libraries(binary)
}

/// The uncompressed layer tar.
fn layer(binary: &Path, arch: Arch) -> anyhow::Result<(Vec<u8>, Vec<String>)> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut listing = Vec::new();
    let libs = layer_libraries(binary, arch)?;
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
    // A foreign binary takes its architecture's objcopy (the host's knows only its own).
    let stripped =
        std::env::temp_dir().join(format!("nri-resize-image-{}-{arch}", std::process::id()));
    let objcopy = arch.objcopy();
    let status = Command::new(&objcopy)
        .arg("--strip-debug")
        .arg(binary)
        .arg(&stripped)
        .status()
        .with_context(|| {
            format!("run {objcopy} (binutils) to strip the binary's debug sections")
        })?;
    if !status.success() {
        bail!(
            "{objcopy} --strip-debug {} failed: {status}",
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

/// The OCI architecture of one of ours.
fn oci_arch(arch: Arch) -> OciArch {
    match arch {
        Arch::Amd64 => OciArch::Amd64,
        Arch::Arm64 => OciArch::ARM64,
    }
}

/// One platform's image: its manifest and the blobs it names.
#[derive(Debug)]
struct PlatformImage {
    arch: Arch,
    manifest_json: Vec<u8>,
    config_json: Vec<u8>,
    layer_gz: Vec<u8>,
    files: Vec<String>,
}

impl PlatformImage {
    /// The image of `binary` (an executable of `arch`).
    fn build(arch: Arch, binary: &Path) -> anyhow::Result<Self> {
        let (layer_tar, files) = layer(binary, arch)?;
        Self::from_layer(arch, &layer_tar, files)
    }

    /// The config and manifest around an uncompressed layer.
    fn from_layer(arch: Arch, layer_tar: &[u8], files: Vec<String>) -> anyhow::Result<Self> {
        let diff_id = digest(layer_tar)?;
        let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(layer_tar)?;
        let layer_gz = gz.finish()?;
        let layer_desc = Descriptor::new(
            MediaType::ImageLayerGzip,
            layer_gz.len() as u64,
            digest(&layer_gz)?,
        );
        let config = ImageConfigurationBuilder::default()
            .architecture(oci_arch(arch))
            .os(Os::Linux)
            .config(
                ConfigBuilder::default()
                    .entrypoint(vec!["/usr/bin/nri-resize".to_string()])
                    .cmd(vec!["run".to_string()])
                    .env(vec![
                        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
                            .to_string(),
                    ])
                    .exposed_ports(vec!["9464/tcp".to_string()])
                    .labels(HashMap::from([(
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
            .config(config_desc)
            .layers(vec![layer_desc])
            .build()?;
        Ok(Self {
            arch,
            manifest_json: manifest.to_string()?.into_bytes(),
            config_json,
            layer_gz,
            files,
        })
    }

    /// The manifest's descriptor in an index, with its platform.
    fn descriptor(&self) -> anyhow::Result<Descriptor> {
        Ok(DescriptorBuilder::default()
            .media_type(MediaType::ImageManifest)
            .size(self.manifest_json.len() as u64)
            .digest(digest(&self.manifest_json)?)
            .platform(
                PlatformBuilder::default()
                    .architecture(oci_arch(self.arch))
                    .os(Os::Linux)
                    .build()?,
            )
            .build()?)
    }
}

/// Paths inside the archive and their contents.
type LayoutFiles = Vec<(String, Vec<u8>)>;

/// The files of the OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/…`) holding
/// `images` under `name`, and the digest `name` points at.
///
/// One platform: `index.json` names its manifest (the form every caller before the multi-arch
/// image used). Several: `index.json` names one image index (a blob) that lists each
/// platform's manifest with its `platform`, the form of a multi-arch image in a registry; the
/// name annotation sits on that single entry, so `ctr images import` makes one image of it and
/// unpacks the platform of the machine (two named entries of one name would make the last one
/// win, whatever its platform).
fn layout(name: &str, images: &[PlatformImage]) -> anyhow::Result<(LayoutFiles, Digest)> {
    if images.is_empty() {
        bail!("an image needs at least one platform");
    }
    let mut seen: Vec<Arch> = images.iter().map(|i| i.arch).collect();
    seen.sort();
    seen.dedup();
    if seen.len() != images.len() {
        bail!("two images of one platform");
    }
    let blob = |data: &[u8]| format!("blobs/sha256/{}", sha256(data));
    let mut files = vec![(
        "oci-layout".to_string(),
        br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
    )];
    let mut blobs = Vec::new();
    for image in images {
        for data in [&image.layer_gz, &image.config_json, &image.manifest_json] {
            blobs.push((blob(data), data.clone()));
        }
    }
    let manifests = images
        .iter()
        .map(PlatformImage::descriptor)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let tag = name.rsplit_once(':').map_or("latest", |(_, t)| t);
    let annotations = HashMap::from([
        ("io.containerd.image.name".to_string(), name.to_string()),
        (
            "org.opencontainers.image.ref.name".to_string(),
            tag.to_string(),
        ),
    ]);
    let top = if let [single] = manifests.as_slice() {
        let mut d = single.clone();
        d.set_annotations(Some(annotations));
        d
    } else {
        let inner = ImageIndexBuilder::default()
            .schema_version(2u32)
            .media_type(MediaType::ImageIndex)
            .manifests(manifests)
            .build()?
            .to_string()?
            .into_bytes();
        let d = DescriptorBuilder::default()
            .media_type(MediaType::ImageIndex)
            .size(inner.len() as u64)
            .digest(digest(&inner)?)
            .annotations(annotations)
            .build()?;
        blobs.push((blob(&inner), inner));
        d
    };
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![top.clone()])
        .build()?;
    files.push(("index.json".to_string(), index.to_string()?.into_bytes()));
    files.extend(blobs);
    Ok((files, top.digest().clone()))
}

/// What one platform of the image holds.
#[derive(Debug)]
pub struct BuiltPlatform {
    pub arch: Arch,
    pub manifest_digest: String,
    pub files: Vec<String>,
}

/// What was built.
#[derive(Debug)]
pub struct Built {
    pub archive: PathBuf,
    pub name: String,
    /// What the name points at: the manifest of a single-platform archive, the image index of
    /// a multi-platform one.
    pub target_digest: String,
    pub platforms: Vec<BuiltPlatform>,
}

/// Writes the OCI image archive of `binary`, an executable of this machine's architecture, to
/// `out` (atomically): a single-platform image (what the test tiers import).
pub fn build_archive(binary: &Path, out: &Path, name: &str) -> anyhow::Result<Built> {
    let arch = Arch::host().with_context(|| {
        format!(
            "the image is built for linux/amd64 or linux/arm64; this machine is {}",
            std::env::consts::ARCH
        )
    })?;
    build_multiarch_archive(&[(arch, binary.to_path_buf())], out, name)
}

/// Writes one OCI image archive holding an image of each `(architecture, executable)` to `out`
/// (atomically). With more than one, the name points at an image index of them.
pub fn build_multiarch_archive(
    binaries: &[(Arch, PathBuf)],
    out: &Path,
    name: &str,
) -> anyhow::Result<Built> {
    let images = binaries
        .iter()
        .map(|(arch, binary)| PlatformImage::build(*arch, binary))
        .collect::<anyhow::Result<Vec<_>>>()?;
    write_archive(images, out, name)
}

/// A small archive of the real layout for each of `arches`, whose layer holds one text file in
/// place of the binary: what the push is tested with, without building the daemon.
#[cfg(test)]
pub fn fake_archive(arches: &[Arch], out: &Path, name: &str) -> anyhow::Result<Built> {
    let images = arches
        .iter()
        .map(|&arch| {
            let mut tar = tar::Builder::new(Vec::new());
            let data = format!("not the daemon: a stand-in for linux/{arch}");
            let mut h = header(tar::EntryType::Regular, 0o755, data.len() as u64);
            tar.append_data(&mut h, "usr/bin/nri-resize", data.as_bytes())?;
            PlatformImage::from_layer(arch, &tar.into_inner()?, vec![])
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    write_archive(images, out, name)
}

/// Writes the archive of `images` under `name` to `out` (atomically).
fn write_archive(images: Vec<PlatformImage>, out: &Path, name: &str) -> anyhow::Result<Built> {
    let (files, target) = layout(name, &images)?;
    let mut archive = tar::Builder::new(Vec::new());
    for (path, data) in &files {
        let mut h = header(tar::EntryType::Regular, 0o644, data.len() as u64);
        archive.append_data(&mut h, path, data.as_slice())?;
    }
    let bytes = archive.into_inner()?;
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let tmp = out.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, &bytes).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, out).with_context(|| format!("rename to {}", out.display()))?;
    let platforms = images
        .into_iter()
        .map(|i| {
            Ok(BuiltPlatform {
                arch: i.arch,
                manifest_digest: digest(&i.manifest_json)?.to_string(),
                files: i.files,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Built {
        archive: out.to_path_buf(),
        name: name.to_string(),
        target_digest: target.to_string(),
        platforms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn image(arch: Arch) -> PlatformImage {
        let mut tar = tar::Builder::new(Vec::new());
        let data = format!("binary for {arch}");
        let mut h = header(tar::EntryType::Regular, 0o755, data.len() as u64);
        tar.append_data(&mut h, "usr/bin/nri-resize", data.as_bytes())
            .unwrap();
        let layer = tar.into_inner().unwrap();
        PlatformImage::from_layer(arch, &layer, vec![]).unwrap()
    }

    fn json(files: &[(String, Vec<u8>)], path: &str) -> Value {
        let data = &files
            .iter()
            .find(|(p, _)| p == path)
            .unwrap_or_else(|| panic!("no {path}"))
            .1;
        serde_json::from_slice(data).unwrap()
    }

    /// The blob a descriptor names, checked against its digest and size.
    fn blob<'a>(files: &'a [(String, Vec<u8>)], desc: &Value) -> &'a [u8] {
        let digest = desc["digest"].as_str().unwrap();
        let hex = digest.strip_prefix("sha256:").unwrap();
        let data = &files
            .iter()
            .find(|(p, _)| *p == format!("blobs/sha256/{hex}"))
            .unwrap_or_else(|| panic!("no blob {digest}"))
            .1;
        assert_eq!(sha256(data), hex, "blob content matches its name");
        assert_eq!(desc["size"].as_u64().unwrap(), data.len() as u64);
        data
    }

    /// Follows a manifest descriptor: its config's architecture and layer, all digests checked.
    fn check_manifest(files: &[(String, Vec<u8>)], desc: &Value) -> String {
        assert_eq!(
            desc["mediaType"],
            "application/vnd.oci.image.manifest.v1+json"
        );
        let manifest: Value = serde_json::from_slice(blob(files, desc)).unwrap();
        let config: Value = serde_json::from_slice(blob(files, &manifest["config"])).unwrap();
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 1);
        blob(files, &layers[0]);
        assert_eq!(config["os"], "linux");
        config["architecture"].as_str().unwrap().to_string()
    }

    #[test]
    fn multiarch_index_has_both_platforms() {
        let name = "localhost/nri-resize:1.2.3";
        let (files, target) = layout(name, &[image(Arch::Amd64), image(Arch::Arm64)]).unwrap();
        assert_eq!(json(&files, "oci-layout")["imageLayoutVersion"], "1.0.0");
        let index = json(&files, "index.json");
        let top = index["manifests"].as_array().unwrap();
        assert_eq!(top.len(), 1, "one named entry: one image in containerd");
        assert_eq!(
            top[0]["mediaType"],
            "application/vnd.oci.image.index.v1+json"
        );
        assert_eq!(top[0]["annotations"]["io.containerd.image.name"], name);
        assert_eq!(
            top[0]["annotations"]["org.opencontainers.image.ref.name"],
            "1.2.3"
        );
        assert_eq!(top[0]["digest"], target.to_string());
        let inner: Value = serde_json::from_slice(blob(&files, &top[0])).unwrap();
        let mut platforms = Vec::new();
        for m in inner["manifests"].as_array().unwrap() {
            let arch = m["platform"]["architecture"].as_str().unwrap().to_string();
            assert_eq!(m["platform"]["os"], "linux");
            assert_eq!(
                check_manifest(&files, m),
                arch,
                "config matches the platform"
            );
            platforms.push(arch);
        }
        assert_eq!(platforms, ["amd64", "arm64"]);
        // Every file is the layout's or a blob, none twice.
        let mut paths: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
        let n = paths.len();
        paths.sort_unstable();
        paths.dedup();
        assert_eq!(paths.len(), n);
        assert_eq!(
            n,
            2 + 2 * 3 + 1,
            "layout files, 3 blobs per platform, the inner index"
        );
    }

    #[test]
    fn single_platform_names_its_manifest() {
        let (files, target) = layout("localhost/x:1", &[image(Arch::Amd64)]).unwrap();
        let index = json(&files, "index.json");
        let top = index["manifests"].as_array().unwrap();
        assert_eq!(top.len(), 1);
        assert_eq!(
            top[0]["annotations"]["io.containerd.image.name"],
            "localhost/x:1"
        );
        assert_eq!(top[0]["platform"]["architecture"], "amd64");
        assert_eq!(top[0]["digest"], target.to_string());
        assert_eq!(check_manifest(&files, &top[0]), "amd64");
        assert_eq!(files.len(), 2 + 3);
    }

    #[test]
    fn layout_refuses_duplicates_and_nothing() {
        assert!(layout("n:1", &[]).is_err());
        assert!(layout("n:1", &[image(Arch::Arm64), image(Arch::Arm64)]).is_err());
    }

    #[test]
    fn deterministic() {
        let a = layout("n:1", &[image(Arch::Amd64), image(Arch::Arm64)]).unwrap();
        let b = layout("n:1", &[image(Arch::Amd64), image(Arch::Arm64)]).unwrap();
        assert_eq!(a.1, b.1);
    }
}
