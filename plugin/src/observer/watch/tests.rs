//! The watch's counting and its driver, with a fake switch (no kernel) on paused tokio time.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ReclaimSwitch, ReclaimWatch};
use crate::observer::ObserverError;

const LINGER: Duration = Duration::from_secs(5);

/// Counts attaches and detaches; refuses to attach while `refuse` is set.
#[derive(Default)]
struct FakeSwitch {
    attaches: AtomicUsize,
    detaches: AtomicUsize,
    refuse: AtomicBool,
}

impl ReclaimSwitch for FakeSwitch {
    fn program(&self) -> &'static str {
        "fake"
    }

    fn attach(&self) -> Result<(), ObserverError> {
        if self.refuse.load(Ordering::SeqCst) {
            return Err(ObserverError::Program {
                program: "fake",
                reason: "refused".into(),
            });
        }
        self.attaches.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn detach(&self) -> Result<(), ObserverError> {
        self.detaches.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

impl FakeSwitch {
    fn counts(&self) -> (usize, usize) {
        (
            self.attaches.load(Ordering::SeqCst),
            self.detaches.load(Ordering::SeqCst),
        )
    }
}

fn started() -> (ReclaimWatch, Arc<FakeSwitch>, CancellationToken) {
    let watch = ReclaimWatch::new(LINGER);
    let switch = Arc::new(FakeSwitch::default());
    let cancel = CancellationToken::new();
    watch.start(&cancel);
    watch.bind(switch.clone());
    (watch, switch, cancel)
}

/// Lets the driver run whatever it has to (no time passes).
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_first_guard_attaches_and_the_last_detaches_after_the_linger() {
    let (watch, switch, _cancel) = started();
    settle().await;
    assert_eq!(switch.counts(), (0, 0), "nothing attached without a guard");
    assert!(!watch.attached());

    let first = watch.watch();
    watch.until_attached(true).await;
    let second = watch.watch();
    settle().await;
    assert_eq!(switch.counts(), (1, 0), "one attach for two guards");

    drop(first);
    tokio::time::sleep(LINGER * 2).await;
    assert_eq!(switch.counts(), (1, 0), "a guard is still live");
    assert!(watch.attached());

    let last_dropped = tokio::time::Instant::now();
    drop(second);
    tokio::time::sleep(LINGER.saturating_sub(Duration::from_millis(10))).await;
    assert_eq!(switch.counts(), (1, 0), "still within the linger");
    watch.until_attached(false).await;
    assert_eq!(switch.counts(), (1, 1));
    assert!(
        last_dropped.elapsed() >= LINGER,
        "detached after {:?}, before the linger",
        last_dropped.elapsed()
    );
    let status = watch.status().expect("bound");
    assert_eq!(
        (status.program, status.attached, status.watchers),
        ("fake", false, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn back_to_back_reclaims_within_the_linger_keep_it_attached() {
    let (watch, switch, _cancel) = started();
    for _ in 0..5 {
        let pass = watch.watch();
        watch.until_attached(true).await;
        drop(pass);
        tokio::time::sleep(LINGER / 2).await;
    }
    assert_eq!(switch.counts(), (1, 0), "no detach between passes");
    watch.until_attached(false).await;
    assert_eq!(switch.counts(), (1, 1));

    // A reclaim after the detach attaches again.
    let again = watch.watch();
    watch.until_attached(true).await;
    assert_eq!(switch.counts(), (2, 1));
    drop(again);
    watch.until_attached(false).await;
    assert_eq!(switch.counts(), (2, 2));
}

#[tokio::test(start_paused = true)]
async fn concurrent_guards_from_threads_attach_once_and_count_back_to_zero() {
    let (watch, switch, _cancel) = started();
    let held = watch.watch();
    watch.until_attached(true).await;
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let watch = watch.clone();
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    let guard = watch.watch();
                    drop(guard);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    settle().await;
    assert_eq!(watch.status().expect("bound").watchers, 1);
    assert_eq!(switch.counts(), (1, 0));
    drop(held);
    watch.until_attached(false).await;
    assert_eq!(watch.status().expect("bound").watchers, 0);
    assert_eq!(switch.counts(), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn guards_taken_before_the_switch_is_bound_attach_once_it_is() {
    let watch = ReclaimWatch::new(LINGER);
    let cancel = CancellationToken::new();
    watch.start(&cancel);
    let early = watch.watch();
    settle().await;
    assert!(watch.status().is_none(), "nothing bound: no status");
    assert!(!watch.attached());

    let switch = Arc::new(FakeSwitch::default());
    watch.bind(switch.clone());
    watch.until_attached(true).await;
    assert_eq!(switch.counts(), (1, 0));
    drop(early);
    watch.until_attached(false).await;
    assert_eq!(switch.counts(), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_refused_attach_is_said_and_tried_again_at_the_next_reclaim() {
    let (watch, switch, _cancel) = started();
    switch.refuse.store(true, Ordering::SeqCst);
    let refused = watch.watch();
    // The refusal comes back from a blocking thread: wait for it, then let time pass.
    while watch.status().is_some_and(|s| s.last_error.is_none()) {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(LINGER * 3).await;
    let status = watch.status().expect("bound");
    assert!(!status.attached);
    assert!(
        status
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("refused")),
        "{status:?}"
    );
    assert_eq!(switch.counts(), (0, 0), "not retried in a loop");

    switch.refuse.store(false, Ordering::SeqCst);
    let next = watch.watch();
    watch.until_attached(true).await;
    assert_eq!(switch.counts(), (1, 0));
    assert_eq!(watch.status().expect("bound").last_error, None);
    drop((refused, next));
    watch.until_attached(false).await;
    assert_eq!(switch.counts(), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn without_a_driver_or_a_switch_guards_only_count() {
    let watch = ReclaimWatch::new(LINGER);
    let guard = watch.watch();
    assert_eq!(watch.status(), None);
    assert!(!watch.attached());
    drop(guard);

    // Bound but not started: nothing switches.
    let switch = Arc::new(FakeSwitch::default());
    watch.bind(switch.clone());
    let guard = watch.watch();
    tokio::time::sleep(LINGER).await;
    assert_eq!(switch.counts(), (0, 0));
    assert_eq!(watch.status().expect("bound").watchers, 1);
    drop(guard);
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_the_driver_and_unbind_says_detached() {
    let (watch, switch, _cancel) = started();
    let guard = watch.watch();
    watch.until_attached(true).await;
    watch.shutdown().await;
    drop(guard);
    tokio::time::sleep(LINGER * 2).await;
    assert_eq!(switch.counts(), (1, 0), "no detach after shutdown");
    watch.unbind();
    assert!(!watch.attached());
    assert_eq!(watch.status(), None);
}
