//! The runtime's deadline for one request, shared by the transport that answers it and the
//! work that computes the answer.
//!
//! The transport answers fail-open when the budget runs out. Work that runs on past that point
//! (it is on a blocking thread, where no timeout can stop it) must then do nothing whose
//! correctness depends on its answer reaching the runtime: before such a step it calls
//! [`Deadline::commit`]. Exactly one side wins:
//! - the work commits first: the transport waits for its answer (what is left after a commit is
//!   in-memory work, so the wait is short);
//! - the transport expires first: the answer is fail-open, and `commit` tells the work to drop
//!   what it would have done. Nothing is applied twice.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

const OPEN: u8 = 0;
const COMMITTED: u8 = 1;
const EXPIRED: u8 = 2;

/// See the module docs. Clones share the outcome.
#[derive(Debug, Clone)]
pub struct Deadline {
    at: Instant,
    gate: Arc<AtomicU8>,
}

impl Deadline {
    /// A deadline `budget` from now.
    pub fn after(budget: Duration) -> Self {
        Deadline {
            at: Instant::now() + budget,
            gate: Arc::new(AtomicU8::new(OPEN)),
        }
    }

    /// No runtime is waiting (the engine's own re-evaluations, tests): never expires.
    pub fn none() -> Self {
        // Far enough to never fire, near enough not to overflow `Instant` arithmetic.
        Self::after(Duration::from_secs(100 * 365 * 24 * 3600))
    }

    /// When the transport gives up.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// Time left before the transport gives up (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// The transport has answered fail-open without this work.
    pub fn expired(&self) -> bool {
        self.gate.load(Ordering::Acquire) == EXPIRED
    }

    /// The work is about to act on its answer. `true`: the transport will wait for that answer
    /// and deliver it; `false`: the runtime was already answered fail-open, so act on nothing.
    #[must_use]
    pub fn commit(&self) -> bool {
        match self
            .gate
            .compare_exchange(OPEN, COMMITTED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == COMMITTED,
        }
    }

    /// The transport gives up. `true`: the work had not committed, and now never will; `false`:
    /// it committed, and its answer must be awaited.
    pub fn expire(&self) -> bool {
        match self
            .gate
            .compare_exchange(OPEN, EXPIRED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == EXPIRED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_first_wins_over_expiry() {
        let d = Deadline::after(Duration::from_secs(1));
        let work = d.clone();
        assert!(work.commit());
        assert!(work.commit(), "committing twice is still committed");
        assert!(!d.expire(), "the transport must wait for committed work");
        assert!(!d.expired());
    }

    #[test]
    fn expiry_first_refuses_the_commit() {
        let d = Deadline::after(Duration::from_secs(1));
        let work = d.clone();
        assert!(d.expire());
        assert!(work.expired());
        assert!(
            !work.commit(),
            "answered fail-open: the work must act on nothing"
        );
        assert!(d.expire(), "expiring twice is still expired");
    }

    #[test]
    fn one_side_wins_under_contention() {
        for _ in 0..1000 {
            let d = Deadline::after(Duration::from_secs(1));
            let work = d.clone();
            let t = std::thread::spawn(move || work.commit());
            let expired = d.expire();
            let committed = t.join().unwrap();
            assert_ne!(expired, committed, "exactly one of commit and expire wins");
        }
    }

    #[tokio::test]
    async fn remaining_counts_down_to_zero() {
        let d = Deadline::after(Duration::from_millis(20));
        assert!(d.remaining() <= Duration::from_millis(20));
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(d.remaining(), Duration::ZERO);
        assert!(Deadline::none().remaining() > Duration::from_secs(3600));
    }
}
