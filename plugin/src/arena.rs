//! The daemon's allocator: glibc's malloc with one arena.
//!
//! glibc gives each thread that allocates under contention an arena of its own, up to eight per
//! CPU. The daemon's per-container state is made on the runtime's workers (NRI events), its
//! blocking threads (read-backs) and the observer thread, and freed on others: each arena kept
//! its own free chunks, and the daemon's RSS grew about 5 KiB per container beyond what it
//! holds (footprint bench: 12.4 KiB per container, 8.4–9.1 KiB with one arena). Its allocation
//! rate is low (a few thousand a second at 500 containers), so one arena costs no measurable
//! contention. Set before any thread starts; `MALLOC_ARENA_MAX` in the environment is then
//! overridden.

/// Limits glibc's malloc to one arena; `false` where it refused. Call before threads start.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn one_arena() -> bool {
    #[expect(
        unsafe_code,
        reason = "mallopt has no safe wrapper; M_ARENA_MAX only bounds future arenas"
    )]
    // SAFETY: mallopt takes no pointers; M_ARENA_MAX with a positive value is always valid.
    let set = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    set == 1
}

/// Other C libraries have no per-thread arenas to bound.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn one_arena() -> bool {
    true
}

#[cfg(test)]
mod tests {
    #[test]
    fn glibc_takes_the_arena_bound() {
        assert!(super::one_arena(), "mallopt(M_ARENA_MAX, 1) refused");
    }
}
