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

use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::codec::FramedRead;
use tracing::debug;

pub use super::frame::{Frame, FrameCodec, MuxError, HEADER_LEN, MAX_PAYLOAD};
use super::mux_conn::MuxConn;
use super::trunk_writer::{self, TrunkWriter};

/// Connection id of the `Plugin` service (the runtime is the ttrpc client).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// Connection id of the `Runtime` service (the plugin is the ttrpc client).
pub const RUNTIME_SERVICE_CONN: u32 = 2;
/// Capacity of each in-memory connection pipe.
const PIPE_CAPACITY: usize = 256 << 10;

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
    use super::super::frame::tests::frame;
    use super::*;
    use bytes::BytesMut;
    use tokio::io::AsyncReadExt;
    use tokio_util::codec::Decoder as _;

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
    async fn a_message_larger_than_a_frame_streams_through_and_the_next_is_framed_whole() {
        let (plugin_side, mut runtime_side) = tokio::io::duplex(1 << 16);
        let mut mux = Mux::start(plugin_side, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
        let mut c2 = mux.take(RUNTIME_SERVICE_CONN).unwrap();
        let big = ttrpc_message(1, &vec![9u8; MAX_PAYLOAD + 100]);
        let small = ttrpc_message(3, b"after");
        let mut wire = big.clone();
        wire.extend_from_slice(&small);
        let writer = tokio::spawn(async move {
            for piece in wire.chunks(100_000) {
                c2.write_all(piece).await.unwrap();
            }
            c2
        });
        let mut buf = BytesMut::new();
        let frames = frames_until(&mut runtime_side, &mut buf, big.len() + small.len()).await;
        let got: Vec<u8> = frames.iter().flat_map(|f| f.payload.to_vec()).collect();
        assert_eq!(got.len(), big.len() + small.len());
        assert!(
            got[..big.len()] == big[..],
            "the large message arrives whole, in order"
        );
        // The large message's last bytes and the next message may share a frame; the next
        // message is not split: the header after the large one was found where it is.
        let last = frames.last().unwrap();
        assert!(
            last.payload.ends_with(&small) && frames.len() >= 2,
            "the message after the large one ends the last frame whole ({} frames)",
            frames.len()
        );
        drop(writer.await.unwrap());
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
