//! Exponential backoff: the one used for reconnecting to the runtime, retrying restarts and
//! re-planning a whole-pod resize after a failed step.

use std::time::Duration;

/// Delays that double from `min` up to `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            next: min,
            min,
            max,
        }
    }

    /// The delay to wait now; doubles the next one up to the maximum.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let seq: Vec<u128> = (0..6).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(seq, [100, 200, 400, 800, 1000, 1000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }
}
