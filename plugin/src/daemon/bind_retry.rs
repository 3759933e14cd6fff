//! Binding the daemon's listeners (metrics address, status API socket) when a previous
//! nri-resize still holds them: after a SIGKILL the old process takes a moment to exit (closing
//! its eBPF links waits for RCU grace periods) and keeps its sockets until it is gone, so a
//! restart right after it would find them in use. Such a bind is retried with the project's
//! backoff for a bounded time, said in the log; any other error, or still in use at the end,
//! stops the daemon as before.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backoff::Backoff;

/// How long a listener in use is waited for.
pub const BIND_RETRY_FOR: Duration = Duration::from_secs(30);

/// Why a bind was not retried further.
#[derive(Debug)]
pub enum Gave<E> {
    /// The bind failed for another reason, or was still in use after the retry budget.
    Up(E),
    /// `cancel` fired while waiting.
    Cancelled,
}

/// Runs `bind` until it succeeds, fails with an error `in_use` does not recognise, `within`
/// has passed, or `cancel` fires. `what` names the listener in the log.
pub async fn retry_while_in_use<T, E, F, Fut>(
    what: &str,
    within: Duration,
    cancel: &CancellationToken,
    in_use: impl Fn(&E) -> bool,
    mut bind: F,
) -> Result<T, Gave<E>>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    let mut attempts: u32 = 0;
    loop {
        attempts += 1;
        match bind().await {
            Ok(bound) => {
                if attempts > 1 {
                    info!(
                        listener = what,
                        attempts, "bound after waiting for it to be free"
                    );
                }
                return Ok(bound);
            }
            Err(err) if in_use(&err) && started.elapsed() < within => {
                let delay = backoff.next_delay();
                // Said on the first attempt, then at powers of two: a restart names what it waits for.
                if attempts.is_power_of_two() {
                    warn!(
                        listener = what,
                        %err,
                        attempts,
                        retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        give_up_after_s = within.as_secs(),
                        "in use (a previous nri-resize still exiting?): retrying"
                    );
                }
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = cancel.cancelled() => return Err(Gave::Cancelled),
                }
            }
            Err(err) => return Err(Gave::Up(err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn in_use(e: &std::io::Error) -> bool {
        e.kind() == std::io::ErrorKind::AddrInUse
    }

    #[tokio::test(start_paused = true)]
    async fn in_use_is_retried_until_free() {
        let calls = Cell::new(0);
        let r = retry_while_in_use(
            "test",
            BIND_RETRY_FOR,
            &CancellationToken::new(),
            in_use,
            || {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move {
                    if n < 4 {
                        Err(std::io::Error::from(std::io::ErrorKind::AddrInUse))
                    } else {
                        Ok(n)
                    }
                }
            },
        )
        .await;
        assert_eq!(r.ok(), Some(4));
    }

    #[tokio::test(start_paused = true)]
    async fn other_errors_are_not_retried() {
        let calls = Cell::new(0);
        let r: Result<(), _> = retry_while_in_use(
            "test",
            BIND_RETRY_FOR,
            &CancellationToken::new(),
            in_use,
            || {
                calls.set(calls.get() + 1);
                async { Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied)) }
            },
        )
        .await;
        assert!(matches!(r, Err(Gave::Up(e)) if e.kind() == std::io::ErrorKind::PermissionDenied));
        assert_eq!(calls.get(), 1);
    }

    /// Still in use when the budget is spent: the last error is returned (paused clock: the
    /// budget passes as the backoff sleeps).
    #[tokio::test(start_paused = true)]
    async fn in_use_for_ever_gives_up_with_the_error() {
        let calls = Cell::new(0);
        let r: Result<(), _> = retry_while_in_use(
            "test",
            Duration::from_secs(5),
            &CancellationToken::new(),
            in_use,
            || {
                calls.set(calls.get() + 1);
                async { Err(std::io::Error::from(std::io::ErrorKind::AddrInUse)) }
            },
        )
        .await;
        assert!(matches!(r, Err(Gave::Up(e)) if in_use(&e)));
        assert!(calls.get() > 1, "retried before giving up");
    }

    #[tokio::test(start_paused = true)]
    async fn cancel_stops_the_wait() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        let r: Result<(), _> =
            retry_while_in_use("test", BIND_RETRY_FOR, &cancel, in_use, || async {
                Err(std::io::Error::from(std::io::ErrorKind::AddrInUse))
            })
            .await;
        assert!(matches!(r, Err(Gave::Cancelled)));
    }
}
