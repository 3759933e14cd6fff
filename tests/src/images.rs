//! Local OCI images, built without any registry and cached per machine.
//!
//! Two single-layer images are built once per machine under `<cache>/images` (keyed by the
//! hash of their inputs), imported with `ctr images import` into a containerd once per
//! containerd build, and every instance starts from a copy of that root
//! ([`crate::seeded_root`]):
//! * [`PAUSE_IMAGE`]: a static C program that sleeps in `pause()` and exits 0 on SIGTERM/SIGINT;
//! * [`BUSYBOX_IMAGE`]: Debian's static `/bin/busybox` with every applet linked under
//!   `/bin`, `/sbin`, `/usr/bin` and `/usr/sbin` (`sh`, `sleep`, `dd`, `cat`, `yes`, `head`, ...),
//!   and our static C `/bin/latency-probe` (`latency_probe.c`: random 4 KiB reads of a file it
//!   keeps cached, per-read latency percentiles per time window; read by [`crate::probe`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sha2::{Digest as _, Sha256};

use crate::util::{cache_dir, next_instance, require_binary, require_in_path};

/// Name of the pause (sandbox) image inside every harness containerd.
pub const PAUSE_IMAGE: &str = "localhost/nri-resize/pause:test";
/// Name of the busybox image inside every harness containerd (the default container image).
pub const BUSYBOX_IMAGE: &str = "localhost/nri-resize/busybox:test";

/// Bump when the archive layout changes, to invalidate cached archives.
const FORMAT: &str = "nri-resize-oci-v2";
const TAG: &str = "test";

const PAUSE_C: &str = r"
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }
static void on_chld(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_chld;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    for (;;) pause();
    return 0;
}
";

const LATENCY_PROBE_C: &str = include_str!("latency_probe.c");

/// The two image archives of this machine.
#[derive(Debug, Clone)]
pub struct ImageArchives {
    /// OCI archive of [`PAUSE_IMAGE`].
    pub pause: PathBuf,
    /// OCI archive of [`BUSYBOX_IMAGE`].
    pub busybox: PathBuf,
}

/// Archives built elsewhere, used instead of building them here: `<pause archive>:<busybox
/// archive>`. The VM tier's arm64 guest gets them from the host ([`build_archives`] for arm64,
/// `src/bin/test_images.rs`): there is no compiler in that guest.
pub const TEST_IMAGES_ENV: &str = "NRI_RESIZE_TEST_IMAGES";

/// Builds (first call on a machine) or finds (later calls) the image archives.
/// Thread-safe; builds at most once per process.
pub fn image_archives() -> &'static ImageArchives {
    static ARCHIVES: OnceLock<ImageArchives> = OnceLock::new();
    ARCHIVES.get_or_init(|| {
        if let Ok(given) = std::env::var(TEST_IMAGES_ENV) {
            let (pause, busybox) = given.split_once(':').unwrap_or_else(|| {
                panic!("{TEST_IMAGES_ENV}={given:?}: expected <pause archive>:<busybox archive>")
            });
            let archives = ImageArchives {
                pause: PathBuf::from(pause),
                busybox: PathBuf::from(busybox),
            };
            for a in [&archives.pause, &archives.busybox] {
                assert!(a.is_file(), "{TEST_IMAGES_ENV}: no archive {}", a.display());
            }
            return archives;
        }
        let dir = cache_dir().join("images");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let gcc = require_in_path(
            "gcc",
            "gcc (to build the pause image and the latency probe)",
        );
        let busybox = Path::new("/bin/busybox");
        require_binary(busybox, "busybox-static (/bin/busybox)");
        build_archives(&dir, &gcc, busybox, oci_arch())
    })
}

/// The two archives for `arch` (OCI's name) in `dir`, built with the C compiler `gcc` (static)
/// around the static `busybox` (its applets as the host's `/bin/busybox` lists them: a foreign
/// busybox cannot run here); cached by the hash of their inputs.
pub fn build_archives(dir: &Path, gcc: &Path, busybox: &Path, arch: &str) -> ImageArchives {
    ImageArchives {
        pause: pause_archive(dir, gcc, arch),
        busybox: busybox_archive(dir, gcc, busybox, arch),
    }
}

pub(crate) fn sha256_hex(data: &[u8]) -> String {
    use std::fmt::Write as _;
    Sha256::digest(data)
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// `gcc --version` (part of the cache keys: another compiler, another binary).
fn gcc_version(gcc: &Path) -> Vec<u8> {
    Command::new(gcc)
        .arg("--version")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default()
}

/// Compiles the C program `source` statically; returns the stripped binary.
fn static_c(dir: &Path, gcc: &Path, name: &str, source: &str) -> Vec<u8> {
    let work = dir.join(format!(
        "{name}-build-{}-{}",
        std::process::id(),
        next_instance()
    ));
    std::fs::create_dir_all(&work).unwrap_or_else(|e| panic!("create {}: {e}", work.display()));
    let src = work.join(format!("{name}.c"));
    let bin = work.join(name);
    std::fs::write(&src, source).unwrap_or_else(|e| panic!("write {}: {e}", src.display()));
    let out = Command::new(gcc)
        .args(["-static", "-O2", "-s", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("run gcc: {e}"));
    assert!(
        out.status.success(),
        "gcc -static failed to build {name} ({}): {}; `cargo xtask test` installs gcc and libc6-dev",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let binary = std::fs::read(&bin).unwrap_or_else(|e| panic!("read {}: {e}", bin.display()));
    let _ = std::fs::remove_dir_all(&work);
    binary
}

fn pause_archive(dir: &Path, gcc: &Path, arch: &str) -> PathBuf {
    let key = sha256_hex(
        &[
            FORMAT.as_bytes(),
            PAUSE_C.as_bytes(),
            &gcc_version(gcc),
            arch.as_bytes(),
        ]
        .concat(),
    );
    let archive = dir.join(format!("pause-{}.tar", &key[..16]));
    if archive.is_file() {
        return archive;
    }
    let binary = static_c(dir, gcc, "pause", PAUSE_C);

    let mut layer = LayerBuilder::new();
    for d in ["dev", "proc", "sys", "etc"] {
        layer.dir(d, 0o755);
    }
    layer.file("pause", 0o755, &binary);
    let config = serde_json::json!({
        "Entrypoint": ["/pause"],
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
    });
    write_archive(&archive, PAUSE_IMAGE, &layer.finish(), &config, arch);
    archive
}

fn busybox_archive(dir: &Path, gcc: &Path, busybox: &Path, arch: &str) -> PathBuf {
    let binary =
        std::fs::read(busybox).unwrap_or_else(|e| panic!("read {}: {e}", busybox.display()));
    let key = sha256_hex(
        &[
            FORMAT.as_bytes(),
            &binary,
            LATENCY_PROBE_C.as_bytes(),
            &gcc_version(gcc),
            arch.as_bytes(),
        ]
        .concat(),
    );
    let archive = dir.join(format!("busybox-{}.tar", &key[..16]));
    if archive.is_file() {
        return archive;
    }
    let probe = static_c(dir, gcc, "latency-probe", LATENCY_PROBE_C);
    let out = Command::new("/bin/busybox")
        .arg("--list-full")
        .output()
        .unwrap_or_else(|e| panic!("run busybox --list-full: {e}"));
    assert!(
        out.status.success(),
        "busybox --list-full failed: {}",
        out.status
    );
    let list = String::from_utf8_lossy(&out.stdout).into_owned();

    let mut layer = LayerBuilder::new();
    for d in [
        "bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "etc", "root", "var",
    ] {
        layer.dir(d, 0o755);
    }
    layer.dir("tmp", 0o1777);
    layer.file("bin/busybox", 0o755, &binary);
    layer.file("bin/latency-probe", 0o755, &probe);
    layer.file(
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    );
    layer.file("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n");
    let mut applets: Vec<&str> = list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    applets.sort_unstable();
    applets.dedup();
    for applet in applets {
        let applet = applet.trim_start_matches('/');
        if applet == "bin/busybox" || !applet.contains('/') {
            continue;
        }
        layer.symlink(applet, "/bin/busybox");
    }
    let config = serde_json::json!({
        "Cmd": ["sh"],
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
    });
    write_archive(&archive, BUSYBOX_IMAGE, &layer.finish(), &config, arch);
    archive
}

/// Deterministic layer tar (mtime 0, root-owned).
struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
}

impl LayerBuilder {
    fn new() -> Self {
        Self {
            tar: tar::Builder::new(Vec::new()),
        }
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(size);
        h
    }

    fn dir(&mut self, path: &str, mode: u32) {
        let mut h = Self::header(tar::EntryType::Directory, mode, 0);
        self.tar
            .append_data(&mut h, format!("{path}/"), std::io::empty())
            .expect("append dir to layer");
    }

    fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        let mut h = Self::header(tar::EntryType::Regular, mode, data.len() as u64);
        self.tar
            .append_data(&mut h, path, data)
            .expect("append file to layer");
    }

    fn symlink(&mut self, path: &str, target: &str) {
        let mut h = Self::header(tar::EntryType::Symlink, 0o777, 0);
        self.tar
            .append_link(&mut h, path, target)
            .expect("append symlink to layer");
    }

    fn finish(self) -> Vec<u8> {
        self.tar.into_inner().expect("finish layer tar")
    }
}

fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// Writes an OCI image-layout archive (`oci-layout`, `index.json`, `blobs/sha256/*`).
/// The image name is carried by the `io.containerd.image.name` annotation, which both
/// containerd 1.7 and 2.x `ctr images import` use as the full name.
fn write_archive(
    path: &Path,
    name: &str,
    layer: &[u8],
    image_config: &serde_json::Value,
    arch: &str,
) {
    let layer_digest = format!("sha256:{}", sha256_hex(layer));
    let config = serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": image_config,
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
    });
    let config = serde_json::to_vec(&config).expect("serialize image config");
    let config_digest = format!("sha256:{}", sha256_hex(&config));
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer.len(),
        }],
    });
    let manifest = serde_json::to_vec(&manifest).expect("serialize manifest");
    let manifest_digest = format!("sha256:{}", sha256_hex(&manifest));
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "platform": { "architecture": arch, "os": "linux" },
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": TAG,
            },
        }],
    });
    let index = serde_json::to_vec(&index).expect("serialize index");

    let mut out = tar::Builder::new(Vec::new());
    let mut add = |p: &str, data: &[u8]| {
        let mut h = LayerBuilder::header(tar::EntryType::Regular, 0o644, data.len() as u64);
        out.append_data(&mut h, p, data)
            .expect("append to OCI archive");
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    add("index.json", &index);
    for (digest, data) in [
        (&manifest_digest, &manifest),
        (&config_digest, &config),
        (&layer_digest, &layer.to_vec()),
    ] {
        add(
            &format!("blobs/sha256/{}", digest.trim_start_matches("sha256:")),
            data,
        );
    }
    let bytes = out.into_inner().expect("finish OCI archive");

    // Atomic publish: concurrent builders (other test processes) write the same bytes.
    let tmp = path.with_extension(format!("tmp.{}.{}", std::process::id(), next_instance()));
    let mut f =
        std::fs::File::create(&tmp).unwrap_or_else(|e| panic!("create {}: {e}", tmp.display()));
    f.write_all(&bytes)
        .unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    f.sync_all()
        .unwrap_or_else(|e| panic!("sync {}: {e}", tmp.display()));
    std::fs::rename(&tmp, path)
        .unwrap_or_else(|e| panic!("rename {} -> {}: {e}", tmp.display(), path.display()));
    tracing::info!(image = name, archive = %path.display(), "built OCI image archive");
}
