//! What the daemon keeps of a pod's or container's annotations and labels: only nri-resize's
//! own keys (`<name>.nri-resize.io/<key>` or `nri-resize.io/<key>`), at most
//! [`MAX_KEPT_KEYS`] of them, each value at most [`MAX_KEPT_VALUE_BYTES`]. Nothing else is read
//! after the event is converted, and annotations come from pod owners, who are not trusted: the
//! API server lets a pod carry 256 KiB of them, and the daemon keeps its model and each trimmed
//! container's copy for as long as the pod lives. So what a pod owner writes costs the daemon a
//! bounded amount whatever its size.

use std::collections::BTreeMap;
#[cfg(test)]
use std::collections::HashMap;

/// At most this many of nri-resize's keys are kept per pod or container (in key order); the
/// daemon reads fewer than ten, one per container for the per-container keys.
pub const MAX_KEPT_KEYS: usize = 64;

/// A value longer than this is kept as [`OVERSIZED`] instead: every parser refuses it as
/// malformed and reports the key, so an oversized value is ignored loudly, never half-read.
pub const MAX_KEPT_VALUE_BYTES: usize = 1024;

/// What an oversized value is kept as.
pub const OVERSIZED: &str = "<value over 1024 bytes, not kept>";

/// Whether `key` is one of nri-resize's: its prefix (before `/`) is `nri-resize.io` or ends in
/// `.nri-resize.io`.
pub fn is_ours(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(domain, _)| domain == "nri-resize.io" || domain.ends_with(".nri-resize.io"))
}

/// The part of `map` (a wire message's map) the daemon keeps (see the module docs).
pub fn kept<'a>(
    map: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> BTreeMap<String, String> {
    let mut ours: Vec<(&String, &String)> = map.into_iter().filter(|(k, _)| is_ours(k)).collect();
    ours.sort_unstable();
    ours.into_iter()
        .take(MAX_KEPT_KEYS)
        .map(|(k, v)| {
            let v = if v.len() > MAX_KEPT_VALUE_BYTES {
                OVERSIZED.to_owned()
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_nri_resizes_keys_are_ours() {
        for k in [
            "memory-decrease.nri-resize.io/pod",
            "trim.nri-resize.io/max-stall",
            "nri-resize.io/anything",
        ] {
            assert!(is_ours(k), "{k}");
        }
        for k in [
            "kubectl.kubernetes.io/last-applied-configuration",
            "io.kubernetes.pod.name",
            "evil-nri-resize.io/pod",
            "nri-resize.io.example.com/pod",
            "memory-decrease.nri-resize.io",
        ] {
            assert!(!is_ours(k), "{k}");
        }
    }

    /// A pod owner's annotations cost a bounded amount whatever their size: the API server's
    /// 256 KiB (here 1000 foreign keys of 4 KiB and 500 of ours of 8 KiB, 7.9 MiB in all) keep
    /// at most 64 keys of nri-resize's, each value at most 1 KiB.
    #[test]
    fn what_is_kept_is_bounded_whatever_the_pod_carries() {
        let mut map = HashMap::new();
        for i in 0..1000 {
            map.insert(format!("example.com/key-{i}"), "x".repeat(4096));
        }
        for i in 0..500 {
            map.insert(
                format!("memory-decrease.nri-resize.io/container.c{i:03}"),
                "R".repeat(8192),
            );
        }
        map.insert(
            "memory-decrease.nri-resize.io/container.a".into(),
            "Reject".into(),
        );
        let k = kept(&map);
        assert_eq!(k.len(), MAX_KEPT_KEYS);
        assert!(k.keys().all(|key| is_ours(key)));
        assert_eq!(
            k.get("memory-decrease.nri-resize.io/container.a")
                .map(String::as_str),
            Some("Reject"),
            "a value within the bound is kept as written"
        );
        assert!(k
            .values()
            .filter(|v| *v != "Reject")
            .all(|v| v == OVERSIZED));
        let bytes: usize = k.iter().map(|(a, b)| a.len() + b.len()).sum();
        // Kubernetes bounds a key to 253 + 1 + 63 characters.
        assert!(
            bytes <= MAX_KEPT_KEYS * (317 + MAX_KEPT_VALUE_BYTES),
            "{bytes} bytes kept"
        );
    }
}
