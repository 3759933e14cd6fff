//! The limit writes of a staged decrease that are inside the kernel right now.
//!
//! A cgroup v1 `memory.limit_in_bytes` write blocks while the kernel reclaims, and the kernel
//! (`mem_cgroup_resize_max`) sets the limit anew between its rounds of reclaim: a write of ours
//! still inside the kernel when a newer update supersedes the decrease can land after the
//! runtime's write of the newer limit and leave the container at our lower one. Nothing stops a
//! write under way, so the newer update waits for it instead: the reclaim marks each limit write
//! here, and whoever supersedes the decrease waits (bounded by the runtime's deadline) until
//! none is in flight before it answers, so the runtime's write comes after ours.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

use crate::sync::Locked as _;

/// See the module docs. One per background reclaim, shared by the reclaim loop and the handle.
#[derive(Debug, Default)]
pub struct LimitWrites {
    in_flight: Mutex<u32>,
    idle: Condvar,
}

/// Marks one write in flight until dropped (a panicking write is unmarked too).
struct Marked<'a>(&'a LimitWrites);

impl Drop for Marked<'_> {
    fn drop(&mut self) {
        let mut n = self.0.in_flight.locked();
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.0.idle.notify_all();
        }
    }
}

impl LimitWrites {
    /// Runs `write` (a blocking limit write) marked as in flight.
    pub fn write<T>(&self, write: impl FnOnce() -> T) -> T {
        *self.in_flight.locked() += 1;
        let _marked = Marked(self);
        write()
    }

    /// Waits until no write is in flight, at most until `until`; `true` when none is.
    /// Blocking: call it on a blocking thread.
    pub fn wait_idle(&self, until: Instant) -> bool {
        let mut n = self.in_flight.locked();
        while *n > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            n = match self.idle.wait_timeout(n, left) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_waiter_returns_when_the_write_left_the_kernel_or_its_time_is_up() {
        let writes = Arc::new(LimitWrites::default());
        assert!(writes.wait_idle(Instant::now()), "nothing in flight");
        let (entered_tx, entered_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let w = Arc::clone(&writes);
        let holder = std::thread::spawn(move || {
            w.write(|| {
                entered_tx.send(()).expect("send");
                release_rx.recv().expect("release");
            });
        });
        entered_rx.recv().expect("the write entered");
        assert!(
            !writes.wait_idle(Instant::now() + Duration::from_millis(20)),
            "the write is still in flight"
        );
        release_tx.send(()).expect("release");
        assert!(writes.wait_idle(Instant::now() + Duration::from_secs(60)));
        holder.join().expect("holder");
    }
}
