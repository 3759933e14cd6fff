//! The NRI connection multiplexer.
//!
//! NRI runs two ttrpc connections over one unix socket ("trunk"). Every chunk of a logical
//! connection's byte stream travels in a frame `[u32 BE conn id][u32 BE length][payload]`:
//! connection 1 carries the `Plugin` service (we serve, the runtime calls), connection 2 the
//! `Runtime` service (we call). A frame is only a chunk: a ttrpc message may span frames and a
//! frame may hold several messages, exactly like the Go implementation (`pkg/net/multiplex`),
//! which splits writes above [`MAX_PAYLOAD`].
//!
//! [`Mux::start`] turns the trunk into one [`MuxConn`] per connection, which ttrpc-rust serves or
//! dials as if it were a socket of its own: incoming frames are routed through an in-memory pipe
//! per connection, outgoing messages are written to the trunk from the writer's own task, one
//! frame per ttrpc message ([`super::trunk_writer`]). Any protocol violation (oversized frame,
//! unknown connection id, truncated frame) ends the whole trunk with a [`MuxError`]: NRI has no
//! per-connection error channel, and the runtime treats a closed plugin connection as a plugin
//! that went away (fail-open: containers keep running).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::codec::{Decoder, Encoder, FramedRead};
use tracing::debug;

use super::mux_conn::MuxConn;
use super::trunk_writer::{self, TrunkWriter};

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

/// The running multiplexer: one [`MuxConn`] per logical connection, plus the task that owns the
/// trunk. The task finishes (with the reason) when the trunk closes or breaks.
#[derive(Debug)]
pub struct Mux {
    conns: HashMap<u32, MuxConn>,
    pub task: JoinHandle<Result<(), MuxError>>,
}

impl Mux {
    /// Starts multiplexing `trunk` for the given connection ids.
    pub fn start<T>(trunk: T, conn_ids: &[u32]) -> Mux
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (trunk_rd, trunk_wr) = tokio::io::split(trunk);
        let writer = TrunkWriter::new(trunk_wr);
        let mut conns = HashMap::new();
        let mut sinks: HashMap<u32, DuplexStream> = HashMap::new();
        // A local end closing its connection (ttrpc gave up on it) closes the whole trunk, so the
        // runtime notices at once instead of waiting for its request deadline.
        let (closed_tx, closed_rx) = mpsc::unbounded_channel();
        for &id in conn_ids {
            let (ours, theirs) = tokio::io::duplex(PIPE_CAPACITY);
            sinks.insert(id, ours);
            conns.insert(
                id,
                MuxConn::new(id, theirs, Arc::clone(&writer), closed_tx.clone()),
            );
        }
        drop(closed_tx);
        let mut drain = tokio::spawn(trunk_writer::drain(Arc::clone(&writer)));
        let task = tokio::spawn(async move {
            let result = tokio::select! {
                r = read_trunk(trunk_rd, sinks, closed_rx) => r,
                r = &mut drain => match r {
                    Ok(Err(e)) => Err(MuxError::Io(e)),
                    Ok(Ok(())) | Err(_) => Ok(()),
                },
            };
            // The trunk is gone: writers get an error, the trunk's write side is dropped, and the
            // connections see EOF because the read side's pipes are dropped.
            drain.abort();
            writer.close();
            result
        });
        Mux { conns, task }
    }

    /// Takes one logical connection (each can be taken once).
    pub fn take(&mut self, conn: u32) -> Option<MuxConn> {
        self.conns.remove(&conn)
    }
}

async fn read_trunk<R>(
    trunk: R,
    mut sinks: HashMap<u32, DuplexStream>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

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

        // plugin -> runtime: a ttrpc message written the way ttrpc-rust writes it (header field
        // by field, a flush, the payload) travels as one frame.
        let msg = ttrpc_message(7, b"reply");
        for piece in [&msg[..4], &msg[4..8], &msg[8..9], &msg[9..10]] {
            c2.write_all(piece).await.unwrap();
        }
        c2.flush().await.unwrap();
        c2.write_all(&msg[10..]).await.unwrap();
        let mut codec_buf = BytesMut::new();
        let got = loop {
            let mut chunk = [0u8; 64];
            let n = runtime_side.read(&mut chunk).await.unwrap();
            codec_buf.extend_from_slice(&chunk[..n]);
            if let Some(f) = FrameCodec.decode(&mut codec_buf).unwrap() {
                break f;
            }
        };
        assert_eq!(got.conn, 2);
        assert_eq!(&got.payload[..], &msg[..]);
        assert!(codec_buf.is_empty(), "nothing but that one frame");

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

    fn ttrpc_message(stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        v.extend_from_slice(&stream.to_be_bytes());
        v.extend_from_slice(&[2, 0]);
        v.extend_from_slice(payload);
        v
    }

    /// Reads frames from the runtime side until `want` payload bytes arrived for `conn`.
    async fn frames_until<R: AsyncRead + Unpin>(
        trunk: &mut R,
        buf: &mut BytesMut,
        want: usize,
    ) -> Vec<Frame> {
        let mut frames = Vec::new();
        let mut got = 0;
        while got < want {
            while let Some(f) = FrameCodec.decode(buf).unwrap() {
                got += f.payload.len();
                frames.push(f);
            }
            if got >= want {
                break;
            }
            let mut chunk = vec![0u8; 64 << 10];
            let n = trunk.read(&mut chunk).await.unwrap();
            assert!(n > 0, "trunk closed after {got} of {want} bytes");
            buf.extend_from_slice(&chunk[..n]);
        }
        frames
    }

    #[tokio::test]
    async fn messages_become_frames_whole_and_connections_never_interleave_inside_one() {
        // A trunk far smaller than what is written: most frames wait in the writer's queue.
        let (plugin_side, mut runtime_side) = tokio::io::duplex(1000);
        let mut mux = Mux::start(plugin_side, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
        let c1 = mux.take(PLUGIN_SERVICE_CONN).unwrap();
        let c2 = mux.take(RUNTIME_SERVICE_CONN).unwrap();
        let mut expected = HashMap::new();
        let mut writers = Vec::new();
        for (conn, mut stream) in [(PLUGIN_SERVICE_CONN, c1), (RUNTIME_SERVICE_CONN, c2)] {
            let mut wire = Vec::new();
            for i in 0..200u32 {
                let size = usize::try_from(i * 37 % 5000).unwrap();
                wire.extend(ttrpc_message(i, &vec![u8::try_from(conn).unwrap(); size]));
            }
            expected.insert(conn, wire.clone());
            // Written in odd-sized pieces, so messages start and end mid-write.
            writers.push(tokio::spawn(async move {
                for piece in wire.chunks(777) {
                    stream.write_all(piece).await.unwrap();
                }
                stream
            }));
        }
        let total: usize = expected.values().map(Vec::len).sum();
        let mut buf = BytesMut::new();
        let frames = frames_until(&mut runtime_side, &mut buf, total).await;
        let mut got: HashMap<u32, Vec<u8>> = HashMap::new();
        for f in &frames {
            // Every frame holds whole ttrpc messages of its connection.
            let mut rest = &f.payload[..];
            while !rest.is_empty() {
                let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
                assert!(
                    rest.len() >= 10 + len,
                    "a frame of conn {} ends mid-message",
                    f.conn
                );
                rest = &rest[10 + len..];
            }
            got.entry(f.conn).or_default().extend_from_slice(&f.payload);
        }
        assert_eq!(got, expected);
        for w in writers {
            w.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_connection_dropped_by_its_local_end_closes_the_trunk() {
        let (plugin_side, _runtime_side) = tokio::io::duplex(1024);
        let mut mux = Mux::start(plugin_side, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
        let c1 = mux.take(PLUGIN_SERVICE_CONN).unwrap();
        drop(c1);
        let err = mux.task.await.unwrap().unwrap_err();
        assert!(
            matches!(
                err,
                MuxError::ConnClosed {
                    conn: PLUGIN_SERVICE_CONN
                }
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn trunk_eof_ends_cleanly() {
        let (plugin_side, runtime_side) = tokio::io::duplex(1024);
        let mux = Mux::start(plugin_side, &[1, 2]);
        drop(runtime_side);
        assert!(mux.task.await.unwrap().is_ok());
    }
}
