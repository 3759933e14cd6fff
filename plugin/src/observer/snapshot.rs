//! One pass's copy of a shared counter map: every entry read with a few batch lookups
//! (`BPF_MAP_LOOKUP_BATCH`) at the start of an observer tick, instead of one
//! `BPF_MAP_LOOKUP_ELEM` per watched cgroup and map (1,500 syscalls a second at 500 containers).
//! Valid only during the pass that took it: a read outside a pass looks the key up itself.

use std::collections::HashMap;
use std::io;
use std::os::fd::BorrowedFd;

use nri_resize_ebpf_common::CgroupKey;

use super::maps;

/// Entries asked for per batch call.
const CHUNK: u32 = 512;

/// The entries of one map as read at the start of the current pass.
#[derive(Debug, Default)]
pub(super) struct MapSnapshot {
    keys: Vec<CgroupKey>,
    values: Vec<u64>,
    /// Key → index of its entry in `keys` (and its `words` in `values`).
    index: HashMap<CgroupKey, usize>,
    words: usize,
    valid: bool,
}

impl MapSnapshot {
    /// Reads every entry of the map `fd` (values `words` u64 wide). On error the snapshot is
    /// left invalid (reads fall back to per-key lookups).
    pub(super) fn take(&mut self, fd: BorrowedFd<'_>, words: usize) -> io::Result<()> {
        self.valid = false;
        self.index.clear();
        maps::lookup_all(fd, words, CHUNK, &mut self.keys, &mut self.values)?;
        self.words = words;
        for (i, key) in self.keys.iter().enumerate() {
            self.index.insert(*key, i);
        }
        self.valid = true;
        Ok(())
    }

    /// Ends the pass: later reads look keys up themselves.
    pub(super) fn invalidate(&mut self) {
        self.valid = false;
    }

    /// The key's value as the pass read it.
    pub(super) fn get(&self, key: &CgroupKey) -> Snapshot<'_> {
        if !self.valid {
            return Snapshot::NotTaken;
        }
        match self
            .index
            .get(key)
            .and_then(|&i| self.values.get(i * self.words..(i + 1) * self.words))
        {
            Some(words) => Snapshot::Found(words),
            None => Snapshot::Absent,
        }
    }
}

/// What a snapshot says of a key.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Snapshot<'a> {
    /// No pass is running (or its read failed): look the key up.
    NotTaken,
    /// The map had no entry for the key when the pass read it.
    Absent,
    /// The key's value words.
    Found(&'a [u64]),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_snapshot_answers_nothing_and_a_valid_one_answers_every_key() {
        let mut s = MapSnapshot::default();
        let (a, b) = (CgroupKey::new(0, 7), CgroupKey::new(0, 8));
        assert_eq!(s.get(&a), Snapshot::NotTaken, "never taken");
        s.keys = vec![a];
        s.values = vec![3, 4];
        s.words = 2;
        s.index.insert(a, 0);
        s.valid = true;
        assert_eq!(s.get(&a), Snapshot::Found(&[3, 4]));
        assert_eq!(
            s.get(&b),
            Snapshot::Absent,
            "absent from the map: zeros to the reader"
        );
        s.invalidate();
        assert_eq!(s.get(&a), Snapshot::NotTaken, "after the pass");
    }
}
