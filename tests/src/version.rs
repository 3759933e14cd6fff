//! The containerd versions the harness can run.

use std::fmt;
use std::path::PathBuf;

use crate::util::cache_dir;

/// Names a directory with another containerd 2.x build (see [`ContainerdVersion::bin_dir`]).
pub const BIN_ENV: &str = "NRI_RESIZE_CONTAINERD_BIN";

/// A containerd release installed on the test machine by `cargo xtask test`
/// (`xtask/scripts/setup-host.sh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerdVersion {
    /// containerd 1.7 (Debian trixie package, `/usr/bin`), NRI v0.6, config version 2.
    V1_7,
    /// containerd 2.x (Debian sid package unpacked under the cache dir), NRI v0.8, config version 3.
    V2,
}

impl ContainerdVersion {
    /// Every version, oldest first.
    pub const fn all() -> [Self; 2] {
        [Self::V1_7, Self::V2]
    }

    /// Directory holding `containerd`, `ctr` and `containerd-shim-runc-v2` of this version.
    /// It is put first in containerd's `PATH` so that containerd starts its own shim.
    ///
    /// `$NRI_RESIZE_CONTAINERD_BIN` replaces the 2.x directory with any containerd 2.x build
    /// (2.2, 2.3, a release candidate): every suite that runs against 2.x then runs against it.
    pub fn bin_dir(self) -> PathBuf {
        match self {
            Self::V1_7 => PathBuf::from("/usr/bin"),
            Self::V2 => std::env::var_os(BIN_ENV)
                .filter(|v| !v.is_empty())
                .map_or_else(|| cache_dir().join("containerd-2/usr/bin"), PathBuf::from),
        }
    }

    /// Path of the `containerd` binary.
    pub fn containerd_bin(self) -> PathBuf {
        self.bin_dir().join("containerd")
    }

    /// Path of the `ctr` binary.
    pub fn ctr_bin(self) -> PathBuf {
        self.bin_dir().join("ctr")
    }

    /// Path of the `containerd-shim-runc-v2` binary.
    pub fn shim_bin(self) -> PathBuf {
        self.bin_dir().join("containerd-shim-runc-v2")
    }

    /// The version every harness containerd of this test process runs instead of the one a
    /// test names: `NRI_RESIZE_CONTAINERD=1.7` or `=2` (unset: each test runs the version it
    /// names). The VM tier runs a whole suite against one containerd this way; the harness
    /// says so in each test's output. Panics on any other value.
    pub fn forced() -> Option<Self> {
        let v = std::env::var("NRI_RESIZE_CONTAINERD").ok()?;
        match v.trim() {
            "" => None,
            "1.7" => Some(Self::V1_7),
            "2" => Some(Self::V2),
            other => panic!("NRI_RESIZE_CONTAINERD={other:?}: expected 1.7 or 2"),
        }
    }

    /// Short label, `"1.7"` or `"2"`.
    pub const fn label(self) -> &'static str {
        match self {
            Self::V1_7 => "1.7",
            Self::V2 => "2",
        }
    }
}

impl fmt::Display for ContainerdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "containerd {}", self.label())
    }
}
