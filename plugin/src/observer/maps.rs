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
