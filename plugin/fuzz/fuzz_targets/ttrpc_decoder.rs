//! ttrpc envelopes and NRI request payloads, as the plugin service decodes them: arbitrary bytes
//! must give an error or a value, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use protobuf::Message;

use nri_resize::nri::{DecodeError, DECODED_METHODS as METHODS};

fuzz_target!(|data: &[u8]| {
    if data.len() >= 10 {
        // ttrpc frame header: length, stream id, type, flags.
        let _ = ttrpc::MessageHeader::from(&data[..10]);
    }
    if let Ok(req) = ttrpc::Request::parse_from_bytes(data) {
        let _ = nri_resize::nri::decode_plugin_request(&req.method, &req.payload);
    }
    let method = METHODS[usize::from(data.first().copied().unwrap_or(0)) % METHODS.len()];
    let decoded = nri_resize::nri::decode_plugin_request(method, data.get(1..).unwrap_or_default());
    assert!(
        !matches!(&decoded, Err(DecodeError::UnknownMethod(_))),
        "{method} is served but not decoded"
    );
});
