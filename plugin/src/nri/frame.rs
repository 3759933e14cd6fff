//! The NRI trunk's frames: `[u32 BE conn id][u32 BE length][payload]`, as the Go multiplexer
//! (`pkg/net/multiplex`) writes them; a frame is a chunk of one logical connection's bytes.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// Frame header: connection id and payload length, both big-endian `u32`.
pub const HEADER_LEN: usize = 8;
/// Largest payload a frame may carry: a ttrpc header (10 bytes) plus ttrpc's 4 MiB message limit.
pub const MAX_PAYLOAD: usize = 10 + (4 << 20);

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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A frame as the runtime writes it.
    pub(in crate::nri) fn frame(conn: u32, payload: &[u8]) -> Vec<u8> {
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
}
