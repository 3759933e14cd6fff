//! The containerd versions the harness can run.

use std::fmt;
use std::path::PathBuf;

use crate::util::cache_dir;

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
    pub fn bin_dir(self) -> PathBuf {
        match self {
            Self::V1_7 => PathBuf::from("/usr/bin"),
            Self::V2 => cache_dir().join("containerd-2/usr/bin"),
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
