//! Which NRI version the runtime speaks, and so which events it accepts in a subscription.
//!
//! A runtime rejects a subscription with a bit it does not know (`events &^ ValidEvents`, NRI
//! v0.6 to v0.11), so the pod-level events (12–14, NRI v0.10.0) may be asked for only where the
//! runtime's NRI has them. Runtimes announce their NRI version in `Configure` only since NRI
//! v0.12.0 (containerd 2.3, CRI-O 1.37); for the others it is known from the runtime's name and
//! version, as NRI's own `InferVersionFromRuntime` knows it (containerd/nri `pkg/api`), from the
//! NRI module each release vendors.

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The NRI version whose protocol nri-resize speaks (`proto/nri/api.proto`), sent when
/// registering (`RegisterPluginRequest.NRI_version`, read by NRI v0.12+ runtimes).
pub const PLUGIN_NRI_VERSION: &str = "v0.12.0";

/// A `major.minor.patch` version; what follows the numbers (`-dev`, `+unknown`, `~ds1`) is
/// ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    /// Parses `v0.12.0`, `2.1.9+unknown`, `1.7.24~ds1`, `1.37.0-dev`, `v2.3.0-beta.0`, `1.7`
    /// (patch 0); `None` for anything without a leading `major.minor`.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let text = text.strip_prefix('v').unwrap_or(text);
        let mut parts = text.splitn(3, '.');
        let number = |part: Option<&str>| -> Option<u32> {
            let part = part?;
            let end = part
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(part.len());
            part[..end].parse().ok()
        };
        let major = number(parts.next())?;
        let minor = number(parts.next())?;
        let patch = parts.next().map_or(Some(0), |p| number(Some(p)))?;
        Some(Version(major, minor, patch))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.0, self.1, self.2)
    }
}

/// NRI v0.10.0: events 12–14 (`UpdatePodSandbox`, `PostUpdatePodSandbox`,
/// `ValidateContainerAdjustment`) and the `UpdatePodSandbox` RPC.
pub const POD_EVENTS_SINCE: Version = Version(0, 10, 0);

/// How the runtime's NRI version was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The runtime said it in `Configure` (NRI v0.12+).
    Announced,
    /// From the runtime's name and version: the NRI its release vendors.
    Inferred,
    /// Neither: an unknown runtime, or a release older than every one known.
    Unknown,
}

/// The runtime's NRI version as nri-resize determined it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeNri {
    pub version: Option<Version>,
    pub source: Source,
}

impl RuntimeNri {
    /// Whether a subscription may name the pod-level events (12–14) without the runtime
    /// refusing it. Unknown: no (the events up to 11 are what every NRI runtime accepts).
    pub fn accepts_pod_events(self) -> bool {
        self.version.is_some_and(|v| v >= POD_EVENTS_SINCE)
    }

    /// `v0.11.0 (inferred from cri-o 1.36.3)`, `v0.12.0 (announced)`, `unknown`.
    pub fn describe(self, runtime: &str, runtime_version: &str) -> String {
        match (self.version, self.source) {
            (Some(v), Source::Announced) => format!("{v} (announced)"),
            (Some(v), _) => format!("{v} (inferred from {runtime} {runtime_version})"),
            (None, _) => "unknown".to_string(),
        }
    }
}

/// NRI's placeholders for a version its module could not tell.
const PLACEHOLDERS: [&str; 2] = ["unknown", "devel"];

/// The runtime's NRI version: as announced (`announced`, from `Configure`), else inferred from
/// its name and version (`containerd`, `cri-o`).
pub fn detect(runtime: &str, runtime_version: &str, announced: &str) -> RuntimeNri {
    let announced = announced.trim();
    if !announced.is_empty() && !PLACEHOLDERS.contains(&announced) {
        if let Some(v) = Version::parse(announced) {
            return RuntimeNri {
                version: Some(v),
                source: Source::Announced,
            };
        }
    }
    let table = match runtime.trim().to_ascii_lowercase().as_str() {
        "containerd" => CONTAINERD,
        "cri-o" | "crio" => CRIO,
        _ => &[],
    };
    match Version::parse(runtime_version).and_then(|v| vendored(table, v)) {
        Some(v) => RuntimeNri {
            version: Some(v),
            source: Source::Inferred,
        },
        None => RuntimeNri {
            version: None,
            source: Source::Unknown,
        },
    }
}

/// The NRI of the newest release in `table` that is not newer than `release` (NRI's
/// `FindClosestMatch`); `None` when `release` predates the table.
fn vendored(table: &[(Version, Version)], release: Version) -> Option<Version> {
    table
        .iter()
        .filter(|(from, _)| from.cmp(&release) != Ordering::Greater)
        .max_by_key(|(from, _)| *from)
        .map(|(_, nri)| *nri)
}

/// containerd release → the NRI it vendors (the first release of each change; containerd/nri
/// `pkg/api` `runtimeVersionMap`, and containerd 2.3's go.mod for v0.12.0).
const CONTAINERD: &[(Version, Version)] = &[
    (Version(1, 7, 0), Version(0, 3, 0)),
    (Version(1, 7, 7), Version(0, 4, 0)),
    (Version(1, 7, 14), Version(0, 6, 0)),
    (Version(1, 7, 16), Version(0, 6, 1)),
    (Version(1, 7, 26), Version(0, 8, 0)),
    (Version(2, 0, 0), Version(0, 8, 0)),
    (Version(2, 2, 0), Version(0, 10, 0)),
    (Version(2, 2, 1), Version(0, 11, 0)),
    (Version(2, 3, 0), Version(0, 12, 0)),
];

/// CRI-O release → the NRI it vendors (NRI's map; 1.36 from its go.mod: v0.11.0; 1.37 main:
/// v0.12.0, which it also announces).
const CRIO: &[(Version, Version)] = &[
    (Version(1, 26, 0), Version(0, 2, 0)),
    (Version(1, 26, 2), Version(0, 3, 0)),
    (Version(1, 27, 0), Version(0, 3, 0)),
    (Version(1, 27, 1), Version(0, 3, 1)),
    (Version(1, 29, 0), Version(0, 5, 0)),
    (Version(1, 29, 2), Version(0, 6, 0)),
    (Version(1, 31, 0), Version(0, 6, 1)),
    (Version(1, 32, 0), Version(0, 9, 0)),
    (Version(1, 33, 0), Version(0, 9, 1)),
    (Version(1, 34, 0), Version(0, 10, 0)),
    (Version(1, 35, 0), Version(0, 11, 0)),
    (Version(1, 37, 0), Version(0, 12, 0)),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_as_runtimes_spell_them() {
        for (text, want) in [
            ("v0.12.0", Some(Version(0, 12, 0))),
            ("2.1.9+unknown", Some(Version(2, 1, 9))),
            ("1.7.24~ds1", Some(Version(1, 7, 24))),
            ("1.37.0-dev", Some(Version(1, 37, 0))),
            ("v2.3.0-beta.0", Some(Version(2, 3, 0))),
            (
                "v0.3.1-0.20230504231226-94185418e253",
                Some(Version(0, 3, 1)),
            ),
            ("1.7", Some(Version(1, 7, 0))),
            ("", None),
            ("unknown", None),
            ("v", None),
            ("1", None),
            ("x.y.z", None),
        ] {
            assert_eq!(Version::parse(text), want, "{text:?}");
        }
    }

    /// Runtime × release × what it announces → its NRI, and whether the pod-level events may
    /// be subscribed. The CRI-O 1.34–1.36 and containerd 2.2 rows are those a check on the
    /// announced version alone got wrong (pod-level admission silently off).
    /// One row: runtime, release, what it announces, its NRI, how that was found, whether the
    /// pod-level events may be subscribed.
    type Row = (
        &'static str,
        &'static str,
        &'static str,
        Option<&'static str>,
        Source,
        bool,
    );

    #[test]
    #[expect(clippy::too_many_lines, reason = "one table, a row per release")]
    fn event_subscription_for_every_runtime_release() {
        let rows: &[Row] = &[
            ("containerd", "1.6.38", "", None, Source::Unknown, false),
            (
                "containerd",
                "1.7.0",
                "",
                Some("v0.3.0"),
                Source::Inferred,
                false,
            ),
            (
                "containerd",
                "1.7.24~ds1",
                "",
                Some("v0.6.1"),
                Source::Inferred,
                false,
            ),
            (
                "containerd",
                "v1.7.27",
                "",
                Some("v0.8.0"),
                Source::Inferred,
                false,
            ),
            (
                "containerd",
                "v2.0.5",
                "",
                Some("v0.8.0"),
                Source::Inferred,
                false,
            ),
            (
                "containerd",
                "2.1.9+unknown",
                "",
                Some("v0.8.0"),
                Source::Inferred,
                false,
            ),
            (
                "containerd",
                "v2.2.0",
                "",
                Some("v0.10.0"),
                Source::Inferred,
                true,
            ),
            (
                "containerd",
                "v2.2.7",
                "",
                Some("v0.11.0"),
                Source::Inferred,
                true,
            ),
            (
                "containerd",
                "v2.3.4",
                "v0.12.0",
                Some("v0.12.0"),
                Source::Announced,
                true,
            ),
            (
                "containerd",
                "v2.3.4",
                "",
                Some("v0.12.0"),
                Source::Inferred,
                true,
            ),
            (
                "containerd",
                "v2.4.0-beta.1",
                "unknown",
                Some("v0.12.0"),
                Source::Inferred,
                true,
            ),
            (
                "cri-o",
                "1.33.4",
                "",
                Some("v0.9.1"),
                Source::Inferred,
                false,
            ),
            (
                "cri-o",
                "1.34.0",
                "",
                Some("v0.10.0"),
                Source::Inferred,
                true,
            ),
            (
                "cri-o",
                "1.35.2",
                "",
                Some("v0.11.0"),
                Source::Inferred,
                true,
            ),
            (
                "cri-o",
                "1.36.3",
                "",
                Some("v0.11.0"),
                Source::Inferred,
                true,
            ),
            (
                "cri-o",
                "1.37.0-dev",
                "v0.12.0",
                Some("v0.12.0"),
                Source::Announced,
                true,
            ),
            (
                "cri-o",
                "1.37.0-dev",
                "devel",
                Some("v0.12.0"),
                Source::Inferred,
                true,
            ),
            ("fake", "0.0", "", None, Source::Unknown, false),
            (
                "fake",
                "0.0",
                "v0.12.0",
                Some("v0.12.0"),
                Source::Announced,
                true,
            ),
            (
                "fake",
                "0.0",
                "v0.8.0",
                Some("v0.8.0"),
                Source::Announced,
                false,
            ),
        ];
        for &(runtime, release, announced, nri, source, pod_events) in rows {
            let got = detect(runtime, release, announced);
            let row = format!("{runtime} {release} announcing {announced:?}");
            assert_eq!(got.version.map(|v| v.to_string()).as_deref(), nri, "{row}");
            assert_eq!(got.source, source, "{row}");
            assert_eq!(got.accepts_pod_events(), pod_events, "{row}");
        }
    }

    #[test]
    fn the_description_says_where_the_version_came_from() {
        assert_eq!(
            detect("cri-o", "1.36.3", "").describe("cri-o", "1.36.3"),
            "v0.11.0 (inferred from cri-o 1.36.3)"
        );
        assert_eq!(
            detect("containerd", "v2.3.4", "v0.12.0").describe("containerd", "v2.3.4"),
            "v0.12.0 (announced)"
        );
        assert_eq!(detect("fake", "0.0", "").describe("fake", "0.0"), "unknown");
    }
}
