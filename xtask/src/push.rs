//! `cargo xtask image --push <registry/repository[:tag]>`: the OCI archive `cargo xtask image`
//! wrote, pushed to a registry the user names, so that nodes pull it (managed node OSes give
//! no shell for `ctr images import`).
//!
//! skopeo (Debian's package, installed here when missing) copies the archive's image index and
//! every platform's manifest, config and layer as they are (`skopeo copy --all
//! oci-archive:<archive> docker://<reference>`): the digests in the registry are the archive's,
//! and each node pulls its own architecture. Credentials are skopeo's own: `skopeo login
//! <registry>` first (it reads `${XDG_RUNTIME_DIR}/containers/auth.json` and
//! `~/.docker/config.json`). `--push-insecure` is for a registry without TLS (a local one).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};

/// Where an image goes: `registry/repository:tag`, the tag the chart's `appVersion` when the
/// user named none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination(String);

impl Destination {
    /// `reference` as the user wrote it (`docker://` accepted and dropped); a reference without
    /// a tag gets `default_tag`. Refuses what no registry takes: nothing, whitespace, a digest
    /// (a digest is what the registry answers, not what is pushed to).
    pub fn parse(reference: &str, default_tag: &str) -> anyhow::Result<Self> {
        let r = reference.strip_prefix("docker://").unwrap_or(reference);
        if r.is_empty() || r.chars().any(char::is_whitespace) {
            bail!("--push {reference:?}: not a registry/repository[:tag] reference");
        }
        if r.contains('@') {
            bail!(
                "--push {reference:?}: push to a tag (registry/repository:tag); the registry \
                 gives the digest"
            );
        }
        let (path, last) = r.rsplit_once('/').map_or(("", r), |(p, l)| (p, l));
        if path.is_empty() {
            bail!(
                "--push {reference:?}: name the registry too, e.g. registry.example.com/{r} \
                 (a bare name would go to docker.io)"
            );
        }
        if last.contains(':') {
            Ok(Self(r.to_string()))
        } else {
            Ok(Self(format!("{r}:{default_tag}")))
        }
    }

    /// `registry/repository` (what the chart's `image.repository` takes).
    pub fn repository(&self) -> &str {
        self.0.rsplit_once(':').map_or(&self.0, |(repo, _)| repo)
    }

    /// The tag (the chart's `image.tag`).
    pub fn tag(&self) -> &str {
        self.0.rsplit_once(':').map_or("", |(_, tag)| tag)
    }
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How to reach the registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transport {
    /// Plain HTTP or an unverified certificate (`--dest-tls-verify=false`).
    pub insecure: bool,
}

/// `skopeo copy --all` of `archive` to `to`, writing the pushed digest to `digest_file`.
pub fn copy_command(
    archive: &Path,
    to: &Destination,
    transport: Transport,
    digest_file: &Path,
) -> Command {
    let mut c = Command::new("skopeo");
    c.args(["copy", "--all", "--preserve-digests"]);
    if transport.insecure {
        c.arg("--dest-tls-verify=false");
    }
    c.arg("--digestfile").arg(digest_file);
    c.arg(format!("oci-archive:{}", archive.display()));
    c.arg(format!("docker://{to}"));
    c
}

/// Installs Debian's `package` when `binary` is not on `PATH`, as `cargo xtask setup` installs
/// the project's other tools.
pub fn ensure_debian_package(binary: &str, package: &str) -> anyhow::Result<()> {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {binary}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Ok(());
    }
    eprintln!("\n==> {binary} missing: installing Debian's {package}");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
    };
    let mut status = install().context("run apt-get (are you root on Debian?)")?;
    if !status.success() {
        // A fresh machine's package lists may not know it yet.
        let _ = Command::new("apt-get").args(["update", "-qq"]).status();
        status = install().context("run apt-get")?;
    }
    if !status.success() {
        bail!("apt-get install {package} failed ({status}); install it and run again");
    }
    Ok(())
}

/// Pushes `archive` to `to` (skopeo installed first if missing); the image's digest in the
/// registry.
pub fn push(archive: &Path, to: &Destination, transport: Transport) -> anyhow::Result<String> {
    ensure_debian_package("skopeo", "skopeo")?;
    if !archive.is_file() {
        bail!(
            "no image archive at {} to push: `cargo xtask image` writes it",
            archive.display()
        );
    }
    let digest_file = digest_file_for(archive);
    let mut cmd = copy_command(archive, to, transport, &digest_file);
    eprintln!("\n==> push the image to {to}\n    $ {cmd:?}");
    let status = cmd.status().context("run skopeo")?;
    if !status.success() {
        bail!(
            "skopeo could not push to {to} ({status}): log in first (`skopeo login {}`), or \
             add --push-insecure for a registry without TLS",
            to.repository().split('/').next().unwrap_or_default()
        );
    }
    let digest = std::fs::read_to_string(&digest_file)
        .with_context(|| format!("read {}", digest_file.display()))?;
    let _ = std::fs::remove_file(&digest_file);
    Ok(digest.trim().to_string())
}

fn digest_file_for(archive: &Path) -> PathBuf {
    archive.with_extension(format!("push-digest.{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cross::Arch;
    use std::io::{Read as _, Write as _};
    use std::process::{Child, Stdio};
    use std::time::{Duration, Instant};

    #[test]
    fn references_get_the_default_tag_and_bad_ones_are_refused() {
        let d = Destination::parse("registry.example.com/team/nri-resize", "0.1.0").unwrap();
        assert_eq!(d.to_string(), "registry.example.com/team/nri-resize:0.1.0");
        assert_eq!(d.repository(), "registry.example.com/team/nri-resize");
        assert_eq!(d.tag(), "0.1.0");
        let d = Destination::parse("docker://localhost:5000/nri-resize:dev", "0.1.0").unwrap();
        assert_eq!(d.to_string(), "localhost:5000/nri-resize:dev");
        assert_eq!(d.repository(), "localhost:5000/nri-resize");
        // A registry port is not a tag.
        let d = Destination::parse("localhost:5000/nri-resize", "0.1.0").unwrap();
        assert_eq!(d.to_string(), "localhost:5000/nri-resize:0.1.0");
        for bad in [
            "",
            "nri-resize",
            "r.example.com/x@sha256:00",
            "r.example.com/a b",
        ] {
            assert!(Destination::parse(bad, "0.1.0").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_copy_takes_every_platform_as_it_is() {
        let to = Destination::parse("r.example.com/nri-resize:1", "x").unwrap();
        let args = |insecure| -> Vec<String> {
            copy_command(
                Path::new("/t/nri-resize.oci.tar"),
                &to,
                Transport { insecure },
                Path::new("/t/d"),
            )
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
        };
        assert_eq!(
            args(false),
            [
                "copy",
                "--all",
                "--preserve-digests",
                "--digestfile",
                "/t/d",
                "oci-archive:/t/nri-resize.oci.tar",
                "docker://r.example.com/nri-resize:1"
            ]
        );
        assert!(args(true).contains(&"--dest-tls-verify=false".to_string()));
    }

    /// `docker-registry` (Debian's distribution registry) on a loopback port, killed by pid.
    struct Registry {
        child: Child,
        addr: String,
    }

    impl Drop for Registry {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// The status of `GET path`, accepting OCI manifests (the registry answers 404 for a
    /// manifest of a type the client does not accept).
    fn http_status(addr: &str, path: &str) -> Option<u16> {
        let mut s = std::net::TcpStream::connect(addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\
             Accept: application/vnd.oci.image.manifest.v1+json\r\n\r\n"
        )
        .ok()?;
        let mut head = String::new();
        s.read_to_string(&mut head).ok()?;
        head.split_whitespace().nth(1)?.parse().ok()
    }

    /// Debian's `docker-registry`, unpacked (not installed) by `cargo xtask setup`.
    fn registry_binary() -> PathBuf {
        let cache = std::env::var_os("NRI_RESIZE_CACHE")
            .map_or_else(|| PathBuf::from("/var/cache/nri-resize"), PathBuf::from);
        let bin = cache.join("docker-registry/usr/bin/docker-registry");
        assert!(
            bin.is_file(),
            "no {}: `cargo xtask setup` unpacks Debian's docker-registry there",
            bin.display()
        );
        bin
    }

    fn start_registry(dir: &Path) -> Registry {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: {addr}\n",
                dir.join("storage").display()
            ),
        )
        .expect("write the registry's configuration");
        let child = Command::new(registry_binary())
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("registry.log")).expect("log file"))
            .spawn()
            .expect("start docker-registry");
        let registry = Registry { child, addr };
        let deadline = Instant::now() + Duration::from_secs(20);
        while http_status(&registry.addr, "/v2/") != Some(200) {
            assert!(
                Instant::now() < deadline,
                "the registry did not answer on {}: {}",
                registry.addr,
                std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        registry
    }

    /// The push end to end against a real registry (Debian's `docker-registry`) started on
    /// loopback and stopped by pid: the image index of both platforms arrives as it is in the
    /// archive (same digest), each platform's manifest with it.
    #[test]
    fn pushes_the_image_index_to_a_registry_on_loopback() {
        let dir = std::env::temp_dir().join(format!("xtask-push-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let archive = dir.join("nri-resize.oci.tar");
        let built = crate::image::fake_archive(
            &[Arch::Amd64, Arch::Arm64],
            &archive,
            "localhost/nri-resize:9.9.9",
        )
        .expect("archive");
        let registry = start_registry(&dir);
        let to = Destination::parse(&format!("{}/test/nri-resize", registry.addr), "9.9.9")
            .expect("reference");
        let digest = push(&archive, &to, Transport { insecure: true }).expect("push");
        assert_eq!(
            digest, built.target_digest,
            "the registry holds the archive's index"
        );
        let raw = Command::new("skopeo")
            .args(["inspect", "--raw", "--tls-verify=false"])
            .arg(format!("docker://{to}"))
            .output()
            .expect("skopeo inspect");
        assert!(
            raw.status.success(),
            "{}",
            String::from_utf8_lossy(&raw.stderr)
        );
        let index: serde_json::Value = serde_json::from_slice(&raw.stdout).expect("JSON");
        assert_eq!(
            index["mediaType"],
            "application/vnd.oci.image.index.v1+json"
        );
        let mut platforms: Vec<&str> = index["manifests"]
            .as_array()
            .expect("manifests")
            .iter()
            .map(|m| m["platform"]["architecture"].as_str().expect("arch"))
            .collect();
        platforms.sort_unstable();
        assert_eq!(platforms, ["amd64", "arm64"]);
        for p in &built.platforms {
            let path = format!("/v2/test/nri-resize/manifests/{}", p.manifest_digest);
            assert_eq!(
                http_status(&registry.addr, &path),
                Some(200),
                "linux/{} manifest {} in the registry",
                p.arch,
                p.manifest_digest
            );
        }
        drop(registry);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
