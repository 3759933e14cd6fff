//! The NRI multiplexer's frame decoder on arbitrary trunk bytes, fed in arbitrary chunk sizes:
//! it must never panic, never return a payload above the limit, and must decode the same frames
//! however the bytes are chunked.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use nri_resize::nri::mux::{Frame, FrameCodec, MAX_PAYLOAD};
use tokio_util::codec::Decoder;

fn decode_all(data: &[u8], chunk: usize) -> (Vec<Frame>, bool) {
    let mut codec = FrameCodec;
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for piece in data.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(f)) => {
                    assert!(f.payload.len() <= MAX_PAYLOAD);
                    frames.push(f);
                }
                Ok(None) => break,
                Err(_) => return (frames, false),
            }
        }
    }
    let ok = match codec.decode_eof(&mut buf) {
        Ok(Some(f)) => {
            frames.push(f);
            true
        }
        Ok(None) => true,
        Err(_) => false,
    };
    (frames, ok)
}

fuzz_target!(|input: (u8, &[u8])| {
    let (chunk, data) = input;
    let whole = decode_all(data, data.len().max(1));
    let chunked = decode_all(data, usize::from(chunk));
    assert_eq!(whole.0, chunked.0, "chunking changed the decoded frames");
});
