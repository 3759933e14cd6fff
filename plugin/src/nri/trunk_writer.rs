//! The trunk's write side, shared by every logical connection.
//!
//! A connection hands whole frames to [`TrunkWriter::send`], which writes them to the trunk
//! at once from the caller's task when nothing is queued (the common case: one `write` per
//! ttrpc message, no task in between, as the Go multiplexer does under its lock). Whatever the
//! trunk does not take at once is queued whole, and [`drain`] writes the queue in order: a frame
//! is never interleaved with another connection's, which would corrupt the framing. Writers wait
//! (their `poll_write` returns `Pending`) only while more than [`QUEUE_LIMIT`] bytes are queued.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use tokio::io::AsyncWrite;
use tokio::sync::Notify;

use crate::sync::Locked as _;

/// Bytes queued behind a trunk that does not take them before writers are made to wait.
pub(crate) const QUEUE_LIMIT: usize = 1 << 20;

type Sink = Pin<Box<dyn AsyncWrite + Send>>;

struct State {
    /// `None` once the trunk is closed or broken.
    sink: Option<Sink>,
    /// Frames (the first possibly partly written) waiting for the trunk, in order.
    queue: VecDeque<Bytes>,
    queued: usize,
    /// Why the trunk can take nothing more.
    failed: Option<io::ErrorKind>,
    /// Writers waiting for the queue to shrink below [`QUEUE_LIMIT`].
    waiting: Vec<Waker>,
}

/// The shared write side of a trunk (see the module docs).
pub(crate) struct TrunkWriter {
    state: Mutex<State>,
    queued_frames: Notify,
}

impl std::fmt::Debug for TrunkWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.locked();
        f.debug_struct("TrunkWriter")
            .field("queued", &s.queued)
            .field("failed", &s.failed)
            .finish_non_exhaustive()
    }
}

fn broken(kind: io::ErrorKind) -> io::Error {
    io::Error::new(kind, "the NRI trunk is closed or broken")
}

impl TrunkWriter {
    pub(crate) fn new(sink: impl AsyncWrite + Send + 'static) -> Arc<TrunkWriter> {
        Arc::new(TrunkWriter {
            state: Mutex::new(State {
                sink: Some(Box::pin(sink)),
                queue: VecDeque::new(),
                queued: 0,
                failed: None,
                waiting: Vec::new(),
            }),
            queued_frames: Notify::new(),
        })
    }

    /// Ready when a writer may hand over another frame: the trunk works and the queue is below
    /// [`QUEUE_LIMIT`]. Registers `cx` to be woken when that changes.
    pub(crate) fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut s = self.state.locked();
        if let Some(kind) = s.failed {
            return Poll::Ready(Err(broken(kind)));
        }
        if s.queued < QUEUE_LIMIT {
            return Poll::Ready(Ok(()));
        }
        if !s.waiting.iter().any(|w| w.will_wake(cx.waker())) {
            s.waiting.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Writes `frame` (one or more whole frames) now if the trunk takes it, else queues what is
    /// left for [`drain`]. Never waits; call [`Self::poll_ready`] first to respect the limit.
    pub(crate) fn send(&self, cx: &mut Context<'_>, mut frame: Bytes) -> io::Result<()> {
        let mut s = self.state.locked();
        if let Some(kind) = s.failed {
            return Err(broken(kind));
        }
        if s.queue.is_empty() {
            let Some(sink) = s.sink.as_mut() else {
                return Err(broken(io::ErrorKind::BrokenPipe));
            };
            while !frame.is_empty() {
                match sink.as_mut().poll_write(cx, &frame) {
                    Poll::Ready(Ok(0)) => return Err(s.fail(io::ErrorKind::WriteZero)),
                    Poll::Ready(Ok(n)) => frame.advance(n),
                    Poll::Ready(Err(e)) => return Err(s.fail_with(e)),
                    Poll::Pending => break,
                }
            }
            if frame.is_empty() {
                return Ok(());
            }
        }
        s.queued += frame.len();
        s.queue.push_back(frame);
        drop(s);
        self.queued_frames.notify_one();
        Ok(())
    }

    /// Closes the trunk's write side: queued frames are dropped, writers get an error.
    pub(crate) fn close(&self) {
        let mut s = self.state.locked();
        s.sink = None;
        s.queue.clear();
        s.queued = 0;
        s.failed.get_or_insert(io::ErrorKind::BrokenPipe);
        s.wake_waiting();
    }

    /// Writes queued frames until the queue is empty (ready) or the trunk takes no more
    /// (pending, `cx` woken when it can).
    fn poll_drain(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut s = self.state.locked();
        if let Some(kind) = s.failed {
            return Poll::Ready(Err(broken(kind)));
        }
        loop {
            let s = &mut *s;
            let (Some(sink), Some(front)) = (s.sink.as_mut(), s.queue.front_mut()) else {
                break;
            };
            let n = match sink.as_mut().poll_write(cx, front) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(s.fail(io::ErrorKind::WriteZero))),
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(s.fail_with(e))),
                Poll::Pending => return Poll::Pending,
            };
            front.advance(n);
            if front.is_empty() {
                s.queue.pop_front();
            }
            s.queued -= n;
            if s.queued < QUEUE_LIMIT {
                s.wake_waiting();
            }
        }
        if s.sink.is_none() {
            return Poll::Ready(Err(broken(io::ErrorKind::BrokenPipe)));
        }
        Poll::Ready(Ok(()))
    }
}

impl State {
    fn fail(&mut self, kind: io::ErrorKind) -> io::Error {
        self.failed = Some(kind);
        self.queue.clear();
        self.queued = 0;
        self.wake_waiting();
        broken(kind)
    }

    fn fail_with(&mut self, e: io::Error) -> io::Error {
        self.failed = Some(e.kind());
        self.queue.clear();
        self.queued = 0;
        self.wake_waiting();
        e
    }

    fn wake_waiting(&mut self) {
        for w in self.waiting.drain(..) {
            w.wake();
        }
    }
}

/// Writes what [`TrunkWriter::send`] queued, for as long as the trunk works. Owned by the
/// multiplexer's task, which aborts it when the trunk ends.
pub(crate) async fn drain(writer: Arc<TrunkWriter>) -> io::Result<()> {
    loop {
        writer.queued_frames.notified().await;
        std::future::poll_fn(|cx| writer.poll_drain(cx)).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn frame_of(len: usize, byte: u8) -> Bytes {
        Bytes::from(vec![byte; len])
    }

    async fn send(w: &TrunkWriter, frame: Bytes) -> io::Result<()> {
        std::future::poll_fn(|cx| w.poll_ready(cx)).await?;
        std::future::poll_fn(|cx| Poll::Ready(w.send(cx, frame.clone()))).await
    }

    #[tokio::test]
    async fn a_frame_the_trunk_takes_is_written_without_the_drain_task() {
        let (ours, mut theirs) = tokio::io::duplex(1024);
        let w = TrunkWriter::new(ours);
        send(&w, frame_of(100, 1)).await.unwrap();
        let mut got = vec![0; 100];
        theirs.read_exact(&mut got).await.unwrap();
        assert_eq!(got, vec![1; 100]);
        assert_eq!(w.state.locked().queued, 0);
    }

    #[tokio::test]
    async fn what_the_trunk_does_not_take_is_queued_whole_and_written_in_order() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let w = TrunkWriter::new(ours);
        // The trunk takes 64 bytes: the rest of the first frame and the whole second queue.
        send(&w, frame_of(100, 1)).await.unwrap();
        send(&w, frame_of(50, 2)).await.unwrap();
        assert_eq!(w.state.locked().queued, 36 + 50);
        let task = tokio::spawn(drain(Arc::clone(&w)));
        let mut got = vec![0; 150];
        theirs.read_exact(&mut got).await.unwrap();
        assert_eq!(&got[..100], &[1; 100][..]);
        assert_eq!(&got[100..], &[2; 50][..]);
        task.abort();
    }

    #[tokio::test]
    async fn writers_wait_above_the_limit_and_resume_as_the_trunk_drains() {
        let (ours, mut theirs) = tokio::io::duplex(1024);
        let w = TrunkWriter::new(ours);
        let task = tokio::spawn(drain(Arc::clone(&w)));
        let total = QUEUE_LIMIT * 3;
        let writer = {
            let w = Arc::clone(&w);
            tokio::spawn(async move {
                for i in 0..(total / 4096) {
                    send(&w, frame_of(4096, u8::try_from(i % 251).unwrap()))
                        .await
                        .unwrap();
                }
            })
        };
        // Nobody reads yet: the writer must stop at the limit rather than queue everything.
        while w.state.locked().queued < QUEUE_LIMIT {
            tokio::task::yield_now().await;
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!writer.is_finished(), "the writer waits above the limit");
        assert!(w.state.locked().queued <= QUEUE_LIMIT + 4096);
        let mut got = vec![0; total];
        theirs.read_exact(&mut got).await.unwrap();
        writer.await.unwrap();
        for (i, chunk) in got.chunks(4096).enumerate() {
            assert!(
                chunk.iter().all(|&b| usize::from(b) == i % 251),
                "frame {i}"
            );
        }
        task.abort();
    }

    #[tokio::test]
    async fn a_closed_trunk_refuses_frames_and_releases_waiting_writers() {
        let (ours, _theirs) = tokio::io::duplex(16);
        let w = TrunkWriter::new(ours);
        w.close();
        let err = send(&w, frame_of(8, 0)).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
