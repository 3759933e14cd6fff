//! When kubelet tries a resize again: the pod worker after a failed sync, the allocation
//! manager for a pending (deferred) resize. Pure: the randomness is a seeded generator.

use std::time::Duration;

/// The pod worker's back-off after a failed sync (`backOffPeriod`, 10 s by default in
/// `pkg/kubelet/kubelet.go`).
pub const POD_WORKER_BACKOFF: Duration = Duration::from_secs(10);

/// `workerBackOffPeriodJitterFactor` (`pkg/kubelet/pod_workers.go`).
pub const BACKOFF_JITTER_FACTOR: f64 = 0.5;

/// `wait.Jitter(base, factor)` (k8s.io/apimachinery `pkg/util/wait`): `base` plus up to
/// `factor` × `base`, by `unit` in [0, 1). With the pod worker's 10 s and 0.5: 10–15 s.
pub fn jitter(base: Duration, factor: f64, unit: f64) -> Duration {
    base + base.mul_f64(factor * unit.clamp(0.0, 1.0))
}

/// A small deterministic generator (splitmix64) for the jitter: a test that passes a seed
/// gets the same waits every run.
#[derive(Debug, Clone)]
pub struct Jitter {
    state: u64,
}

impl Jitter {
    /// A generator from `seed`.
    pub fn seeded(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next value in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // The top 53 bits as a fraction: exact in an f64.
        f64::from(u32::try_from(z >> 43).unwrap_or(0)) / f64::from(1_u32 << 21)
    }

    /// The pod worker's wait before the next sync after a failed one, from `base` (kubelet:
    /// [`POD_WORKER_BACKOFF`]; a test passes less) with [`BACKOFF_JITTER_FACTOR`]
    /// (`podWorkers.completeWork`: `wait.Jitter(p.backOffPeriod, workerBackOffPeriodJitterFactor)`).
    pub fn pod_worker_backoff(&mut self, base: Duration) -> Duration {
        jitter(base, BACKOFF_JITTER_FACTOR, self.unit())
    }
}

/// The allocation manager's first retry of pending resizes (`initialRetryDelay`,
/// `pkg/kubelet/allocation/allocation_manager.go`).
pub const PENDING_FIRST_RETRY: Duration = Duration::from_secs(30);

/// Its period after that (`retryDelay`: `retryPendingResizes` resets its ticker to it).
pub const PENDING_RETRY_PERIOD: Duration = Duration::from_secs(180);

/// When the `n`-th periodic retry (from 1) of a Deferred resize happens after the ticker
/// started: 30 s, then every 3 min (`manager.Run` → `retryPendingResizes`). An Infeasible
/// resize leaves the queue; only a new resize brings it back.
pub fn pending_retry_at(n: u32) -> Duration {
    PENDING_FIRST_RETRY + PENDING_RETRY_PERIOD * n.saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_worker_waits_ten_to_fifteen_seconds() {
        let mut j = Jitter::seeded(36);
        for _ in 0..1000 {
            let d = j.pod_worker_backoff(POD_WORKER_BACKOFF);
            assert!(
                d >= Duration::from_secs(10) && d < Duration::from_secs(15),
                "{d:?}"
            );
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_waits() {
        let waits = |seed| {
            let mut j = Jitter::seeded(seed);
            (0..5)
                .map(|_| j.pod_worker_backoff(Duration::from_millis(200)))
                .collect::<Vec<_>>()
        };
        assert_eq!(waits(7), waits(7));
        assert_ne!(waits(7), waits(8));
    }

    #[test]
    fn jitter_bounds() {
        let base = Duration::from_secs(10);
        assert_eq!(jitter(base, 0.5, 0.0), base);
        assert_eq!(jitter(base, 0.5, 1.0), Duration::from_secs(15));
    }

    #[test]
    fn deferred_is_retried_after_30s_then_every_3_min() {
        assert_eq!(pending_retry_at(1), Duration::from_secs(30));
        assert_eq!(pending_retry_at(2), Duration::from_secs(210));
        assert_eq!(pending_retry_at(3), Duration::from_secs(390));
    }
}
