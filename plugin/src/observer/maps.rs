//! Allocation-free reads of the observer's shared counter maps.
//!
//! aya's `HashMap::get` copies through a typed value; the observer reads every watched cgroup
//! each interval, so it issues `BPF_MAP_LOOKUP_ELEM` itself into a buffer it keeps, as whole
//! u64 words.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use nri_resize_ebpf_common::CgroupKey;

/// `BPF_MAP_LOOKUP_ELEM` command of the `bpf(2)` syscall.
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;

/// The `map_elem` member of `union bpf_attr`.
#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// Looks `key` up in the (not per-CPU) map `fd`, whose values are `value.len()` u64 words wide,
/// and writes the value into `value`. `buf` is reused between calls. Returns `false` if the key
/// is absent (`value` is then left as it was).
pub fn lookup(
    fd: BorrowedFd<'_>,
    key: &CgroupKey,
    buf: &mut Vec<u64>,
    value: &mut [u64],
) -> io::Result<bool> {
    buf.resize(value.len(), 0);
    let attr = MapElemAttr {
        map_fd: u32::try_from(fd.as_raw_fd())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        pad: 0,
        key: std::ptr::from_ref(key) as u64,
        value: buf.as_mut_ptr() as u64,
        flags: 0,
    };
    #[expect(
        unsafe_code,
        reason = "bpf(2) has no safe wrapper that reads into a caller buffer"
    )]
    // SAFETY: `attr` points at a live key of the map's key size (`CgroupKey`, 16 bytes) and a
    // buffer of the map's value size (`value.len()` words), which is what the kernel writes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_ELEM,
            std::ptr::from_ref(&attr),
            size_of::<MapElemAttr>(),
        )
    };
    if rc != 0 {
        let err = io::Error::last_os_error();
        return if err.raw_os_error() == Some(libc::ENOENT) {
            Ok(false)
        } else {
            Err(err)
        };
    }
    value.copy_from_slice(buf);
    Ok(true)
}

/// `BPF_MAP_LOOKUP_BATCH` command of the `bpf(2)` syscall (Linux 5.6).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Reads every entry of the (not per-CPU) hash map `fd`, whose values are `words` u64 words
/// wide, into `keys` and `values` (`words` per key, in the same order), with as few
/// `BPF_MAP_LOOKUP_BATCH` calls as the entries need (one per `chunk` entries). Both vectors are
/// cleared first and keep their capacity between calls. `Unsupported` (`EINVAL`, `ENOTSUPP`)
/// where the kernel has no batch operations for the map (before 5.6).
pub fn lookup_all(
    fd: BorrowedFd<'_>,
    words: usize,
    chunk: u32,
    keys: &mut Vec<CgroupKey>,
    values: &mut Vec<u64>,
) -> io::Result<()> {
    keys.clear();
    values.clear();
    let map_fd =
        u32::try_from(fd.as_raw_fd()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut chunk = chunk.max(1);
    // The hash map's batch token: a bucket index (`u32`); an 8-byte slot leaves room.
    let mut token = [0u64; 1];
    let mut started = false;
    loop {
        let have = keys.len();
        let room = usize::try_from(chunk).unwrap_or(usize::MAX);
        keys.resize(have + room, CgroupKey::default());
        values.resize((have + room) * words, 0);
        let mut out = [0u64; 1];
        let mut attr = BatchAttr {
            in_batch: if started {
                std::ptr::from_ref(&token) as u64
            } else {
                0
            },
            out_batch: std::ptr::from_mut(&mut out) as u64,
            keys: keys[have..].as_mut_ptr() as u64,
            values: values[have * words..].as_mut_ptr() as u64,
            count: chunk,
            map_fd,
            elem_flags: 0,
            flags: 0,
        };
        #[expect(
            unsafe_code,
            reason = "bpf(2) has no safe wrapper for batch lookups (aya has none)"
        )]
        // SAFETY: `keys` and `values` have room for `count` entries past `have` (key size
        // `CgroupKey`, value size `words` u64s, what the map holds); the tokens are 8-byte
        // slots, larger than the hash map's `u32` token; `attr` lives across the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                std::ptr::from_mut(&mut attr),
                size_of::<BatchAttr>(),
            )
        };
        let err = (rc != 0).then(io::Error::last_os_error);
        // The kernel reports how many entries it copied in `count`, also with `ENOENT`.
        let got = if err
            .as_ref()
            .is_none_or(|e| e.raw_os_error() == Some(libc::ENOENT))
        {
            usize::try_from(attr.count).unwrap_or(0).min(room)
        } else {
            0
        };
        keys.truncate(have + got);
        values.truncate((have + got) * words);
        match err.as_ref().and_then(io::Error::raw_os_error) {
            None => {
                token = out;
                started = true;
            }
            // Past the last bucket: every entry read.
            Some(libc::ENOENT) => return Ok(()),
            // One bucket holds more entries than `chunk`: again with more room.
            Some(libc::ENOSPC) if chunk < 1 << 20 => chunk *= 4,
            // 524: the kernel's ENOTSUPP (no batch operations for this map type).
            Some(libc::EINVAL | 524) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "BPF_MAP_LOOKUP_BATCH: not supported by this kernel",
                ))
            }
            Some(_) => return Err(err.unwrap_or_else(io::Error::last_os_error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd as _, FromRawFd as _, OwnedFd};

    use super::*;

    /// `BPF_MAP_TYPE_LRU_HASH`, what the observer's counter maps are.
    const BPF_MAP_TYPE_LRU_HASH: u32 = 9;

    /// An LRU hash map of `CgroupKey` → two u64 words, made with `bpf(2)` as the loader would.
    fn lru_map(entries: u32) -> OwnedFd {
        #[repr(C)]
        struct CreateAttr {
            map_type: u32,
            key_size: u32,
            value_size: u32,
            max_entries: u32,
            map_flags: u32,
        }
        let attr = CreateAttr {
            map_type: BPF_MAP_TYPE_LRU_HASH,
            key_size: 16,
            value_size: 16,
            max_entries: entries,
            map_flags: 0,
        };
        #[expect(unsafe_code, reason = "bpf(2) map creation for the test")]
        // SAFETY: `attr` is a valid prefix of `union bpf_attr` for BPF_MAP_CREATE.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                0,
                std::ptr::from_ref(&attr),
                size_of::<CreateAttr>(),
            )
        };
        assert!(
            fd >= 0,
            "BPF_MAP_CREATE: {} (the unit tier runs as root, with CAP_BPF)",
            io::Error::last_os_error()
        );
        // SAFETY: a new fd the kernel just returned, owned by nobody else.
        #[expect(unsafe_code, reason = "owning the fd bpf(2) returned")]
        unsafe {
            OwnedFd::from_raw_fd(i32::try_from(fd).expect("fd"))
        }
    }

    fn update(fd: &OwnedFd, key: &CgroupKey, value: &[u64; 2]) {
        let attr = MapElemAttr {
            map_fd: u32::try_from(fd.as_raw_fd()).expect("fd"),
            pad: 0,
            key: std::ptr::from_ref(key) as u64,
            value: value.as_ptr() as u64,
            flags: 0,
        };
        #[expect(unsafe_code, reason = "bpf(2) map update for the test")]
        // SAFETY: key and value are live and of the map's sizes.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                2,
                std::ptr::from_ref(&attr),
                size_of::<MapElemAttr>(),
            )
        };
        assert_eq!(rc, 0, "BPF_MAP_UPDATE_ELEM: {}", io::Error::last_os_error());
    }

    /// Every entry comes back once with its own value, over several batch calls (a chunk much
    /// smaller than the map), and agrees with the per-key lookup; an empty map reads empty.
    #[test]
    fn a_batch_read_returns_every_entry_with_its_value() {
        let fd = lru_map(4096);
        let mut keys = Vec::new();
        let mut values = Vec::new();
        lookup_all(fd.as_fd(), 2, 64, &mut keys, &mut values).expect("empty map");
        assert!(keys.is_empty() && values.is_empty());
        let n: u64 = 1000;
        for i in 0..n {
            update(&fd, &CgroupKey::new(3, 1000 + i), &[i, i * 7]);
        }
        lookup_all(fd.as_fd(), 2, 64, &mut keys, &mut values).expect("batch read");
        assert_eq!(keys.len(), 1000, "every entry once");
        assert_eq!(values.len(), 2000);
        let mut seen = std::collections::HashSet::new();
        for (k, v) in keys.iter().zip(values.chunks(2)) {
            let i = k.cgroup_id - 1000;
            assert!(seen.insert(i), "entry {i} twice");
            assert_eq!(v, [i, i * 7], "entry {i}'s value");
            let mut one = [0u64; 2];
            assert!(lookup(fd.as_fd(), k, &mut Vec::new(), &mut one).expect("lookup"));
            assert_eq!(one, [i, i * 7], "the per-key lookup agrees");
        }
    }
}
