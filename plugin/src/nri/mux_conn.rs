//! One logical connection of the trunk, as the stream ttrpc-rust reads and writes.
//!
//! Reading: the bytes the multiplexer's trunk reader routed to this connection. Writing:
//! ttrpc-rust writes a message in pieces (the 10-byte header field by field, then the payload),
//! so the connection gathers bytes until they hold whole ttrpc messages and sends those as one
//! frame, straight to the trunk ([`TrunkWriter`]): one frame and, usually, one `write` per
//! message, as the Go side sends them. Dropping the connection closes the trunk (NRI has no
//! per-connection close).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::codec::Encoder as _;

use super::frame::{FrameCodec, MAX_PAYLOAD};
use super::trunk_writer::TrunkWriter;

/// Length of a ttrpc message header: payload length (u32 BE), stream id (u32), type, flags.
const TTRPC_HEADER_LEN: usize = 10;

/// A logical connection of a [`super::Mux`].
pub struct MuxConn {
    conn: u32,
    incoming: DuplexStream,
    /// Bytes written but not yet a whole ttrpc message.
    partial: BytesMut,
    /// Body bytes of a message larger than a frame still to come (see [`MuxConn::ready`]).
    owed: usize,
    trunk: Arc<TrunkWriter>,
    closed: mpsc::UnboundedSender<u32>,
}

impl std::fmt::Debug for MuxConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MuxConn")
            .field("conn", &self.conn)
            .field("partial", &self.partial.len())
            .finish_non_exhaustive()
    }
}

impl MuxConn {
    pub(crate) fn new(
        conn: u32,
        incoming: DuplexStream,
        trunk: Arc<TrunkWriter>,
        closed: mpsc::UnboundedSender<u32>,
    ) -> MuxConn {
        MuxConn {
            conn,
            incoming,
            partial: BytesMut::new(),
            owed: 0,
            trunk,
            closed,
        }
    }

    /// How many leading bytes of `partial` can go now, and how many body bytes of a message
    /// larger than a frame are still owed after them. Whole ttrpc messages go when complete; a
    /// message larger than a frame (ttrpc-rust sends none: its limit is 4 MiB, which fits)
    /// goes as its bytes come, the Go side reassembling chunks all the same, and the bytes owed
    /// keep the next message's header where it is.
    fn ready(&self) -> (usize, usize) {
        let len = self.partial.len();
        if self.owed >= len {
            return (len, self.owed - len);
        }
        let mut at = self.owed;
        while let Some(header) = self.partial.get(at..at + TTRPC_HEADER_LEN) {
            let body = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
            let end = at + TTRPC_HEADER_LEN + body;
            if end <= len {
                at = end;
            } else if end - at > MAX_PAYLOAD {
                return (len, end - len);
            } else {
                break;
            }
        }
        (at, 0)
    }
}

impl AsyncRead for MuxConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().incoming).poll_read(cx, buf)
    }
}

impl AsyncWrite for MuxConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.trunk.poll_ready(cx))?;
        // Never more than a frame's worth held back.
        let n = buf
            .len()
            .min(MAX_PAYLOAD.saturating_sub(this.partial.len()).max(1));
        this.partial.put_slice(&buf[..n]);
        let (ready, owed) = this.ready();
        this.owed = owed;
        if ready > 0 {
            let data = this.partial.split_to(ready);
            let mut frame = BytesMut::new();
            FrameCodec
                .encode((this.conn, &data[..]), &mut frame)
                .map_err(|e| io::Error::other(e.to_string()))?;
            this.trunk.send(cx, frame.freeze())?;
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Whole messages were handed to the trunk as they completed; a partial one waits for
        // its remaining bytes (ttrpc-rust flushes between a header and its payload).
        let _ = cx;
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_flush(cx)
    }
}

impl Drop for MuxConn {
    fn drop(&mut self) {
        // ttrpc gave up on this connection: the whole trunk closes, so the runtime notices at
        // once instead of at its request deadline.
        let _ = self.closed.send(self.conn);
    }
}
