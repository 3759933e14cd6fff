//! Pure parsers of cgroup file formats that cgroup I/O and the observer share (the observer
//! re-exports them from `observer::parse`). No I/O here: each function takes the file's text.

/// Value of `key` in a flat-keyed cgroup file (`key value` per line), if present.
#[must_use]
pub fn flat_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        if k == key {
            v.trim().parse().ok()
        } else {
            None
        }
    })
}
