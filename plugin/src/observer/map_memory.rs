//! What the observer's eBPF maps cost: each map's `memlock` from `/proc/self/fdinfo/<fd>`.
//!
//! Since Linux 5.11 map memory is charged to the memory cgroup of the process that created the
//! map (the daemon's: it counts against the container's limit) and is not part of its RSS.
//! `memlock` is the kernel's figure for the map: per-CPU maps count every *possible* CPU; from
//! 6.4 it is the map's own accounting of what it allocated, before that an estimate from the
//! key, value and entry counts. Every map of the observer is preallocated, so the figure is read
//! once, after load.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;

/// One loaded map and its memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapMemory {
    /// The map's name in the object (`THROTTLE`, `RECLAIM`, ...).
    pub name: String,
    /// `memlock`: bytes.
    pub bytes: u64,
    /// `max_entries` as created.
    pub max_entries: u32,
}

/// The fields of a BPF map's fdinfo the observer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapFdinfo {
    pub map_type: u32,
    pub max_entries: u32,
    pub memlock: u64,
}

/// Parses the text of `/proc/<pid>/fdinfo/<fd>`; `None` when it is not a BPF map's (no
/// `map_type`) or a field is missing or malformed.
#[must_use]
pub fn parse_fdinfo(text: &str) -> Option<MapFdinfo> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim())
        })
    };
    Some(MapFdinfo {
        map_type: field("map_type")?.parse().ok()?,
        max_entries: field("max_entries")?.parse().ok()?,
        memlock: field("memlock")?.parse().ok()?,
    })
}

/// Reads the memory of each `(name, fd)` from `fdinfo` (`/proc/self/fdinfo`). A map whose
/// fdinfo cannot be read or parsed is left out, with a debug log.
pub fn read<'a>(
    fdinfo: &Path,
    maps: impl IntoIterator<Item = (&'a str, BorrowedFd<'a>)>,
) -> Vec<MapMemory> {
    maps.into_iter()
        .filter_map(|(name, fd)| {
            let path = fdinfo.join(fd.as_raw_fd().to_string());
            let parsed = std::fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|t| parse_fdinfo(&t).ok_or_else(|| "not a BPF map's".to_owned()));
            match parsed {
                Ok(info) => Some(MapMemory {
                    name: name.to_owned(),
                    bytes: info.memlock,
                    max_entries: info.max_entries,
                }),
                Err(reason) => {
                    tracing::debug!(map = name, path = %path.display(), reason, "observer: map memory");
                    None
                }
            }
        })
        .collect()
}

/// The sum of `maps`' memory.
#[must_use]
pub fn total(maps: &[MapMemory]) -> u64 {
    maps.iter().map(|m| m.bytes).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A per-CPU LRU hash's fdinfo as Debian's 6.1 prints it.
    const LRU_PERCPU_6_1: &str = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\n\
        map_type:\t10\nkey_size:\t16\nvalue_size:\t104\nmax_entries:\t16384\n\
        map_flags:\t0x0\nmap_extra:\t0x0\nmemlock:\t227540992\nmap_id:\t42\nfrozen:\t0\n";

    #[test]
    fn reads_a_maps_memlock() {
        assert_eq!(
            parse_fdinfo(LRU_PERCPU_6_1),
            Some(MapFdinfo {
                map_type: 10,
                max_entries: 16_384,
                memlock: 227_540_992,
            })
        );
    }

    #[test]
    fn a_file_or_a_program_is_not_a_map() {
        assert_eq!(
            parse_fdinfo("pos:\t0\nflags:\t0100002\nmnt_id:\t25\nino:\t7\n"),
            None
        );
        // A program's fdinfo has `memlock` but no `map_type`.
        assert_eq!(
            parse_fdinfo("pos:\t0\nprog_type:\t26\nprog_jited:\t1\nmemlock:\t4096\nprog_id:\t9\n"),
            None
        );
    }

    #[test]
    fn a_malformed_number_is_refused_not_read_as_zero() {
        let text = LRU_PERCPU_6_1.replace("227540992", "lots");
        assert_eq!(parse_fdinfo(&text), None);
    }

    #[test]
    fn reads_the_fdinfo_of_each_named_fd() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = std::fs::File::open("/dev/null").expect("open /dev/null");
        let fd = std::os::fd::AsFd::as_fd(&file);
        std::fs::write(dir.path().join(fd.as_raw_fd().to_string()), LRU_PERCPU_6_1)
            .expect("write fdinfo");
        let maps = read(dir.path(), [("RECLAIM", fd)]);
        assert_eq!(
            maps,
            vec![MapMemory {
                name: "RECLAIM".into(),
                bytes: 227_540_992,
                max_entries: 16_384,
            }]
        );
        assert_eq!(total(&maps), 227_540_992);
    }
}
