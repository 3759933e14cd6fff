//! The NRI connection multiplexer.
//!
//! NRI runs two ttrpc connections over one unix socket ("trunk"). Every chunk of a logical
//! connection's byte stream travels in a frame `[u32 BE conn id][u32 BE length][payload]`:
//! connection 1 carries the `Plugin` service (we serve, the runtime calls), connection 2 the
//! `Runtime` service (we call). A frame is only a chunk: a ttrpc message may span frames and a
//! frame may hold several messages, exactly like the Go implementation (`pkg/net/multiplex`),
//! which splits writes above [`MAX_PAYLOAD`].
//!
//! [`Mux::start`] turns the trunk into one in-memory duplex stream per connection, which ttrpc-rust
//! serves or dials as if it were a socket of its own. Any protocol violation (oversized frame,
//! unknown connection id, truncated frame) ends the whole trunk with a [`MuxError`]: NRI has no
//! per-connection error channel, and the runtime treats a closed plugin connection as a plugin
//! that went away (fail-open: containers keep running).

use std::collections::HashMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::codec::{Decoder, Encoder, FramedRead};
use tracing::{debug, warn};

/// Connection id of the `Plugin` service (the runtime is the ttrpc client).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// Connection id of the `Runtime` service (the plugin is the ttrpc client).
pub const RUNTIME_SERVICE_CONN: u32 = 2;
/// Frame header: connection id and payload length, both big-endian `u32`.
pub const HEADER_LEN: usize = 8;
/// Largest payload a frame may carry: a ttrpc header (10 bytes) plus ttrpc's 4 MiB message limit.
pub const MAX_PAYLOAD: usize = 10 + (4 << 20);
/// Capacity of each in-memory connection pipe.
const PIPE_CAPACITY: usize = 256 << 10;

/// A multiplexer protocol error or trunk I/O failure.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    #[error("frame for connection {conn} announces {len} bytes, more than the {max} allowed", max = MAX_PAYLOAD)]
    Oversized { conn: u32, len: u32 },
    #[error("frame for unknown connection id {conn} ({len} bytes); NRI uses only ids 1 and 2")]
    UnknownConn { conn: u32, len: u32 },
    #[error("trunk closed in the middle of a frame ({buffered} bytes of an incomplete frame)")]
    Truncated { buffered: usize },
    #[error("connection {conn} was closed by its local end; closing the trunk")]
    ConnClosed { conn: u32 },
    #[error("trunk i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub conn: u32,
    pub payload: Bytes,
}

/// Frame codec: decodes a trunk byte stream into frames, encodes payloads into frames
/// (splitting payloads above [`MAX_PAYLOAD`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct FrameCodec;

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = MuxError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, MuxError> {
        if src.len() < HEADER_LEN {
            return Ok(None);
        }
        let conn = u32::from_be_bytes([src[0], src[1], src[2], src[3]]);
        let len = u32::from_be_bytes([src[4], src[5], src[6], src[7]]);
        if len as usize > MAX_PAYLOAD {
            return Err(MuxError::Oversized { conn, len });
        }
        let total = HEADER_LEN + len as usize;
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(HEADER_LEN);
        let payload = src.split_to(len as usize).freeze();
        Ok(Some(Frame { conn, payload }))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, MuxError> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => Err(MuxError::Truncated {
                buffered: src.len(),
            }),
        }
    }
}

impl Encoder<(u32, &[u8])> for FrameCodec {
    type Error = MuxError;

    fn encode(
        &mut self,
        (conn, mut data): (u32, &[u8]),
        dst: &mut BytesMut,
    ) -> Result<(), MuxError> {
        dst.reserve(data.len() + HEADER_LEN * (1 + data.len() / MAX_PAYLOAD));
        loop {
            let n = data.len().min(MAX_PAYLOAD);
            dst.put_u32(conn);
            dst.put_u32(u32::try_from(n).expect("MAX_PAYLOAD fits in u32"));
            dst.put_slice(&data[..n]);
            data = &data[n..];
            if data.is_empty() {
                return Ok(());
            }
        }
    }
}

/// The running multiplexer: one duplex stream per logical connection, plus the task that owns the
/// trunk. The task finishes (with the reason) when the trunk closes or breaks.
#[derive(Debug)]
pub struct Mux {
    conns: HashMap<u32, DuplexStream>,
    pub task: JoinHandle<Result<(), MuxError>>,
}

impl Mux {
    /// Starts multiplexing `trunk` for the given connection ids.
    pub fn start<T>(trunk: T, conn_ids: &[u32]) -> Mux
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (trunk_rd, trunk_wr) = tokio::io::split(trunk);
        let (out_tx, out_rx) = mpsc::channel::<Bytes>(64);
        let mut conns = HashMap::new();
        let mut sinks: HashMap<u32, WriteHalf<DuplexStream>> = HashMap::new();
        let mut pumps = Vec::new();
        // A local end closing its connection (ttrpc gave up on it) closes the whole trunk, so the
        // runtime notices at once instead of waiting for its request deadline.
        let (closed_tx, closed_rx) = mpsc::unbounded_channel();
        for &id in conn_ids {
            let (ours, theirs) = tokio::io::duplex(PIPE_CAPACITY);
            let (rd, wr) = tokio::io::split(ours);
            sinks.insert(id, wr);
            pumps.push(tokio::spawn(pump_outgoing(
                id,
                rd,
                out_tx.clone(),
                closed_tx.clone(),
            )));
            conns.insert(id, theirs);
        }
        drop(out_tx);
        let writer = tokio::spawn(write_trunk(trunk_wr, out_rx));
        let task = tokio::spawn(async move {
            let result = read_trunk(trunk_rd, sinks, closed_rx).await;
            // The trunk is gone: stop sending; the duplex ends see EOF because their peers dropped.
            for p in pumps {
                p.abort();
            }
            writer.abort();
            result
        });
        Mux { conns, task }
    }

    /// Takes the stream of one logical connection (each can be taken once).
    pub fn take(&mut self, conn: u32) -> Option<DuplexStream> {
        self.conns.remove(&conn)
    }
}

async fn read_trunk<R>(
    trunk: R,
    mut sinks: HashMap<u32, WriteHalf<DuplexStream>>,
    mut closed: mpsc::UnboundedReceiver<u32>,
) -> Result<(), MuxError>
where
    R: AsyncRead + Unpin,
{
    let mut frames = FramedRead::with_capacity(trunk, FrameCodec, 64 << 10);
    loop {
        let frame = tokio::select! {
            f = frames.next() => match f {
                Some(f) => f?,
                None => return Ok(()),
            },
            Some(conn) = closed.recv() => return Err(MuxError::ConnClosed { conn }),
        };
        let Some(sink) = sinks.get_mut(&frame.conn) else {
            return Err(MuxError::UnknownConn {
                conn: frame.conn,
                len: u32::try_from(frame.payload.len()).unwrap_or(u32::MAX),
            });
        };
        if let Err(err) = sink.write_all(&frame.payload).await {
            debug!(conn = frame.conn, %err, "local end of connection is gone");
            return Err(MuxError::ConnClosed { conn: frame.conn });
        }
    }
}

async fn pump_outgoing(
    conn: u32,
    mut rd: ReadHalf<DuplexStream>,
    out: mpsc::Sender<Bytes>,
    closed: mpsc::UnboundedSender<u32>,
) {
    let mut buf = vec![0u8; 64 << 10];
    let mut codec = FrameCodec;
    loop {
        let n = match rd.read(&mut buf).await {
            Ok(0) => {
                let _ = closed.send(conn);
                return;
            }
            Ok(n) => n,
            Err(err) => {
                warn!(conn, %err, "reading outgoing connection data failed");
                return;
            }
        };
        let mut frame = BytesMut::with_capacity(n + HEADER_LEN);
        if codec.encode((conn, &buf[..n]), &mut frame).is_err()
            || out.send(frame.freeze()).await.is_err()
        {
            return;
        }
    }
}

async fn write_trunk<W>(mut trunk: W, mut frames: mpsc::Receiver<Bytes>)
where
    W: AsyncWrite + Unpin,
{
    while let Some(frame) = frames.recv().await {
        if let Err(err) = trunk.write_all(&frame).await {
            debug!(%err, "writing to trunk failed");
            return;
        }
    }
    let _ = trunk.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(conn: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&conn.to_be_bytes());
        v.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn decodes_frames_fed_byte_by_byte() {
        let mut wire = frame(1, b"hello");
        wire.extend(frame(2, b""));
        wire.extend(frame(2, b"xyz"));
        let mut codec = FrameCodec;
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for b in wire {
            buf.put_u8(b);
            while let Some(f) = codec.decode(&mut buf).unwrap() {
                out.push(f);
            }
        }
        assert_eq!(
            out,
            vec![
                Frame {
                    conn: 1,
                    payload: Bytes::from_static(b"hello")
                },
                Frame {
                    conn: 2,
                    payload: Bytes::new()
                },
                Frame {
                    conn: 2,
                    payload: Bytes::from_static(b"xyz")
                },
            ]
        );
    }

    #[test]
    fn rejects_oversized_frame_before_buffering_it() {
        let mut buf = BytesMut::new();
        buf.put_u32(1);
        buf.put_u32(u32::try_from(MAX_PAYLOAD + 1).unwrap());
        let err = FrameCodec.decode(&mut buf).unwrap_err();
        assert!(matches!(err, MuxError::Oversized { conn: 1, .. }), "{err}");
        assert!(err.to_string().contains("more than"), "{err}");
    }

    #[test]
    fn truncated_frame_at_eof_is_an_error() {
        let mut buf = BytesMut::from(&frame(1, b"abcdef")[..10]);
        let err = FrameCodec.decode_eof(&mut buf).unwrap_err();
        assert!(matches!(err, MuxError::Truncated { buffered: 10 }), "{err}");
        let mut header_only = BytesMut::from(&[0u8, 0, 0][..]);
        assert!(FrameCodec.decode_eof(&mut header_only).is_err());
    }

    #[test]
    fn encoder_splits_large_payloads_like_the_go_mux() {
        let data = vec![7u8; MAX_PAYLOAD * 2 + 5];
        let mut dst = BytesMut::new();
        FrameCodec.encode((2, &data[..]), &mut dst).unwrap();
        let mut sizes = Vec::new();
        while let Some(f) = FrameCodec.decode(&mut dst).unwrap() {
            assert_eq!(f.conn, 2);
            sizes.push(f.payload.len());
        }
        assert_eq!(sizes, vec![MAX_PAYLOAD, MAX_PAYLOAD, 5]);
    }

    #[tokio::test]
    async fn routes_both_directions_and_reports_unknown_conn() {
        let (plugin_side, mut runtime_side) = tokio::io::duplex(1 << 16);
        let mut mux = Mux::start(plugin_side, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
        let mut c1 = mux.take(PLUGIN_SERVICE_CONN).unwrap();
        let mut c2 = mux.take(RUNTIME_SERVICE_CONN).unwrap();
        assert!(mux.take(RUNTIME_SERVICE_CONN).is_none());

        // runtime -> plugin, split across frames
        runtime_side.write_all(&frame(1, b"ab")).await.unwrap();
        runtime_side.write_all(&frame(1, b"cd")).await.unwrap();
        runtime_side.write_all(&frame(2, b"zz")).await.unwrap();
        let mut got = [0u8; 4];
        c1.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"abcd");
        let mut got2 = [0u8; 2];
        c2.read_exact(&mut got2).await.unwrap();
        assert_eq!(&got2, b"zz");

        // plugin -> runtime
        c2.write_all(b"reply").await.unwrap();
        let mut hdr = [0u8; 8];
        runtime_side.read_exact(&mut hdr).await.unwrap();
        assert_eq!(u32::from_be_bytes(hdr[..4].try_into().unwrap()), 2);
        let len = u32::from_be_bytes(hdr[4..].try_into().unwrap()) as usize;
        let mut body = vec![0u8; len];
        runtime_side.read_exact(&mut body).await.unwrap();
        assert_eq!(body, b"reply");

        // protocol violation ends the trunk, and the connections see EOF
        runtime_side.write_all(&frame(7, b"??")).await.unwrap();
        let err = mux.task.await.unwrap().unwrap_err();
        assert!(
            matches!(err, MuxError::UnknownConn { conn: 7, len: 2 }),
            "{err}"
        );
        let mut rest = Vec::new();
        assert_eq!(c1.read_to_end(&mut rest).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn trunk_eof_ends_cleanly() {
        let (plugin_side, runtime_side) = tokio::io::duplex(1024);
        let mux = Mux::start(plugin_side, &[1, 2]);
        drop(runtime_side);
        assert!(mux.task.await.unwrap().is_ok());
    }
}
