//! Allocation-free reads of per-CPU hash map values.
//!
//! aya's `PerCpuHashMap::get` returns a freshly allocated `PerCpuValues` on every call; the
//! observer reads on every resize confirmation, so it issues `BPF_MAP_LOOKUP_ELEM` itself into a
//! buffer it keeps.

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

/// Looks `key` up in the per-CPU map `fd`, whose values are `sum.len()` u64 words wide, and
/// writes the word-wise sum over all possible CPUs into `sum`. `buf` is reused between calls.
/// Returns `false` if the key is absent.
pub fn lookup_percpu_sum(
    fd: BorrowedFd<'_>,
    key: &CgroupKey,
    cpus: usize,
    buf: &mut Vec<u64>,
    sum: &mut [u64],
) -> io::Result<bool> {
    let words = sum.len();
    if !lookup_percpu(fd, key, cpus, words, buf)? {
        return Ok(false);
    }
    sum.fill(0);
    for cpu_value in buf.chunks_exact(words) {
        for (total, word) in sum.iter_mut().zip(cpu_value) {
            *total = total.wrapping_add(*word);
        }
    }
    Ok(true)
}

/// Looks `key` up in the per-CPU map `fd` whose values are `words` u64 words wide; on success
/// `buf` holds one value per possible CPU (`buf.chunks_exact(words)`). `buf` is resized once and
/// reused. Returns `false` if the key is absent.
pub fn lookup_percpu(
    fd: BorrowedFd<'_>,
    key: &CgroupKey,
    cpus: usize,
    words: usize,
    buf: &mut Vec<u64>,
) -> io::Result<bool> {
    // Per-CPU values are laid out with an 8-byte-aligned stride; ours are whole u64 words.
    buf.resize(words * cpus, 0);
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
    // buffer of `cpus` × value size bytes, which is what the kernel writes for a per-CPU map.
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
    Ok(true)
}
