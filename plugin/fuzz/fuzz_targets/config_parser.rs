//! The plugin configuration parser (runtime-provided text is untrusted input).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nri_resize::config::Config;

fuzz_target!(|text: &str| {
    if let Ok(cfg) = Config::parse(text, "fuzz") {
        let again = Config::default().overlay(text, "fuzz").expect("parsed once, parses again");
        assert_eq!(cfg, again);
    }
});
