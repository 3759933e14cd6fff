//! Memory limits as the kernel holds them. `memory.max` (v2) and `memory.limit_in_bytes` (v1)
//! are kept in whole pages, rounded down: on 4 KiB pages, 1G (1000000000 bytes) reads back as
//! 999997440. A limit asked and the one read back are compared through [`held_memory_limit`],
//! never byte for byte.

/// The memory limit a cgroup holds once `asked` bytes are written to it: whole pages of
/// `page_size` bytes, rounded down (the kernel's `page_counter_memparse`). A page size of 0
/// (unknown) leaves `asked` as is.
pub fn held_memory_limit(asked: u64, page_size: u64) -> u64 {
    if page_size == 0 {
        return asked;
    }
    asked - asked % page_size
}

#[cfg(test)]
mod tests {
    use super::*;

    const KI: u64 = 1 << 10;

    #[test]
    fn a_memory_limit_is_held_in_whole_pages_rounded_down() {
        // (asked, page size, held)
        let table = [
            // 1G, common in specs: not a whole number of pages.
            (1_000_000_000, 4 * KI, 999_997_440),
            // 500M.
            (500_000_000, 4 * KI, 499_998_720),
            // A VPA-like byte count: one byte past 256Mi.
            (268_435_457, 4 * KI, 268_435_456),
            // Whole pages are held as asked.
            (256 << 20, 4 * KI, 256 << 20),
            (4 * KI, 4 * KI, 4 * KI),
            // Less than a page: none.
            (1000, 4 * KI, 0),
            // arm64 nodes with 16 KiB and 64 KiB pages.
            (1_000_000_000, 16 * KI, 999_997_440),
            (268_435_457, 16 * KI, 268_435_456),
            (268_435_456 + 16 * KI - 1, 16 * KI, 268_435_456),
            (1_000_000_000, 64 * KI, 999_948_288),
            (268_435_457, 64 * KI, 268_435_456),
            (256 << 20, 64 * KI, 256 << 20),
            // An unknown page size changes nothing.
            (1_000_000_000, 0, 1_000_000_000),
        ];
        for (asked, page, held) in table {
            assert_eq!(
                held_memory_limit(asked, page),
                held,
                "{asked} bytes with {page}-byte pages"
            );
        }
    }
}
